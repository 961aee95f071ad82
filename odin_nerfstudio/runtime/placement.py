"""Which rank of a sharded run runs which schedule worker's tasks: in each step, the rank that owns most of their
rows, so that most of a task's rows are read where they live and fewer cross the link; among placements that read as
many rows locally, the one that evens out the ranks' loads over the run.

The schedule fixes each step's views and their split into W workers (conflict-free, balanced); which rank runs
which worker is free, as long as the owners sum the gradients in worker order (the replicated barrier's order), so
the sharded model stays the barrier's bit for bit whatever the placement. The choice is an assignment problem per
step (maximise the rows read locally), solved from a table every rank holds alike: per training view, how many of
its candidate rows each rank owns, gathered when the shards are cut and re-cut (``drivers/sharded_loop.py``).

Ties are common where a step's views lie in part of the shards (the halves order, ``scheduling/regions.py``: half
the workers read another rank's shard, and any of the ranks holding none of their rows will do). There the placement
gives the costlier workers (more candidate rows, which a task's time grows with) to the ranks that have read fewer
rows so far. A barrier's step waits for its slowest rank whatever the placement, but in a mode whose ranks run
ahead of each other (quality-first) a rank handed the costlier views step after step sets the run's pace: on a
simulated 1,024-view city at 64 workers, the slowest rank's render time over 40 steps at the fitted costs was 1.049
times the mean rank's by locality alone, and 1.009 with the ties broken so (BENCHMARKS.md, bench_simulate_sharded's
hand note on placement ties). Locality still comes first exactly: the balance term of a whole assignment is less
than one row, so as many rows cross the link as by locality alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from odin_nerfstudio.core.tasks import Task


class Placement:
    """Per step, the rank for each schedule worker (see the module). Steps are placed in order, the same on every
    rank, so that every rank's loads, and with them its placements, are the same.

    Args:
        rows_owned: int64 [V, W]: per training view (``Task.view``), its candidate rows each rank owns.
        loads: per rank, the candidate rows of the tasks placed on it so far (a placement made again after the rows
            moved carries them on), or None (none yet).
    """

    def __init__(self, rows_owned: Tensor, loads: np.ndarray | None = None) -> None:
        if rows_owned.dim() != 2:
            raise ValueError(f"rows_owned must be [views, ranks], got shape {tuple(rows_owned.shape)}")
        self.rows_owned = rows_owned.cpu().numpy().astype(np.int64)
        num_ranks = self.rows_owned.shape[1]
        self.loads = np.zeros(num_ranks) if loads is None else np.array(loads, dtype=np.float64)
        """Per rank, the candidate rows of the tasks placed on it so far."""
        if self.loads.shape != (num_ranks,):
            raise ValueError(f"loads must hold one value per rank ({num_ranks}), got shape {self.loads.shape}")
        self.last_step = -1
        """The last step placed (steps are placed in increasing order)."""

    def ranks_of(self, workers: Sequence[Sequence[Task]]) -> list[int]:
        """Per schedule worker (its tasks of one step), the rank that runs it: a permutation maximising the rows
        read on their owner, then giving the costlier workers to the less loaded ranks (deterministic: every rank
        computes the same one, placing the same steps in the same order)."""
        num_ranks = self.rows_owned.shape[1]
        if len(workers) != num_ranks:
            raise ValueError(f"{len(workers)} workers for {num_ranks} ranks: the sharded mode runs one per rank")
        steps = {task.step for tasks in workers for task in tasks}
        if steps and (len(steps) > 1 or min(steps) <= self.last_step):
            raise ValueError(f"placing steps {sorted(steps)} after step {self.last_step}: one step at a time, in order")
        self.last_step = max(steps, default=self.last_step)
        score = np.zeros((num_ranks, num_ranks), dtype=np.int64)
        for worker, tasks in enumerate(workers):
            for task in tasks:
                score[worker] += self.rows_owned[task.view]
        cost = score.sum(axis=1).astype(np.float64)  # a worker's candidate rows, wherever they live
        _, ranks = linear_sum_assignment(score + balance_term(cost, self.loads), maximize=True)
        np.add.at(self.loads, ranks, cost)
        return [int(rank) for rank in ranks]


def balance_term(cost: np.ndarray, loads: np.ndarray) -> np.ndarray:
    """[workers, ranks]: the costlier the worker and the less loaded the rank, the larger (each worker's cost and
    each rank's room below the most loaded, scaled to [0, 1], multiplied), over W + 1 so that a whole assignment's
    terms sum below one row: by the rearrangement inequality the assignment that maximises it pairs the costliest
    worker with the least loaded rank, and it decides only between assignments with as many rows read locally."""
    spread = loads.max() - loads.min() if loads.size else 0.0
    room = (loads.max() - loads) / spread if spread > 0 else np.zeros_like(loads)
    scaled = cost / cost.max() if cost.size and cost.max() > 0 else np.zeros_like(cost)
    return np.outer(scaled, room) / (len(loads) + 1)


def by_rank(workers: Sequence[Sequence[Task]], ranks_of: Sequence[int]) -> list[list[Task]]:
    """The step's tasks per rank, given each worker's rank (a permutation)."""
    out: list[list[Task]] = [[] for _ in workers]
    for worker, rank in enumerate(ranks_of):
        out[rank] = list(workers[worker])
    return out
