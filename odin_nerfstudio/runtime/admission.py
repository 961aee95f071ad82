"""Admission: one small policy class per mode, deciding whether a task with pending conflicts may read.

The runtime checks what every mode shares (the ring has a slot for the task's step; C(t) against the unpublished
writes, RAW) and asks its :class:`AdmissionPolicy` the rest: whether the task may read at all yet (:meth:`gate`),
whether a read with conflicts may go ahead stale (:meth:`admit_stale`), and whether a task that failed
validation is re-run (:meth:`reruns`). A control is one more subclass registered in :data:`POLICIES` (HOGWILD
and the DDP-style dense barrier are). See ``docs/architecture.md``.

- :class:`BarrierPolicy` ("barrier"), the reference: a task of step s reads only after step s - 1 is published (a
  global wait per step). theta_{s+1}[p] = Adam(theta_s[p], sum_t g_t[p]) for p in the union of the active sets,
  the sum in task order: each worker sums its tasks in task order, the workers' sums are added in worker order.
- :class:`QualityPolicy` ("quality"): a task waits exactly for the publications of the rows in C(t) with a
  pending write from an earlier step, nothing else; validation re-runs any failed task on the synchronous state,
  so the result is bit-identical to "barrier" for any interleaving.
- :class:`ThroughputPolicy` ("throughput"): as quality, but admits a stale read when |C n pending| / |C| <=
  stale_fraction, the producers' gradient magnitude on each of those rows < stale_grad_ratio x the mean over the
  producer's staged active set, and no row is more than max_staleness steps stale; only "stale" validation
  failures (a write unknown at admission) are re-run, so no final read exceeds the bounds.

The paper's controls, each one mode of the same code:

- :class:`DenseBarrierPolicy` ("ddp"): what a ``DistributedDataParallel`` trainer does: a global wait per step,
  every task reads every row (no culling), its update is dense (every row, zeros where it has no gradient) and
  Adam steps every row (moments decay and momentum moves rows without a gradient, as ``torch.optim.Adam`` does).
- "barrier" itself is "locality without overlap" (the RLG schedule behind the barrier); "overlap without locality"
  is "quality" on ``--pipeline.datamanager.schedule-order random``.
- :class:`HogwildPolicy` ("hogwild"): no synchronization of reads: every conflict is read stale, whatever its
  size or age (within the ring), nothing is validated or re-run; publications still apply each step's sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import torch

from odin_nerfstudio.core.conflicts import Conflicts, StepRows, isin_sorted, union_sorted
from odin_nerfstudio.core.tasks import Task, TaskKey
from odin_nerfstudio.runtime.reads import StaleRead
from odin_nerfstudio.runtime.shadow import RingSlot

if TYPE_CHECKING:
    from odin_nerfstudio.runtime.config import OdinRuntimeConfig


class AdmissionPolicy:
    """The reads a mode admits; the base class waits on every conflict and re-runs every failed task."""

    mode: ClassVar[str]
    reads_every_row: ClassVar[bool] = False
    """Whether a task reads (and its update covers) every row of the model instead of its culled C(t)."""
    validates: ClassVar[bool] = True
    """Whether a task's read is validated against the synchronous state before its update is exchanged."""
    publishes_first: ClassVar[bool] = True
    """Whether a step's exchange asks for the rows the next step's reads need first (priority publication): for
    modes whose reads overlap an unpublished step."""
    commits_early: ClassVar[bool] = False
    """Whether a worker's step may be committed (validated, exchanged) once the step before is published in its
    first part, when its reads are surely valid whatever the rest (quality-first: exact either way)."""

    @classmethod
    def of(cls, config: OdinRuntimeConfig) -> AdmissionPolicy:
        """The policy with the thresholds of ``config``."""
        return cls()

    def gate(self, task: Task, published_through: int, ring_slots: int) -> tuple[str, int] | None:
        """A reason and the step to wait for if ``task`` may not read yet whatever its candidate set, else None:
        in every mode "ring" while its ring slot still holds step - K."""
        if published_through < task.step - ring_slots:
            return ("ring", task.step - ring_slots)
        return None

    def admit_stale(
        self,
        task: Task,
        candidate: torch.Tensor,
        conflicts: Conflicts,
        open_slots: Sequence[RingSlot],
        params: dict,
        predicted: Sequence[StepRows] = (),
    ) -> tuple[tuple[StepRows, ...], StaleRead] | None:
        """Whether a read with RAW ``conflicts`` may go ahead without their publications: None (wait), or per
        pending step the rows whose write the read may miss, and the :class:`StaleRead` to count. ``predicted``:
        the pending writes of tasks not staged here (other ranks'), known by prediction only."""
        return None

    def reruns(self, failures: Sequence[str]) -> bool:
        """Whether a task whose validation found ``failures`` is re-run on the synchronous state (never in a mode
        that does not validate)."""
        return self.validates and bool(failures)

    def settled(self, key: TaskKey, rerun: bool) -> bool:
        """Task ``key`` was validated: re-run, or exchanged with the read it made; returns whether a stale read it
        was admitted with thereby reached the model."""
        return False


class BarrierPolicy(AdmissionPolicy):
    """The reference: a global wait per step (step s reads once step s - 1 is published)."""

    mode = "barrier"
    publishes_first = False

    def gate(self, task: Task, published_through: int, ring_slots: int) -> tuple[str, int] | None:
        """The ring, then "barrier" until step - 1 is published."""
        ring = super().gate(task, published_through, ring_slots)
        if ring is None and published_through < task.step - 1:
            return ("barrier", task.step - 1)
        return ring


class QualityPolicy(AdmissionPolicy):
    """Quality-first: wait for exactly the conflicting rows' publications; exact, re-run every failed task."""

    mode = "quality"
    commits_early = True


class ThroughputPolicy(AdmissionPolicy):
    """Throughput-first: admit bounded stale reads (the paper's t = 0.2, K = 4).

    Args:
        stale_fraction: t, the largest admitted |C n pending| / |C|.
        stale_grad_ratio: the admitted producer gradient magnitude, as a fraction of its active-set mean.
        max_staleness: the most steps a stale row may lag behind.
    """

    mode = "throughput"

    def __init__(self, stale_fraction: float, stale_grad_ratio: float, max_staleness: int) -> None:
        self.stale_fraction = stale_fraction
        self.stale_grad_ratio = stale_grad_ratio
        self.max_staleness = max_staleness
        self._open: dict[TaskKey, StaleRead] = {}

    @classmethod
    def of(cls, config: OdinRuntimeConfig) -> ThroughputPolicy:
        return cls(config.stale_fraction, config.stale_grad_ratio, config.max_staleness)

    def admit_stale(
        self,
        task: Task,
        candidate: torch.Tensor,
        conflicts: Conflicts,
        open_slots: Sequence[RingSlot],
        params: dict,
        predicted: Sequence[StepRows] = (),
    ) -> tuple[tuple[StepRows, ...], StaleRead] | None:
        """Admitted when |C n pending| / |C| <= stale_fraction, no row lags more than max_staleness steps, and on
        every pending step the conflicting rows are staged (not still being computed) with a gradient magnitude
        below stale_grad_ratio x the mean magnitude over that step's staged active rows. A row another rank's task
        is predicted to write waits: its producer's gradient is not known here (admitting it would only end in a
        "stale" validation failure and a re-run)."""
        fraction = conflicts.rows.numel() / max(candidate.numel(), 1)
        staleness = int((task.step - conflicts.first_step).max())
        if fraction > self.stale_fraction or staleness > self.max_staleness:
            return None
        if predicted:
            remote = union_sorted([writes.rows for writes in predicted], candidate.device)
            if bool(isin_sorted(conflicts.rows, remote).any()):
                return None
        admitted = []
        for slot in open_slots:
            if slot.step >= task.step:
                break
            rows = conflicts.rows[isin_sorted(conflicts.rows, slot.writes().rows)]
            if rows.numel() == 0:
                continue
            producer = slot.staged_update(params)
            if not bool(isin_sorted(rows, producer.rows).all()):
                return None
            running = [c for key, c in slot.candidates.items() if key not in slot.staged]
            if running and bool(isin_sorted(rows, union_sorted(running, candidate.device)).any()):
                return None
            magnitude = producer.row_magnitude()
            ours = magnitude[torch.searchsorted(producer.rows, rows)]
            if not bool((ours < self.stale_grad_ratio * magnitude.mean()).all()):
                return None
            admitted.append(StepRows(slot.step, rows))
        stale = StaleRead(task.key, conflicts.rows.numel(), staleness, fraction)
        self._open[task.key] = stale
        return tuple(admitted), stale

    def reruns(self, failures: Sequence[str]) -> bool:
        """Only a "stale" failure (a write unknown at admission) is re-run; "candidate" and "escape" are counted."""
        return "stale" in failures

    def settled(self, key: TaskKey, rerun: bool) -> bool:
        """The task's stale read reached the model unless it was re-run."""
        stale = self._open.pop(key, None)
        if stale is not None and not rerun:
            stale.kept = True
            return True
        return False


class DenseBarrierPolicy(BarrierPolicy):
    """The DDP-style control: the barrier, every row read, a dense update and a dense Adam step (no validation:
    with every row read there is nothing to escape, and the barrier leaves nothing stale)."""

    mode = "ddp"
    reads_every_row = True
    validates = False


class HogwildPolicy(AdmissionPolicy):
    """The HOGWILD control: reads never wait for a publication (only for a free ring slot); every conflicting row
    is read stale and nothing is validated or re-run."""

    mode = "hogwild"
    validates = False
    publishes_first = False

    def admit_stale(
        self,
        task: Task,
        candidate: torch.Tensor,
        conflicts: Conflicts,
        open_slots: Sequence[RingSlot],
        params: dict,
        predicted: Sequence[StepRows] = (),
    ) -> tuple[tuple[StepRows, ...], StaleRead] | None:
        """Always: every conflicting row, for every pending step."""
        first = int(conflicts.first_step.min())
        fraction = conflicts.rows.numel() / max(candidate.numel(), 1)
        stale = StaleRead(task.key, conflicts.rows.numel(), task.step - first, fraction, kept=True)
        return tuple(StepRows(step, conflicts.rows) for step in range(first, task.step)), stale


POLICIES: dict[str, type[AdmissionPolicy]] = {
    policy.mode: policy
    for policy in (BarrierPolicy, QualityPolicy, ThroughputPolicy, DenseBarrierPolicy, HogwildPolicy)
}
"""Every mode's policy class, by the mode's name (``OdinRuntimeConfig.mode``)."""
