"""A step's sparse update (rows and their summed gradients), and its sum in a fixed order.

Everything Odin stages, exchanges and publishes is a :class:`SparseUpdate`: the sorted rows of the primitives
a piece of work touched and, per parameter name, their gradient rows. Sums always run in the order the caller
gives (task order within a worker, then worker order), so two runs with the same schedule produce the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SparseUpdate:
    """Gradient rows for a sorted set of primitives.

    Attributes:
        rows: sorted, unique primitive rows, int64 [M].
        grads: per parameter name, gradient rows aligned with ``rows``, [M, ...].
    """

    rows: Tensor
    grads: dict[str, Tensor]

    @property
    def nbytes(self) -> int:
        """Bytes held by the rows and gradient tensors."""
        return tensor_bytes(self.rows) + sum(tensor_bytes(g) for g in self.grads.values())

    def row_magnitude(self) -> Tensor:
        """L2 norm of each row's gradient over all parameters, [M] float32 (the producer's gradient size)."""
        total = torch.zeros(self.rows.numel(), dtype=torch.float32, device=self.rows.device)
        for grad in self.grads.values():
            total = total + grad.detach().reshape(grad.shape[0], -1).float().square().sum(dim=1)
        return total.sqrt()


def tensor_bytes(tensor: Tensor) -> int:
    """Bytes of one tensor's elements."""
    return tensor.numel() * tensor.element_size()


def sum_in_order(updates: Sequence[SparseUpdate], template: dict[str, Tensor]) -> SparseUpdate:
    """Sum sparse updates in the given order on the union of their rows.

    Every row starts from zero and receives each update's contribution in sequence (``index_add_`` adds each
    index once per call, so the per-row order is exactly the order of ``updates``).

    Args:
        updates: the updates to sum, in the order the sum must run.
        template: per parameter name, a tensor [N, ...] giving the trailing shape, dtype and device of the
            gradient rows (the model's parameters).

    Returns:
        The summed update over the sorted union of rows.
    """
    device = next(iter(template.values())).device
    if updates:
        rows = torch.unique(torch.cat([u.rows for u in updates]))
    else:
        rows = torch.empty(0, dtype=torch.int64, device=device)
    grads = {}
    for name, ref in template.items():
        total = torch.zeros((rows.numel(), *ref.shape[1:]), dtype=ref.dtype, device=device)
        for update in updates:
            total.index_add_(0, torch.searchsorted(rows, update.rows), update.grads[name])
        grads[name] = total
    return SparseUpdate(rows=rows, grads=grads)
