"""How workers exchange a step's sparse update, behind a small interface like DDP's comm hooks.

A worker hands its local update of step s to ``start_exchange(step, local_update)`` and gets a handle;
``handle.wait(timeout)`` returns the merged update: every worker's contribution summed in worker order (worker 0
first) on the union of their rows, with every worker's task statistics listed in worker order (then task order),
identical on every worker, so every replica's densification statistics hold every task (the distributed
transport's all_reduce exchanges with W > 2 sum in the backend's order instead, see below). The runtime never names
a backend: the in-process :class:`VirtualTransport` serves virtual workers, and a torch.distributed backend
(over gloo or NCCL, below) plugs in behind the same :class:`Transport` protocol.
Every wait has a timeout and its error names what it waited for.

:class:`DistributedTransport` is the torch.distributed backend. Its design, in four decisions:

- A progress thread per transport owns every collective of the exchanges. ``start_exchange`` only queues (step,
  update); the thread issues the header all_gather (each rank's rows, statistics entries, tasks, span, and its
  tasks' squared gradient norms, ``SparseUpdate.sq_norms``, float64 bits as int64), waits,
  issues the payload sized from it, waits, merges and marks the handle done. Why: a payload sized from the header
  cannot be issued with it, and when the main thread issued it (at its next ``done()`` / ``wait()``), a rank deep
  in a long render held back every rank's payload. Now progress never depends on a rank polling; ``done()`` never
  blocks and ``wait(timeout)`` waits on a condition. Each collective is waited for at most the transport's
  ``timeout``, asleep on its future on gloo, polling its completion on NCCL (never a timed wait on the work: on
  gloo that timeout becomes the collective's own, so a short one fails it when a peer is late;
  :meth:`DistributedTransport.close` ends the wait); an error (a timeout naming
  the step and what it waited for, or a failed collective) fails that exchange and every later one, and reaches
  their next ``done()`` / ``wait()``. The launcher closes the thread (:func:`close_transports`) before destroying
  the process group, as it stops the heartbeat.
- Any number of exchanges may be in flight, and the thread runs them one after the other in step order. Why: gloo
  and NCCL pair the ranks' collectives by the order they are issued, so every rank must issue the same sequence;
  the runtime starts exchanges in step order on every rank (a step out of order is an error), and one thread that
  issues all of them in that order makes the sequence identical on every rank whatever each rank's timing. For the
  same reason a collective from the main thread (a replica check, the barrier after rank 0's work) may run only
  when no exchange is in flight, after the runtime's ``settle``: :func:`require_no_exchange_in_flight` makes a
  violation an error instead of a silent interleaving.
- Per step, the gradient rows travel by the cheapest of three exchanges (bytes a rank sends, as many received, ring
  model; D the packed gradient width, R the longest rows of any rank, W ranks; :meth:`_Shape.predict`):
  (a) ``sparse``, today's all-gather of every rank's rows padded to R with their indices,
  (W - 1) R (8 + 4 D), O(W |A|); (b) ``union``, all-gather the row indices ((a) needs them anyway), agree on their
  union U, then all_reduce (sum) only [|U|, D], (W - 1) 8 R + 2 (W - 1) / W |U| 4 D; (c) ``dense``, all_reduce
  [N, D + 1] with no indices at all (the last column counts the ranks that touched a row: U is where it is
  positive), 2 (W - 1) / W N 4 (D + 1), O(N) whatever W, N being the largest row touched + 1. The choice is made
  from what every rank knows, so it is the same on every rank: after the header, dense if its bytes are below
  sparse's and union's with |U| estimated from the sizes (:func:`estimated_union`); otherwise after the indices,
  with the exact |U|, union if cheaper than sparse. The tasks' statistics always travel by all-gather. A transport
  may force one (``choice``; the trainer's ``--exchange``). Each handle tells its choice and its bytes, predicted
  per choice and counted from the tensors passed to the collectives (:class:`ExchangeBytes`).
- Every choice gives every rank the same merged update (rows, bits, statistics in rank order). For W = 2 all three
  equal ``sum_in_order`` bit for bit: a row's sum is g0 + g1, g0 + 0 or 0 + g1, and two-term float addition
  commutes (``sum_in_order`` starts a row from 0 and adds each rank's part, so a rank without the row adds
  nothing; only the sign of a zero can differ, which no consumer tells apart). For W > 2, union and dense sum in
  the order of the backend's all_reduce algorithm (chunk by chunk around a ring or tree), not in rank order: the
  bits may differ from ``sum_in_order``'s (and so from the in-process transport's) in the last place, while every
  rank gets the same bits (a ring reduces each chunk once and copies it to every rank; shown for gloo with W = 4
  by tests/comm/test_exchange_choice.py, not tested on NCCL). Force ``sparse`` where W > 2 runs must match the
  in-process run bit for bit.

- Rows asked for first (the runtime's priority publication): ``start_exchange(step, update, first)`` names rows
  a rank wants before the rest. Where any rank asks, the asked rows travel in the int64 message as runs of
  consecutive rows (:func:`runs_of`), then (unless the exchange is dense, whose first part comes with the whole
  update) P = U n the asked rows is known on every rank, each rank's gradient rows of P are all-gathered and
  summed in rank order (:meth:`DistributedTransport._first`, bit for bit the sums the whole exchange gives them),
  delivered as the handle's :class:`FirstPart`, and the rest travel by the chosen exchange without them.

A rank with no task in a step still sends its empty update.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from odin_nerfstudio.core.conflicts import isin_sorted, union_sorted
from odin_nerfstudio.core.sparse import Merge, SparseUpdate, joined, restricted, sum_in_order, tensor_bytes


@dataclass(frozen=True)
class FirstPart:
    """What a step's exchange delivers before the rest when some worker asked for rows first (the design's
    priority publication): every row the step writes, and the asked-for ones among them with their gradients.

    Attributes:
        rows: U, every row the step's merged update holds, sorted int64 [R].
        update: P = U n (every worker's asked rows), its gradients summed in worker order, as in the merged
            update, bit for bit; no statistics.
        sent_bytes: per worker, the bytes of its message up to and with this part (its rows, its asked rows, its
            gradient rows of P), for the interconnect model; None where the part came with the whole update (the
            dense exchange sends no rows ahead of the gradients).
    """

    rows: Tensor
    update: SparseUpdate
    sent_bytes: tuple[int, ...] | None

    @classmethod
    def of(cls, merged: SparseUpdate, first: Tensor, sent_bytes: tuple[int, ...] | None) -> FirstPart:
        """The first part of a merged update: its rows ``first`` (P, sorted), their sums as merged."""
        return cls(merged.rows, restricted(merged, isin_sorted(merged.rows, first)), sent_bytes)


def chosen_rows(union: Tensor, asked: Sequence[Tensor | None]) -> Tensor:
    """P: the rows of ``union`` (U, sorted) that some worker asked for first (None: it asks for none)."""
    wanted = union_sorted([a for a in asked if a is not None and a.numel()], union.device)
    return union[isin_sorted(union, wanted)]


def first_bytes(
    rows: Sequence[Tensor], asked_nbytes: Sequence[int], counts: Sequence[int], template: dict[str, Tensor]
) -> tuple[int, ...]:
    """Per worker, its message's bytes up to and with the first part: its rows, its asked rows (``asked_nbytes``)
    and its ``counts`` gradient rows of P."""
    width = row_bytes(template)
    return tuple(
        tensor_bytes(r) + asked + width * count for r, asked, count in zip(rows, asked_nbytes, counts, strict=True)
    )


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


class ExchangeHandle(Protocol):
    """An exchange in flight."""

    def done(self) -> bool:
        """Whether :meth:`wait` would return without blocking."""

    def wait(self, timeout: float) -> SparseUpdate:
        """The merged update; raises ``TimeoutError`` naming the step and the missing workers."""

    def first(self) -> FirstPart | None:
        """Never blocks: the :class:`FirstPart` once it has arrived, else None (always None where no worker asked
        for rows first)."""

    def wait_first(self, timeout: float) -> FirstPart:
        """The :class:`FirstPart` (some worker asked for rows first); raises ``TimeoutError`` naming the step."""


class Transport(Protocol):
    """One worker's end of the exchange."""

    def start_exchange(self, step: int, local_update: SparseUpdate, first: Tensor | None = None) -> ExchangeHandle:
        """Send this worker's update of ``step``; exchanges are started in step order on every worker. ``first``
        (sorted int64 [Q], possibly empty): rows this worker asks every worker to send first (a :class:`FirstPart`
        then arrives before the rest); every worker of a run passes it, or none does."""


class _Exchange:
    """The contributions of one step gathered in process, merged once all workers have sent."""

    def __init__(self, step: int, num_workers: int, condition: threading.Condition, merge: Merge) -> None:
        self.step = step
        self._merge = merge
        self.contributions: list[SparseUpdate | None] = [None] * num_workers
        self.asked: list[Tensor | None] = [None] * num_workers
        self.merged: SparseUpdate | None = None
        self.first: FirstPart | None = None
        self._condition = condition

    def missing(self) -> list[int]:
        return [w for w, c in enumerate(self.contributions) if c is None]

    def contribute(
        self, worker: int, update: SparseUpdate, template: dict[str, Tensor], first: Tensor | None
    ) -> None:
        if self.contributions[worker] is not None:
            raise RuntimeError(f"worker {worker} started the exchange of step {self.step} twice")
        self.contributions[worker] = update
        self.asked[worker] = first
        if not self.missing():
            self.merged = self._merge(self.contributions, template)
            if any(a is not None for a in self.asked):
                self.first = self._first_part(template)
            self._condition.notify_all()

    def _first_part(self, template: dict[str, Tensor]) -> FirstPart:
        """The merged update's asked-for rows (its sums, so the same bits) and each worker's bytes up to them."""
        rows = [c.rows for c in self.contributions]
        first = chosen_rows(self.merged.rows, self.asked)
        counts = [int(isin_sorted(r, first).sum()) for r in rows]
        sent = first_bytes(rows, [asked_bytes(a) for a in self.asked], counts, template)
        return FirstPart.of(self.merged, first, sent)


class VirtualHandle:
    """Handle of an in-process exchange."""

    def __init__(self, exchange: _Exchange, condition: threading.Condition) -> None:
        self._exchange = exchange
        self._condition = condition

    def done(self) -> bool:
        with self._condition:
            return self._exchange.merged is not None

    def wait(self, timeout: float) -> SparseUpdate:
        with self._condition:
            if not self._condition.wait_for(lambda: self._exchange.merged is not None, timeout=timeout):
                raise TimeoutError(
                    f"exchange of step {self._exchange.step}: waited {timeout} s for the updates of workers "
                    f"{self._exchange.missing()}"
                )
            return self._exchange.merged

    def first(self) -> FirstPart | None:
        with self._condition:
            return self._exchange.first

    def wait_first(self, timeout: float) -> FirstPart:
        self.wait(timeout)
        if self._exchange.first is None:
            raise RuntimeError(f"exchange of step {self._exchange.step}: no worker asked for rows first")
        return self._exchange.first


class VirtualEndpoint:
    """Worker ``worker``'s end of a :class:`VirtualTransport`."""

    def __init__(self, transport: VirtualTransport, worker: int) -> None:
        self._transport = transport
        self.worker = worker

    def start_exchange(self, step: int, local_update: SparseUpdate, first: Tensor | None = None) -> VirtualHandle:
        return self._transport.contribute(step, self.worker, local_update, first)


class VirtualTransport:
    """In-process exchange for W virtual workers (thread-safe; merges in worker order).

    Args:
        num_workers: W.
        template: per parameter name, a tensor [N, ...] giving the gradient rows' trailing shape and dtype.
        merge: the sum of the W parts in worker order (``sum_in_order`` or an op equal to it bit for bit).
    """

    def __init__(self, num_workers: int, template: dict[str, Tensor], merge: Merge = sum_in_order) -> None:
        self.num_workers = num_workers
        self.template = template
        self.merge = merge
        self._condition = threading.Condition()
        self._exchanges: dict[int, _Exchange] = {}

    def endpoint(self, worker: int) -> VirtualEndpoint:
        """The transport as worker ``worker`` sees it."""
        return VirtualEndpoint(self, worker)

    def contribute(self, step: int, worker: int, update: SparseUpdate, first: Tensor | None = None) -> VirtualHandle:
        """Add ``worker``'s update (and the rows it asks for first) to the exchange of ``step``; its handle
        completes when all W have."""
        with self._condition:
            exchange = self._exchanges.setdefault(step, _Exchange(step, self.num_workers, self._condition, self.merge))
            exchange.contribute(worker, update, self.template, first)
            if exchange.merged is not None:
                del self._exchanges[step]
            return VirtualHandle(exchange, self._condition)


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
class _Sizes:
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


def _header(update: SparseUpdate, first: Tensor | None, num_params: int, device: torch.device) -> Tensor:
    """The header every rank gathers, int64 [6 + G]: [rows, statistics entries, tasks with statistics, span, asked
    rows, asks] of a local update and the rows it asks for first, then its ``sq_norms`` (zeros without any) as
    float64 bits."""
    span = int(update.rows[-1]) + 1 if update.rows.numel() else 0
    asked = 0 if first is None else runs_of(first).numel()
    entries = sum(_entries(s) for s in update.stats)
    sizes = [update.rows.numel(), entries, len(update.stats), span, asked, int(first is not None)]
    norms = torch.zeros(num_params, dtype=torch.float64) if update.sq_norms is None else update.sq_norms
    return torch.cat([torch.tensor(sizes, dtype=torch.int64), norms.cpu().view(torch.int64)]).to(device)


def _read_headers(headers: list[Tensor]) -> tuple[list[_Sizes], Tensor]:
    """Every rank's sizes, and their ``sq_norms`` added in rank order from zeros (float64 [G], the bits
    ``summed_sq_norms`` gives the in-process exchange), from the gathered headers."""
    gathered = torch.stack(headers).cpu()
    fields = len(dataclasses.fields(_Sizes))
    sizes = [_Sizes(*values) for values in gathered[:, :fields].tolist()]
    norms = gathered[:, fields:].contiguous().view(torch.float64)
    total = torch.zeros(norms.shape[1], dtype=torch.float64)
    for rank_norms in norms:
        total.add_(rank_norms)
    return sizes, total


def _padded(tensor: Tensor, length: int) -> Tensor:
    """``tensor`` [M, ...] zero-padded to [length, ...] (collectives need one shape on every rank)."""
    out = tensor.new_zeros((length, *tensor.shape[1:]))
    out[: tensor.shape[0]] = tensor
    return out


def _pack(update: SparseUpdate, template: dict[str, Tensor]) -> Tensor:
    """Gradient rows of every parameter side by side, [M, D_total] (one row per primitive)."""
    count = update.rows.numel()
    parts = [update.grads[name].reshape(count, math.prod(ref.shape[1:])) for name, ref in template.items()]
    return torch.cat(parts, dim=1)


def _unpack(rows: Tensor, packed: Tensor, template: dict[str, Tensor]) -> SparseUpdate:
    """Inverse of :func:`_pack` for ``rows`` [M] and ``packed`` [M, D_total]."""
    grads, start = {}, 0
    for name, ref in template.items():
        width = math.prod(ref.shape[1:])
        grads[name] = packed[:, start : start + width].reshape(rows.numel(), *ref.shape[1:])
        start += width
    return SparseUpdate(rows=rows, grads=grads)


def _concat(update: SparseUpdate, name: str, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Statistic ``name`` of every task of ``update``, task after task, [entries]."""
    return torch.cat([torch.empty(0, dtype=dtype, device=device), *(s[name].to(dtype) for s in update.stats)])


def _pack_indices(
    update: SparseUpdate, first: Tensor | None, layout: StatsLayout, longest: _Sizes, device: torch.device
) -> Tensor:
    """The int64 part of a rank's message, [longest rows + entries x int statistics + tasks + asked]: its rows,
    each int64 statistic (task after task), each task's entry count and the rows it asks for first, each padded to
    the longest of any rank (``longest`` is the message's lengths: its rows are 0 where the rows do not travel)."""
    lengths = torch.tensor([_entries(s) for s in update.stats], dtype=torch.int64, device=device)
    stats = [_padded(_concat(update, name, torch.int64, device), longest.entries) for name in layout.index_names]
    rows = update.rows if longest.rows else update.rows[:0]  # the dense exchange sends no rows (longest.rows = 0)
    asked = update.rows[:0] if first is None else runs_of(first)
    parts = [_padded(rows, longest.rows), *stats, _padded(lengths, longest.tasks), _padded(asked, longest.asked)]
    return torch.cat(parts)


def _asked_rows(indices: Tensor, layout: StatsLayout, size: _Sizes, longest: _Sizes) -> Tensor:
    """The rows one rank asked for first, from its gathered int64 message (where they travel as runs)."""
    offset = longest.rows + longest.entries * len(layout.index_names) + longest.tasks
    return rows_of_runs(indices[offset : offset + size.asked])


def _pack_stat_values(update: SparseUpdate, layout: StatsLayout, longest: _Sizes, device: torch.device) -> Tensor:
    """The statistics' values of a rank's tasks, task after task, as [longest entries, value statistics]."""
    values = [_concat(update, name, layout.value_dtype, device) for name in layout.value_names]
    return _padded(torch.stack(values, dim=1), longest.entries)


def _unpack_stats(
    indices: Tensor, values: Tensor, layout: StatsLayout, sizes: _Sizes, longest: _Sizes
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


ExchangeChoice = Literal["auto", "sparse", "union", "dense"]
"""How the gradient rows of an exchange travel: chosen per step by predicted bytes ("auto"), or forced."""
CHOICES: tuple[str, ...] = ("sparse", "union", "dense")
"""The three exchanges, in the order a tie is broken (today's sparse all-gather first)."""


@dataclass(frozen=True)
class _Shape:
    """What the byte formulas need besides the ranks' sizes: W, the packed gradient width D and its element size,
    the statistics' layout, and G, the parameters (whose squared norms ride in the header)."""

    world_size: int
    width: int
    itemsize: int
    layout: StatsLayout
    num_params: int

    def all_gather(self, nbytes: int) -> int:
        """Bytes a rank sends (and receives) in a ring all_gather of ``nbytes`` per rank: (W - 1) x nbytes."""
        return (self.world_size - 1) * nbytes

    def all_reduce(self, nbytes: int) -> int:
        """Bytes a rank sends (and receives) in a ring all_reduce of ``nbytes``: 2 (W - 1) / W x nbytes."""
        return 2 * (self.world_size - 1) * nbytes // self.world_size

    def predict(self, sizes: Sequence[_Sizes], union_rows: int) -> dict[str, int]:
        """Per choice, the bytes a rank sends (and as many received) in the exchange of these sizes (every
        collective: header, indices, statistics, gradient rows), with ``union_rows`` = |U|.

        sparse: (W - 1) [R (8 + 4 D) + S], union: (W - 1) (8 R + S) + 2 (W - 1) / W |U| 4 D,
        dense: (W - 1) S' + 2 (W - 1) / W N (4 D + 4), with R the longest rows of any rank, S (S') the statistics'
        message with (without) the rows' padding, N the largest span, 4 the gradients' element size.
        """
        longest = _longest(sizes)
        header = self.all_gather((len(dataclasses.fields(_Sizes)) + self.num_params) * 8)
        index_columns = longest.entries * len(self.layout.index_names) + longest.tasks
        values = 0
        if longest.entries and self.layout.value_names:
            values = longest.entries * len(self.layout.value_names) * _itemsize(self.layout.value_dtype)
        stats = self.all_gather(8 * index_columns + values)
        with_rows = self.all_gather(8 * longest.rows) + stats
        return {
            "sparse": header + with_rows + self.all_gather(longest.rows * self.width * self.itemsize),
            "union": header + with_rows + self.all_reduce(union_rows * self.width * self.itemsize),
            "dense": header + stats + self.all_reduce(longest.span * (self.width + 1) * self.itemsize),
        }


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def estimated_union(sizes: Sequence[_Sizes]) -> int:
    """|U| predicted from the sizes alone: rows drawn independently from [0, N) (N the largest span),
    N (1 - prod(1 - R_r / N)), clamped to the bounds max R_r <= |U| <= min(N, sum R_r)."""
    span = max(s.span for s in sizes)
    if span == 0:
        return 0
    missed = math.prod(1.0 - s.rows / span for s in sizes)
    estimate = round(span * (1.0 - missed))
    return min(max(estimate, max(s.rows for s in sizes)), span, sum(s.rows for s in sizes))


@dataclass(frozen=True)
class ExchangeBytes:
    """What one exchange cost one rank, for the meter and the interconnect model.

    Attributes:
        choice: the exchange that ran ("sparse", "union" or "dense").
        predicted: per choice, the bytes :meth:`_Shape.predict` gives (sent, and as many received); the union's
            is exact when the rows were gathered (``union_exact``), else from :func:`estimated_union`.
        union_exact: whether |U| was known.
        sent: bytes this rank sent, counted from the tensors passed to the collectives (ring model: an all_gather
            of b bytes per rank sends (W - 1) b, an all_reduce of b bytes 2 (W - 1) / W b).
        received: bytes received, counted the same way (the ring receives what it sends).
        collectives: each collective issued, in order: (kind, bytes of the tensor a rank passed).
    """

    choice: str
    predicted: dict[str, int]
    union_exact: bool
    sent: int
    received: int
    collectives: tuple[tuple[str, int], ...]


class DistributedHandle:
    """Handle of a torch.distributed exchange; the transport's progress thread completes it.

    :meth:`done` never blocks; :meth:`wait` blocks at most ``timeout``. Both raise the progress thread's error
    (a failed or timed-out collective) once it has one.
    """

    def __init__(
        self, transport: DistributedTransport, step: int, local_update: SparseUpdate, asked: Tensor | None = None
    ) -> None:
        self.step = step
        self._transport = transport
        self.local_update: SparseUpdate | None = local_update
        self.asked: Tensor | None = asked
        """The rows this rank asks for first (None: it asks for none)."""
        self.first_part: FirstPart | None = None
        self.part = "row counts"
        """What the exchange waits for now (for the errors): "row counts" (its header, or an earlier exchange
        ahead of it), "sparse rows" (indices and statistics), "first rows", "gradient rows"."""
        self.merged: SparseUpdate | None = None
        self.error: BaseException | None = None
        self.bytes: ExchangeBytes | None = None
        """Its bytes and choice, once done."""

    def done(self) -> bool:
        """Never blocks: whether the merged update is in; raises the progress thread's error."""
        with self._transport.condition:
            if self.error is not None:
                raise self.error
            return self.merged is not None

    def wait(self, timeout: float) -> SparseUpdate:
        """The merged update; raises ``TimeoutError`` naming the step and the part still missing after ``timeout``."""
        with self._transport.condition:
            finished = self._transport.condition.wait_for(
                lambda: self.merged is not None or self.error is not None, timeout=max(timeout, 0.0)
            )
            if self.error is not None:
                raise self.error
            if not finished:
                raise TimeoutError(f"waited {timeout:.3g} s for {self.what(self.part)}")
            return self.merged

    def first(self) -> FirstPart | None:
        """Never blocks: the first part once in; raises the progress thread's error."""
        with self._transport.condition:
            if self.error is not None:
                raise self.error
            return self.first_part

    def wait_first(self, timeout: float) -> FirstPart:
        """The first part; raises ``TimeoutError`` naming the step and the part still missing after ``timeout``."""
        with self._transport.condition:
            finished = self._transport.condition.wait_for(
                lambda: self.first_part is not None or self.merged is not None or self.error is not None,
                timeout=max(timeout, 0.0),
            )
            if self.error is not None:
                raise self.error
            if not finished:
                raise TimeoutError(f"waited {timeout:.3g} s for {self.what(self.part)}")
            if self.first_part is None:
                raise RuntimeError(f"exchange of step {self.step}: no rank asked for rows first")
            return self.first_part

    def what(self, part: str) -> str:
        """What a wait of this exchange waits for, for its errors: the step, the part and the ranks."""
        return f"exchange of step {self.step}: the {part} of ranks 0..{self._transport.world_size - 1}"


class _Closed(Exception):
    """The transport was closed while its progress thread waited for a collective."""


_TRANSPORTS: weakref.WeakSet[DistributedTransport] = weakref.WeakSet()
"""Every distributed transport of this process, for the main-thread guard and the launcher's shutdown."""


def require_no_exchange_in_flight(what: str) -> None:
    """Raise if an exchange is in flight in this process: a collective from the main thread (``what``: a replica
    check, a barrier) would interleave with the progress thread's and break the rank-identical order.

    Raises:
        RuntimeError: naming ``what`` and the steps in flight (call the runtime's ``settle`` first).
    """
    steps = sorted(step for transport in list(_TRANSPORTS) for step in transport.in_flight())
    if steps:
        raise RuntimeError(
            f"{what}: a collective from the main thread while the exchanges of steps {steps} are in flight; the "
            "progress thread owns the collectives until the runtime has settled (every started step published)"
        )


def close_transports() -> None:
    """Stop the progress thread of every distributed transport of this process (before destroying the process
    group: a daemon thread inside a collective at exit aborts the process)."""
    for transport in list(_TRANSPORTS):
        transport.close()


class DistributedTransport:
    """Sparse-update exchange over torch.distributed (gloo on CPU, NCCL on CUDA): one instance per rank.

    :meth:`start_exchange` queues (step, update) and returns at once. A progress thread, one per transport, owns
    every collective of the exchanges and runs them one exchange after the other in step order: the header
    all_gather, then, sized from it, the indices and statistics, then the gradient rows by the chosen exchange,
    then the merge; it marks the handle done. See the module docstring for why a thread and why step order.

    Args:
        template: per parameter name, a tensor [N, ...] giving the gradient rows' trailing shape, dtype and
            device (every name must share one dtype).
        timeout: the longest the progress thread waits for any one collective of an exchange; past it the
            exchange (and every later one) fails with a ``TimeoutError`` naming the step and the part.
        group: the process group (default: the world).
        stats_schema: per statistic name, its dtype (the render adapter's ``stats_schema``); None if the tasks
            carry no statistics.
        choice: "auto" (per step, the fewest predicted bytes) or a forced "sparse", "union", "dense".
        merge: the sum of the ranks' gathered parts in rank order (``sum_in_order`` or an op equal to it bit for
            bit).
    """

    def __init__(
        self,
        template: dict[str, Tensor],
        timeout: float = 60.0,
        group: Any = None,
        stats_schema: dict[str, torch.dtype] | None = None,
        choice: ExchangeChoice = "auto",
        merge: Merge = sum_in_order,
    ) -> None:
        dtypes = {ref.dtype for ref in template.values()}
        if len(dtypes) != 1:
            raise ValueError(f"all gradients must share one dtype to be packed, got {dtypes}")
        if choice not in ("auto", *CHOICES):
            raise ValueError(f"unknown exchange {choice!r}; choose one of auto, {', '.join(CHOICES)} (--exchange)")
        self.template = template
        self.timeout = timeout
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.stats_layout = StatsLayout.of(stats_schema)
        self.choice = choice
        self.merge = merge
        self.shape = _Shape(
            self.world_size,
            sum(math.prod(ref.shape[1:]) for ref in template.values()),
            dtypes.pop().itemsize,
            self.stats_layout,
            len(template),
        )
        self.condition = threading.Condition()
        self._queue: queue.SimpleQueue[DistributedHandle | None] = queue.SimpleQueue()
        self._in_flight: list[DistributedHandle] = []
        self._last_step: int | None = None
        self._error: BaseException | None = None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        _TRANSPORTS.add(self)

    @property
    def device(self) -> torch.device:
        """The device of the gradients and of every message."""
        return next(iter(self.template.values())).device

    def start_exchange(self, step: int, local_update: SparseUpdate, first: Tensor | None = None) -> DistributedHandle:
        """Queue this rank's update of ``step`` (and the rows it asks for first) for the progress thread and return
        at once (never blocks).

        Raises:
            ValueError: ``step`` is not after the last started step (exchanges start in step order).
        """
        if local_update.stats and not self.stats_layout.index_names + self.stats_layout.value_names:
            raise ValueError("the tasks carry statistics but the transport has no stats_schema")
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"exchange of step {step} started after step {self._last_step}: start them in step order")
        self._last_step = step
        handle = DistributedHandle(self, step, local_update, first)
        with self.condition:
            if self._error is not None or self._closed.is_set():
                handle.error = self._error or RuntimeError(f"{handle.what('row counts')}: the transport is closed")
                return handle
            self._in_flight.append(handle)
        if self._thread is None:
            self._thread = threading.Thread(target=self._progress, name="odin-exchange", daemon=True)
            self._thread.start()
        self._queue.put(handle)
        return handle

    def in_flight(self) -> list[int]:
        """The steps started and not yet merged (or failed)."""
        with self.condition:
            return [handle.step for handle in self._in_flight]

    def close(self) -> None:
        """Stop the progress thread (exchanges in flight fail, naming the closed transport); idempotent."""
        self._closed.set()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5.0)
        _TRANSPORTS.discard(self)

    def _progress(self) -> None:
        """The progress thread: every exchange in step order until closed or a collective fails (then that error
        is every later exchange's: the ranks' collective order is lost)."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        while (handle := self._queue.get()) is not None:
            try:
                merged, spent = self._exchange(handle)
            except _Closed:
                error: BaseException = RuntimeError(f"{handle.what(handle.part)}: the transport was closed")
            except BaseException as failure:  # noqa: BLE001 - every failure must reach the waiting handles
                error = failure
            else:
                with self.condition:
                    handle.merged, handle.bytes, handle.local_update, handle.asked = merged, spent, None, None
                    self._in_flight.remove(handle)
                    self.condition.notify_all()
                continue
            with self.condition:
                self._error = error
                for failed in self._in_flight:
                    failed.error = error
                self._in_flight.clear()
                self.condition.notify_all()
            return

    def _exchange(self, handle: DistributedHandle) -> tuple[SparseUpdate, ExchangeBytes]:
        """One exchange, from the header to the merge (in the progress thread). Where some rank asks for rows
        first (and the exchange is not dense), the asked-for rows' gradients go once the rows have travelled
        (:meth:`_first`); the rest then travel by the chosen exchange without them."""
        update, shape, layout = handle.local_update, self.shape, self.stats_layout
        issued: list[tuple[str, int]] = []
        header = _header(update, handle.asked, len(self.template), self.device)
        headers, work = self._all_gather(header, issued)
        self._wait(work, handle, "row counts")
        sizes, sq_norms = _read_headers(headers)
        longest = _longest(sizes)
        asks = bool(longest.asks)
        predicted = shape.predict(sizes, estimated_union(sizes))
        choice = self.choice
        if choice == "auto" and predicted["dense"] < min(predicted["sparse"], predicted["union"]):
            choice = "dense"
        # The int64 message: rows (unless dense), int statistics, tasks' entry counts, asked rows (as runs); then
        # the statistics' values. The dense exchange sends no rows ahead of the gradients: its first part comes
        # with the whole update.
        lengths = dataclasses.replace(longest, rows=0) if choice == "dense" else longest
        works, indices, values = [], None, None
        if lengths.rows or lengths.tasks or lengths.asked:
            indices, work = self._all_gather(_pack_indices(update, handle.asked, layout, lengths, self.device), issued)
            works.append(work)
        if longest.entries and layout.value_names:
            values, work = self._all_gather(_pack_stat_values(update, layout, longest, self.device), issued)
            works.append(work)
        for work in works:
            self._wait(work, handle, "sparse rows")
        stats = self._stats(sizes, lengths, indices, values)
        packed, rows = _pack(update, self.template), update.rows
        rank_rows = None  # every rank's rows, where they travelled
        if lengths.rows or choice != "dense":
            empty = rows.new_empty(0)
            rank_rows = [empty if indices is None else indices[r][: size.rows] for r, size in enumerate(sizes)]
        first, asked = None, None
        if asks:
            asked = [
                rows[:0] if indices is None else _asked_rows(indices[r], layout, size, lengths)
                for r, size in enumerate(sizes)
            ]
        if asks and choice != "dense":
            first, masks = self._first(handle, rank_rows, asked, sizes, packed, issued)
            rank_rows = [ranks_rows[~mask] for ranks_rows, mask in zip(rank_rows, masks, strict=True)]
            rows, packed = rows[~masks[self.rank]], packed[~masks[self.rank]]
        union = None
        if choice != "dense":
            union = union_sorted(rank_rows, self.device)
            rest = [dataclasses.replace(size, rows=r.numel()) for size, r in zip(sizes, rank_rows, strict=True)]
            predicted = shape.predict(rest, union.numel())
            if choice == "auto":
                choice = "union" if predicted["union"] < predicted["sparse"] else "sparse"
        handle.part = "gradient rows"
        if choice == "sparse":
            merged = self._sparse(handle, rank_rows, packed, stats, issued)
        elif choice == "union":
            merged = self._union(handle, rows, union, packed, stats, issued)
        else:
            span = longest.span
            if rank_rows is not None:
                span = max((int(r[-1]) + 1 for r in rank_rows if r.numel()), default=0)
            merged = self._dense(handle, rows, span, packed, stats, issued)
        if first is not None:
            merged = joined([first.update, merged], stats)
        merged = dataclasses.replace(merged, sq_norms=sq_norms)
        if first is None and asks:
            part = FirstPart.of(merged, chosen_rows(merged.rows, asked), None)
            with self.condition:
                handle.first_part = part
        counted = sum(shape.all_gather(n) if kind == "all_gather" else shape.all_reduce(n) for kind, n in issued)
        spent = ExchangeBytes(choice, predicted, union is not None, counted, counted, tuple(issued))
        return merged, spent

    def _first(
        self,
        handle: DistributedHandle,
        rank_rows: list[Tensor],
        asked: list[Tensor],
        sizes: list[_Sizes],
        packed: Tensor,
        issued: list[tuple[str, int]],
    ) -> tuple[FirstPart, list[Tensor]]:
        """Gather every rank's gradient rows of P (U n every rank's asked rows), sum them in rank order, and
        deliver them as the handle's :class:`FirstPart`; returns it and per rank the mask of its rows in P."""
        union = union_sorted(rank_rows, self.device)
        first = chosen_rows(union, asked)
        masks = [isin_sorted(r, first) for r in rank_rows]
        counts = [int(mask.sum()) for mask in masks]
        handle.part = "first rows"
        if max(counts, default=0):
            gathered, work = self._all_gather(_padded(packed[masks[self.rank]], max(counts)), issued)
            self._wait(work, handle, "first rows")
            parts = [
                _unpack(r[mask], gathered[rank][:count], self.template)
                for rank, (r, mask, count) in enumerate(zip(rank_rows, masks, counts, strict=True))
            ]
            update = self.merge(parts, self.template)
        else:
            update = _unpack(first, packed[:0], self.template)
        sent = first_bytes(rank_rows, [8 * size.asked for size in sizes], counts, self.template)
        part = FirstPart(union, update, sent)
        with self.condition:
            handle.first_part = part
            self.condition.notify_all()
        return part, masks

    def _stats(
        self, sizes: list[_Sizes], lengths: _Sizes, indices: list[Tensor] | None, values: list[Tensor] | None
    ) -> tuple[dict[str, Tensor], ...]:
        """Every rank's task statistics, rank after rank (then task order), from the gathered messages."""
        layout = self.stats_layout
        out = []
        for rank, size in enumerate(sizes):
            if size.tasks == 0:
                continue
            empty = indices[rank].new_empty((0, len(layout.value_names)), dtype=layout.value_dtype)
            rank_values = empty if values is None else values[rank]
            out.extend(_unpack_stats(indices[rank], rank_values, layout, size, lengths))
        return tuple(out)

    def _sparse(
        self,
        handle: DistributedHandle,
        rank_rows: list[Tensor],
        packed: Tensor,
        stats: tuple[dict[str, Tensor], ...],
        issued: list[tuple[str, int]],
    ) -> SparseUpdate:
        """(a) All-gather every rank's gradient rows padded to the longest, summed in rank order (``sum_in_order``)."""
        longest = max(r.numel() for r in rank_rows)
        if longest == 0:
            empty = _unpack(packed.new_empty(0, dtype=torch.int64), packed, self.template)
            return dataclasses.replace(empty, stats=stats)
        gathered, work = self._all_gather(_padded(packed, longest), issued)
        self._wait(work, handle, "gradient rows")
        updates = [_unpack(r, gathered[rank][: r.numel()], self.template) for rank, r in enumerate(rank_rows)]
        return dataclasses.replace(self.merge(updates, self.template), stats=stats)

    def _union(
        self,
        handle: DistributedHandle,
        rows: Tensor,
        union: Tensor,
        packed: Tensor,
        stats: tuple[dict[str, Tensor], ...],
        issued: list[tuple[str, int]],
    ) -> SparseUpdate:
        """(b) Every rank scatters its rows into [|U|, D] zeros, then one all_reduce (sum) of that."""
        total = packed.new_zeros((union.numel(), packed.shape[1]))
        total[torch.searchsorted(union, rows)] = packed
        if union.numel():
            self._wait(self._all_reduce(total, issued), handle, "gradient rows")
        return dataclasses.replace(_unpack(union, total, self.template), stats=stats)

    def _dense(
        self,
        handle: DistributedHandle,
        rows: Tensor,
        span: int,
        packed: Tensor,
        stats: tuple[dict[str, Tensor], ...],
        issued: list[tuple[str, int]],
    ) -> SparseUpdate:
        """(c) Every rank writes its rows into [N, D + 1] zeros, the last column 1 on its rows, then one
        all_reduce (sum): U is where that column is positive (no rows travel), the gradients its first D."""
        width = packed.shape[1]
        total = packed.new_zeros((span, width + 1))
        total[rows, :width] = packed
        total[rows, width] = 1
        if span:
            self._wait(self._all_reduce(total, issued), handle, "gradient rows")
        union = torch.nonzero(total[:, width] > 0).flatten()
        return dataclasses.replace(_unpack(union, total[union, :width], self.template), stats=stats)

    def _wait(self, work: Any, handle: DistributedHandle, part: str) -> None:
        """Wait (in the progress thread) for a collective of ``handle``'s exchange, at most :attr:`timeout`, noticing
        :meth:`close`; then wait on the work, which raises a failed collective's error and, on NCCL, orders this
        thread's stream after it. Never a wait with a timeout: on gloo a work-level timeout is handed to the
        collective's own sends and receives, so a short one fails the collective when a peer is late (seen as step
        0's exchange hanging on both ranks under load), and on NCCL an expired one may abort the communicator. A
        timeout raises ``TimeoutError`` naming the step and part.

        On gloo the thread sleeps until the work's future completes (woken by gloo, checking :meth:`close` every
        :data:`_CLOSE_CHECK_S`): polling ``is_completed`` every 0.5 ms woke it about 150 times per exchange while a
        peer rendered, CPU taken from the renders beside it on a loaded machine. On NCCL, whose future completes
        once the collective is enqueued, it polls ``is_completed`` (the GPU's completion) every :data:`_POLL_S`."""
        handle.part = part
        deadline = time.monotonic() + self.timeout
        arrived = _arrival(work) if self.device.type == "cpu" else None
        while not (work.is_completed() if arrived is None else arrived.is_set()):
            if self._closed.is_set():
                raise _Closed
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"waited {self.timeout:.3g} s for {handle.what(part)}")
            if arrived is None:
                time.sleep(_POLL_S)
            else:
                arrived.wait(min(_CLOSE_CHECK_S, deadline - now))
        try:
            work.wait()
        except RuntimeError as error:
            raise RuntimeError(f"{handle.what(part)} failed: {error}") from error

    def _all_gather(self, tensor: Tensor, issued: list[tuple[str, int]]) -> tuple[list[Tensor], Any]:
        """Start an async all_gather of ``tensor`` (one shape on every rank), noted in ``issued``; returns the
        outputs and the work."""
        outputs = [torch.empty_like(tensor) for _ in range(self.world_size)]
        issued.append(("all_gather", tensor_bytes(tensor)))
        return outputs, dist.all_gather(outputs, tensor, group=self.group, async_op=True)

    def _all_reduce(self, tensor: Tensor, issued: list[tuple[str, int]]) -> Any:
        """Start an async all_reduce (sum) of ``tensor`` in place, noted in ``issued``; returns the work."""
        issued.append(("all_reduce", tensor_bytes(tensor)))
        return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group, async_op=True)


def _longest(sizes: Sequence[_Sizes]) -> _Sizes:
    """The largest rows, entries, tasks and span of any rank (the padded lengths of the messages)."""
    return _Sizes(*(max(getattr(s, f.name) for s in sizes) for f in dataclasses.fields(_Sizes)))


_POLL_S = 0.0005
"""How often the progress thread polls a collective in flight on NCCL."""
_CLOSE_CHECK_S = 0.05
"""How often the progress thread, asleep on a gloo collective, checks whether the transport was closed."""


def _arrival(work: Any) -> threading.Event:
    """An event set once ``work``'s future completes (with its result or its error)."""
    arrived = threading.Event()
    work.get_future().add_done_callback(lambda _: arrived.set())
    return arrived
