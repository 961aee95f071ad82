"""What the runtime answers a task that asks to read, and what it remembers of a read.

``before_read`` answers a :class:`Read` (C(t) gathered into task-local leaves) or a :class:`Wait` (what to wait
for); a :class:`ReadRecord` is what validation later checks; a :class:`StaleRead` is throughput-first's record of
an admitted stale read. See ``docs/architecture.md`` for the life of a task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from odin_nerfstudio.core.conflicts import StepRows, union_sorted
from odin_nerfstudio.core.tasks import Task, TaskKey
from odin_nerfstudio.culling.candidates import CullRegion

RenderFn = Callable[[Task, dict[str, Tensor], torch.Generator], tuple[Tensor, dict[str, Any]]]
"""(task, gathered leaves [M, ...] per name, generator) -> (loss, info); info may hold the rasterizer's meta."""
VisibilityFn = Callable[[Task, dict[str, Tensor]], Tensor]
"""(task, parameter rows [M, ...] per name) -> bool [M]: the rows the rasterizer would see (radii > 0), each row
decided on its own (whatever other rows are passed with it). Given alone, the runtime passes every row (M = N,
detached views, never a copy) and keeps those outside C(t); see :class:`EscapeCheck` for the cheap form."""
DrawableFn = Callable[[Task], CullRegion]
"""task -> a region outside which the VisibilityFn it comes with reports no row visible (``CullRegion.drawable``
of the camera it projects with)."""


@dataclass(frozen=True)
class EscapeCheck:
    """A visibility function with a sound bound of what it can report: the escape check then costs O(|C(t)|).

    The runtime projects only the rows whose bounding sphere meets ``drawable(task)`` and that are outside C(t)
    (found with the culling index, gathered). Sound because ``visible`` reports a row visible only inside that
    region (for gsplat's projection, :meth:`~odin_nerfstudio.culling.candidates.CullRegion.drawable` proves it) and
    decides each row on its own, so the rows skipped are exactly rows it would report invisible.

    Attributes:
        visible: which of the given parameter rows the rasterizer would see for a task.
        drawable: per task, the region outside which ``visible`` reports nothing.
        reads: the parameters ``visible`` reads, the only ones gathered for it (a projection reads a Gaussian's
            geometry, not its colours); None: every parameter.
    """

    visible: VisibilityFn
    drawable: DrawableFn
    reads: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ReadRecord:
    """What a task read: its candidate set, the last published step then, and the stale writes it may miss.

    Attributes:
        candidate: C(t), sorted int64 [M].
        read_mark: the last published step when it read.
        admitted: per unpublished earlier step, the rows whose write by it the read may miss (throughput's
            admitted stale rows, sorted int64 [S] each); empty otherwise.
        early: rows of step ``read_mark + 1`` already published when it read (that step's first part, sorted
            int64 [P]), or None.
    """

    candidate: Tensor
    read_mark: int
    admitted: tuple[StepRows, ...] = ()
    early: Tensor | None = None

    @property
    def stale_rows(self) -> Tensor:
        """Rows read with an admitted stale value, sorted int64 [S]."""
        return union_sorted([a.rows for a in self.admitted], self.candidate.device)


@dataclass
class Read:
    """A task admitted to read: what it read (its :class:`ReadRecord`), its gathered leaves and random stream.

    Attributes:
        task: the task.
        record: C(t), the read mark and the admitted stale rows (``candidate``, ``read_mark`` and ``admitted``
            read through).
        leaves: per name, the gathered rows as leaves [M, ...] that require grad; emptied once the runtime has
            staged their gradients (the Shadow Graph frees them).
        generator: the task's random stream.
    """

    task: Task
    record: ReadRecord
    leaves: dict[str, Tensor]
    generator: torch.Generator

    @property
    def candidate(self) -> Tensor:
        """C(t), sorted int64 [M]."""
        return self.record.candidate

    @property
    def read_mark(self) -> int:
        """The last published step when the task read."""
        return self.record.read_mark

    @property
    def admitted(self) -> tuple[StepRows, ...]:
        """Per unpublished earlier step, the rows whose write by it the read may miss."""
        return self.record.admitted


@dataclass(frozen=True)
class Wait:
    """Why a task cannot read yet.

    Attributes:
        task: the task.
        reason: "raw" (conflicting rows), "ring" (its ring slot still holds step - K), "barrier" (the barrier
            and ddp modes: the previous step).
        step: the step whose publication ends the wait.
        rows: the conflicting primitives, sorted int64 [M] (empty unless "raw").
    """

    task: Task
    reason: str
    step: int
    rows: Tensor


@dataclass
class StaleRead:
    """One admitted stale read (throughput-first; HOGWILD reads every conflicting row so): task, rows read stale,
    the largest staleness and the fraction.

    ``kept`` becomes True when the task's update is exchanged with this read (validation did not re-run the task
    on fresh state): the stale read then reached the model.
    """

    key: TaskKey
    rows: int
    staleness: int
    fraction: float
    kept: bool = False
