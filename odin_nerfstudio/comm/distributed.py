"""The torch.distributed transport (gloo on CPU, NCCL on CUDA): one :class:`DistributedTransport` per rank, whose
progress thread runs every exchange's collectives, in step order, behind the ``comm/protocol.py`` interface.

Its design, in four decisions:

- A progress thread per transport owns every collective of the exchanges. ``start_exchange`` only queues (step, update);
  the thread issues the header all_gather (each rank's rows, statistics entries, tasks, span, asked rows and whether it
  asks, and its tasks' squared gradient norms, ``SparseUpdate.sq_norms``, float64 bits as int64; ``comm/wire.py``),
  waits, issues the payload sized from it, waits, merges and marks the handle done. Why: a payload sized from the header
  cannot be issued with it, and when the main thread issued it (at its next ``done()`` / ``wait()``), a rank deep in a
  long render held back every rank's payload. Now progress never depends on a rank polling; ``done()`` never blocks and
  ``wait(timeout)`` waits on a condition. Each collective is waited for at most the transport's ``timeout``, asleep on
  its future on gloo, polling its completion on NCCL (never a timed wait on the work: on gloo that timeout becomes the
  collective's own, so a short one fails it when a peer is late; :meth:`DistributedTransport.close` ends the wait); an
  error (a timeout naming the step and what it waited for, or a failed collective) fails that exchange and every later
  one, and reaches their next ``done()`` / ``wait()``. Whoever creates the transport (the trainer) closes it before the
  launcher destroys the process group, as the launcher stops the heartbeat.
- Any number of exchanges may be in flight, and the thread runs them one after the other in step order. Why: gloo
  and NCCL pair the ranks' collectives by the order they are issued, so every rank must issue the same sequence;
  the runtime starts exchanges in step order on every rank (a step out of order is an error), and one thread that
  issues all of them in that order makes the sequence identical on every rank whatever each rank's timing. For the
  same reason a collective from the main thread (a replica check, the barrier after rank 0's work) may run only
  when no exchange is in flight, after the runtime's ``settle``: :func:`require_no_exchange_in_flight`, given the
  owner's transports, makes a violation an error instead of a silent interleaving.
- Per step, the gradient rows travel by the cheapest of three exchanges, sparse all-gather, union-then-reduce or
  dense all-reduce (``comm/exchange_choice.py``); each handle tells its choice and its bytes, predicted per choice
  and counted from the tensors passed to the collectives (:class:`ExchangeBytes`).
- Rows asked for first (the runtime's priority publication): ``start_exchange(step, update, first)`` names rows
  a rank wants before the rest. Where any rank asks, the asked rows travel in the int64 message as runs of
  consecutive rows (``wire.runs_of``), then (unless the exchange is dense, whose first part comes with the whole
  update) P = U n the asked rows is known on every rank, each rank's gradient rows of P are all-gathered and
  summed in rank order (:meth:`DistributedTransport._first`, bit for bit the sums the whole exchange gives them),
  delivered as the handle's :class:`FirstPart`, and the rest travel by the chosen exchange without them.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from odin_nerfstudio.comm.exchange_choice import (
    CHOICES,
    ExchangeBytes,
    ExchangeChoice,
    ExchangeShape,
    estimated_union,
)
from odin_nerfstudio.comm.protocol import FirstPart, chosen_rows
from odin_nerfstudio.comm import wire
from odin_nerfstudio.comm.waiting import Closed, wait_for_handle, wait_for_work
from odin_nerfstudio.comm.wire import INDEX_BYTES, Sizes, StatsLayout
from odin_nerfstudio.core.conflicts import isin_sorted, union_sorted
from odin_nerfstudio.core.sparse import Merge, SparseUpdate, joined, sum_in_order, tensor_bytes


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
            arrived = lambda: self.merged is not None  # noqa: E731
            what = lambda: self.what(self.part)  # noqa: E731
            wait_for_handle(self._transport.condition, arrived, lambda: self.error, timeout, what)
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
            arrived = lambda: self.first_part is not None or self.merged is not None  # noqa: E731
            what = lambda: self.what(self.part)  # noqa: E731
            wait_for_handle(self._transport.condition, arrived, lambda: self.error, timeout, what)
            if self.first_part is None:
                raise RuntimeError(f"exchange of step {self.step}: no rank asked for rows first")
            return self.first_part

    def what(self, part: str) -> str:
        """What a wait of this exchange waits for, for its errors: the step, the part and the ranks."""
        return f"exchange of step {self.step}: the {part} of ranks 0..{self._transport.world_size - 1}"


def require_no_exchange_in_flight(what: str, transports: Iterable[DistributedTransport]) -> None:
    """Raise if an exchange of ``transports`` (their owner's, every one of this process) is in flight: a collective
    from the main thread (``what``: a replica check, a barrier) would interleave with the progress thread's and
    break the rank-identical order.

    Raises:
        RuntimeError: naming ``what`` and the steps in flight (call the runtime's ``settle`` first).
    """
    steps = sorted(step for transport in transports for step in transport.in_flight())
    if steps:
        raise RuntimeError(
            f"{what}: a collective from the main thread while the exchanges of steps {steps} are in flight; the "
            "progress thread owns the collectives until the runtime has settled (every started step published)"
        )


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
        choice: "auto" (per step, the least predicted time) or a forced "sparse", "union", "dense".
        merge: the sum of the ranks' gathered parts in rank order (``sum_in_order`` or an op equal to it bit for
            bit).
        latency_bytes: the link's latency x bandwidth, what "auto" weighs each collective's latency at
            (``exchange_choice.RingBytes.fastest``; 0: the fewest bytes); the same on every rank.
    """

    def __init__(
        self,
        template: dict[str, Tensor],
        timeout: float = 60.0,
        group: Any = None,
        stats_schema: dict[str, torch.dtype] | None = None,
        choice: ExchangeChoice = "auto",
        merge: Merge = sum_in_order,
        latency_bytes: float = 0.0,
    ) -> None:
        dtypes = {ref.dtype for ref in template.values()}
        if len(dtypes) != 1:
            raise ValueError(f"all gradients must share one dtype to be packed, got {dtypes}")
        if choice not in ("auto", *CHOICES):
            raise ValueError(f"unknown exchange {choice!r}; choose one of auto, {', '.join(CHOICES)} (--exchange)")
        self.template = template
        self.latency_bytes = latency_bytes
        self.timeout = timeout
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.stats_layout = StatsLayout.of(stats_schema)
        self.choice = choice
        self.merge = merge
        self.shape = ExchangeShape(
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

    def _progress(self) -> None:
        """The progress thread: every exchange in step order until closed or a collective fails (then that error
        is every later exchange's: the ranks' collective order is lost)."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        while (handle := self._queue.get()) is not None:
            try:
                merged, spent = self._exchange(handle)
            except Closed:
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
        header = wire.header_of(update, handle.asked, len(self.template), self.device)
        headers, work = self._all_gather(header, issued)
        self._wait(work, handle, "row counts")
        sizes, sq_norms = wire.read_headers(headers)
        longest = wire.longest_of(sizes)
        asks = bool(longest.asks)
        predicted = shape.predict(sizes, estimated_union(sizes))
        choice = self.choice
        if choice == "auto" and shape.fastest(predicted, self.latency_bytes) == "dense":
            choice = "dense"
        # The int64 message: rows (unless dense), int statistics, tasks' entry counts, asked rows (as runs); then
        # the statistics' values. The dense exchange sends no rows ahead of the gradients: its first part comes
        # with the whole update.
        lengths = dataclasses.replace(longest, rows=0) if choice == "dense" else longest
        works, indices, values = [], None, None
        if lengths.rows or lengths.tasks or lengths.asked:
            message = wire.pack_indices(update, handle.asked, layout, lengths, self.device)
            indices, work = self._all_gather(message, issued)
            works.append(work)
        if longest.entries and layout.value_names:
            values, work = self._all_gather(wire.pack_stat_values(update, layout, longest, self.device), issued)
            works.append(work)
        for work in works:
            self._wait(work, handle, "sparse rows")
        stats = wire.gathered_stats(layout, sizes, lengths, indices, values)
        packed, rows = wire.pack(update, self.template), update.rows
        rank_rows = None  # every rank's rows, where they travelled
        if lengths.rows or choice != "dense":
            empty = rows.new_empty(0)
            rank_rows = [empty if indices is None else indices[r][: size.rows] for r, size in enumerate(sizes)]
        first, asked = None, None
        if asks:
            asked = [
                rows[:0] if indices is None else wire.asked_rows(indices[r], layout, size, lengths)
                for r, size in enumerate(sizes)
            ]
        if asks and choice != "dense":
            first, masks = self._first(handle, rank_rows, asked, sizes, packed, issued)
            rank_rows = [ranks_rows[~mask] for ranks_rows, mask in zip(rank_rows, masks, strict=True)]
            rest = torch.nonzero(~masks[self.rank]).flatten()  # one index_select of the wide rows: see _first
            rows, packed = rows.index_select(0, rest), packed.index_select(0, rest)
        union = None
        if choice != "dense":
            union = union_sorted(rank_rows, self.device)
            rest = [dataclasses.replace(size, rows=r.numel()) for size, r in zip(sizes, rank_rows, strict=True)]
            predicted = shape.predict(rest, union.numel())
            if choice == "auto":
                choice = shape.fastest({name: predicted[name] for name in ("sparse", "union")}, self.latency_bytes)
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
        counted = shape.sent(issued)
        spent = ExchangeBytes(choice, predicted, union is not None, counted, counted, tuple(issued))
        return merged, spent

    def _first(
        self,
        handle: DistributedHandle,
        rank_rows: list[Tensor],
        asked: list[Tensor],
        sizes: list[Sizes],
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
            # the positions, then one index_select: a boolean mask on the wide packed rows costs several times more
            mine = packed.index_select(0, torch.nonzero(masks[self.rank]).flatten())
            gathered, work = self._all_gather(wire.padded(mine, max(counts)), issued)
            self._wait(work, handle, "first rows")
            parts = [
                wire.unpack(r[mask], gathered[rank][:count], self.template)
                for rank, (r, mask, count) in enumerate(zip(rank_rows, masks, counts, strict=True))
            ]
            update = self.merge(parts, self.template)
        else:
            update = wire.unpack(first, packed[:0], self.template)
        sent = wire.first_bytes(rank_rows, [INDEX_BYTES * size.asked for size in sizes], counts, self.template)
        part = FirstPart(union, update, sent)
        with self.condition:
            handle.first_part = part
            self.condition.notify_all()
        return part, masks

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
            empty = wire.unpack(packed.new_empty(0, dtype=torch.int64), packed, self.template)
            return dataclasses.replace(empty, stats=stats)
        gathered, work = self._all_gather(wire.padded(packed, longest), issued)
        self._wait(work, handle, "gradient rows")
        updates = [wire.unpack(r, gathered[rank][: r.numel()], self.template) for rank, r in enumerate(rank_rows)]
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
        return dataclasses.replace(wire.unpack(union, total, self.template), stats=stats)

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
        return dataclasses.replace(wire.unpack(union, total[union, :width], self.template), stats=stats)

    def _wait(self, work: Any, handle: DistributedHandle, part: str) -> None:
        """Wait (in the progress thread) for a collective of ``handle``'s exchange, at most :attr:`timeout`, noticing
        :meth:`close` (``comm/waiting.py``); a timeout raises ``TimeoutError`` naming the step and part."""
        handle.part = part
        wait_for_work(work, self.device, self.timeout, self._closed, handle.what(part))

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
