"""The pure-torch reference of each kernel op: the runtime's existing bookkeeping, the yardstick of the C++/CUDA ops.

Like gsplat's ``cuda/_torch_impl.py``, every function here is what its compiled twin in ``cuda/csrc`` must equal
bit for bit, and it reuses the core code where that code already is the computation (culling, conflicts,
sum_in_order, selective Adam), so the reference is the code the runtime has always run. Shapes: N rows in the
model, M rows in a call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from odin_nerfstudio.core.conflicts import Conflicts, StepRows, isin_sorted, raw, union_sorted
from odin_nerfstudio.core.selective_adam import SelectiveAdam
from odin_nerfstudio.core.sparse import SparseUpdate, sum_in_order
from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion


def cull_conflicts(
    bounds: BoundingSpheres, region: CullRegion, reader_step: int, writes: Sequence[StepRows]
) -> tuple[Tensor, Conflicts]:
    """C(t) and its read-after-write conflicts: ``bounds.rows_in(region)`` then ``raw``.

    Args:
        bounds: the culling bounds of the N rows and their block index.
        region: the task's cull region.
        reader_step: the reading task's step s.
        writes: per unpublished step, the rows it may write (sorted int64 or bool [N]); only steps < s count.

    Returns:
        C(t), sorted int64 [M], and the rows of C(t) with an earlier unpublished write (with latest and earliest
        such step).
    """
    candidate = bounds.rows_in(region)
    return candidate, raw(candidate, reader_step, writes)


def gather_rows(
    params: dict[str, Tensor], rows: Tensor, seq: Tensor, check_locks: bool = True
) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Copy ``rows`` of every parameter, with each row's version and whether a publication held it.

    Args:
        params: per name, a parameter [N, ...] (float32).
        rows: the rows to read, int64 [M] (duplicates allowed).
        seq: per row, its sequence word, int64 [N]: twice its version, odd while a publication writes it.
        check_locks: whether odd words count as locked (False: the debug switch that reads regardless).

    Returns:
        Per name the copied rows [M, ...] (zeros on locked rows), the versions read ``seq[rows] >> 1`` int64 [M],
        and ``locked`` bool [M].
    """
    words = seq.index_select(0, rows)
    locked = (words & 1).bool() if check_locks else torch.zeros_like(rows, dtype=torch.bool)
    leaves = {}
    for name, param in params.items():
        leaf = param.detach().index_select(0, rows)
        # masked_fill_ with the mask broadcast over the row: no host synchronization (boolean indexing would)
        leaves[name] = leaf.masked_fill_(locked.view(-1, *[1] * (leaf.dim() - 1)), 0.0)
    return leaves, words >> 1, locked


def stage_rows(
    candidate: Tensor, grads: Sequence[Tensor], positions: Tensor | None = None
) -> tuple[Tensor, list[Tensor]]:
    """A task's active rows and their gradient rows: ``index_select`` at ``positions`` (or the mask's), or at the
    rows with a non-zero gradient element in any tensor when none are given (NaN counts, -0.0 does not).

    Args:
        candidate: the task's C(t), int64 [M].
        grads: the gradients of its leaves, each [M, ...].
        positions: positions in C(t) of A(t), int64 [A], or a mask of them, bool [M] (from the render's meta), or
            None.

    Returns:
        The rows ``candidate[positions]`` [A] and each gradient's rows [A, ...].
    """
    if positions is not None and positions.dtype == torch.bool:
        positions = torch.nonzero(positions).flatten()
    if positions is None:
        size = candidate.numel()
        nonzero = torch.zeros(size, dtype=torch.bool, device=candidate.device)
        for grad in grads:
            nonzero |= (grad.reshape(size, grad[0].numel() if size else 1) != 0).any(dim=1)
        positions = torch.nonzero(nonzero).flatten()
    return candidate.index_select(0, positions), [grad.index_select(0, positions) for grad in grads]


def scatter_in_order(updates: Sequence[SparseUpdate], template: dict[str, Tensor]) -> SparseUpdate:
    """The tasks' updates summed on the union of their rows in the order given: ``sum_in_order``.

    Args:
        updates: per task, in task order, sorted unique rows [A_t] and gradient rows [A_t, ...] per name.
        template: per name, a tensor [N, ...] giving trailing shape, dtype and device.

    Returns:
        The update on the sorted union of rows [U], gradients [U, ...] summed in task order, statistics listed.
    """
    return sum_in_order(updates, template)


def publish_adam(
    optimizers: dict[str, SelectiveAdam],
    rows: Tensor,
    grads: dict[str, Tensor],
    seq: Tensor,
    priority: Tensor | None = None,
    use_locks: bool = True,
    part: str = "whole",
) -> Tensor:
    """Selective Adam on ``rows`` of every parameter (``step_rows``), then each row's version advanced.

    Args:
        optimizers: per name, the parameter's SelectiveAdam (one parameter tensor [N, ...] each).
        rows: the step's union rows, sorted unique int64 [M].
        grads: per name, the summed gradient rows [M, ...].
        seq: per row, its sequence word, int64 [N]; ``seq[rows] += 2``.
        priority: rows to publish first (sorted int64 [Q]); the values do not depend on the order.
        use_locks: ignored (one thread runs the reference).
        part: "whole", "first" or "rest" (``ops.publish_adam``'s).

    Returns:
        Lock contention, int64 [1]: 0 (no other thread).
    """
    del priority, use_locks
    for name, optimizer in optimizers.items():
        optimizer.step_rows(rows, [grads[name]], advance=part != "rest", finish=part != "first")
    seq.index_add_(0, rows, torch.full_like(rows, 2))
    return torch.zeros(1, dtype=torch.int64, device=rows.device)


def refresh_bounds(bounds: BoundingSpheres, rows: Tensor, means: Tensor, scales: Tensor) -> None:
    """The culling bounds of ``rows`` (int64 [R]) after a publication moved them: ``bounds.update``.

    Args:
        bounds: the culling bounds of the N rows (and their block index, if built).
        rows: the rows written, int64 [R].
        means: their new centres [R, 3].
        scales: their new activated (world-space) scales [R, 3].
    """
    bounds.update(rows, means, scales)


def validate_read(
    candidate: Tensor,
    written: Sequence[tuple[int, Tensor]],
    admitted: dict[int, Tensor],
    bounds: BoundingSpheres,
    region: CullRegion,
) -> tuple[bool, bool]:
    """A read's stale and candidate checks (``Validator.validate``) against the rows written since it read.

    Args:
        candidate: the read's C(t), sorted int64 [M].
        written: per step published since the read, (step, the rows it wrote that the read did not see, sorted).
        admitted: per step, the stale rows the read was admitted with (a written row of C(t) among them is allowed).
        bounds: the culling bounds of the current state.
        region: the task's culling region (C(t)'s).

    Returns:
        ("stale": a written row of C(t) not admitted, "candidate": a written row outside C(t) now meets ``region``).
    """
    stale, outside = False, []
    for step, published in written:
        read = isin_sorted(published, candidate)
        missed = published[read]
        allowed = admitted.get(step)
        if missed.numel() and not stale and (allowed is None or not bool(isin_sorted(missed, allowed).all())):
            stale = True
        outside.append(published[~read])
    moved = union_sorted(outside, candidate.device)
    return stale, bool(moved.numel()) and bool(bounds.meets(region, moved).any())
