"""Exchange bookkeeping, as DDP's Reducer keeps it: which worker's update of which step is ready and sent.

The transport (``comm/protocol.py``) moves the bytes; this part knows how many tasks each worker runs per step
(B, or a short step's plan), whether a worker's part of a step can be committed, the handles of the exchanges in
flight and their communication time. In the modes that validate, a step is committed once every earlier step is
published (quality-first's early commit: once the step before has its first part published and the reads are
surely valid, ``runtime/commit.py``); ddp and HOGWILD commit at once. Exchanges start in step order on every
worker either way. See ``docs/architecture.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from odin_nerfstudio.comm.protocol import ExchangeHandle, FirstPart, Transport
from odin_nerfstudio.core.sparse import SparseUpdate
from odin_nerfstudio.runtime.metering import Meter
from odin_nerfstudio.runtime.shadow import RingSlot


class ExchangeBook:
    """Step plans, commit readiness and the exchanges in flight of the local workers.

    Args:
        transports: per local worker, its end of the exchange (W = their number).
        tasks_per_worker: B, the tasks of a worker in a step without a plan.
        meter: where the communication time and spans go.
    """

    def __init__(self, transports: Sequence[Transport], tasks_per_worker: int, meter: Meter) -> None:
        self.transports = list(transports)
        self.tasks_per_worker = tasks_per_worker
        self.meter = meter
        self._handles: dict[int, dict[int, tuple[ExchangeHandle, int]]] = {}
        self._plans: dict[int, tuple[int, ...]] = {}
        self._asked: set[int] = set()

    @property
    def num_workers(self) -> int:
        """W, the local workers."""
        return len(self.transports)

    def plan(self, step: int, tasks_per_worker: Sequence[int]) -> None:
        """Declare how many tasks each worker runs in ``step`` (a short step)."""
        if len(tasks_per_worker) != self.num_workers or min(tasks_per_worker) < 0:
            raise ValueError(f"step {step}: a plan needs one task count (>= 0) per worker")
        self._plans[step] = tuple(int(n) for n in tasks_per_worker)

    def tasks_of(self, step: int, worker: int) -> int:
        """How many tasks ``worker`` runs in ``step``."""
        plan = self._plans.get(step)
        return self.tasks_per_worker if plan is None else plan[worker]

    def no_local_task(self, step: int) -> bool:
        """Whether a plan gives no local worker a task in ``step`` (its slot is then opened without a read)."""
        plan = self._plans.get(step)
        return plan is not None and not any(plan)

    def ready(self, slot: RingSlot, worker: int, published_through: int, after_published: bool = True) -> bool:
        """Whether ``worker``'s part of the slot's step can be committed: not sent yet, every task of the worker
        staged and, when its reads are validated first (``after_published``), every earlier step published; a
        mode that does not validate (ddp, hogwild) commits at once, its exchanges in flight side by side."""
        if worker in self._handles.get(slot.step, {}):
            return False
        if after_published and published_through < slot.step - 1:
            return False
        if not all(self.all_sent(step) for step in range(published_through + 1, slot.step)):
            return False  # exchanges start in step order on every worker (an earlier step with no local task too)
        staged = sum(1 for key in slot.staged if key[1] == worker)
        return staged == self.tasks_of(slot.step, worker)

    def start(self, step: int, worker: int, update: SparseUpdate, first: Tensor | None = None) -> None:
        """Send ``worker``'s update of ``step``, asking for ``first`` (sorted int64 rows) first if given."""
        start = self.meter.timeline.now()
        handle = self.meter.in_transport(self.transports[worker].start_exchange, step, update, first)
        if first is not None:
            self._asked.add(step)
        self._handles.setdefault(step, {})[worker] = (handle, start)

    def asked(self, step: int) -> bool:
        """Whether a local worker asked for rows first in ``step``'s exchange (a first part then comes)."""
        return step in self._asked

    def first(self, step: int) -> FirstPart | None:
        """The first part of ``step``'s exchange once it has arrived (every local worker has sent), else None."""
        if not self.all_sent(step):
            return None
        handle = self._handles[step][0][0]
        return self.meter.in_transport(handle.first)

    def wait_first(self, step: int, timeout: float) -> None:
        """Block until the first part of ``step``'s exchange has arrived (every local worker has sent)."""
        self.meter.in_transport(self._handles[step][0][0].wait_first, timeout)

    def all_sent(self, step: int) -> bool:
        """Whether every local worker has sent its part of ``step``."""
        return len(self._handles.get(step, {})) == self.num_workers

    def complete(self, step: int) -> bool:
        """Whether the exchange of ``step`` has every worker's part and has arrived (never blocks)."""
        handles = self._handles.get(step, {})
        return self.all_sent(step) and all(self.meter.in_transport(h.done) for h, _ in handles.values())

    def wait(self, step: int, timeout: float) -> None:
        """Block until the exchange of ``step`` has arrived (every local worker has sent its part)."""
        for handle, _ in self._handles[step].values():
            self.meter.in_transport(handle.wait, timeout)

    def collect(self, step: int, timeout: float) -> SparseUpdate:
        """The merged update of ``step`` (every worker's part sent), its "comm" spans recorded; forgets the step."""
        handles = self._handles.pop(step)
        self._plans.pop(step, None)
        self._asked.discard(step)
        merged = self.meter.in_transport(handles[0][0].wait, timeout)
        for worker, (_, comm_start) in sorted(handles.items()):
            self.meter.timeline.record("comm", worker, step, comm_start)
        return merged

    def in_flight(self) -> bool:
        """Whether an exchange was started and not collected."""
        return bool(self._handles)
