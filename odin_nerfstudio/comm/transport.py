"""How workers exchange a step's sparse update, behind a small interface like DDP's comm hooks.

A worker hands its local update of step s to ``start_exchange(step, local_update)`` and gets a handle;
``handle.wait(timeout)`` returns the merged update: every worker's contribution summed in worker order (worker 0
first) on the union of their rows, with every worker's task statistics listed in worker order (then task order),
identical on every worker, so every replica's densification statistics hold every task. The runtime never names
a backend: the in-process :class:`VirtualTransport` serves virtual workers, and a torch.distributed backend
(all_gather of variable-sized sparse rows over gloo or NCCL) plugs in behind the same :class:`Transport` protocol.
Every wait has a timeout and its error names what it waited for.

:class:`DistributedTransport` is the torch.distributed backend: all ranks issue the same collectives in the same
order (exchanges start in step order), every one asynchronous: an all_gather of a header (row count, statistics
entries, tasks with statistics), and once it has arrived all_gathers of the indices (rows, statistics' rows, each
task's entry count), the packed gradient rows and, when any rank has statistics, their values (per
:class:`StatsLayout`: the statistics are the render adapter's plain per-task tensor dicts),
each padded to the longest of any rank, merged in rank order on every rank. Starting an exchange never blocks.
A rank with no task in a step still sends its empty update.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from odin_nerfstudio.core.sparse import SparseUpdate, sum_in_order


class ExchangeHandle(Protocol):
    """An exchange in flight."""

    def done(self) -> bool:
        """Whether :meth:`wait` would return without blocking."""

    def wait(self, timeout: float) -> SparseUpdate:
        """The merged update; raises ``TimeoutError`` naming the step and the missing workers."""


class Transport(Protocol):
    """One worker's end of the exchange."""

    def start_exchange(self, step: int, local_update: SparseUpdate) -> ExchangeHandle:
        """Send this worker's update of ``step``; exchanges are started in step order on every worker."""


class _Exchange:
    """The contributions of one step gathered in process, merged once all workers have sent."""

    def __init__(self, step: int, num_workers: int, condition: threading.Condition) -> None:
        self.step = step
        self.contributions: list[SparseUpdate | None] = [None] * num_workers
        self.merged: SparseUpdate | None = None
        self._condition = condition

    def missing(self) -> list[int]:
        return [w for w, c in enumerate(self.contributions) if c is None]

    def contribute(self, worker: int, update: SparseUpdate, template: dict[str, Tensor]) -> None:
        if self.contributions[worker] is not None:
            raise RuntimeError(f"worker {worker} started the exchange of step {self.step} twice")
        self.contributions[worker] = update
        if not self.missing():
            self.merged = sum_in_order(self.contributions, template)
            self._condition.notify_all()


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


class VirtualEndpoint:
    """Worker ``worker``'s end of a :class:`VirtualTransport`."""

    def __init__(self, transport: VirtualTransport, worker: int) -> None:
        self._transport = transport
        self.worker = worker

    def start_exchange(self, step: int, local_update: SparseUpdate) -> VirtualHandle:
        return self._transport.contribute(step, self.worker, local_update)


class VirtualTransport:
    """In-process exchange for W virtual workers (thread-safe; merges in worker order).

    Args:
        num_workers: W.
        template: per parameter name, a tensor [N, ...] giving the gradient rows' trailing shape and dtype.
    """

    def __init__(self, num_workers: int, template: dict[str, Tensor]) -> None:
        self.num_workers = num_workers
        self.template = template
        self._condition = threading.Condition()
        self._exchanges: dict[int, _Exchange] = {}

    def endpoint(self, worker: int) -> VirtualEndpoint:
        """The transport as worker ``worker`` sees it."""
        return VirtualEndpoint(self, worker)

    def contribute(self, step: int, worker: int, update: SparseUpdate) -> VirtualHandle:
        """Add ``worker``'s update to the exchange of ``step``; its handle completes when all W have."""
        with self._condition:
            exchange = self._exchanges.setdefault(step, _Exchange(step, self.num_workers, self._condition))
            exchange.contribute(worker, update, self.template)
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
    """What one rank sends in a step: sparse rows, statistics entries (all its tasks) and tasks with statistics."""

    rows: int
    entries: int
    tasks: int


def _entries(stats: dict[str, Tensor]) -> int:
    """M_t, the entries of one task's statistics."""
    return next(iter(stats.values())).shape[0]


def _sizes_of(update: SparseUpdate) -> list[int]:
    """[rows, statistics entries, tasks with statistics] of a local update (the header every rank gathers)."""
    return [update.rows.numel(), sum(_entries(s) for s in update.stats), len(update.stats)]


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


def _pack_indices(update: SparseUpdate, layout: StatsLayout, longest: _Sizes, device: torch.device) -> Tensor:
    """The int64 part of a rank's message, [longest rows + entries x int statistics + tasks]: its rows, each int64
    statistic (task after task) and each task's entry count, each padded to the longest of any rank."""
    lengths = torch.tensor([_entries(s) for s in update.stats], dtype=torch.int64, device=device)
    stats = [_padded(_concat(update, name, torch.int64, device), longest.entries) for name in layout.index_names]
    return torch.cat([_padded(update.rows, longest.rows), *stats, _padded(lengths, longest.tasks)])


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


@dataclass(frozen=True)
class _Payload:
    """The payload all_gathers of an exchange, issued once the header is in: every rank's sizes, the works and
    their outputs (the statistics' values only when some rank has statistics)."""

    sizes: list[_Sizes]
    works: list[Any]
    indices: list[Tensor]
    packed: list[Tensor]
    stat_values: list[Tensor] | None


class DistributedHandle:
    """Handle of a torch.distributed exchange: its header all_gather in flight, then its payload all_gathers.

    The payload is issued by the first :meth:`done` or :meth:`wait` that finds the header arrived (it is sized
    from every rank's header); :meth:`done` never blocks, :meth:`wait` blocks at most ``timeout`` in all.
    """

    def __init__(
        self, transport: DistributedTransport, step: int, local_update: SparseUpdate, headers: list[Tensor], work: Any
    ) -> None:
        self.step = step
        self._transport = transport
        self._local_update: SparseUpdate | None = local_update
        self._headers = headers
        self._header_work = work
        self._payload: _Payload | None = None
        self._merged: SparseUpdate | None = None

    def done(self) -> bool:
        """Never blocks: polls the header, issues the payload once it is in (waiting for the complete header returns
        at once, raises if it failed, and on NCCL orders the current stream after the gather), polls the payload."""
        if self._merged is not None:
            return True
        if self._payload is None:
            if not self._header_work.is_completed():
                return False
            _wait(self._header_work, self._transport.timeout, self._what("row counts"))
            self._start_payload()
        return all(work.is_completed() for work in self._payload.works)

    def wait(self, timeout: float) -> SparseUpdate:
        if self._merged is None:
            deadline = time.monotonic() + timeout
            if self._payload is None:
                _wait(self._header_work, min(timeout, self._transport.timeout), self._what("row counts"))
                self._start_payload()
            for work in self._payload.works:
                _wait(work, deadline - time.monotonic(), self._what("sparse rows"))
            self._merged = self._merge()
        return self._merged

    def _what(self, part: str) -> str:
        """What a wait of this exchange waits for, for its errors: the step, the part and the ranks."""
        return f"exchange of step {self.step}: the {part} of ranks 0..{self._transport.world_size - 1}"

    def _start_payload(self) -> None:
        """Issue the payload all_gathers, sized from the headers (their work waited for); the local update is then
        let go."""
        sizes = [_Sizes(*values) for values in torch.stack(self._headers).tolist()]
        self._payload = self._transport.send_payload(self._local_update, sizes)
        self._local_update = None

    def _merge(self) -> SparseUpdate:
        """Every rank's update summed in rank order (``sum_in_order``), their statistics listed in rank order."""
        longest = _longest(self._payload.sizes)
        updates = [self._rank_update(rank, longest) for rank in range(self._transport.world_size)]
        return sum_in_order(updates, self._transport.template)

    def _rank_update(self, rank: int, longest: _Sizes) -> SparseUpdate:
        """Rank ``rank``'s update as it sent it: rows, gradients and its tasks' statistics."""
        payload = self._payload
        sizes, indices = payload.sizes[rank], payload.indices[rank]
        update = _unpack(indices[: sizes.rows], payload.packed[rank][: sizes.rows], self._transport.template)
        if sizes.tasks == 0:
            return update
        layout = self._transport.stats_layout
        stat_values = payload.stat_values
        empty = indices.new_empty((0, len(layout.value_names)), dtype=layout.value_dtype)
        values = empty if stat_values is None else stat_values[rank]
        return dataclasses.replace(update, stats=_unpack_stats(indices, values, layout, sizes, longest))


def _longest(sizes: list[_Sizes]) -> _Sizes:
    """The largest rows, entries and tasks of any rank (the padded lengths of the messages)."""
    return _Sizes(*(max(getattr(s, f) for s in sizes) for f in ("rows", "entries", "tasks")))


_SHORTEST_WAIT_S = 0.001
"""A collective's wait takes milliseconds and 0 ms means "no timeout": a spent deadline still waits 1 ms."""


def _wait(work: Any, timeout: float, what: str) -> None:
    """Wait for a collective; a timeout raises TimeoutError naming ``what``, other errors say what failed."""
    try:
        work.wait(timeout=datetime.timedelta(seconds=max(timeout, _SHORTEST_WAIT_S)))
    except RuntimeError as error:
        if "timed out" in str(error).lower():
            raise TimeoutError(f"waited {timeout:.3g} s for {what}") from error
        raise RuntimeError(f"{what} failed: {error}") from error


class DistributedTransport:
    """Sparse-update exchange over torch.distributed (gloo on CPU, NCCL on CUDA): one instance per rank.

    Nothing blocks at :meth:`start_exchange`: it issues the header all_gather and returns, so a rank that commits
    step s early goes on reading and rendering step s + 1 while the other ranks still compute step s. The payload
    is issued later, by the handle's first ``done()`` or ``wait()`` that finds the header arrived.

    Why every rank still issues the same collectives in the same order, header(s), payload(s), header(s + 1), ...:
    the runtime commits (starts the exchange of) step s + 1 only once step s is published (``_ready_to_commit``),
    and publishing s takes its merged update, which only exists once payload(s) was issued; payload(s) needs
    header(s) arrived, so it comes after header(s). So one exchange at most is in flight per rank, and polling
    ``done()`` at different moments on different ranks moves payload(s) in time, never past header(s + 1) or
    another exchange. No other collective can slip in between: replica checks (``replicas.py``) and the trainer's
    checkpoints run after ``settle`` (every started exchange published, nothing in flight), and the setup's
    broadcasts run before training.

    Args:
        template: per parameter name, a tensor [N, ...] giving the gradient rows' trailing shape, dtype and
            device (every name must share one dtype).
        timeout: the longest a handle's ``wait`` waits for the row counts (the header), within its own timeout.
        group: the process group (default: the world).
        stats_schema: per statistic name, its dtype (the render adapter's ``stats_schema``); None if the tasks
            carry no statistics.
    """

    def __init__(
        self,
        template: dict[str, Tensor],
        timeout: float = 60.0,
        group: Any = None,
        stats_schema: dict[str, torch.dtype] | None = None,
    ) -> None:
        dtypes = {ref.dtype for ref in template.values()}
        if len(dtypes) != 1:
            raise ValueError(f"all gradients must share one dtype to be packed, got {dtypes}")
        self.template = template
        self.timeout = timeout
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.stats_layout = StatsLayout.of(stats_schema)

    @property
    def device(self) -> torch.device:
        """The device of the gradients and of every message."""
        return next(iter(self.template.values())).device

    def start_exchange(self, step: int, local_update: SparseUpdate) -> DistributedHandle:
        """Issue the async all_gather of the header (row count, statistics entries, tasks with statistics) and
        return at once; the handle issues the payload when the header has arrived."""
        header = torch.tensor(_sizes_of(local_update), dtype=torch.int64, device=self.device)
        headers = [torch.zeros_like(header) for _ in range(self.world_size)]
        work = dist.all_gather(headers, header, group=self.group, async_op=True)
        return DistributedHandle(self, step, local_update, headers, work)

    def send_payload(self, local_update: SparseUpdate, sizes: list[_Sizes]) -> _Payload:
        """Issue the payload all_gathers, each padded to the longest of any rank: indices (rows, statistics' rows,
        tasks' entry counts), gradient rows, and the statistics' values when any rank has some."""
        longest = _longest(sizes)
        layout = self.stats_layout
        if local_update.stats and not layout.index_names + layout.value_names:
            raise ValueError("the tasks carry statistics but the transport has no stats_schema")
        indices, indices_work = self._all_gather(_pack_indices(local_update, layout, longest, self.device))
        packed, packed_work = self._all_gather(_padded(_pack(local_update, self.template), longest.rows))
        works = [indices_work, packed_work]
        values = None
        if longest.entries and layout.value_names:
            values, values_work = self._all_gather(_pack_stat_values(local_update, layout, longest, self.device))
            works.append(values_work)
        return _Payload(sizes, works, indices, packed, values)

    def _all_gather(self, tensor: Tensor) -> tuple[list[Tensor], Any]:
        """Start an async all_gather of ``tensor`` (one shape on every rank); returns the outputs and the work."""
        outputs = [torch.empty_like(tensor) for _ in range(self.world_size)]
        return outputs, dist.all_gather(outputs, tensor, group=self.group, async_op=True)
