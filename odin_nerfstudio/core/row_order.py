"""Spatial row order: Morton codes of Gaussian centres and the permutation of every per-row tensor into their order.

Why: a view reads a compact piece of space. When the model's rows follow a Z-order curve, that piece is a few runs
of consecutive rows, so the runtime's gathers, scatters and selective Adam (and the rasterizer's own gathers) read
whole cache lines and pages instead of one row per miss. On the 300 m street of ``bench_runtime`` this cuts the
bookkeeping per task by about a third. gsplat appends the Gaussians it densifies at the end of every tensor, so the
runtime restores the order after each structural change, behind the same drain barrier.

A permutation of rows changes no formula: every optimizer and strategy rule is per row and the rasterizer composites
in depth order. Only rounding may move: CPU matrix products round a row by its place in the kernel's blocks, so a
moved row can differ in its last bit (tested: within 1e-5 after 8 steps). The order is a function of the centres
alone, so every worker of a distributed run computes the same order from its identical replica.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

MORTON_BITS = 21
"""Bits per axis of a Morton code (63 in all, an int64)."""


def _spread_bits(values: Tensor) -> Tensor:
    """Spread the low 21 bits of int64 ``values`` three apart (bit i moves to bit 3 i), for Morton codes."""
    values = values & 0x1FFFFF
    values = (values | (values << 32)) & 0x1F00000000FFFF
    values = (values | (values << 16)) & 0x1F0000FF0000FF
    values = (values | (values << 8)) & 0x100F00F00F00F00F
    values = (values | (values << 4)) & 0x10C30C30C30C30C3
    return (values | (values << 2)) & 0x1249249249249249


def sample_stride(num_rows: int) -> int:
    """The stride of the rows whose centres set the Z-order's frame (at most about 65536 of them)."""
    return max(1, num_rows // 65536)


def morton_frame(sample: Tensor) -> tuple[Tensor, float]:
    """The Z-order's cells from a sample of centres [3, S] (every :func:`sample_stride`-th row): the corner [3, 1]
    and the cell size, cubic over the widest 0.1% to 99.9% quantile range."""
    sample = sample.double()
    lo = torch.nanquantile(sample, 0.001, dim=1, keepdim=True)
    hi = torch.nanquantile(sample, 0.999, dim=1, keepdim=True)
    top = (1 << MORTON_BITS) - 1
    return lo, float((hi - lo).max().nan_to_num(0.0).clamp(min=1e-12)) / top


def codes_in(centres: Tensor, frame: tuple[Tensor, float]) -> Tensor:
    """Z-order codes of centres [3, N] in ``frame`` (:func:`morton_frame`), int64 [N]; outliers clamp to the edge,
    NaN centres get cell 0."""
    lo, size = frame
    top = (1 << MORTON_BITS) - 1
    cells = ((centres.double() - lo.to(centres.device)) / size).nan_to_num(0.0).clamp(0, top).long()
    return _spread_bits(cells[0]) | (_spread_bits(cells[1]) << 1) | (_spread_bits(cells[2]) << 2)


def morton_codes(centres: Tensor) -> Tensor:
    """Z-order codes of centres [3, N], int64 [N], in the frame of their own sample (:func:`morton_frame`)."""
    return codes_in(centres, morton_frame(centres[:, :: sample_stride(centres.shape[1])]))


def spatial_order(means: Tensor) -> Tensor:
    """The rows of Gaussians with centres [N, 3] in Z-order, int64 [N] (new row -> old row); ties keep row order."""
    if means.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=means.device)
    return torch.argsort(morton_codes(means.detach().T), stable=True)


@torch.no_grad()
def permute_rows(
    params: dict[str, Tensor],
    optimizers: dict[str, torch.optim.Optimizer],
    strategy_state: dict[str, Any] | None,
    order: Tensor,
) -> None:
    """Put row ``order[i]`` at row i of every parameter, optimizer state tensor and strategy state tensor.

    Parameters are rewritten in place (the same tensors, so a model, an optimizer or a transport holding them stays
    valid); per-row optimizer state (``exp_avg``, ``exp_avg_sq``) is rewritten in place too, and per-row tensors of
    the strategy state (gsplat's ``grad2d``, ``count``, ``radii``) are replaced, as gsplat's own ops do. Scalars
    (Adam's ``step``) are left alone. The transient is one tensor's copy at a time, as in gsplat's ops.

    Args:
        params: per name, the parameter [N, ...].
        optimizers: per name, its optimizer over that parameter.
        strategy_state: gsplat's strategy state, or None.
        order: a permutation of range(N), int64 [N] (new row -> old row).
    """
    rows = params["means"].shape[0]
    if order.shape != (rows,):
        raise ValueError(f"a row order for {rows} rows has shape {tuple(order.shape)}")

    def per_row(value: Any) -> bool:
        return isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == rows

    for name, param in params.items():
        param.copy_(param.index_select(0, order))
        if param.grad is not None:
            param.grad = param.grad.index_select(0, order)
        optimizer = optimizers.get(name)
        for value in optimizer.state[param].values() if optimizer is not None else ():
            if per_row(value):
                value.copy_(value.index_select(0, order))
    for key, value in (strategy_state or {}).items():
        if per_row(value):
            strategy_state[key] = value.index_select(0, order)


def restore_spatial_order(
    params: dict[str, Tensor], optimizers: dict[str, torch.optim.Optimizer], strategy_state: dict[str, Any] | None
) -> Tensor:
    """Permute the model's rows (parameters, optimizer and strategy state) into the Z-order of their centres;
    returns the order applied, int64 [N] (new row -> old row)."""
    order = spatial_order(params["means"])
    permute_rows(params, optimizers, strategy_state, order)
    return order
