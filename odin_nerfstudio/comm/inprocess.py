"""The in-process transport: W virtual workers of one process exchange their updates through shared memory.

Why: a single process runs every worker of a schedule (tests, the virtual driver, one-GPU training), and its merge
is the reference the distributed transport must equal: every contribution summed in worker order once all W have
sent (``comm/protocol.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

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


class VirtualRowExchange:
    """The sharded mode's row all-to-all between W ranks that are threads of one process (tests, predictions):
    the k-th exchange a rank starts meets the k-th of every other rank, as the collectives of
    ``comm/all_to_all.py`` pair up. Rows are handed over, not copied (readers never write them).

    Args:
        num_ranks: W.
    """

    def __init__(self, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self._condition = threading.Condition()
        self._sent: dict[int, dict[int, Sequence[dict[str, Tensor]]]] = {}
        self._taken: dict[int, int] = {}
        self._started = [0] * num_ranks

    def endpoint(self, rank: int) -> VirtualRowEndpoint:
        """The exchange as rank ``rank`` sees it."""
        return VirtualRowEndpoint(self, rank)

    def start(self, rank: int, pieces: Sequence[dict[str, Tensor]], what: str) -> VirtualRowHandle:
        """Rank ``rank``'s next exchange: ``pieces[r]`` goes to rank r."""
        if len(pieces) != self.num_ranks:
            raise ValueError(f"{what}: {len(pieces)} pieces for {self.num_ranks} ranks")
        with self._condition:
            number = self._started[rank]
            self._started[rank] += 1
            self._sent.setdefault(number, {})[rank] = pieces
            self._condition.notify_all()
        return VirtualRowHandle(self, rank, number, what)

    def received(self, rank: int, number: int, what: str, timeout: float) -> list[dict[str, Tensor]]:
        """What every rank sent ``rank`` in exchange ``number``, in rank order, once all have sent."""
        with self._condition:
            sent = self._sent[number]
            if not self._condition.wait_for(lambda: len(sent) == self.num_ranks, timeout=timeout):
                missing = sorted(set(range(self.num_ranks)) - set(sent))
                raise TimeoutError(f"{what}: ranks {missing} sent nothing within {timeout} s")
            self._taken[number] = self._taken.get(number, 0) + 1
            if self._taken[number] == self.num_ranks:  # every rank has its pieces: forget the exchange
                del self._sent[number], self._taken[number]
            return [sent[source][rank] for source in range(self.num_ranks)]


class VirtualRowEndpoint:
    """One rank's end of a :class:`VirtualRowExchange` (``runtime/sharding.py``'s ``RowExchange``)."""

    def __init__(self, exchange: VirtualRowExchange, rank: int) -> None:
        self._exchange, self.rank = exchange, rank

    def start(self, pieces: Sequence[dict[str, Tensor]], what: str) -> VirtualRowHandle:
        return self._exchange.start(self.rank, pieces, what)


class VirtualRowHandle:
    """A row exchange of a :class:`VirtualRowExchange` in flight."""

    def __init__(self, exchange: VirtualRowExchange, rank: int, number: int, what: str) -> None:
        self._exchange, self._rank, self._number, self._what = exchange, rank, number, what

    def wait(self, timeout: float) -> list[dict[str, Tensor]]:
        return self._exchange.received(self._rank, self._number, self._what, timeout)
