"""Primitive-level conflict checks (RAW, WAW, WAR) between a task or publication and unpublished work.

Odin (arXiv 2607.19893, Sec. "three hooks") synchronizes on the primitives two pieces of work share:

- RAW: a row in the reader's candidate set has a write from an earlier, unpublished step; the reader must not
  read the old value.
- WAW: a step writes a row whose earlier write (from an earlier step) is still staged; publications must apply
  in step order.
- WAR: a publication would overwrite a row that a task of the same or an earlier step, still running, has read.

Row sets are sorted unique int64 tensors or bool masks [N]. Every check is vectorized over primitives; the only
Python loop runs over the (at most ring-size) unpublished steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from odin_nerfstudio.core.tasks import NO_STEP


@dataclass(frozen=True)
class StepRows:
    """The rows one step writes (or one task reads), sorted int64 [M], tagged with that step."""

    step: int
    rows: Tensor


@dataclass(frozen=True)
class Conflicts:
    """Which rows conflict and with which steps.

    Attributes:
        rows: sorted conflicting rows, int64 [M].
        last_step: per row, the latest conflicting step, int64 [M] (a reader waits for its publication,
            which implies every earlier one since publications run in step order).
        first_step: per row, the earliest conflicting step, int64 [M] (a stale read misses every write from
            it on: its staleness is ``reader_step - first_step``).
    """

    rows: Tensor
    last_step: Tensor
    first_step: Tensor

    @property
    def any(self) -> bool:
        """Whether any row conflicts."""
        return self.rows.numel() > 0

    @property
    def wait_step(self) -> int:
        """The publication to wait for so that no conflict remains (``NO_STEP`` if none)."""
        return int(self.last_step.max()) if self.any else NO_STEP


def as_rows(rows_or_mask: Tensor) -> Tensor:
    """Sorted unique int64 rows [M] from a bool mask [N] or an int64 row tensor."""
    if rows_or_mask.dtype == torch.bool:
        return torch.nonzero(rows_or_mask).flatten()
    return torch.unique(rows_or_mask.to(torch.int64))


def _sorted_rows(rows_or_mask: Tensor) -> Tensor:
    """Rows [M] of a bool mask [N], or an int64 row tensor as is: the checks below take sorted unique rows
    (their contract), so they never pay for a sort."""
    if rows_or_mask.dtype == torch.bool:
        return torch.nonzero(rows_or_mask).flatten()
    return rows_or_mask


def union_sorted(parts: Sequence[Tensor], device: torch.device | str = "cpu") -> Tensor:
    """Sorted union of sorted unique int64 row tensors, [M]: a single part is returned as is, more are
    concatenated, sorted and deduplicated (``unique_consecutive``, cheaper than ``unique`` on CPU)."""
    if not parts:
        return torch.empty(0, dtype=torch.int64, device=device)
    if len(parts) == 1:
        return parts[0]
    return torch.unique_consecutive(torch.sort(torch.cat(list(parts))).values)


def isin_sorted(rows: Tensor, sorted_set: Tensor) -> Tensor:
    """Membership of each of ``rows`` [M] in the sorted int64 tensor ``sorted_set`` [S], bool [M]."""
    if sorted_set.numel() == 0:
        return torch.zeros_like(rows, dtype=torch.bool)
    position = torch.searchsorted(sorted_set, rows).clamp(max=sorted_set.numel() - 1)
    return sorted_set[position] == rows


def _against(rows: Tensor, others: Sequence[StepRows]) -> Conflicts:
    """Rows of ``rows`` found in any of ``others``, with the latest and earliest such step."""
    last = torch.full_like(rows, NO_STEP)
    first = torch.full_like(rows, NO_STEP)
    for other in sorted(others, key=lambda o: o.step):
        hit = isin_sorted(rows, _sorted_rows(other.rows))
        last = torch.where(hit, other.step, last)
        first = torch.where(hit & (first == NO_STEP), other.step, first)
    hit = last != NO_STEP
    return Conflicts(rows=rows[hit], last_step=last[hit], first_step=first[hit])


def raw(candidate: Tensor, reader_step: int, unpublished_writes: Sequence[StepRows]) -> Conflicts:
    """Read-after-write: rows of a reader's candidate set written by an earlier, unpublished step.

    Args:
        candidate: the reader's candidate set C(t), sorted int64 [M] or bool [N].
        reader_step: the reader's step s.
        unpublished_writes: per unpublished step, the rows it declared or staged.

    Returns:
        The rows of C(t) with a write from a step < s that is not published.
    """
    earlier = [w for w in unpublished_writes if w.step < reader_step]
    return _against(_sorted_rows(candidate), earlier)


def waw(writes: Tensor, writer_step: int, unpublished_writes: Sequence[StepRows]) -> Conflicts:
    """Write-after-write: rows a step writes whose write from an earlier step is still staged.

    Args:
        writes: the rows step s publishes, sorted int64 [M] or bool [N].
        writer_step: the writing step s.
        unpublished_writes: per unpublished step, its staged rows.

    Returns:
        The rows whose earlier write must be published before step s's.
    """
    earlier = [w for w in unpublished_writes if w.step < writer_step]
    return _against(_sorted_rows(writes), earlier)


def war(writes: Tensor, writer_step: int, running_reads: Sequence[StepRows]) -> Conflicts:
    """Write-after-read: rows a publication overwrites that a still-running task of a step <= s has read.

    Args:
        writes: the rows the publication of step s writes, sorted int64 [M] or bool [N].
        writer_step: the publishing step s.
        running_reads: per running task, its step and the rows it read.

    Returns:
        The rows the publication must not overwrite yet, with the readers' steps.
    """
    readers = [r for r in running_reads if r.step <= writer_step]
    return _against(_sorted_rows(writes), readers)
