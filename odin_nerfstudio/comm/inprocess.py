"""The in-process transport: W virtual workers of one process exchange their updates through shared memory.

Why: a single process runs every worker of a schedule (tests, the virtual driver, one-GPU training), and its merge
is the reference the distributed transport must equal: every contribution summed in worker order once all W have
sent (``comm/protocol.py``).
"""

from __future__ import annotations

import threading

from torch import Tensor

from odin_nerfstudio.comm.protocol import FirstPart, chosen_rows
from odin_nerfstudio.comm.wire import asked_bytes, first_bytes
from odin_nerfstudio.core.conflicts import isin_sorted
from odin_nerfstudio.core.sparse import Merge, SparseUpdate, sum_in_order


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
