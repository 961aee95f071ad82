"""Balanced steps: cost bands, measured view costs, schedules balanced by them, and the locality-only schedule
unchanged (pinned against the schedule before cost bands)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from odin_nerfstudio.core.timeline import SpanCursor, Timeline
from odin_nerfstudio.scenes.citygen import CityConfig, city_point_sets, object_point_sets, street_point_sets
from odin_nerfstudio.scheduling import balance
from odin_nerfstudio.scheduling.balance import (
    FLOOR_SPREAD,
    MIN_BAND_GROUPS,
    TAIL_SHARE,
    ViewTimes,
    cost_bands,
    measured_view_cost,
)
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig, _epoch_to_dict

# sha256 of epochs 0 and 1 (``_epoch_to_dict``) at seed 5, written by the schedule before cost bands (v3) and by
# its grow_groups before the masked frontier: with balance_tolerance=None the schedule must not change.
PINNED = {
    ("city", 2): "99c31e25c81610f90b463f2dc9e3c468ae7894b1ee84eac6c2ac5bba8fdefbf5",
    ("city", 8): "6cb7a502b04cd6b2b9d5e89819cd295f656ca555aa9a402f4b84eec434be6126",
    ("street", 2): "d8d6bc76ccc2c04193c6b6e26a025e5340e17244ba5f9a006c09185a0e36d2f4",
    ("street", 8): "883539bfa59509dbb5e4a1d6af1c916448c6b20494f85d9352aa729963576bec",
    ("object", 2): "a8ca7521b9325badb211c9e543a7ef9fd9a61fef63104c9ddcaf73eee4b738a8",
    ("object", 8): "695ec302c2b3b9e92f5c1c03915638e23228cb29eb7183da94e21cda656637c7",
}


def scenes() -> dict[str, list[np.ndarray]]:
    """The pinned scenes: a small city, a street and a dense object."""
    return {
        "city": city_point_sets(CityConfig(num_views=2000, seed=3)).point_sets,
        "street": street_point_sets(600, seed=1),
        "object": object_point_sets(40, num_points=300, seed=2),
    }


def measured_like(rlg: RelativeLocalityGraph, seed: int = 7) -> np.ndarray:
    """Per-view seconds: a linear cost in the points times a persistent per-view factor (lognormal, sigma 0.3)."""
    rng = np.random.default_rng(seed)
    return (0.14 + 1.5e-3 * rlg.num_points) * np.exp(rng.normal(0.0, 0.3, rlg.num_views))


def test_locality_only_schedule_is_unchanged() -> None:
    """balance_tolerance=None gives exactly the steps of the schedule before cost bands."""
    for name, point_sets in scenes().items():
        rlg = RelativeLocalityGraph.from_point_sets(point_sets)
        for workers in (2, 8):
            schedule = Schedule(rlg, ScheduleConfig(num_workers=workers, seed=5, balance_tolerance=None))
            text = json.dumps([_epoch_to_dict(schedule.epoch(e)) for e in (0, 1)])
            assert hashlib.sha256(text.encode()).hexdigest() == PINNED[name, workers], (name, workers)


def test_cost_bands_cut_sorted_costs_into_whole_steps() -> None:
    """Every view once, each band a multiple of S (the last takes the rest), within the tolerance where costs are
    dense, at least MIN_BAND_GROUPS steps unless those would hold a view over 1 + FLOOR_SPREAD x tolerance times
    their mean (the tails: then within that bound, or one step), and the shuffle's order kept inside a band."""
    rng = np.random.default_rng(0)
    cost = rng.lognormal(0.0, 0.3, 5003)
    order = rng.permutation(cost.size)
    size, tolerance = 8, 0.05
    arranged, bounds = cost_bands(order, cost, size, tolerance)
    assert sorted(arranged.tolist()) == list(range(cost.size))
    lengths = np.diff(bounds)
    assert np.all(lengths[:-1] % size == 0) and lengths[-1] >= size
    spreads = [cost[arranged[a:b]].max() / cost[arranged[a:b]].min() for a, b in zip(bounds[:-1], bounds[1:])]
    assert np.median(spreads) <= 1 + tolerance and len(spreads) > 10
    floor, bound, narrow = MIN_BAND_GROUPS * size, 1 + FLOOR_SPREAD * tolerance, 0
    ascending = np.sort(cost)
    for a, b in zip(bounds[:-2], bounds[1:-1]):
        band = ascending[a:b]
        if b - a < floor:
            narrow += 1
            assert ascending[a : a + floor].max() > bound * ascending[a : a + floor].mean()
            assert band.max() <= bound * band.mean() or b - a == size
        else:
            assert band.max() <= (1 + tolerance) * band.min() or (b - a == floor and band.max() <= bound * band.mean())
    assert 0 < narrow < len(lengths) // 2
    rank = np.empty(cost.size, dtype=np.int64)
    rank[order] = np.arange(cost.size)
    for a, b in zip(bounds[:-1], bounds[1:]):
        assert np.all(np.diff(rank[arranged[a:b]]) > 0)
        assert cost[arranged[a:b]].max() <= cost[arranged[b:]].min(initial=np.inf)
    same, one = cost_bands(order, cost, size, None)
    assert same is order and one.tolist() == [0, cost.size]


@pytest.mark.parametrize("workers", [2, 8, 16])
def test_banded_steps_balance_within_tolerance_and_keep_locality(workers: int) -> None:
    """On a 3,000-view city with measured-like costs, locality alone leaves steps at max/mean >= 1.15; cost bands
    bring them within 1.05 while consecutive steps still conflict far less than a random order."""
    rlg = RelativeLocalityGraph.from_point_sets(city_point_sets(CityConfig(num_views=3000, seed=1)).point_sets)
    cost = measured_like(rlg)
    alone = Schedule(rlg, ScheduleConfig(num_workers=workers, balance_tolerance=None), view_cost=cost).summary()
    banded = Schedule(rlg, ScheduleConfig(num_workers=workers), view_cost=cost)
    summary = banded.summary()
    assert alone["balance"] >= 1.15
    assert summary["balance"] <= 1.05
    assert summary["ratio"] <= 0.5 and summary["random_conflict_mass"] > 0
    step = banded.at(3)
    np.testing.assert_allclose(step.worker_cost, [cost[list(t)].sum() for t in step.tasks])


def test_short_epoch_tails_get_narrower_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2,000-view street at W = 32 (62 steps) with measured-like costs: the 4-step floor everywhere left its tail
    bands spanning far more than the tolerance (balance 1.061); narrower tail bands bring it within 1.05 while the
    steps still conflict far less than a random order, and the rest of the bands keep the floor. With B = 4 views
    per worker (the same step size) the floor holds everywhere."""
    rlg = RelativeLocalityGraph.from_point_sets(street_point_sets(2000, seed=0))
    cost, config = measured_like(rlg), ScheduleConfig(num_workers=32, seed=0)
    _, bounds = cost_bands(np.arange(rlg.num_views), cost, config.step_size, config.band_tolerance)
    lengths = np.diff(bounds)
    narrow = lengths < MIN_BAND_GROUPS * config.step_size
    assert narrow.any() and lengths[narrow].sum() <= TAIL_SHARE * rlg.num_views
    fours = ScheduleConfig(num_workers=8, views_per_worker=4)  # the same S: LPT evens out sums of 4 views
    _, fours_bounds = cost_bands(np.arange(rlg.num_views), cost, fours.step_size, fours.band_tolerance, 4)
    assert np.all(np.diff(fours_bounds) >= MIN_BAND_GROUPS * fours.step_size)
    summary = Schedule(rlg, config, view_cost=cost).summary()
    assert summary["balance"] <= 1.05 and summary["ratio"] <= 0.1
    monkeypatch.setattr(balance, "FLOOR_SPREAD", np.inf)
    _, floor_bounds = cost_bands(np.arange(rlg.num_views), cost, config.step_size, config.band_tolerance)
    assert np.all(np.diff(floor_bounds) >= MIN_BAND_GROUPS * config.step_size)
    assert Schedule(rlg, config, view_cost=cost).summary()["balance"] > 1.05


def test_a_small_scene_keeps_the_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """24 views whose costs are sparse throughout (a small scene, where grown groups need the floor's neighbours):
    narrower bands would hold most views, over TAIL_SHARE, so every band keeps MIN_BAND_GROUPS steps."""
    cost = np.geomspace(1.0, 8.0, 24)
    floor = MIN_BAND_GROUPS * 2
    _, bounds = cost_bands(np.arange(24), cost, 2, 0.05)
    assert np.all(np.diff(bounds) >= floor)
    monkeypatch.setattr(balance, "TAIL_SHARE", 1.0)
    _, narrowed = cost_bands(np.arange(24), cost, 2, 0.05)
    assert np.all(np.diff(narrowed) < floor)


def test_lpt_balances_the_step_first() -> None:
    """With B > 1 the step's own balance comes first: a worker far ahead in the epoch still gets its share."""
    from odin_nerfstudio.scheduling.ordering import assign_lpt

    tasks, loads = assign_lpt(np.arange(4), np.array([4.0, 3.0, 2.0, 1.0]), 2, 2, carried=[100.0, 0.0])
    assert tasks == ((1, 2), (0, 3)) and loads == (5.0, 5.0)


def test_measured_view_cost_means_and_fills_unmeasured_views() -> None:
    """Mean of each view's measured times; unmeasured views get the predicted cost at the measured scale."""
    predicted = np.array([100.0, 200.0, 300.0, 400.0])
    cost = measured_view_cost(np.array([0, 0, 1, 2]), np.array([1.0, 3.0, 4.0, 6.0]), predicted)
    np.testing.assert_allclose(cost, [2.0, 4.0, 6.0, 0.02 * 400.0])
    with pytest.raises(ValueError, match="one view index"):
        measured_view_cost(np.array([4]), np.array([1.0]), predicted)
    with pytest.raises(ValueError, match=">= 0"):
        measured_view_cost(np.array([1]), np.array([-1.0]), predicted)


def test_view_times_add_up_a_tasks_spans_and_every_ranks_measurements() -> None:
    """A task's backward adds to its render's measurement without counting another; two ranks' sums add up to the
    costs of every task."""
    predicted = np.array([10.0, 20.0, 30.0])
    rank0, rank1 = ViewTimes(3), ViewTimes(3)
    rank0.add(np.array([0, 0]), np.array([1.0, 3.0]))
    rank0.add(np.array([0, 0]), np.array([1.0, 1.0]), count=False)
    rank1.add(np.array([1]), np.array([4.0]))
    both = ViewTimes(3)
    both.seconds, both.count = rank0.seconds + rank1.seconds, rank0.count + rank1.count
    np.testing.assert_allclose(both.view_cost(predicted), [3.0, 4.0, 0.25 * 30.0])
    np.testing.assert_allclose(rank0.view_cost(predicted), [3.0, 0.3 * 20.0, 0.3 * 30.0])
    with pytest.raises(ValueError, match="one view index"):
        rank0.add(np.array([3]), np.array([1.0]))


def test_view_times_take_a_timelines_task_spans_once() -> None:
    """A timeline's renders and backwards reach the view's measured time through a cursor, each once: a re-run is a
    measurement of its own, a backward adds to its render's, a wait is no task's cost."""
    now = [0]
    timeline = Timeline(clock=lambda: now[0])

    def span(name: str, view: int, length: int) -> None:
        start = now[0]
        now[0] += length * 10**9
        timeline.record(name, 0, 0, start, {"view": view})

    cursor, times = SpanCursor(), ViewTimes(2)
    span("render", 1, 2), span("backward", 1, 1), span("wait", 1, 50), span("render", 1, 4)  # a re-run of view 1
    times.add_spans(cursor.take(timeline.events, timeline.recorded))
    span("render", 0, 3)
    times.add_spans(cursor.take(timeline.events, timeline.recorded))
    np.testing.assert_allclose(times.seconds, [3.0, 7.0])
    np.testing.assert_array_equal(times.count, [1, 2])
    assert cursor.take(timeline.events, timeline.recorded) == [], "every span is taken once"


def test_with_view_cost_rebalances_and_round_trips() -> None:
    """A schedule re-balanced by measured costs keeps its length, uses the costs, and saves and reloads only
    with them."""
    rlg = RelativeLocalityGraph.from_point_sets(street_point_sets(400, seed=2))
    schedule = Schedule(rlg, ScheduleConfig(num_workers=4, seed=1))
    cost = measured_like(rlg)
    measured = schedule.with_view_cost(cost)
    assert measured.steps_per_epoch == schedule.steps_per_epoch and measured.rlg is schedule.rlg
    np.testing.assert_array_equal(measured.view_cost, cost)
    assert measured.epoch(0) != schedule.epoch(0)
    text = measured.to_json()
    assert Schedule.from_json(text, rlg, view_cost=cost).epoch(0) == measured.epoch(0)
    with pytest.raises(ValueError, match="measured view_cost"):
        Schedule.from_json(text, rlg)
    with pytest.raises(ValueError, match="one cost per view"):
        schedule.with_view_cost(cost[:-1])
    with pytest.raises(ValueError, match="balance_tolerance"):
        ScheduleConfig(balance_tolerance=-0.1)
