"""An emulated interconnect around any :class:`~odin_nerfstudio.comm.protocol.Transport`: an exchange is delivered
only once every worker's message has crossed a modeled link (latency + bytes / bandwidth).

Why: on one CPU machine, gloo over loopback makes an exchange nearly free, so a barrier loses only to imbalance; on
a GPU cluster the exchange is a real share of a step (the Odin paper's idle of up to 26% per GPU under the barrier).
This module is an emulation that stands for such links, applied identically to every mode, so that the modes are
compared on a fair stage. It is off by default (``--interconnect none``).

The model, per exchange of step s: worker r's message leaves when r starts its exchange (``send_r``) and arrives
everywhere at ``send_r + latency + bytes_r / bandwidth``, bytes_r being its sparse update's size
(:attr:`~odin_nerfstudio.core.sparse.SparseUpdate.nbytes`: rows, gradient rows, statistics, and the rows it asks
for first). The exchange is delivered on every worker at the latest arrival, as a collective completes everywhere
once every part has crossed. Where workers asked for rows first, the message sends its rows and asked rows, then the
asked-for gradient rows, then the rest: the first part is delivered at the latest ``send_r + latency + first_r /
bandwidth``, first_r being worker r's bytes up to it (:attr:`~odin_nerfstudio.comm.protocol.FirstPart.sent_bytes`).
Messages do not contend for a link (a full-bisection network, one message per worker and exchange), which is the
all-gather of two workers exactly and an optimistic bound for more.

How, without the runtime knowing: :class:`LinkedTransport` wraps a worker's transport. At ``start_exchange`` it posts
its message's departure and modeled arrival on a board shared by the workers (:class:`LocalBoard` in one process,
:class:`StoreBoard` on torch.distributed's key-value store, beside the collectives, never among them) and starts the
real exchange at once. Its handle is done when the real exchange is done, every worker's arrival is on the board
and the clock has passed the latest one; ``wait`` sleeps only for what remains of the modeled delay. Nothing sleeps
at the start or in ``done``, so the delay runs while the worker computes, as on a real link, and a worker that polls
late finds the exchange delivered. The store's round trips (a post, a read of every rank's, the last reader's
deletes: 4-7 ms per step on this loaded 2-core machine, measured) run in the board's own thread, not the worker's:
they stand for nothing a real link does, and on the worker's thread they sat on its critical path whenever it
polled between two tasks.

Clock: ``time.time`` by default, one clock for every process of a machine (and, NTP-synchronized, roughly of a
cluster, where a real link exists anyway); tests pass a fake clock.

Presets (:data:`PRESETS`): real link classes slowed by :data:`DILATION`, how much slower the CPU rasterizer trains a
view than a GPU, so that communication takes the share of a step it takes beside a GPU. See :data:`PRESETS` for the
values and how they were chosen.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from torch import Tensor

from odin_nerfstudio.comm.inprocess import VirtualTransport
from odin_nerfstudio.comm.protocol import ExchangeHandle, FirstPart, Transport
from odin_nerfstudio.comm.wire import asked_bytes
from odin_nerfstudio.core.sparse import SparseUpdate

Clock = Callable[[], float]
"""Seconds, the same clock on every worker of a run."""
Sleep = Callable[[float], None]


@dataclass(frozen=True)
class LinkModel:
    """A link: every message is delayed by ``latency_s + bytes / bandwidth_bytes_per_s``.

    Attributes:
        name: what it stands for.
        latency_s: per-message latency, seconds.
        bandwidth_bytes_per_s: bytes per second.
    """

    name: str
    latency_s: float
    bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.bandwidth_bytes_per_s <= 0:
            raise ValueError(f"link {self.name}: latency must be >= 0 and bandwidth > 0, got {self}")

    def delay_s(self, nbytes: int) -> float:
        """Seconds a message of ``nbytes`` bytes takes to cross the link."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


InterconnectName = Literal["none", "10gbe", "pcie"]
"""The trainer's and the benchmark's ``--interconnect`` choices: no model, or a preset of :data:`PRESETS`."""

DILATION = 75.0
"""How much slower this machine computes a training view than a GPU: the CPU rasterizer's render + backward of a
128x96 view of bench_train's 300 m street takes about 60 ms per task (render 44-49 ms + backward 14-16 ms, its
barrier timelines on an idle machine, 2026-12-01), gsplat's on a GPU about 0.8 ms (an estimate: no GPU was at hand
to measure it). A link is emulated slowed by the same factor, so that an exchange takes the share of a step it
takes beside a GPU."""


def _scaled(name: str, latency_s: float, bandwidth_bytes_per_s: float) -> LinkModel:
    """A real link's latency and bandwidth, slowed by :data:`DILATION`."""
    return LinkModel(f"{name} slowed {DILATION:g}x", latency_s * DILATION, bandwidth_bytes_per_s / DILATION)


PRESETS: dict[str, LinkModel] = {
    "10gbe": _scaled("10 GbE (1.25 GB/s, 50 us)", 50e-6, 1.25e9),
    "pcie": _scaled("PCIe 4.0 x16 through the host (12 GB/s, 10 us)", 10e-6, 12e9),
}
"""Named links: 10 GbE between GPU nodes, and PCIe between the GPUs of one box without NVLink (NCCL through host
memory), at their nominal bandwidth, latency with the software stack, slowed by :data:`DILATION`.

How they were chosen: on bench_train's 300 m street (2 gloo ranks, one thread each, 120 steps) a step's exchange
writes 536 rows on average (median 196, at most 2,860 when a view looks down the street), a rank's message about
250 bytes per row, and a barrier step lasts about 80 ms. ``10gbe`` delays a median message by 3.75 ms + 30 KB /
16.7 MB/s = 5.6 ms and the largest by about 45 ms, which puts the barrier's idle share near the paper's 15-26% (the
measured figure is in BENCHMARKS.md, bench_train); ``pcie`` adds about 0.9 ms to a median message. On a loaded
machine every compute span stretches and the fixed delays weigh less."""


def link_preset(name: str) -> LinkModel | None:
    """The link named ``name`` (a key of :data:`PRESETS`), or None for ``"none"``."""
    if name == "none":
        return None
    if name not in PRESETS:
        raise ValueError(f"unknown interconnect {name!r}; choose one of none, {', '.join(PRESETS)}")
    return PRESETS[name]


Post = tuple[float, float]
"""A worker's message of a step: when it left and when it arrives everywhere (seconds)."""


class ArrivalBoard(Protocol):
    """Where the workers of a run post when their message of a step leaves and arrives, and read every worker's."""

    def post(self, step: int, worker: int, sent_s: float, arrival_s: float) -> None:
        """Worker ``worker``'s message of ``step`` left at ``sent_s`` and arrives everywhere at ``arrival_s``."""

    def ready(self, step: int) -> bool:
        """Whether every worker's post of ``step`` can be read now without waiting."""

    def posts(self, step: int, worker: int, timeout: float | None = None) -> list[Post]:
        """Every worker's (sent, arrival) of ``step``, in worker order; asked by each worker once, waiting at most
        ``timeout`` seconds (None: the board's own bound) for the posts to be readable."""


class _Arrivals:
    """The posts of one step's messages in one process."""

    def __init__(self, num_workers: int) -> None:
        self.times: list[Post | None] = [None] * num_workers
        self.readers = 0


class LocalBoard:
    """An :class:`ArrivalBoard` for W workers of one process (thread-safe); a step is forgotten once all W read."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._lock = threading.Lock()
        self._steps: dict[int, _Arrivals] = {}

    def post(self, step: int, worker: int, sent_s: float, arrival_s: float) -> None:
        with self._lock:
            self._steps.setdefault(step, _Arrivals(self.num_workers)).times[worker] = (sent_s, arrival_s)

    def ready(self, step: int) -> bool:
        with self._lock:
            arrivals = self._steps.get(step)
            return arrivals is not None and None not in arrivals.times

    def posts(self, step: int, worker: int, timeout: float | None = None) -> list[Post]:
        """Raises ``RuntimeError`` at once when a worker has not posted (the workers of one process post in turn,
        so waiting would never end)."""
        with self._lock:
            arrivals = self._steps[step]
            if None in arrivals.times:
                missing = [w for w, t in enumerate(arrivals.times) if t is None]
                raise RuntimeError(f"step {step}: worker {worker} asked for the delivery before workers {missing} sent")
            arrivals.readers += 1
            if arrivals.readers == self.num_workers:
                del self._steps[step]
            return list(arrivals.times)


class StoreBoard:
    """An :class:`ArrivalBoard` on a torch.distributed key-value store (default: the process group's own), one per
    rank.

    Each rank sets ``odin/<namespace>/<step>/<rank>``; the last rank to read a step (an atomic counter) deletes its keys. The
    store is a side channel: it never issues a collective, so the ranks' collectives keep their order. Its round trips
    run in the board's daemon thread, in the order of the posts: ``post`` queues this rank's post, the thread sets it,
    reads every rank's (the store's get waits for keys not set yet, at most the store's timeout) and keeps them for
    ``posts``. Every rank posts its steps in order and posts a step before reading it, so the thread never waits on
    a rank that waits on it.
    """

    def __init__(self, world_size: int, store: Any = None, namespace: str = "link") -> None:
        import torch.distributed as dist

        self.world_size, self.namespace = world_size, namespace
        self._store = store if store is not None else dist.distributed_c10d._get_default_store()
        self._queue: queue.SimpleQueue[tuple[int, int, str]] = queue.SimpleQueue()
        self._read = threading.Condition()
        self._posts: dict[int, list[Post] | Exception] = {}
        self._thread: threading.Thread | None = None

    def _key(self, step: int, rank: int) -> str:
        return f"odin/{self.namespace}/{step}/{rank}"

    def post(self, step: int, worker: int, sent_s: float, arrival_s: float) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="odin-link-board", daemon=True)
            self._thread.start()
        self._queue.put((step, worker, f"{sent_s!r} {arrival_s!r}"))

    def ready(self, step: int) -> bool:
        with self._read:
            return step in self._posts

    def posts(self, step: int, worker: int, timeout: float | None = None) -> list[Post]:
        """Raises ``TimeoutError`` when not every rank has posted ``step`` within ``timeout`` seconds, and
        ``RuntimeError`` when the store failed."""
        with self._read:
            if not self._read.wait_for(lambda: step in self._posts, timeout):
                missing = f"not every rank's on the store within {timeout:.3g} s"
                raise TimeoutError(f"the modeled link's arrivals of step {step}: {missing}")
            posts = self._posts.pop(step)
        if isinstance(posts, Exception):
            raise RuntimeError(f"the modeled link's arrivals of step {step}: the store failed ({posts})") from posts
        return posts

    def _run(self) -> None:
        """The board's thread: each queued post is set, then every rank's post of its step read (and deleted by the
        last reader)."""
        while True:
            step, worker, value = self._queue.get()
            try:
                self._store.set(self._key(step, worker), value)
                posts: list[Post] | Exception = self._read_step(step)
            except Exception as error:  # the store is gone (a peer died, shutdown): the waiting reader says so
                posts = error
            with self._read:
                self._posts[step] = posts
                self._read.notify_all()

    def _read_step(self, step: int) -> list[Post]:
        keys = [self._key(step, rank) for rank in range(self.world_size)]
        posts = []
        for value in self._store.multi_get(keys):
            sent, arrival = (float(part) for part in bytes(value).decode().split())
            posts.append((sent, arrival))
        counter = f"odin/{self.namespace}/{step}/read"
        if self._store.add(counter, 1) == self.world_size:
            for key in [*keys, counter]:
                self._store.delete_key(key)
        return posts


class LinkedHandle:
    """An exchange in flight on a modeled link: done once the real exchange is done and its delivery time passed;
    its first part (where a worker asked for rows first) once that part is in and its own delivery time passed."""

    def __init__(self, inner: ExchangeHandle, step: int, transport: LinkedTransport, what: str = "") -> None:
        self.step, self.what = step, what or f"step {step}"
        self.inner = inner
        self._transport = transport
        self._posts: list[Post] | None = None

    @property
    def bytes(self) -> Any:
        """The real exchange's :class:`~odin_nerfstudio.comm.exchange_choice.ExchangeBytes` once done (None for a
        transport that does not count them, such as the in-process one)."""
        return getattr(self.inner, "bytes", None)

    def _posted(self) -> bool:
        """Whether every worker's (sent, arrival) can be read without waiting."""
        return self._posts is not None or self._transport.board.ready(self.step)

    def _board(self, timeout: float | None = None) -> list[Post]:
        """Every worker's (sent, arrival), read once, waiting at most ``timeout`` seconds for them."""
        if self._posts is None:
            self._posts = self._transport.board.posts(self.step, self._transport.worker, timeout)
        return self._posts

    def delivery_s(self) -> float:
        """When the modeled link delivers this exchange (on the transport's clock); the real exchange must be done."""
        return max(arrival for _, arrival in self._board())

    def first_delivery_s(self, first: FirstPart) -> float:
        """When the modeled link delivers the first part: every worker's message up to it (``first.sent_bytes``)
        has crossed, each from when it left."""
        if first.sent_bytes is None:
            return self.delivery_s()
        link = self._transport.link
        return max(sent + link.delay_s(n) for (sent, _), n in zip(self._board(), first.sent_bytes, strict=True))

    def done(self) -> bool:
        """Never blocks: the real exchange is done, every worker's arrival read and the clock past the latest."""
        if not self.inner.done() or not self._posted():
            return False
        return self._transport.clock() >= self.delivery_s()

    def wait(self, timeout: float) -> SparseUpdate:
        """The merged update, once delivered; raises ``TimeoutError`` if that is more than ``timeout`` away."""
        start = self._transport.clock()
        merged = self.inner.wait(timeout)
        self._board(max(0.0, timeout - (self._transport.clock() - start)))
        self._sleep_until(self.delivery_s(), start, timeout, "exchange")
        return merged

    def first(self) -> FirstPart | None:
        """Never blocks: the first part once in and delivered by the modeled link."""
        first = self.inner.first()
        if first is None or not self._posted() or self._transport.clock() < self.first_delivery_s(first):
            return None
        return first

    def wait_first(self, timeout: float) -> FirstPart:
        """The first part, once delivered; raises ``TimeoutError`` if that is more than ``timeout`` away."""
        start = self._transport.clock()
        first = self.inner.wait_first(timeout)
        self._board(max(0.0, timeout - (self._transport.clock() - start)))
        self._sleep_until(self.first_delivery_s(first), start, timeout, "first part")
        return first

    def _sleep_until(self, delivery: float, start: float, timeout: float, what: str) -> None:
        """Sleep until ``delivery`` (the clock's seconds); raise if it lies past the wait's ``timeout``."""
        clock = self._transport.clock
        remaining = delivery - clock()
        if remaining > 0:
            left = timeout - (clock() - start)
            if remaining > left:
                raise TimeoutError(
                    f"{what} of {self.what}: the modeled link ({self._transport.link.name}) delivers in "
                    f"{remaining:.3g} s, more than the {max(left, 0.0):.3g} s left of the wait"
                )
            self._transport.sleep(remaining)


class LinkedTransport:
    """A worker's transport with every message delayed by a :class:`LinkModel` (an emulation; see the module).

    Args:
        inner: the real transport (this worker's end).
        link: the modeled link.
        board: where the workers of the run post their messages' arrivals (shared by all of them).
        worker: this worker's id on the board (its rank in a distributed run).
        clock: seconds, the same clock for every worker.
        sleep: how ``wait`` sleeps (tests pass one that advances a fake clock).
    """

    def __init__(
        self,
        inner: Transport,
        link: LinkModel,
        board: ArrivalBoard,
        worker: int,
        clock: Clock = time.time,
        sleep: Sleep = time.sleep,
    ) -> None:
        self.inner = inner
        self.link = link
        self.board = board
        self.worker = worker
        self.clock = clock
        self.sleep = sleep

    def start_exchange(self, step: int, local_update: SparseUpdate, first: Tensor | None = None) -> LinkedHandle:
        """Post the message's departure and arrival (now + its modeled delay; its bytes: the update and the rows it
        asks for first), then start the real exchange; never blocks."""
        now, nbytes = self.clock(), local_update.nbytes + asked_bytes(first)
        self.board.post(step, self.worker, now, now + self.link.delay_s(nbytes))
        return LinkedHandle(self.inner.start_exchange(step, local_update, first), step, self)


def linked_virtual(
    transport: VirtualTransport, link: LinkModel, clock: Clock = time.time, sleep: Sleep = time.sleep
) -> list[LinkedTransport]:
    """Every virtual worker's end of ``transport`` behind ``link``, sharing one in-process board."""
    board = LocalBoard(transport.num_workers)
    return [
        LinkedTransport(transport.endpoint(worker), link, board, worker, clock, sleep)
        for worker in range(transport.num_workers)
    ]


def linked_distributed(transport: Transport, link: LinkModel, group: Any = None) -> LinkedTransport:
    """This rank's torch.distributed transport behind ``link``, arrivals posted on the process group's store."""
    import torch.distributed as dist

    return LinkedTransport(transport, link, StoreBoard(dist.get_world_size(group)), dist.get_rank(group))
