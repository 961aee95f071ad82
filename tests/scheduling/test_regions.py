"""The regional order: views keyed by the Z-order of their points' centroid, cut into W equal runs; each worker
trains its own region's views, every view once per epoch; the schedule needs the keys."""

from __future__ import annotations

import numpy as np
import pytest

from odin_nerfstudio.scenes.citygen import street_point_sets
from odin_nerfstudio.scheduling.balance import mean_balance, steps_balance
from odin_nerfstudio.scheduling.regions import (
    aligned_balance,
    _band_counts,
    cost_banded,
    halves_steps,
    regional_steps,
    regions_of,
    strided,
    view_keys,
)
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig


def street(num_views: int = 40) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """citygen's street: view i sees points [4 i, 4 i + 40); point p sits at x = p (COLMAP ids 1000 + p, shuffled)."""
    sets = street_point_sets(num_views)
    count = int(max(s.max() for s in sets)) + 1
    rows = np.random.default_rng(0).permutation(count)
    ids = 1000 + rows  # row r holds point rows[r]
    xyz = np.stack([rows.astype(float), np.zeros(count), np.zeros(count)], axis=1)
    return [1000 + s for s in sets], ids, xyz


def test_keys_follow_the_street_and_regions_are_equal_runs_of_it() -> None:
    sets, ids, xyz = street()
    keys = view_keys(sets, ids, xyz)
    assert np.all(np.diff(keys) >= 0), "views along the street get increasing Z-order codes"
    regions = regions_of(keys, 3)
    assert [len(r) for r in regions] == [14, 13, 13]
    assert np.array_equal(np.concatenate(regions), np.arange(40)), "contiguous runs of the street, in order"


def test_each_worker_takes_its_own_regions_views_once_per_epoch() -> None:
    regions = [np.arange(0, 5), np.arange(5, 9)]
    steps = regional_steps(regions, 2, np.random.default_rng(0))
    assert len(steps) == 3
    for worker, region in enumerate(regions):
        taken = np.concatenate([step[worker] for step in steps])
        assert sorted(taken.tolist()) == region.tolist()
    assert [len(step[1]) for step in steps] == [2, 2, 0], "a spent region's worker idles"


def test_the_schedule_in_regional_order_keeps_workers_in_their_regions() -> None:
    sets, ids, xyz = street()
    rlg = RelativeLocalityGraph.from_point_sets(sets)
    config = ScheduleConfig(num_workers=2, views_per_worker=1, seed=3, order="regions")
    schedule = Schedule(rlg, config, view_keys=view_keys(sets, ids, xyz))
    halves = regions_of(view_keys(sets, ids, xyz), 2)
    seen = []
    for s in range(schedule.steps_per_epoch):
        step = schedule.at(s)
        for worker, views in enumerate(step.tasks):
            assert set(views) <= set(halves[worker].tolist())
            seen += views
    assert sorted(seen) == list(range(40))
    assert schedule.epoch(0).conflict_mass < schedule.epoch(0).random_conflict_mass, "a step's views are far apart"
    with pytest.raises(ValueError, match="regional order needs a key per view"):
        Schedule(rlg, config)


def test_halves_alternate_between_the_two_halves_of_the_scene_by_global_step() -> None:
    regions = [np.arange(0, 5), np.arange(5, 9), np.arange(9, 13), np.arange(13, 17)]  # 2 workers: 4 regions
    first, second = set(range(0, 9)), set(range(9, 17))
    for first_step in (0, 1):
        steps = halves_steps(regions, 1, np.random.default_rng(0), first_step)
        assert len(steps) == 9, "worker 0 trains regions 0 and 3 (9 views), worker 1 regions 1 and 2 (8)"
        for worker, own in enumerate(([0, 3], [1, 2])):
            taken = np.concatenate([step[worker] for step in steps])
            assert sorted(taken.tolist()) == sorted(np.concatenate([regions[r] for r in own]).tolist())
        for index, step in enumerate(steps[:8]):
            views = set(np.concatenate(step).tolist())
            assert views <= (first if (first_step + index) % 2 == 0 else second), f"step {index} left its half"
        assert steps[8][0].tolist() != [] and steps[8][1].tolist() == [], "worker 0's last view; worker 1 is spent"


def test_halves_fill_a_step_from_the_other_half_where_one_runs_short() -> None:
    regions = [np.arange(0, 3), np.arange(3, 5)]  # 1 worker, 3 views a step: 5 views in 2 steps
    steps = halves_steps(regions, 3, np.random.default_rng(0), 0)
    assert [len(step[0]) for step in steps] == [3, 2]
    assert sorted(np.concatenate([step[0] for step in steps]).tolist()) == list(range(5))
    with pytest.raises(ValueError, match="even number of regions"):
        halves_steps(regions[:1], 1, np.random.default_rng(0), 0)


def test_the_halves_order_keeps_consecutive_steps_of_a_street_apart() -> None:
    """On citygen's street (a view shares points with the 9 views on either side), 4 workers: the regional order's
    consecutive steps share points (its regions are 10 views long), the halves order's only across the border."""
    sets, ids, xyz = street()
    keys = view_keys(sets, ids, xyz)
    rlg = RelativeLocalityGraph.from_point_sets(sets)
    plans = {}
    for order in ("regions", "halves"):
        schedule = Schedule(rlg, ScheduleConfig(num_workers=4, order=order), view_keys=keys)
        assert schedule.epoch(0).steps[-1].index + 1 == schedule.steps_per_epoch == 10
        views = [v for step in schedule.epoch(1).steps for task in step.tasks for v in task]
        assert sorted(views) == list(range(40)), "every view once per epoch"
        plans[order] = schedule.epoch(0).conflict_mass, schedule.epoch(1).conflict_mass
    assert all(h < r / 4 for h, r in zip(plans["halves"], plans["regions"])), plans


def test_cost_bands_even_the_steps_that_a_regions_space_order_leaves_uneven() -> None:
    """Two regions whose costs alternate along space (a view down a street, one facing a wall): strided alone,
    a step pairs a costly view with a cheap one; banded, the k-th views of both regions cost alike. Every region
    keeps its own views; orders already even stay as they are."""
    regions = [np.arange(0, 40), np.arange(40, 80)]
    cost = np.where(np.arange(80) % 2 == 0, 1.0, 5.0)
    cost[40:] = cost[40:][::-1]
    rng = np.random.default_rng(0)
    strided_orders = [strided(region, np.random.default_rng(0)) for region in regions]
    banded = cost_banded(strided_orders, cost, 0.05, 1)
    for region, order in zip(regions, banded):
        assert sorted(order.tolist()) == region.tolist()
    uneven = aligned_balance(strided_orders, cost, 1)
    assert uneven > 1.2, "the strided order pairs costly and cheap views"
    assert aligned_balance(banded, cost, 1) <= 1.05
    assert np.array_equal(cost[banded[0]], cost[banded[1]]), "the k-th views of both regions cost alike"
    even = np.ones(80)
    assert all(a is b for a, b in zip(cost_banded(strided_orders, even, 0.05, 1), strided_orders))
    steps = regional_steps(regions, 1, rng, cost, 0.05)
    assert max(cost[step[0]].sum() / cost[step[1]].sum() for step in steps) == 1.0


def test_cost_bands_even_the_halves_steps_and_keep_their_sweep_band_by_band() -> None:
    """Two workers, four regions of 40 views whose costs alternate along space: the halves order's steps, swept in
    key order alone, pair costly and cheap views; banded, each half's regions take like costs at every step, each
    worker still trains its own two regions in alternate halves, and each band is swept in key order (the direction
    seeded), so the two regions at the border stay apart at consecutive steps."""
    regions = [np.arange(40 * r, 40 * (r + 1)) for r in range(4)]
    cost = np.where(np.arange(160) % 2 == 0, 1.0, 5.0)
    cost[40:80] = cost[40:80][::-1]
    cost[120:] = cost[120:][::-1]
    swept = halves_steps(regions, 1, np.random.default_rng(0), 0)
    banded = halves_steps(regions, 1, np.random.default_rng(0), 0, cost, 0.05)
    def balance(steps: list[list[np.ndarray]]) -> float:
        return mean_balance(np.array([[cost[views].sum() for views in step] for step in steps]))

    assert balance(swept) > 1.2 and balance(banded) <= 1.05
    for steps in (swept, banded):
        assert len(steps) == 80
        for worker, own in enumerate(([0, 3], [1, 2])):
            taken = np.concatenate([step[worker] for step in steps])
            assert sorted(taken.tolist()) == sorted(np.concatenate([regions[r] for r in own]).tolist())
        assert all(np.concatenate(step).max() < 80 for step in steps[::2]), "even steps in the first half"
    border = [int(banded[index][1][0]) for index in range(80)]  # worker 1: regions 1 and 2, at the border (80)
    for band in (cost[border] == 1.0, cost[border] == 5.0):
        parity = np.arange(80) % 2
        first, second = np.array(border)[band & (parity == 0)], np.array(border)[band & (parity == 1)]
        assert np.all(np.diff(first) * np.diff(second) > 0), "each band swept one way in both regions"
    gaps = [abs(a - b) for a, b in zip(border, border[1:])]
    assert min(gaps) >= 30, "a region's length apart, as in the sweep alone"


def test_the_halves_orders_bands_may_be_one_step_wide() -> None:
    """Regions of 4 views (a 1,024-view city at 64 workers: 8) are too small for bands of MIN_BAND_GROUPS steps;
    the halves order, whose worker's consecutive steps lie in opposite halves, bands them one step wide."""
    regions = [np.arange(4 * r, 4 * (r + 1)) for r in range(4)]
    cost = np.array([1.0, 2.0, 3.0, 4.0, 4.0, 3.0, 2.0, 1.0] * 2)
    steps = halves_steps(regions, 1, np.random.default_rng(0), 0, cost, 0.05)
    assert all(len({float(cost[views].sum()) for views in step}) == 1 for step in steps), "like costs in each step"
    kept = cost_banded(regions[:2], cost, 0.05, 1)
    assert all(np.array_equal(a, b) for a, b in zip(kept, regions[:2])), "the regional order keeps its floor"


def test_the_regional_schedule_follows_its_costs_predicted_or_measured() -> None:
    """The schedule in the regions order cut by uneven view costs: evener steps by those costs than the same
    schedule cut by even ones, and re-balanced by measured costs (``with_view_cost``) it follows them."""
    sets, ids, xyz = street()
    rlg = RelativeLocalityGraph.from_point_sets(sets)
    config = ScheduleConfig(num_workers=2, views_per_worker=1, seed=3, order="regions")
    keys = view_keys(sets, ids, xyz)
    uneven = np.random.default_rng(5).uniform(1.0, 6.0, size=40)
    flat = Schedule(rlg, config, view_cost=np.ones(40), view_keys=keys)
    banded = Schedule(rlg, config, view_cost=uneven, view_keys=keys)
    assert steps_balance(flat.epoch(0).steps, uneven) > 1.2
    assert steps_balance(banded.epoch(0).steps, uneven) < 1.1
    rebalanced = flat.with_view_cost(uneven)
    assert steps_balance(rebalanced.epoch(0).steps, uneven) == steps_balance(banded.epoch(0).steps, uneven)


def test_a_band_floor_of_one_step_gives_the_regions_order_its_evenest_steps() -> None:
    """``band_floor`` 1 with a tolerance of 0 (a barrier's evenest steps): bands one step wide pair each region's
    k-th cheapest views, evener than the default floor's bands of four steps, which a region of 20 views caps at
    five; a floor below one step is refused by name."""
    sets, ids, xyz = street()
    rlg = RelativeLocalityGraph.from_point_sets(sets)
    keys = view_keys(sets, ids, xyz)
    cost = np.random.default_rng(5).uniform(1.0, 6.0, size=40)
    balance = {}
    for floor in (4, 1):
        config = ScheduleConfig(num_workers=2, seed=3, order="regions", balance_tolerance=0.0, band_floor=floor)
        balance[floor] = steps_balance(Schedule(rlg, config, view_cost=cost, view_keys=keys).epoch(0).steps, cost)
    assert balance[1] < balance[4] - 0.01, balance
    with pytest.raises(ValueError, match="band_floor"):
        ScheduleConfig(band_floor=0)


def test_large_regions_try_band_counts_on_a_ladder() -> None:
    """Up to 32 bands every count is tried; above, each count 1.25 times the last, up to the most a region allows:
    a 500,000-view city at W = 8 (62,500 views a region, at most 15,625 bands) tries 59, not 15,624."""
    assert _band_counts(1) == [] and _band_counts(8) == list(range(2, 9))
    counts = _band_counts(15_625)
    assert counts[:31] == list(range(2, 33)) and counts[-1] == 15_625 and len(counts) == 59
    assert all(later <= 1.25 * earlier + 1 for earlier, later in zip(counts[31:], counts[32:]))
