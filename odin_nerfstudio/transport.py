"""How workers exchange a step's sparse update, behind a small interface like DDP's comm hooks.

A worker hands its local update of step s to ``start_exchange(step, local_update)`` and gets a handle;
``handle.wait(timeout)`` returns the merged update: every worker's contribution summed in worker order (worker 0
first) on the union of their rows, identical on every worker. The runtime never names a backend: the in-process
:class:`VirtualTransport` serves virtual workers, and a torch.distributed backend (all_gather of variable-sized
sparse rows over gloo or NCCL) plugs in behind the same :class:`Transport` protocol. Every wait has a timeout and
its error names what it waited for.

:class:`DistributedTransport` is the torch.distributed backend: all ranks issue the same collectives in the same
order (exchanges start in step order), first an all_gather of the row counts, then async all_gathers of the rows
and the packed gradient rows padded to the largest count, merged in rank order on every rank.
"""

from __future__ import annotations

import datetime
import math
import threading
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from odin_nerfstudio.sparse import SparseUpdate, sum_in_order


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


class DistributedHandle:
    """Handle of a torch.distributed exchange: the payload all_gathers in flight."""

    def __init__(
        self,
        step: int,
        counts: list[int],
        works: list[Any],
        rows: list[Tensor],
        packed: list[Tensor],
        template: dict[str, Tensor],
    ) -> None:
        self.step = step
        self._counts = counts
        self._works = works
        self._rows = rows
        self._packed = packed
        self._template = template
        self._merged: SparseUpdate | None = None

    def done(self) -> bool:
        return self._merged is not None or all(work.is_completed() for work in self._works)

    def wait(self, timeout: float) -> SparseUpdate:
        if self._merged is None:
            what = f"exchange of step {self.step}: the sparse rows of ranks 0..{len(self._counts) - 1}"
            for work in self._works:
                _wait(work, timeout, what)
            updates = [
                _unpack(rows[:count], packed[:count], self._template)
                for rows, packed, count in zip(self._rows, self._packed, self._counts, strict=True)
            ]
            self._merged = sum_in_order(updates, self._template)
        return self._merged


def _wait(work: Any, timeout: float, what: str) -> None:
    """Wait for a collective; a timeout raises TimeoutError naming ``what``, other errors say what failed."""
    try:
        work.wait(timeout=datetime.timedelta(seconds=timeout))
    except RuntimeError as error:
        if "timed out" in str(error).lower():
            raise TimeoutError(f"waited {timeout} s for {what}") from error
        raise RuntimeError(f"{what} failed: {error}") from error


class DistributedTransport:
    """Sparse-update exchange over torch.distributed (gloo on CPU, NCCL on CUDA): one instance per rank.

    Args:
        template: per parameter name, a tensor [N, ...] giving the gradient rows' trailing shape, dtype and
            device (every name must share one dtype).
        timeout: seconds to wait for the row counts at :meth:`start_exchange`.
        group: the process group (default: the world).
    """

    def __init__(self, template: dict[str, Tensor], timeout: float = 60.0, group: Any = None) -> None:
        dtypes = {ref.dtype for ref in template.values()}
        if len(dtypes) != 1:
            raise ValueError(f"all gradients must share one dtype to be packed, got {dtypes}")
        self.template = template
        self.timeout = timeout
        self.group = group
        self.world_size = dist.get_world_size(group)

    def start_exchange(self, step: int, local_update: SparseUpdate) -> DistributedHandle:
        """All-gather the row counts (bounded by ``timeout``), then start the payload all_gathers."""
        device = next(iter(self.template.values())).device
        count = torch.tensor([local_update.rows.numel()], dtype=torch.int64, device=device)
        counts = [torch.zeros_like(count) for _ in range(self.world_size)]
        work = dist.all_gather(counts, count, group=self.group, async_op=True)
        _wait(work, self.timeout, f"exchange of step {step}: the row counts of ranks 0..{self.world_size - 1}")
        sizes = [int(c) for c in counts]
        longest = max(sizes)
        packed = _pack(local_update, self.template)
        rows = torch.zeros(longest, dtype=torch.int64, device=device)
        rows[: local_update.rows.numel()] = local_update.rows
        payload = torch.zeros((longest, packed.shape[1]), dtype=packed.dtype, device=device)
        payload[: packed.shape[0]] = packed
        all_rows = [torch.empty_like(rows) for _ in range(self.world_size)]
        all_payloads = [torch.empty_like(payload) for _ in range(self.world_size)]
        works = [
            dist.all_gather(all_rows, rows, group=self.group, async_op=True),
            dist.all_gather(all_payloads, payload, group=self.group, async_op=True),
        ]
        return DistributedHandle(step, sizes, works, all_rows, all_payloads, self.template)
