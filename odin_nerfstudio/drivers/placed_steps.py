"""The sharded loop's side of placement (``runtime/placement.py``): which rank runs which schedule worker in each
step begun, and the time this rank spent on each step's tasks, which rides on the step's return to every rank so
that every rank's placement counts the same measurements."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from odin_nerfstudio.comm.all_to_all import side_of, with_side
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.core.timeline import StepTotals, Timeline
from odin_nerfstudio.runtime.placement import Placement, RankLoads, by_rank
from odin_nerfstudio.runtime.sharding import Rows, ShardCounters

SPENT = "spent"
"""The return's side table of the sender's render + backward nanoseconds of the step's tasks (one int64 row)."""


class PlacedSteps:
    """Per step begun and not yet published, the rank of each schedule worker: placed (:meth:`place`) or worker w
    on rank w; and, where the placement counts measured time, this rank's per step and every rank's as it arrives.

    Args:
        step_tasks: step -> every schedule worker's tasks of the step, in task order.
        timeline: this rank's timeline, whose render and backward spans are its tasks' time.
        counters: this rank's counters (``placed``).
    """

    def __init__(
        self, step_tasks: Callable[[int], Sequence[Sequence[Task]]], timeline: Timeline, counters: ShardCounters
    ) -> None:
        self.step_tasks, self.counters = step_tasks, counters
        self.placement: Placement | None = None
        self.ranks_of: dict[int, list[int]] = {}
        """Per step begun and not yet published, each schedule worker's rank."""
        self._spent = StepTotals(timeline)

    def place(self, rows_owned: Tensor, lag: int | None) -> None:
        """Place the steps to come by ``rows_owned`` ([V, W], every rank's alike), the loads so far carried on
        (``lag``: see :class:`RankLoads`; None: by candidate rows); no step may be begun."""
        if self.ranks_of:
            raise RuntimeError(f"placement with steps {sorted(self.ranks_of)} begun")
        loads = RankLoads(rows_owned.shape[1], lag) if self.placement is None else self.placement.loads
        self.placement = Placement(rows_owned, loads)

    @property
    def timed(self) -> bool:
        """Whether the placement counts the ranks' measured time (which then rides on each step's return)."""
        return self.placement is not None and self.placement.loads.lag is not None

    def tasks(self, step: int) -> list[list[Task]]:
        """Step ``step``'s tasks per rank (placed the first time the step is asked for)."""
        workers = self.step_tasks(step)
        if self.placement is None:
            return [list(tasks) for tasks in workers]
        if step not in self.ranks_of:
            self.ranks_of[step] = self.placement.ranks_of(workers)
            self.counters.placed += int(self.ranks_of[step] != list(range(len(workers))))
        return by_rank(workers, self.ranks_of[step])

    def worker_order(self, step: int, parts: Sequence[Rows]) -> list[Rows]:
        """Per-rank ``parts`` of ``step`` re-ordered by the schedule worker each rank ran (the barrier's sum order)."""
        ranks = self.ranks_of.get(step)
        return list(parts) if ranks is None or not parts else [parts[rank] for rank in ranks]

    def worker(self, step: int, rank: int) -> int:
        """The schedule worker whose tasks ``rank`` runs in ``step``."""
        ranks = self.ranks_of.get(step)
        return rank if ranks is None else ranks.index(rank)

    def with_spent(self, step: int, returns: list[Rows], device: torch.device) -> list[Rows]:
        """``returns`` (step ``step``'s, one piece per owner) with this rank's time on the step's tasks riding on
        each, where the placement counts it (every task of the step done, none rendering meanwhile)."""
        if not self.timed:
            return returns
        spent = {"ns": torch.tensor([self._spent.take(step)], dtype=torch.int64, device=device)}
        return [with_side(piece, SPENT, spent) for piece in returns]

    def arrived(self, step: int, parts: Sequence[Rows]) -> None:
        """Step ``step``'s return arrived (``parts``: one piece from each rank): every rank's time, for the
        placements to come; the step is done here."""
        if self.timed:
            spent = torch.cat([side_of(part, SPENT)["ns"] for part in parts])
            self.placement.loads.measured(step, spent.cpu().numpy())  # type: ignore[union-attr]
        self.ranks_of.pop(step, None)
