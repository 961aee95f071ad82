"""Which rank of a sharded run runs which schedule worker's tasks: in each step, the rank that owns most of their
rows, so that most of a task's rows are read where they live and fewer cross the link.

The schedule fixes each step's views and their split into W workers (conflict-free, balanced); which rank runs
which worker is free, as long as the owners sum the gradients in worker order (the replicated barrier's order), so
the sharded model stays the barrier's bit for bit whatever the placement. The choice is an assignment problem per
step (maximise the rows read locally), solved from a table every rank holds alike: per training view, how many of
its candidate rows each rank owns, gathered when the shards are cut and re-cut (``drivers/sharded_loop.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from odin_nerfstudio.core.tasks import Task


class Placement:
    """Per step, the rank for each schedule worker (see the module).

    Args:
        rows_owned: int64 [V, W]: per training view (``Task.view``), its candidate rows each rank owns.
    """

    def __init__(self, rows_owned: Tensor) -> None:
        if rows_owned.dim() != 2:
            raise ValueError(f"rows_owned must be [views, ranks], got shape {tuple(rows_owned.shape)}")
        self.rows_owned = rows_owned.cpu().numpy().astype(np.int64)

    def ranks_of(self, workers: Sequence[Sequence[Task]]) -> list[int]:
        """Per schedule worker (its tasks of one step), the rank that runs it: a permutation maximising the rows
        read on their owner (deterministic: every rank computes the same one)."""
        num_ranks = self.rows_owned.shape[1]
        if len(workers) != num_ranks:
            raise ValueError(f"{len(workers)} workers for {num_ranks} ranks: the sharded mode runs one per rank")
        score = np.zeros((num_ranks, num_ranks), dtype=np.int64)
        for worker, tasks in enumerate(workers):
            for task in tasks:
                score[worker] += self.rows_owned[task.view]
        _, ranks = linear_sum_assignment(score, maximize=True)
        return [int(rank) for rank in ranks]


def by_rank(workers: Sequence[Sequence[Task]], ranks_of: Sequence[int]) -> list[list[Task]]:
    """The step's tasks per rank, given each worker's rank (a permutation)."""
    out: list[list[Task]] = [[] for _ in workers]
    for worker, rank in enumerate(ranks_of):
        out[rank] = list(workers[worker])
    return out

