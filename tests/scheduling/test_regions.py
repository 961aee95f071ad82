"""The regional order: views keyed by the Z-order of their points' centroid, cut into W equal runs; each worker
trains its own region's views, every view once per epoch; the schedule needs the keys."""

from __future__ import annotations

import numpy as np
import pytest

from odin_nerfstudio.scenes.citygen import street_point_sets
from odin_nerfstudio.scheduling.regions import regional_steps, regions_of, view_keys
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
