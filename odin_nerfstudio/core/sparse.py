"""A step's sparse update (rows, their summed gradients, the tasks' statistics), and its sum in a fixed order.

Everything Odin stages, exchanges and publishes is a :class:`SparseUpdate`: the sorted rows of the primitives
a piece of work touched, per parameter name their gradient rows, and the statistics of the tasks it holds (per
task a plain ``dict[str, Tensor]`` whose meaning only the render adapter knows, see ``docs/architecture.md``). Sums always run in the order the caller gives (task order within a worker, then worker order), so two
runs with the same schedule produce the same bits; statistics are kept per task in that order, not summed, so
that every replica accumulates them with the same per-task operations as the runtime that made them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from odin_nerfstudio.core.conflicts import union_sorted


@dataclass(frozen=True)
class SparseUpdate:
    """Gradient rows for a sorted set of primitives, and the densification statistics of the tasks they sum.

    Attributes:
        rows: sorted, unique primitive rows, int64 [M].
        grads: per parameter name, gradient rows aligned with ``rows``, [M, ...].
        stats: per task, in the order of the sum, its statistics: per name a 1-D tensor [M_t] (the render
            adapter's ``stats_schema``; tasks without any are absent).
        sq_norms: per parameter, in ``grads``' order, the squared norms of the gradients of the tasks it sums,
            summed in their order, float64 [G] (``batch_gain.squared_norms`` of each task's; what the adaptive batch
            rule measures r with); None where not measured (an empty update, a first part).
    """

    rows: Tensor
    grads: dict[str, Tensor]
    stats: tuple[dict[str, Tensor], ...] = ()
    sq_norms: Tensor | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held by the rows, gradient and statistics tensors."""
        stats = sum(tensor_bytes(t) for s in self.stats for t in s.values())
        return tensor_bytes(self.rows) + sum(tensor_bytes(g) for g in self.grads.values()) + stats

    def row_magnitude(self) -> Tensor:
        """L2 norm of each row's gradient over all parameters, [M] float32 (the producer's gradient size)."""
        total = torch.zeros(self.rows.numel(), dtype=torch.float32, device=self.rows.device)
        for grad in self.grads.values():
            total = total + grad.detach().reshape(grad.shape[0], math.prod(grad.shape[1:])).float().square().sum(dim=1)
        return total.sqrt()


def densified(update: SparseUpdate, num_rows: int) -> SparseUpdate:
    """``update`` over every row 0..num_rows-1, zeros where it has no gradient (a DDP-style dense gradient)."""
    rows = torch.arange(num_rows, dtype=torch.int64, device=update.rows.device)
    grads = {
        name: grad.new_zeros((num_rows, *grad.shape[1:])).index_copy_(0, update.rows, grad)
        for name, grad in update.grads.items()
    }
    return SparseUpdate(rows=rows, grads=grads, stats=update.stats, sq_norms=update.sq_norms)


def restricted(update: SparseUpdate, keep: Tensor) -> SparseUpdate:
    """The rows of ``update`` where ``keep`` (bool [M]) holds, with their gradients; no statistics."""
    # the positions once, then one index_select per gradient: a boolean mask per gradient finds them again each time
    # (about 3x slower on CPU for a model's six gradients)
    kept = torch.nonzero(keep).flatten()
    grads = {name: grad.index_select(0, kept) for name, grad in update.grads.items()}
    return SparseUpdate(rows=update.rows.index_select(0, kept), grads=grads)


def joined(
    parts: Sequence[SparseUpdate], stats: tuple[dict[str, Tensor], ...] = (), sq_norms: Tensor | None = None
) -> SparseUpdate:
    """Updates over disjoint rows as one, rows sorted (nothing is summed, so no bit changes), with ``stats`` and
    ``sq_norms``."""
    rows = torch.cat([part.rows for part in parts])
    order = torch.argsort(rows)
    grads = {name: torch.cat([part.grads[name] for part in parts])[order] for name in parts[0].grads}
    return SparseUpdate(rows=rows[order], grads=grads, stats=stats, sq_norms=sq_norms)


def summed_sq_norms(updates: Sequence[SparseUpdate]) -> Tensor | None:
    """The updates' ``sq_norms`` added in the given order from zeros (an update without any adds nothing; adding
    +0.0 changes no bit, so a transport may send zeros for it), float64 [G]; None when none has them."""
    parts = [update.sq_norms for update in updates if update.sq_norms is not None]
    if not parts:
        return None
    total = torch.zeros_like(parts[0])
    for part in parts:
        total.add_(part)
    return total


def tensor_bytes(tensor: Tensor) -> int:
    """Bytes of one tensor's elements."""
    return tensor.numel() * tensor.element_size()


def sum_in_order(updates: Sequence[SparseUpdate], template: dict[str, Tensor]) -> SparseUpdate:
    """Sum sparse updates in the given order on the union of their rows; their statistics follow in that order.

    Every row starts from zero and receives each update's contribution in sequence (``index_add_`` adds each
    index once per call, so the per-row order is exactly the order of ``updates``). An update whose rows are the
    whole union (workers that touched the same rows) is added with ``add_``, the same element-wise ``0 + g``
    without the index; positions are found once for all parameters.

    A single update is returned as is, not copied: ``0 + g`` equals ``g`` bit for bit except that it turns a
    -0.0 into +0.0, and no consumer tells the two apart (a later sum starts from +0.0 and a running sum that
    starts there is never -0.0, so adding either zero gives the same bits; selective Adam's ``lerp`` and
    ``addcmul`` of a zero gradient give the same moments for both signs; tested).

    Args:
        updates: the updates to sum, in the order the sum must run.
        template: per parameter name, a tensor [N, ...] giving the trailing shape, dtype and device of the
            gradient rows (the model's parameters).

    Returns:
        The summed update over the sorted union of rows, with every update's statistics, update by update.
    """
    if len(updates) == 1:
        return updates[0]
    device = next(iter(template.values())).device
    rows = union_sorted([u.rows for u in updates], device)
    positions = [None if _same_rows(u.rows, rows) else torch.searchsorted(rows, u.rows) for u in updates]
    grads = {}
    for name, ref in template.items():
        total = torch.zeros((rows.numel(), *ref.shape[1:]), dtype=ref.dtype, device=device)
        for update, position in zip(updates, positions, strict=True):
            if position is None:
                total.add_(update.grads[name])
            else:
                total.index_add_(0, position, update.grads[name])
        grads[name] = total
    stats = tuple(s for update in updates for s in update.stats)
    return SparseUpdate(rows=rows, grads=grads, stats=stats, sq_norms=summed_sq_norms(updates))


Merge = Callable[[Sequence[SparseUpdate], dict[str, Tensor]], SparseUpdate]
"""A transport's sum of a step's parts: ``sum_in_order`` or an op equal to it bit for bit (the compiled
``kernels.ops.scatter_in_order``, which a layer above hands the transports: ``comm/`` does not import ``kernels/``)."""


def _same_rows(rows: Tensor, union: Tensor) -> bool:
    """Whether sorted unique ``rows`` [M] are all of the sorted ``union`` [U] (then M == U)."""
    return rows is union or (rows.numel() == union.numel() and bool(torch.equal(rows, union)))
