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
gives the costlier workers (more candidate rows, which a task's time grows with) to the ranks that have spent less
so far. A barrier's step waits for its slowest rank whatever the placement, but in a mode whose ranks run ahead of
each other (quality-first) a rank handed the costlier views step after step sets the run's pace. What a rank has
spent (:class:`RankLoads`) is measured where every rank knows it: each rank's render + backward time of a step rides
on the step's return to every rank, so that a task's variation, which no prediction knows, is made up for in the
steps after; for the steps whose return has not yet counted, their candidate rows at the seconds a row has cost so
far. On a simulated 1,024-view city at 64 workers (BENCHMARKS.md, bench_simulate_sharded and its hand notes on
placement) the slowest rank computed 1.044 times the mean rank's placed by candidate rows and 1.025 by measured time
(medians of three seeds), quality-first's views/s within the seeds' spread either way; with rank 0 1.3 times slower
than the others, 1.262 and 1.154, and quality-first 264.0 and 288.8 views/s. Locality still comes first exactly: the
balance term of a whole assignment is less than one row, so as many rows cross the link as by locality alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from odin_nerfstudio.core.tasks import Task


class RankLoads:
    """Per rank, what the tasks placed on it have cost, the same on every rank (see the module): the render + backward
    nanoseconds every rank measured in the steps at least ``lag`` before the one being placed, and the candidate rows
    of the steps placed since, at the nanoseconds a candidate row has cost in the measured steps (before any: rows).

    Args:
        num_ranks: W.
        lag: the placement of step s counts the measurements of steps s - ``lag`` and before, never a later one, even
            where it has arrived: every rank then counts the same ones whatever it has heard since. The sharded loop
            passes K, since it places step s only after it published step s - K, whose return brought every rank's
            measurement of it (``drivers/sharded_loop.py``); None: by candidate rows alone (nothing is measured).
    """

    def __init__(self, num_ranks: int, lag: int | None) -> None:
        if lag is not None and lag < 1:
            raise ValueError(f"a placement counts the measurements of earlier steps: lag >= 1, got {lag}")
        self.lag = lag
        self.rows = np.zeros(num_ranks)
        """Per rank, the candidate rows of every task placed on it."""
        self.measured_ns = np.zeros(num_ranks)
        """Per rank, the nanoseconds its tasks measured in the steps counted (through :attr:`counted_through`)."""
        self.counted_through = -1
        self._counted_rows = 0.0  # the candidate rows of the steps counted, all ranks
        self._placed: dict[int, np.ndarray] = {}  # per step placed and not counted, the rows per rank
        self._arrived: dict[int, np.ndarray] = {}  # per step measured and not counted, the nanoseconds per rank

    def placed(self, step: int, rows: np.ndarray) -> None:
        """Step ``step`` placed ``rows`` candidate rows on each rank (kept until counted, where time is counted)."""
        self.rows += rows
        if self.lag is not None:
            self._placed[step] = rows

    def measured(self, step: int, nanoseconds: np.ndarray) -> None:
        """Every rank's render + backward nanoseconds of its tasks of step ``step``, as its return brought them."""
        if step in self._placed:
            self._arrived[step] = np.asarray(nanoseconds, dtype=np.float64)

    def before(self, step: int) -> np.ndarray:
        """Per rank, its load when step ``step`` is placed: the steps ``lag`` before it and earlier by their
        measurements (each must have arrived), the later ones by their candidate rows."""
        if self.lag is None:
            return self.rows
        for earlier in sorted(s for s in self._placed if s <= step - self.lag):
            if earlier not in self._arrived:
                raise RuntimeError(
                    f"placing step {step}: every rank's measured time of step {earlier} has not arrived (it rides on "
                    f"that step's return, which comes before step {step} is placed)"
                )
            self.measured_ns += self._arrived.pop(earlier)
            self._counted_rows += float(self._placed.pop(earlier).sum())
            self.counted_through = earlier
        spent = float(self.measured_ns.sum())
        per_row = spent / self._counted_rows if spent > 0 and self._counted_rows > 0 else 1.0
        pending = sum(self._placed.values(), np.zeros_like(self.rows))
        return self.measured_ns + per_row * pending


class Placement:
    """Per step, the rank for each schedule worker (see the module). Steps are placed in order, the same on every
    rank, so that every rank's loads, and with them its placements, are the same.

    Args:
        rows_owned: int64 [V, W]: per training view (``Task.view``), its candidate rows each rank owns.
        loads: the ranks' loads so far (a placement made again after the rows moved carries them on), or None: by
            candidate rows alone, none yet.
    """

    def __init__(self, rows_owned: Tensor, loads: RankLoads | None = None) -> None:
        if rows_owned.dim() != 2:
            raise ValueError(f"rows_owned must be [views, ranks], got shape {tuple(rows_owned.shape)}")
        self.rows_owned = rows_owned.cpu().numpy().astype(np.int64)
        num_ranks = self.rows_owned.shape[1]
        self.loads = RankLoads(num_ranks, None) if loads is None else loads
        if self.loads.rows.shape != (num_ranks,):
            raise ValueError(f"loads must hold one value per rank ({num_ranks}), got shape {self.loads.rows.shape}")
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
        if not steps:
            return list(range(num_ranks))
        step = self.last_step = steps.pop()
        score = np.zeros((num_ranks, num_ranks), dtype=np.int64)
        for worker, tasks in enumerate(workers):
            for task in tasks:
                score[worker] += self.rows_owned[task.view]
        cost = score.sum(axis=1).astype(np.float64)  # a worker's candidate rows, wherever they live
        _, ranks = linear_sum_assignment(score + balance_term(cost, self.loads.before(step)), maximize=True)
        rows = np.zeros(num_ranks)
        rows[ranks] = cost
        self.loads.placed(step, rows)
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
