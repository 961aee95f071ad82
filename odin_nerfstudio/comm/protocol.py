"""What the runtime sees of an exchange: the :class:`Transport` protocol, its handles and the :class:`FirstPart`.

A worker hands its local update of step s to ``start_exchange(step, local_update)`` and gets a handle;
``handle.wait(timeout)`` returns the merged update: every worker's contribution summed in worker order (worker 0
first) on the union of their rows, with every worker's task statistics listed in worker order (then task order),
identical on every worker, so every replica's densification statistics hold every task (the distributed
transport's all_reduce exchanges with W > 2 sum in the backend's order instead, ``comm/distributed.py``). The
runtime never names a backend: the in-process ``comm/inprocess.py`` serves virtual workers, and
``comm/distributed.py`` (torch.distributed over gloo or NCCL) plugs in behind the same protocol, like DDP's comm
hooks. Every wait has a timeout and its error names what it waited for. A worker with no task in a step still
sends its empty update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from odin_nerfstudio.core.conflicts import isin_sorted, union_sorted
from odin_nerfstudio.core.sparse import SparseUpdate, restricted


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
