"""Random draws per Gaussian: a function of (seed, step, global id) alone, never of which rank holds the row.

Why: densification splits a Gaussian by sampling two points from it. gsplat draws one ``torch.randn`` block for all
the rows it splits, so a row's sample depends on how many rows precede it in the block; in the sharded mode a
shard holds some of them, so the draw would depend on the cut. A counter-based draw (SplitMix64 of the row's
global id, hashed with the run's seed and the step; Box-Muller for normals) gives every row the same sample in the
replicated and the sharded mode, on every rank (on one kind of device: CPU and CUDA may round cos and log apart).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from odin_nerfstudio.core.tasks import task_seed

_LOW53 = (1 << 53) - 1
STRUCTURAL_VIEW = -1
"""The view id that seeds a structural change's draws (no task renders view -1)."""


def _mix(values: Tensor) -> Tensor:
    """SplitMix64's finalizer on int64 tensors (wrapping arithmetic; logical shifts emulated by masking)."""
    values = values + -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
    values = (values ^ ((values >> 30) & ((1 << 34) - 1))) * -4658895280553007687  # 0xBF58476D1CE4E5B9
    values = (values ^ ((values >> 27) & ((1 << 37) - 1))) * -7723592293110705685  # 0x94D049BB133111EB
    return values ^ ((values >> 31) & ((1 << 33) - 1))


def row_uniforms(seed: int, step: int, ids: Tensor, count: int) -> Tensor:
    """``count`` uniforms in (0, 1) per row id, float64 [len(ids), count]: draw k of row i hashes (seed, step, i, k)."""
    base = task_seed(seed, step, STRUCTURAL_VIEW)
    keys = ids.to(torch.int64)[:, None] * count + torch.arange(count, device=ids.device)[None, :]
    bits = _mix(_mix(keys ^ base))
    return ((bits & _LOW53).double() + 0.5) / float(1 << 53)


def row_normals(seed: int, step: int, ids: Tensor, count: int) -> Tensor:
    """``count`` standard normals per row id, float32 [len(ids), count] (Box-Muller on :func:`row_uniforms`)."""
    pairs = (count + 1) // 2
    uniforms = row_uniforms(seed, step, ids, 2 * pairs)
    radius = torch.sqrt(-2.0 * torch.log(uniforms[:, :pairs]))
    angle = 2.0 * math.pi * uniforms[:, pairs:]
    normals = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    return normals[:, :count].float()
