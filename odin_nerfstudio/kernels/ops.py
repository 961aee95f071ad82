"""Odin's bookkeeping kernels, one function per op: the compiled ``torch.ops.odin`` op or the pure-torch reference.

Each function takes the runtime's own objects, packs them into the op's tensors and calls the op registered by
``cuda/csrc`` (CPU: C++ with at::parallel_for; CUDA: .cu kernels) when the library is loaded and supports the
tensors' device, else the pure-torch reference of :mod:`._torch_impl` (the existing core code). The results are
bit-identical either way (tests/kernels). Force the reference with :func:`use_reference` (a context manager) or
``ODIN_KERNELS=reference``.

The four kernels (five ops), with the runtime steps they stand for:

- :func:`cull_conflicts`: C(t) by the block index fused with the RAW check against unpublished write sets
  (``BoundingSpheres.rows_in`` + ``conflicts.raw``); :func:`cull_rows` is the same op without write sets (the
  escape check's and the predicted writes' drawable rows).
- :func:`gather_rows`: C(t)'s rows copied into task leaves under per-row seqlocks, with each row's version
  (``ShadowGraph.gather``); a row a publication holds is reported, never read torn.
- the staging scatter, two ops: :func:`stage_rows`, a task's active rows A(t) and their gradient rows taken out of
  its leaves (``index_select``, and the rows with a gradient where the render does not say); and
  :func:`scatter_in_order`, the tasks' staged sparse gradients summed on their union in task order
  (``sum_in_order``), without float atomics.
- :func:`publish_adam`: selective Adam on the union rows fused with the version bump, each row locked while
  written, priority rows first (``SelectiveAdam.step_rows`` + ``PrimitiveTables.publish``'s version advance).

Five more ops, CPU only, take the rest of the hot path's per-row bookkeeping out of Python (on CUDA the torch
code they stand for runs: the reference's of :mod:`._torch_impl` for the first two, the core's own for the others;
some of it synchronizes with the host, e.g. a bound's largest magnitude or a check's verdict read as a number):

- :func:`refresh_bounds`: the culling index's bounds of the rows a publication wrote (``BoundingSpheres.update``).
- :func:`validate_read`: a read's stale and candidate checks against the rows published since it read
  (``Validator.validate``).
- :func:`union_rows`: the sorted union of row sets (``union_sorted``): a step's pending writes, predicted ones.
- :func:`declare_rows`, :func:`settle_rows`: the tables' pending-write marks (``PrimitiveTables.declare``,
  ``settle``).

The per-row ``seq`` word (int64 [N]) is twice the row's version (``PrimitiveTables.versions``), odd while a
publication writes the row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Literal

import torch
from torch import Tensor

from odin_nerfstudio.core.conflicts import Conflicts, StepRows, union_sorted
from odin_nerfstudio.core.selective_adam import SelectiveAdam, adam_constants
from odin_nerfstudio.core.sparse import SparseUpdate, summed_sq_norms
from odin_nerfstudio.core.tables import PrimitiveTables
from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion
from odin_nerfstudio.kernels import _backend, _torch_impl

_forced_reference = False


@contextlib.contextmanager
def use_reference(enabled: bool = True) -> Iterator[None]:
    """Run every op on the pure-torch reference inside the block (``enabled=False``: the compiled ops again)."""
    global _forced_reference
    previous, _forced_reference = _forced_reference, enabled
    try:
        yield
    finally:
        _forced_reference = previous


def compiled(device: torch.device | str) -> bool:
    """Whether the compiled ops will run for tensors on ``device`` (built, loaded, not forced off)."""
    if _forced_reference:
        return False
    flavour = _backend.load()
    kind = torch.device(device).type
    return flavour is not None and (kind == "cpu" or (kind == "cuda" and flavour == "cuda"))


def _compiled_on_cpu(device: torch.device | str) -> bool:
    """Whether a CPU-only op (``refresh_bounds``, ``validate_read``, ...) will run: compiled ops, a CPU tensor."""
    return torch.device(device).type == "cpu" and compiled(device)


def cull_conflicts(
    bounds: BoundingSpheres, region: CullRegion, reader_step: int, writes: Sequence[StepRows]
) -> tuple[Tensor, Conflicts]:
    """C(t) over the block index and its read-after-write conflicts, in one op (which also computes the block
    test's coefficients, ``block_coefficients``, from the region vector).

    Args:
        bounds: the culling bounds of the N rows (its block index is built if it is not).
        region: the task's cull region (``CullRegion.candidates``).
        reader_step: the reading task's step s.
        writes: per unpublished step, the rows it may write (sorted unique int64 [W_s] or bool [N]); steps >= s
            are ignored.

    Returns:
        C(t), sorted int64 [M], and its conflicts: rows [Q] with the latest and earliest conflicting step [Q].
    """
    device = bounds.radii.device
    if not compiled(device) or bounds.centres.dtype != torch.float32:
        return _torch_impl.cull_conflicts(bounds, region, reader_step, writes)
    if bounds.num_rows == 0:
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return empty, Conflicts(empty, empty, empty)
    blocks = bounds.index()
    # bool masks are made rows here (a synchronization on CUDA); the runtime's write sets are rows already
    parts = [w.rows if w.rows.dtype != torch.bool else torch.nonzero(w.rows).flatten() for w in writes]
    candidate, rows, last, first = torch.ops.odin.cull_conflicts(
        blocks.rows,
        blocks.spheres,
        blocks.bounds,
        region.vector,
        [p.contiguous() for p in parts],
        [w.step for w in writes],
        reader_step,
        blocks.magnitude,
    )
    return candidate, Conflicts(rows, last, first)


def cull_rows(bounds: BoundingSpheres, region: CullRegion) -> Tensor:
    """The sorted rows whose sphere meets ``region``, int64 [M]: ``bounds.rows_in(region)``, through
    :func:`cull_conflicts` without write sets (one compiled op instead of about ten torch calls)."""
    return cull_conflicts(bounds, region, 0, ())[0]


def gather_rows(
    params: dict[str, Tensor], rows: Tensor, seq: Tensor, check_locks: bool = True
) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Copy ``rows`` of every parameter under per-row seqlocks, with the version of each row read.

    Args:
        params: per name, a contiguous float32 parameter [N, ...].
        rows: the rows to read, int64 [M] (duplicates allowed).
        seq: per row, its sequence word, int64 [N] (twice its version; odd while a publication writes it).
        check_locks: False reads without the seqlock (a debug switch: a concurrent publication may then tear rows).

    Returns:
        Per name the copied rows [M, ...] (fresh tensors, zeros on locked rows), the versions read int64 [M], and
        ``locked`` bool [M]: rows a publication held during every try (read them again after it).
    """
    if not compiled(rows.device) or any(not p.is_contiguous() or p.dtype != torch.float32 for p in params.values()):
        return _torch_impl.gather_rows(params, rows, seq, check_locks)
    leaves, versions, locked = torch.ops.odin.gather_rows(
        [p.detach() for p in params.values()], rows, seq, check_locks
    )
    return dict(zip(params, leaves, strict=True)), versions, locked


def stage_rows(
    candidate: Tensor, grads: dict[str, Tensor], positions: Tensor | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """A task's active set A(t) and its gradient rows, taken out of its leaves' gradients in one pass.

    Args:
        candidate: the task's C(t), int64 [M] (the rows of the leaves).
        grads: per name, the gradient of its leaf [M, ...].
        positions: which rows of C(t) are in A(t), bool [M], or their positions, sorted int64 [A], where the
            render's meta says (gsplat's radii > 0); None: the rows with a non-zero gradient element.

    Returns:
        A(t), the rows [A], and per name its gradient rows [A, ...] (fresh tensors).
    """
    tensors = [grad.contiguous() for grad in grads.values()]
    if not compiled(candidate.device) or any(t.dtype != torch.float32 for t in tensors):
        rows, staged = _torch_impl.stage_rows(candidate, tensors, positions)
    else:
        rows, staged = torch.ops.odin.stage_rows(candidate, tensors, positions)
    return rows, dict(zip(grads, staged, strict=True))


def scatter_in_order(updates: Sequence[SparseUpdate], template: dict[str, Tensor]) -> SparseUpdate:
    """The tasks' sparse updates summed on the union of their rows, each row's sum in task order.

    Args:
        updates: per task, in task order, sorted unique rows [A_t] and per name gradient rows [A_t, ...].
        template: per name, a tensor [N, ...] giving the gradients' trailing shape, dtype and device.

    Returns:
        The update on the sorted union of rows [U] with summed gradients [U, ...], every task's statistics in
        order and their squared norms summed in order (as ``sum_in_order``).
    """
    device = next(iter(template.values())).device
    # One update is its own sum (the reference returns it as is): no copy, no op call.
    if len(updates) <= 1 or not compiled(device) or any(t.dtype != torch.float32 for t in template.values()):
        return _torch_impl.scatter_in_order(updates, template)
    rows, sums = torch.ops.odin.scatter_in_order(
        [u.rows.contiguous() for u in updates], [u.grads[name].contiguous() for u in updates for name in template]
    )
    stats = tuple(s for update in updates for s in update.stats)
    grads = dict(zip(template, sums, strict=True))
    return SparseUpdate(rows=rows, grads=grads, stats=stats, sq_norms=summed_sq_norms(updates))


def refresh_bounds(bounds: BoundingSpheres, rows: Tensor, means: Tensor, scales: Tensor) -> None:
    """The culling bounds of the rows a publication wrote (``BoundingSpheres.update``), in one op on the CPU.

    Args:
        bounds: the culling bounds of the N rows; their block index grows, and is dropped once stale.
        rows: the rows written, sorted unique int64 [R].
        means: their new centres [R, 3].
        scales: their new activated (world-space) scales [R, 3].
    """
    blocks = bounds.blocks
    tensors = (means, scales, bounds.centres, bounds.radii)
    if blocks is None or not _compiled_on_cpu(rows.device) or any(t.dtype != torch.float32 for t in tensors):
        return _torch_impl.refresh_bounds(bounds, rows, means, scales)
    magnitude = torch.ops.odin.refresh_bounds(
        bounds.centres,
        bounds.radii,
        blocks.spheres,
        blocks.bounds,
        blocks.slot_of,
        rows,
        means.detach().contiguous(),
        scales.detach().contiguous(),
    )
    blocks.magnitude = max(blocks.magnitude, magnitude)
    bounds.drop_stale_index()


def validate_read(
    candidate: Tensor,
    written: Sequence[tuple[int, Tensor]],
    admitted: dict[int, Tensor],
    bounds: BoundingSpheres,
    region: CullRegion,
) -> tuple[bool, bool]:
    """A read's stale and candidate checks against the rows written since it read, in one op on the CPU for a read
    with no admitted stale rows (else the reference).

    Args:
        candidate: the read's C(t), sorted int64 [M].
        written: per step published since the read, (step, the rows it wrote that the read did not see, sorted).
        admitted: per step, the stale rows the read was admitted with.
        bounds: the culling bounds of the current state.
        region: the task's culling region.

    Returns:
        ("stale": a written row of C(t) not admitted, "candidate": a written row outside C(t) now meets ``region``).
    """
    if admitted or not _compiled_on_cpu(candidate.device) or bounds.centres.dtype != torch.float32:
        return _torch_impl.validate_read(candidate, written, admitted, bounds, region)
    rows = [published.contiguous() for _, published in written]
    return torch.ops.odin.validate_read(candidate, rows, bounds.centres, bounds.radii, region.vector)


def union_rows(parts: Sequence[Tensor], device: torch.device | str = "cpu") -> Tensor:
    """Sorted union of sorted unique int64 row sets, [M] (``union_sorted``), merged in one op on the CPU."""
    if len(parts) <= 1 or not _compiled_on_cpu(parts[0].device):
        return union_sorted(parts, device)
    return torch.ops.odin.union_rows([part.contiguous() for part in parts])


def declare_rows(tables: PrimitiveTables, rows: Tensor, step: int) -> None:
    """Mark ``rows`` (int64 [M]) as possibly written by ``step`` (``PrimitiveTables.declare``), in one op on the CPU."""
    if not _compiled_on_cpu(rows.device):
        return tables.declare(rows, step)
    torch.ops.odin.declare_rows(tables.pending_step, rows.contiguous(), step)


def settle_rows(tables: PrimitiveTables, rows: Tensor, declared: Sequence[Tensor], step: int) -> None:
    """The marks of ``step``'s publication (``PrimitiveTables.settle``): ``rows`` written, the ``declared`` sets no
    longer pending; in one op on the CPU."""
    if not _compiled_on_cpu(rows.device):
        return tables.settle(rows, list(declared), step)
    parts = [part.contiguous() for part in declared]
    torch.ops.odin.settle_rows(tables.published_step, tables.pending_step, rows.contiguous(), parts, step)


PublicationPart = Literal["whole", "first", "rest"]
"""Which part of a step's publication a ``publish_adam`` call is (see its ``part``)."""


def _advance(optimizer: SelectiveAdam, advance: bool = True) -> list[float]:
    """Advance ``optimizer``'s global step as ``step_rows`` does (unless not ``advance``); its Adam constants as
    the op's hyper row [6]."""
    (group,) = optimizer.param_groups
    (param,) = group["params"]
    step_size, bias_correction2_sqrt = adam_constants(group, optimizer.advance_step(param, advance))
    beta1, beta2 = group["betas"]
    return [1 - beta1, beta2, 1 - beta2, bias_correction2_sqrt, group["eps"], -step_size]


def publish_adam(
    optimizers: dict[str, SelectiveAdam],
    rows: Tensor,
    grads: dict[str, Tensor],
    seq: Tensor,
    priority: Tensor | None = None,
    use_locks: bool = True,
    part: PublicationPart = "whole",
) -> Tensor:
    """Selective Adam on ``rows`` of every parameter fused with the version bump, each row locked while written.

    Args:
        optimizers: per name, the parameter's SelectiveAdam (gsplat's layout: one parameter [N, ...] each); the
            global step of each advances (bias correction counts global steps) and its post-hooks run.
        rows: the step's union rows, sorted unique int64 [M] (may be empty: the steps still count).
        grads: per name, the summed gradient rows [M, ...].
        seq: per row, its sequence word, int64 [N]: ``seq[rows] += 2``, odd while the row is written.
        priority: rows a waiting reader needs, sorted int64 [Q]: published before the others (None: none).
        use_locks: False writes without taking the row locks (a debug switch for the stress test).
        part: "whole" (a step's publication), or a step published in two calls: "first" (advances the global
            step, runs no post-hook) then "rest" (at that step, runs the post-hooks); a row's values are the same
            in whichever call it is.

    Returns:
        Lock contention, int64 [1] on ``rows``' device: failed try-acquires (another publisher held the row); 0 on
        the reference. A tensor, so that a CUDA publication never waits for the host to read it.
    """
    states = [optimizer.state[optimizer.param_groups[0]["params"][0]] for optimizer in optimizers.values()]
    params = [optimizer.param_groups[0]["params"][0] for optimizer in optimizers.values()]
    tensors = params + [s.get("exp_avg") for s in states] + [s.get("exp_avg_sq") for s in states]
    if not compiled(rows.device) or any(
        t is None or not t.is_contiguous() or t.dtype != torch.float32 for t in tensors
    ):
        return _torch_impl.publish_adam(optimizers, rows, grads, seq, priority, use_locks, part)
    advance = part != "rest"
    hyper = torch.tensor([_advance(optimizer, advance) for optimizer in optimizers.values()], dtype=torch.float64)
    if priority is None:
        priority = torch.empty(0, dtype=torch.int64, device=rows.device)
    contention = torch.ops.odin.publish_adam(
        [p.detach() for p in params],
        [s["exp_avg"] for s in states],
        [s["exp_avg_sq"] for s in states],
        [grads[name].contiguous() for name in optimizers],
        rows,
        seq,
        hyper.reshape(len(optimizers), 6),
        priority,
        use_locks,
    )
    if part != "first":
        for optimizer in optimizers.values():
            optimizer.finish_step()
    return contention
