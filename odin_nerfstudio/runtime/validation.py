"""Validation: a task's read checked against the synchronous state before its update is exchanged.

Reads are optimistic about writes that were unknown when they read (an earlier task that had not read yet, or a
task of another rank). Once every earlier step is published, each task is checked against the rows of the last
K publications (kept sparse; a read lags at most K - 1 steps behind, by the ring):

- "stale": a row it read was written since, and the write was not an admitted stale read (throughput);
- "candidate": a row written since, outside C(t), moved into the task's culling region (C(t) would differ);
- "escape": the rasterizer would see rows outside C(t) (A(t) escapes C(t)); checked when a visibility function
  is given. The re-run adds the escaped rows to the task's candidate set.

The escape check is a seam: :attr:`Validator.find_escapes` is any ``(task, C(t)) -> rows`` callable, built from
the runtime's visibility function by :func:`escape_finder`; tests may wrap it. See ``docs/architecture.md``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from odin_nerfstudio.core.conflicts import isin_sorted, union_sorted
from odin_nerfstudio.core.tasks import Task, TaskKey
from odin_nerfstudio.kernels import ops
from odin_nerfstudio.runtime.culling_index import CullingIndex, Reach
from odin_nerfstudio.runtime.publication import EarlyRows
from odin_nerfstudio.runtime.reads import DrawableFn, EscapeCheck, ReadRecord, VisibilityFn

EscapeFinder = Callable[[Task, Tensor], Tensor]
"""(task, C(t) sorted int64 [M]) -> the rows outside C(t) the rasterizer would see for the task, sorted int64 [E]."""


def escape_finder(
    visibility_fn: VisibilityFn | EscapeCheck, index: CullingIndex, params: dict[str, Tensor]
) -> EscapeFinder:
    """The escape check of a visibility function.

    With an :class:`EscapeCheck`, only the rows of its drawable region outside C(t) are gathered and asked about,
    found with the culling index in O(|C(t)|); with a plain VisibilityFn, every row is (views, no copy): O(N).
    """

    def escaped(task: Task, candidate: Tensor) -> Tensor:
        if isinstance(visibility_fn, EscapeCheck):
            rows = ops.cull_rows(index.bounds(), visibility_fn.drawable(task))
            return visible_rows(visibility_fn, task, rows[~isin_sorted(rows, candidate)], params)
        every_row = {name: p.detach() for name, p in params.items()}
        visible = torch.nonzero(visibility_fn(task, every_row)).flatten()
        return visible[~isin_sorted(visible, candidate)]

    return escaped


def visible_rows(check: EscapeCheck, task: Task, rows: Tensor, params: dict[str, Tensor]) -> Tensor:
    """Which of ``rows`` (sorted int64 [M]) the rasterizer would draw for ``task`` on the current state."""
    if rows.numel() == 0:
        return rows
    names = params if check.reads is None else check.reads
    gathered = {name: params[name].detach().index_select(0, rows) for name in names}
    return rows[check.visible(task, gathered)]


def drawn_finder(check: EscapeCheck, index: CullingIndex, params: dict[str, Tensor]) -> Callable[[Task], Tensor]:
    """The rows the rasterizer would draw for a task on the current state (a superset of its active set A(t) if
    it rendered now), found in O(|C(t)|) through the drawable region: the tightest prediction of a task's writes."""
    return lambda task: visible_rows(check, task, ops.cull_rows(index.bounds(), check.drawable(task)), params)


class ReadLog:
    """The tasks that have read and what they read, until their step is published.

    Attributes:
        tasks: per task key, the task.
        reads: per task key, its latest read.
        final_reads: per task key, the read its exchanged update came from (kept with ``record_reads`` only).
    """

    def __init__(self, record_reads: bool) -> None:
        self.record_reads = record_reads
        self.tasks: dict[TaskKey, Task] = {}
        self.reads: dict[TaskKey, ReadRecord] = {}
        self.final_reads: dict[TaskKey, ReadRecord] = {}

    def add(self, task: Task, record: ReadRecord) -> None:
        """``task`` read ``record`` (a re-run replaces its first read)."""
        self.tasks[task.key] = task
        self.reads[task.key] = record

    def final(self, key: TaskKey) -> None:
        """Task ``key``'s read is the one its update is exchanged with."""
        if self.record_reads:
            self.final_reads[key] = self.reads[key]

    def forget(self, key: TaskKey) -> None:
        """Task ``key``'s step is published."""
        self.reads.pop(key, None)
        self.tasks.pop(key, None)


class Validator:
    """Checks reads against the recent publications, the culling index and the escape check.

    Args:
        ring_slots: K, how many recent publications to keep.
        index: the culling index (candidate regions of the current state).
        find_escapes: the escape check, or None to skip it.
    """

    def __init__(
        self,
        ring_slots: int,
        index: CullingIndex,
        find_escapes: EscapeFinder | None,
        drawable: DrawableFn | None = None,
    ) -> None:
        self.ring_slots = ring_slots
        self.index = index
        self.find_escapes = find_escapes
        self.drawable = drawable
        self._recent: dict[int, Tensor] = {}

    def published(self, step: int, rows: Tensor) -> None:
        """Step ``step`` wrote ``rows`` (sorted int64 [R]); the publication of step - K is forgotten."""
        self._recent[step] = rows
        self._recent.pop(step - self.ring_slots, None)

    def forget(self) -> None:
        """Drop the recent publications (a structural change renamed the rows; after a drain no read needs them)."""
        self._recent.clear()

    def surely_valid(self, task: Task, record: ReadRecord, step: int, early: EarlyRows, reach: Reach) -> bool:
        """Whether a read is valid before step ``step`` (the one before the task's) is wholly published: only its
        first part is (``early``), the rest's rows are known (``early.pending``) but not their new values.

        True only if every check passes whatever the rest's values: no row the read missed (of the earlier steps,
        of the first part unless it read after it, of the rest), no written row outside C(t) in C(t)'s region (the
        published ones where they are now, the rest's anywhere within ``reach`` of where they are), no escape on
        the current state, and none of the rest's rows within reach of the rasterizer's drawable region. False
        means "not sure yet" as well as "invalid": the caller validates again once the step is published.
        """
        if record.admitted or (self.find_escapes is not None and self.drawable is None):
            return False
        candidate, outside = record.candidate, []
        written = [rows for _, rows in self._written_since(record, step)]
        read_after_first = record.read_mark == step - 1 and record.early is not None  # its early rows are step's
        written.append(early.published[:0] if read_after_first else early.published)
        for rows in written:
            read = isin_sorted(rows, candidate)
            if bool(read.any()):
                return False
            outside.append(rows)
        if bool(isin_sorted(early.pending, candidate).any()):
            return False
        moved = union_sorted(outside, candidate.device)
        if moved.numel() and self.index.any_meets(task, moved):
            return False
        if early.pending.numel():
            if self.index.any_meets(task, early.pending, reach):
                return False
            if self.drawable is not None and self.index.any_meets(task, early.pending, reach, self.drawable(task)):
                return False
        return self.find_escapes is None or self.find_escapes(task, candidate).numel() == 0

    def _written_since(self, record: ReadRecord, before: int) -> list[tuple[int, Tensor]]:
        """Per published step after the read's mark and before ``before``, the rows it wrote that the read did not
        see (a first part published before the read was seen)."""
        written = []
        for step in range(record.read_mark + 1, before):
            rows = self._recent[step]
            if step == record.read_mark + 1 and record.early is not None:
                rows = rows[~isin_sorted(rows, record.early)]
            written.append((step, rows))
        return written

    def validate(self, task: Task, record: ReadRecord) -> tuple[list[str], Tensor]:
        """Check a task's read against the synchronous state (all earlier steps published).

        Returns:
            The failure kinds ("stale", "candidate", "escape"; empty if valid), and the rows outside C(t) the
            rasterizer would see (int64 [E], empty without an escape check), which a re-run adds to C(t).
        """
        admitted = {a.step: a.rows for a in record.admitted}
        written = self._written_since(record, task.step)
        stale, moved = self.index.validate_read(task, record.candidate, written, admitted)
        failures = ["stale"] * stale + ["candidate"] * moved
        device = record.candidate.device
        escaped = torch.empty(0, dtype=torch.int64, device=device)
        if self.find_escapes is not None:
            escaped = self.find_escapes(task, record.candidate)
        if escaped.numel():
            failures.append("escape")
        return failures, escaped
