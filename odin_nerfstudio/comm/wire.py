"""The distributed exchange's wire format: what each rank's messages hold and how they are packed and read back.

Why apart: the transport (``comm/distributed.py``) only sequences collectives; the layout of the header, the int64
message (rows, int statistics, entry counts, asked rows as runs) and the statistics' values is one concern, shared
with the byte model (``comm/exchange_choice.py``) and the first part's byte counts (``comm/inprocess.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from odin_nerfstudio.core.sparse import SparseUpdate, tensor_bytes

INDEX_BYTES = 8
"""Bytes of a row index (int64), as every int64 field of the messages."""


def runs_of(rows: Tensor) -> Tensor:
    """Sorted unique rows as their runs of consecutive rows, [start_0, end_0, start_1, end_1, ...] int64 [2 R]
    (ends exclusive): how asked rows travel (in the model's Z-order a view's candidate set is a few runs)."""
    if rows.numel() == 0:
        return rows
    breaks = torch.nonzero(rows[1:] != rows[:-1] + 1).flatten() + 1
    starts = torch.cat([rows[:1], rows[breaks]])
    ends = torch.cat([rows[breaks - 1] + 1, rows[-1:] + 1])
    return torch.stack([starts, ends], dim=1).flatten()


def rows_of_runs(runs: Tensor) -> Tensor:
    """The sorted rows of :func:`runs_of`'s runs."""
    if runs.numel() == 0:
        return runs
    starts, ends = runs.view(-1, 2).unbind(1)
    lengths = ends - starts
    shift = torch.repeat_interleave(starts - (torch.cumsum(lengths, 0) - lengths), lengths)
    return torch.arange(int(lengths.sum()), dtype=runs.dtype, device=runs.device) + shift


def asked_bytes(first: Tensor | None) -> int:
    """Bytes the rows a worker asks for first take in its message (as runs)."""
    return 0 if first is None else tensor_bytes(runs_of(first))


def row_bytes(template: dict[str, Tensor]) -> int:
    """Bytes of one packed gradient row (every parameter's trailing shape)."""
    return sum(math.prod(ref.shape[1:]) * ref.element_size() for ref in template.values())


def first_bytes(
    rows: Sequence[Tensor], asked_nbytes: Sequence[int], counts: Sequence[int], template: dict[str, Tensor]
) -> tuple[int, ...]:
    """Per worker, its message's bytes up to and with the first part: its rows, its asked rows (``asked_nbytes``)
    and its ``counts`` gradient rows of P."""
    width = row_bytes(template)
    return tuple(
        tensor_bytes(r) + asked + width * count for r, asked, count in zip(rows, asked_nbytes, counts, strict=True)
    )


@dataclass(frozen=True)
class StatsLayout:
    """How the tasks' statistics travel: their int64 names (with the indices) and their value names (one float
    dtype, side by side in one message), from the render adapter's ``stats_schema``.

    Every statistic of a task is 1-D with one entry per visible (camera, row) pair ([M_t], M_t the task's entries).
    """

    index_names: tuple[str, ...] = ()
    value_names: tuple[str, ...] = ()
    value_dtype: torch.dtype = torch.float32

    @classmethod
    def of(cls, schema: dict[str, torch.dtype] | None) -> StatsLayout:
        """The layout of a ``stats_schema`` (name -> dtype); empty for None (no statistics)."""
        schema = schema or {}
        value_dtypes = {dtype for dtype in schema.values() if dtype != torch.int64}
        if len(value_dtypes) > 1:
            raise ValueError(f"the statistics' values must share one dtype, got {value_dtypes}")
        return cls(
            index_names=tuple(name for name, dtype in schema.items() if dtype == torch.int64),
            value_names=tuple(name for name, dtype in schema.items() if dtype != torch.int64),
            value_dtype=value_dtypes.pop() if value_dtypes else torch.float32,
        )


@dataclass(frozen=True)
class Sizes:
    """What one rank sends in a step: sparse rows, statistics entries (all its tasks), tasks with statistics, its
    span (its largest row + 1, 0 without rows: the dense exchange covers rows [0, the largest span)), the rows it
    asks for first and whether it asks (1) or not (0)."""

    rows: int
    entries: int
    tasks: int
    span: int
    asked: int = 0
    asks: int = 0


def _entries(stats: dict[str, Tensor]) -> int:
    """M_t, the entries of one task's statistics."""
    return next(iter(stats.values())).shape[0]


def header_of(update: SparseUpdate, first: Tensor | None, num_params: int, device: torch.device) -> Tensor:
    """The header every rank gathers, int64 [6 + G]: [rows, statistics entries, tasks with statistics, span, asked
    rows, asks] of a local update and the rows it asks for first, then its ``sq_norms`` (zeros without any) as
    float64 bits."""
    span = int(update.rows[-1]) + 1 if update.rows.numel() else 0
    asked = 0 if first is None else runs_of(first).numel()
    entries = sum(_entries(s) for s in update.stats)
    sizes = [update.rows.numel(), entries, len(update.stats), span, asked, int(first is not None)]
    norms = torch.zeros(num_params, dtype=torch.float64) if update.sq_norms is None else update.sq_norms
    return torch.cat([torch.tensor(sizes, dtype=torch.int64), norms.cpu().view(torch.int64)]).to(device)


def read_headers(headers: list[Tensor]) -> tuple[list[Sizes], Tensor]:
    """Every rank's sizes, and their ``sq_norms`` added in rank order from zeros (float64 [G], the bits
    ``summed_sq_norms`` gives the in-process exchange), from the gathered headers."""
    gathered = torch.stack(headers).cpu()
    fields = len(dataclasses.fields(Sizes))
    sizes = [Sizes(*values) for values in gathered[:, :fields].tolist()]
    norms = gathered[:, fields:].contiguous().view(torch.float64)
    total = torch.zeros(norms.shape[1], dtype=torch.float64)
    for rank_norms in norms:
        total.add_(rank_norms)
    return sizes, total


def padded(tensor: Tensor, length: int) -> Tensor:
    """``tensor`` [M, ...] zero-padded to [length, ...] (collectives need one shape on every rank)."""
    out = tensor.new_zeros((length, *tensor.shape[1:]))
    out[: tensor.shape[0]] = tensor
    return out


def pack(update: SparseUpdate, template: dict[str, Tensor]) -> Tensor:
    """Gradient rows of every parameter side by side, [M, D_total] (one row per primitive)."""
    count = update.rows.numel()
    parts = [update.grads[name].reshape(count, math.prod(ref.shape[1:])) for name, ref in template.items()]
    return torch.cat(parts, dim=1)


def unpack(rows: Tensor, packed: Tensor, template: dict[str, Tensor]) -> SparseUpdate:
    """Inverse of :func:`pack` for ``rows`` [M] and ``packed`` [M, D_total]."""
    grads, start = {}, 0
    for name, ref in template.items():
        width = math.prod(ref.shape[1:])
        grads[name] = packed[:, start : start + width].reshape(rows.numel(), *ref.shape[1:])
        start += width
    return SparseUpdate(rows=rows, grads=grads)


def _concat(update: SparseUpdate, name: str, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Statistic ``name`` of every task of ``update``, task after task, [entries]."""
    return torch.cat([torch.empty(0, dtype=dtype, device=device), *(s[name].to(dtype) for s in update.stats)])


def pack_indices(
    update: SparseUpdate, first: Tensor | None, layout: StatsLayout, longest: Sizes, device: torch.device
) -> Tensor:
    """The int64 part of a rank's message, [longest rows + entries x int statistics + tasks + asked]: its rows,
    each int64 statistic (task after task), each task's entry count and the rows it asks for first, each padded to
    the longest of any rank (``longest`` is the message's lengths: its rows are 0 where the rows do not travel)."""
    lengths = torch.tensor([_entries(s) for s in update.stats], dtype=torch.int64, device=device)
    stats = [padded(_concat(update, name, torch.int64, device), longest.entries) for name in layout.index_names]
    rows = update.rows if longest.rows else update.rows[:0]  # the dense exchange sends no rows (longest.rows = 0)
    asked = update.rows[:0] if first is None else runs_of(first)
    parts = [padded(rows, longest.rows), *stats, padded(lengths, longest.tasks), padded(asked, longest.asked)]
    return torch.cat(parts)


def asked_rows(indices: Tensor, layout: StatsLayout, size: Sizes, longest: Sizes) -> Tensor:
    """The rows one rank asked for first, from its gathered int64 message (where they travel as runs)."""
    offset = longest.rows + longest.entries * len(layout.index_names) + longest.tasks
    return rows_of_runs(indices[offset : offset + size.asked])


def pack_stat_values(update: SparseUpdate, layout: StatsLayout, longest: Sizes, device: torch.device) -> Tensor:
    """The statistics' values of a rank's tasks, task after task, as [longest entries, value statistics]."""
    values = [_concat(update, name, layout.value_dtype, device) for name in layout.value_names]
    return padded(torch.stack(values, dim=1), longest.entries)


def unpack_stats(
    indices: Tensor, values: Tensor, layout: StatsLayout, sizes: Sizes, longest: Sizes
) -> tuple[dict[str, Tensor], ...]:
    """One rank's task statistics from its gathered int64 message and values (inverse of the two packs)."""
    offset = longest.rows + longest.entries * len(layout.index_names)
    lengths = indices[offset : offset + sizes.tasks].tolist()
    columns = {}
    for i, name in enumerate(layout.index_names):
        start = longest.rows + i * longest.entries
        columns[name] = indices[start : start + sizes.entries].split(lengths)
    for i, name in enumerate(layout.value_names):
        columns[name] = values[: sizes.entries, i].split(lengths)
    return tuple({name: parts[t] for name, parts in columns.items()} for t in range(sizes.tasks))


def gathered_stats(
    layout: StatsLayout, sizes: list[Sizes], lengths: Sizes, indices: list[Tensor] | None, values: list[Tensor] | None
) -> tuple[dict[str, Tensor], ...]:
    """Every rank's task statistics, rank after rank (then task order), from the gathered messages."""
    out = []
    for rank, size in enumerate(sizes):
        if size.tasks == 0:
            continue
        empty = indices[rank].new_empty((0, len(layout.value_names)), dtype=layout.value_dtype)
        rank_values = empty if values is None else values[rank]
        out.extend(unpack_stats(indices[rank], rank_values, layout, size, lengths))
    return tuple(out)


def longest_of(sizes: Sequence[Sizes]) -> Sizes:
    """The largest of each field of :class:`Sizes` over the ranks (rows, entries, tasks, span, asked rows and
    asks: the padded lengths of the messages)."""
    return Sizes(*(max(getattr(s, f.name) for s in sizes) for f in dataclasses.fields(Sizes)))
