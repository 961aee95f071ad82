"""A variable-size all-to-all of rows over torch.distributed (gloo on CPU, NCCL on CUDA), the exchange of the
sharded ("mixed parallel") mode: owners send parameter rows to the ranks whose views read them, readers send
gradient rows back to the owners; the row count of each (source, destination) pair differs and is often zero.

Why ``all_to_all_single`` with split sizes: on gloo the list form ``dist.all_to_all`` (and gsplat's
``all_to_all_tensor_list``) fails with uneven splits, while ``all_to_all_single`` takes them on gloo and NCCL. A
receiver does not know how many rows come, so one exchange is two collectives: the counts (int64 [W], one per
destination), then the payload split by them. A rank's piece for itself never enters the collectives: it is
handed back as is.

:class:`RowAllToAll` runs the exchanges on a progress thread, as ``comm/distributed.py`` runs the sparse-update
exchanges, with the same waits (asleep on a gloo future, polling on NCCL, each bounded by a timeout that names
what it waited for) and the same rule: every rank starts the same exchanges in the same order. :func:`pack_rows`
packs several per-row columns (parameters and their int64 versions) into one uint8 buffer, so they travel
together; :func:`all_to_all_rows` is the synchronous, differentiable form.

A piece may carry side tables with their own row counts: its columns named ``<table>.<column>`` (:func:`with_side`,
:func:`side_of`), e.g. a step's gradient rows with its densification statistics. :class:`TableAllToAll` sends all
of a piece's tables as one message (a header of row counts, then each table packed), so a step's small tables ride
on one exchange and pay one message latency, not one each.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from odin_nerfstudio.comm.waiting import Closed, wait_for_handle, wait_for_work
from odin_nerfstudio.core.sparse import tensor_bytes


@dataclass(frozen=True)
class RowLayout:
    """Where each table's bytes lie in a packed row: per name, its dtype and trailing shape, in packing order."""

    fields: tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]

    @classmethod
    def of(cls, tables: Mapping[str, Tensor]) -> RowLayout:
        """The layout of ``tables`` (a zero-row template will do: only dtypes and trailing shapes count)."""
        return cls(tuple((name, t.dtype, tuple(t.shape[1:])) for name, t in tables.items()))

    @property
    def row_bytes(self) -> int:
        """Bytes of one packed row."""
        return sum(math.prod(shape) * dtype.itemsize for _, dtype, shape in self.fields)


def pack_rows(tables: Mapping[str, Tensor]) -> Tensor:
    """Per-row tensors of one row count n and any dtypes as one contiguous uint8 [n, row_bytes] buffer, bit for bit
    (read back with :func:`unpack_rows` and ``RowLayout.of(tables)``). uint8, because bytes hold every dtype and
    gloo's and NCCL's all_to_all_single both take it."""
    counts = {t.shape[0] for t in tables.values()}
    if len(counts) != 1:
        raise ValueError(f"the tables must share one row count, got {counts}")
    n = counts.pop()
    columns = [t.contiguous().reshape(n, math.prod(t.shape[1:])).view(torch.uint8) for t in tables.values()]
    return torch.cat(columns, dim=1)


def unpack_rows(buffer: Tensor, layout: RowLayout) -> dict[str, Tensor]:
    """The tables of a :func:`pack_rows` buffer, uint8 [n, row_bytes], each a contiguous copy [n, ...]."""
    if buffer.dtype != torch.uint8 or buffer.dim() != 2 or buffer.shape[1] != layout.row_bytes:
        raise ValueError(f"expected a uint8 [n, {layout.row_bytes}] buffer, got {buffer.dtype} {list(buffer.shape)}")
    tables, start = {}, 0
    for name, dtype, shape in layout.fields:
        width = math.prod(shape) * dtype.itemsize
        # A copy with its own strides (contiguous() keeps a 1-row or empty slice's): in place, a column's rows
        # are not aligned for its dtype.
        column = buffer[:, start : start + width].clone(memory_format=torch.contiguous_format)
        tables[name] = column.view(dtype).reshape(buffer.shape[0], *shape)
        start += width
    return tables


@dataclass(frozen=True)
class RowBytes:
    """Bytes of one exchange, counted from the tensors passed to its collectives (the counts message, 8 W bytes
    each way, included; the piece a rank keeps is not)."""

    sent: int
    received: int


Wait = Callable[[Any, str], None]
"""Waits for a collective's work; its second argument names the collective ("counts" or "payload")."""


def _validated(pieces: Sequence[Tensor], world_size: int) -> None:
    """Raise ``ValueError`` unless there is one piece per rank, all of one dtype, device and trailing shape."""
    if len(pieces) != world_size:
        raise ValueError(f"expected one piece per rank ({world_size}), got {len(pieces)}")
    kinds = {(p.dtype, p.device, tuple(p.shape[1:])) for p in pieces}
    if len(kinds) != 1:
        raise ValueError(f"the pieces must share dtype, device and trailing shape, got {sorted(map(str, kinds))}")


def _send_buffer(pieces: Sequence[Tensor], rank: int) -> tuple[Tensor, list[int]]:
    """The pieces for the other ranks, in rank order, as one contiguous tensor, and its rows per destination (0 for
    ``rank``, whose piece stays here)."""
    splits = [0 if r == rank else p.shape[0] for r, p in enumerate(pieces)]
    return torch.cat([p[:0] if r == rank else p for r, p in enumerate(pieces)]), splits


def _counts(splits: list[int], device: torch.device, group: Any, wait: Wait) -> tuple[list[int], int]:
    """The rows each rank sends this one (the counts collective), and the bytes of each of its two tensors."""
    sent = torch.tensor(splits, dtype=torch.int64, device=device)
    received = torch.empty_like(sent)
    wait(dist.all_to_all_single(received, sent, group=group, async_op=True), "counts")
    return received.tolist(), tensor_bytes(sent)


def _payload(send: Tensor, send_splits: list[int], recv_splits: list[int], group: Any, wait: Wait) -> Tensor:
    """The rows from every rank, in rank order (the payload collective, issued even when nothing moves: every rank
    must issue it, and none knows whether the others send)."""
    received = send.new_empty((sum(recv_splits), *send.shape[1:]))
    wait(dist.all_to_all_single(received, send, recv_splits, send_splits, group=group, async_op=True), "payload")
    return received


def _exchange(pieces: Sequence[Tensor], rank: int, group: Any, wait: Wait) -> tuple[list[Tensor], RowBytes]:
    """Both collectives of one exchange: per source rank, the rows it sent this one (``pieces[rank]`` itself for
    this rank's own), and the bytes."""
    send, send_splits = _send_buffer(pieces, rank)
    recv_splits, counts_bytes = _counts(send_splits, send.device, group, wait)
    received = _payload(send, send_splits, recv_splits, group, wait)
    out = list(received.split(recv_splits))
    out[rank] = pieces[rank]
    return out, RowBytes(counts_bytes + tensor_bytes(send), counts_bytes + tensor_bytes(received))


def _describe(what: str, collective: str, world_size: int) -> str:
    """An exchange's wait, for its errors: what it moves, the collective and the ranks."""
    return f"{what}: the {collective} all_to_all of ranks 0..{world_size - 1}"


class RowHandle:
    """An exchange of :class:`RowAllToAll` in flight; its progress thread completes it."""

    def __init__(self, owner: RowAllToAll, what: str, pieces: Sequence[Tensor]) -> None:
        self.what = what
        self._owner = owner
        self._pieces: Sequence[Tensor] | None = pieces
        self._ready = _cuda_event(pieces[0].device)
        """On CUDA, what the rows' next user waits for: the pieces' producer, then (once done) the exchange."""
        self.collective = "counts"
        """What the exchange waits for now: "counts" (or an exchange ahead of it), then "payload"."""
        self.received: list[Tensor] | None = None
        self.bytes: RowBytes | None = None
        """Its bytes, once done."""
        self.error: BaseException | None = None

    def done(self) -> bool:
        """Never blocks: whether the rows are in; raises the exchange's error."""
        with self._owner.condition:
            if self.error is not None:
                raise self.error
            return self.received is not None

    def wait(self, timeout: float) -> list[Tensor]:
        """Per source rank, in rank order, the [m_r, ...] rows it sent this rank (this rank's own piece itself);
        raises ``TimeoutError`` naming the exchange and the collective still missing after ``timeout``, or the
        exchange's error."""
        with self._owner.condition:
            wait_for_handle(
                self._owner.condition, lambda: self.received is not None, lambda: self.error, timeout,
                lambda: _describe(self.what, self.collective, self._owner.world_size),
            )  # fmt: skip
            if self._ready is not None:  # the caller's stream reads the rows after the collectives wrote them
                self._ready.wait()
            return self.received


class RowAllToAll:
    """Variable-size, asynchronous all-to-all of rows over torch.distributed: one instance per rank.

    :meth:`start` queues a rank's pieces (``pieces[r]`` for rank r) and returns a :class:`RowHandle` at once; a
    progress thread issues each exchange's two collectives (counts, then payload) and waits on them, one exchange
    after the other in the order started. gloo and NCCL pair the ranks' collectives by issue order, so every rank
    must start the same exchanges in the same order (a rank with nothing to send passes empty pieces), and no
    other collective of ``group`` may run while an exchange is in flight. An error (a timeout naming the exchange
    and the collective, or a failed collective) fails that exchange and every later one. Whoever creates it closes
    it before the process group is destroyed.

    Args:
        timeout: the longest the progress thread waits for any one collective.
        group: the process group (default: the world).
    """

    def __init__(self, timeout: float = 60.0, group: Any = None) -> None:
        self.timeout = timeout
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.condition = threading.Condition()
        self._queue: queue.SimpleQueue[RowHandle | None] = queue.SimpleQueue()
        self._in_flight: list[RowHandle] = []
        self._error: BaseException | None = None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, pieces: Sequence[Tensor], what: str) -> RowHandle:
        """Queue one exchange and return at once: ``pieces[r]``, [n_r, ...] (n_r may be 0; one dtype, device and
        trailing shape for all, the same on every rank), goes to rank r; ``what`` names it in errors (e.g. "fetch
        of step 12"). The pieces must not change until the handle is done; the own piece comes back as is.

        Raises:
            ValueError: not one piece per rank, or pieces of different dtypes, devices or trailing shapes.
        """
        _validated(pieces, self.world_size)
        handle = RowHandle(self, what, pieces)
        with self.condition:
            if self._error is not None or self._closed.is_set():
                handle.error = self._error or RuntimeError(f"{what}: the all-to-all is closed")
                return handle
            self._in_flight.append(handle)
        if self._thread is None:
            self._thread = threading.Thread(target=self._progress, name="odin-all-to-all", daemon=True)
            self._thread.start()
        self._queue.put(handle)
        return handle

    def close(self) -> None:
        """Stop the progress thread (exchanges in flight fail, naming the closed all-to-all); idempotent."""
        self._closed.set()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5.0)

    def _progress(self) -> None:
        """The progress thread: every exchange in the order started, until closed or one fails (then its error is
        every later exchange's: the ranks' collective order is lost)."""
        while (handle := self._queue.get()) is not None:
            try:
                received, spent = self._run(handle)
            except Closed:
                describe = _describe(handle.what, handle.collective, self.world_size)
                error: BaseException = RuntimeError(f"{describe}: the all-to-all was closed")
            except BaseException as failure:  # noqa: BLE001 - every failure must reach the waiting handles
                error = failure
            else:
                with self.condition:
                    handle.received, handle.bytes, handle._pieces = received, spent, None
                    self._in_flight.remove(handle)
                    self.condition.notify_all()
                continue
            with self.condition:
                self._error = error
                for failed in self._in_flight:
                    failed.error, failed._pieces = error, None
                self._in_flight.clear()
                self.condition.notify_all()
            return

    def _run(self, handle: RowHandle) -> tuple[list[Tensor], RowBytes]:
        """One exchange, in the progress thread (on CUDA after the pieces' producer, then marked for their user)."""
        device = handle._pieces[0].device
        if handle._ready is not None:
            torch.cuda.set_device(device)
            handle._ready.wait()

        def wait(work: Any, collective: str) -> None:
            handle.collective = collective
            describe = _describe(handle.what, collective, self.world_size)
            wait_for_work(work, device, self.timeout, self._closed, describe)

        received, spent = _exchange(handle._pieces, self.rank, self.group, wait)
        handle._ready = _cuda_event(device)
        return received, spent


def _cuda_event(device: torch.device) -> torch.cuda.Event | None:
    """On CUDA, an event recorded on the current stream (where the pieces were made); None on CPU."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class _AllToAllRows(torch.autograd.Function):
    """The all-to-all of rows whose backward sends each received piece's gradient back to its sender."""

    @staticmethod
    def forward(ctx: Any, group: Any, timeout: float, *pieces: Tensor) -> tuple[Tensor, ...]:
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        _validated(pieces, world_size)
        device = pieces[0].device

        def wait(work: Any, collective: str) -> None:
            wait_for_work(work, device, timeout, None, _describe("all_to_all_rows", collective, world_size))

        received, _ = _exchange(pieces, rank, group, wait)
        ctx.group, ctx.timeout, ctx.rank, ctx.device = group, timeout, rank, device
        ctx.sent = [p.shape[0] for p in pieces]
        return tuple(received)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        world_size = len(grads)

        def wait(work: Any, collective: str) -> None:
            describe = _describe("all_to_all_rows backward", collective, world_size)
            wait_for_work(work, ctx.device, ctx.timeout, None, describe)

        # Along the reverse splits (the payload alone: both ends know the counts). An unused piece's gradient
        # comes as zeros (autograd materializes it), so every split holds what its receiver expects.
        send, send_splits = _send_buffer(grads, ctx.rank)
        recv_splits = [0 if r == ctx.rank else n for r, n in enumerate(ctx.sent)]
        back = list(_payload(send, send_splits, recv_splits, ctx.group, wait).split(recv_splits))
        back[ctx.rank] = grads[ctx.rank]
        return (None, None, *back)


def all_to_all_rows(pieces: Sequence[Tensor], group: Any = None, timeout: float = 60.0) -> list[Tensor]:
    """Synchronous, differentiable all-to-all: ``pieces[r]`` [n_r, ...] goes to rank r; returns per source rank its
    [m_r, ...] piece for this rank. Backward sends each returned piece's gradient back to its sender, so gradients
    of a loss on the received rows reach the senders' ``pieces``.

    Every rank calls it (and its backward, i.e. every rank's loss depends on its result) in the same order, with
    no :class:`RowAllToAll` exchange of ``group`` in flight; each collective waits at most ``timeout``.
    """
    return list(_AllToAllRows.apply(group, timeout, *pieces))


SIDE = "."
"""Separates a side table's name from its column's in a piece's keys (``stats.rows``); main columns have none."""


def with_side(piece: Mapping[str, Tensor], name: str, table: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``piece`` with ``table`` (its own row count) as side table ``name``."""
    return {**piece, **{f"{name}{SIDE}{column}": value for column, value in table.items()}}


def side_of(piece: Mapping[str, Tensor], name: str) -> dict[str, Tensor]:
    """Side table ``name`` of ``piece`` (empty: none)."""
    prefix = f"{name}{SIDE}"
    return {key[len(prefix):]: value for key, value in piece.items() if key.startswith(prefix)}


def main_of(piece: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The main table of ``piece``: its columns that belong to no side table."""
    return {key: value for key, value in piece.items() if SIDE not in key}


def tables_of(piece: Mapping[str, Tensor]) -> dict[str, dict[str, Tensor]]:
    """A piece's tables by name ("" the main one), columns in the piece's order."""
    tables: dict[str, dict[str, Tensor]] = {}
    for key, value in piece.items():
        name, _, column = key.rpartition(SIDE)
        tables.setdefault(name, {})[column] = value
    return tables


@dataclass(frozen=True)
class MessageLayout:
    """Where a packed piece's tables lie: per table name, its :class:`RowLayout`, in packing order."""

    tables: tuple[tuple[str, RowLayout], ...]

    @classmethod
    def of(cls, piece: Mapping[str, Tensor]) -> MessageLayout:
        """The layout of ``piece`` (every piece of an exchange has the same tables and columns)."""
        return cls(tuple((name, RowLayout.of(table)) for name, table in tables_of(piece).items()))


def pack_message(piece: Mapping[str, Tensor]) -> Tensor:
    """A piece's tables as one uint8 [bytes] message: each table's :func:`pack_rows`, in order, after a header of
    their int64 row counts (no header for a piece of one table: its row count is its bytes / row bytes)."""
    tables = list(tables_of(piece).values())
    packed = [pack_rows(table).reshape(-1) for table in tables]
    if len(tables) == 1:
        return packed[0]
    counts = [next(iter(table.values())).shape[0] for table in tables]
    header = torch.tensor(counts, dtype=torch.int64, device=packed[0].device).view(torch.uint8)
    return torch.cat([header, *packed])


def unpack_message(message: Tensor, layout: MessageLayout) -> dict[str, Tensor]:
    """:func:`pack_message`'s inverse: the piece's columns, side tables' under their prefixed names."""
    if len(layout.tables) == 1:
        ((_, rows),) = layout.tables
        counts, start = [message.numel() // rows.row_bytes if rows.row_bytes else 0], 0
    else:
        start = 8 * len(layout.tables)
        counts = message[:start].clone().view(torch.int64).tolist()
    piece: dict[str, Tensor] = {}
    for (name, rows), count in zip(layout.tables, counts, strict=True):
        width = count * rows.row_bytes
        table = unpack_rows(message[start : start + width].reshape(count, rows.row_bytes), rows)
        piece.update({f"{name}{SIDE}{column}" if name else column: value for column, value in table.items()})
        start += width
    return piece


class TableAllToAll:
    """Row tables (per-row tensors of one row count, any dtypes, and side tables) through a :class:`RowAllToAll`:
    each piece packed into one message (:func:`pack_message`), unpacked on arrival; every piece of an exchange has
    the same tables and columns."""

    def __init__(self, rows: RowAllToAll) -> None:
        self.rows = rows

    def start(self, pieces: Sequence[Mapping[str, Tensor]], what: str) -> TableHandle:
        """Send ``pieces[r]`` to rank r, at once (see :meth:`RowAllToAll.start`)."""
        layout = MessageLayout.of(pieces[0])
        return TableHandle(self.rows.start([pack_message(piece) for piece in pieces], what), layout)

    def close(self) -> None:
        """Stop the row exchange's progress thread."""
        self.rows.close()


class TableHandle:
    """A table exchange in flight."""

    def __init__(self, handle: RowHandle, layout: MessageLayout) -> None:
        self.handle, self.layout = handle, layout

    @property
    def bytes(self) -> RowBytes | None:
        """Its bytes, once done."""
        return self.handle.bytes

    def done(self) -> bool:
        """Never blocks: whether the tables are in."""
        return self.handle.done()

    def wait(self, timeout: float) -> list[dict[str, Tensor]]:
        """Per source rank, in rank order, the piece it sent this rank (this rank's own as it was passed)."""
        received = self.handle.wait(timeout)
        return [unpack_message(message, self.layout) for message in received]
