"""The sharded mode's placement (``runtime/placement.py``): rows read locally first, then the ranks' loads evened out
among the placements that read as many rows locally, by candidate rows and, once every rank's measurement of a step
has arrived, by the time the ranks measured."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.runtime.placement import Placement, RankLoads

# Four views on four ranks: views 0 and 1 wholly on ranks 0 and 1 (100 rows each); views 2 and 3 (50 and 30 rows)
# also on ranks 0 and 1, so that by locality they go to ranks 2 and 3, in either order (a tie).
ROWS_OWNED = torch.tensor([[100, 0, 0, 0], [0, 100, 0, 0], [50, 0, 0, 0], [0, 30, 0, 0]])


def step_workers(step: int) -> list[list[Task]]:
    """One task a worker, worker w view w."""
    return [[Task(step, 0, 0, view, None)] for view in range(4)]  # type: ignore[arg-type]


def local_rows(ranks: list[int], workers: list[list[Task]], rows_owned: torch.Tensor) -> int:
    """The rows the placement ``ranks`` reads on their owners."""
    return sum(int(rows_owned[task.view, rank]) for rank, tasks in zip(ranks, workers) for task in tasks)


def test_tied_workers_go_to_the_less_loaded_rank_so_the_loads_even_out() -> None:
    """Ten steps of the same views: the 50-row worker alternates between ranks 2 and 3 (by locality alone it would
    land on one of them every step, 200 rows apart after ten), every step reads the most rows locally it can, and the
    two ranks' loads end one task apart at most."""
    placement = Placement(ROWS_OWNED)
    of_the_costlier = []
    for step in range(10):
        workers = step_workers(step)
        ranks = placement.ranks_of(workers)
        best = linear_sum_assignment(np.array([[int(ROWS_OWNED[w.view, r]) for r in range(4)] for (w,) in workers]),
                                     maximize=True)[1]
        assert local_rows(ranks, workers, ROWS_OWNED) == local_rows(list(best), workers, ROWS_OWNED) == 200
        assert ranks[:2] == [0, 1]
        of_the_costlier.append(ranks[2])
    assert set(of_the_costlier) == {2, 3}, "the tie was broken toward the less loaded rank"
    rows = placement.loads.rows
    assert rows.tolist()[:2] == [1000.0, 1000.0]
    assert abs(rows[2] - rows[3]) <= 50
    assert rows[2] + rows[3] == 10 * 80


def test_locality_comes_before_the_loads() -> None:
    """One row of the 50-row view on rank 2 makes that placement read more locally: it holds every step, however
    loaded rank 2 grows."""
    rows_owned = ROWS_OWNED.clone()
    rows_owned[2, 2] = 1
    placement = Placement(rows_owned)
    assert all(placement.ranks_of(step_workers(step))[2] == 2 for step in range(10))
    assert placement.loads.rows[2] == 10 * 51 and placement.loads.rows[3] == 10 * 30


def test_a_placement_made_again_carries_the_loads_on_and_steps_go_in_order() -> None:
    """After a re-cut the loads go on (the next tie goes to the rank that read less before it); a step placed twice
    or out of order is refused, since every rank must place the same steps in the same order."""
    placement = Placement(ROWS_OWNED)
    first = placement.ranks_of(step_workers(0))
    again = Placement(ROWS_OWNED, placement.loads)
    assert again.ranks_of(step_workers(1))[2] == ({2, 3} - {first[2]}).pop()
    with pytest.raises(ValueError, match="one step at a time, in order"):
        again.ranks_of(step_workers(1))
    with pytest.raises(ValueError, match="one value per rank"):
        Placement(ROWS_OWNED, RankLoads(3, None))


def test_measured_time_steers_the_ties_once_every_rank_has_it() -> None:
    """Rank 3 computes three times slower than the others. By rows alone the 50-row worker alternates between ranks
    2 and 3; by measured time (lag 2: step s is placed by the measurements of steps s - 2 and before, the later ones
    by rows) rank 3 is the more loaded from step 2 on, so the 50-row worker stays on rank 2. A placement whose lag's
    measurement has not arrived is refused, since every rank must count the same measurements."""
    slowness = np.array([1.0, 1.0, 1.0, 3.0])  # measured nanoseconds per candidate row on each rank
    placement = Placement(ROWS_OWNED, RankLoads(4, lag=2))
    by_rows = Placement(ROWS_OWNED)
    measured, alternating = [], []
    for step in range(12):
        workers = step_workers(step)
        ranks = placement.ranks_of(workers)
        measured.append(ranks[2])
        alternating.append(by_rows.ranks_of(workers)[2])
        rows = np.zeros(4)
        rows[ranks] = [int(ROWS_OWNED[task.view].sum()) for (task,) in workers]
        placement.loads.measured(step, rows * slowness)
    assert measured[:2] == alternating[:2], "before any measurement counts, placed by rows alone"
    assert measured[2:] == [2] * 10 and set(alternating[2:]) == {2, 3}, "the slower rank got the cheaper worker"
    assert placement.loads.counted_through == 9 and placement.loads.measured_ns[3] > placement.loads.measured_ns[2]
    late = Placement(ROWS_OWNED, RankLoads(4, lag=2))
    late.ranks_of(step_workers(0))
    late.ranks_of(step_workers(1))
    with pytest.raises(RuntimeError, match="measured time of step 0 has not arrived"):
        late.ranks_of(step_workers(2))
