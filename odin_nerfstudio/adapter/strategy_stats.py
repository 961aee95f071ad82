"""Densification statistics of tasks that render gathered subsets, scattered into the global strategy state.

gsplat's DefaultStrategy accumulates, per Gaussian, the norm of its screen-space mean gradient (``grad2d``), how
often it was visible (``count``) and optionally its largest normalized radius (``radii``). Under the Shadow
Graph a task renders only its candidate rows, so the rasterizer's ids are local; :func:`task_stats` maps them
to global rows with the same arithmetic as ``DefaultStrategy._update_state`` and :func:`accumulate` adds them to
the state. The runtime stages each task's statistics beside its gradients (``SparseUpdate.stats``), they travel
with the step's exchange, and every replica accumulates every worker's tasks at publication, task by task in
worker order then task order: the totals do not depend on the order tasks ran in nor on the rank, so the
statistics are already reduced when a structural change drains the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class TaskStats:
    """One task's contribution to the densification statistics.

    Attributes:
        rows: global rows of the visible Gaussians, int64 [M] (one entry per camera and visible Gaussian).
        grad2d: norm of each entry's normalized screen-space gradient, [M].
        radii: each entry's radius normalized by max(width, height), [M].
    """

    rows: Tensor
    grad2d: Tensor
    radii: Tensor


def task_stats(info: dict[str, Any], candidate: Tensor, packed: bool, absgrad: bool = False) -> TaskStats:
    """A task's statistics in global rows, as ``DefaultStrategy._update_state`` computes them.

    Args:
        info: the rasterizer's meta after backward (``means2d`` with ``.grad`` or ``.absgrad``, ``radii``,
            ``width``, ``height``, ``n_cameras``, and ``gaussian_ids`` when packed); ids index the gathered rows.
        candidate: the task's candidate set, sorted int64 [M_c] (gathered row i is global row candidate[i]).
        packed: whether the rasterizer ran packed (means2d [nnz, 2]) or not (means2d [C, M_c, 2]).
        absgrad: use ``means2d.absgrad`` as gsplat's ``absgrad=True``.
    """
    grads = (info["means2d"].absgrad if absgrad else info["means2d"].grad).clone()
    grads[..., 0] *= info["width"] / 2.0 * info["n_cameras"]
    grads[..., 1] *= info["height"] / 2.0 * info["n_cameras"]
    if packed:
        local_ids = info["gaussian_ids"]
        radii = info["radii"]
    else:
        visible = info["radii"] > 0.0
        local_ids = torch.where(visible)[1]
        grads = grads[visible]
        radii = info["radii"][visible]
    return TaskStats(
        rows=candidate[local_ids],
        grad2d=grads.norm(dim=-1),
        radii=radii / float(max(info["width"], info["height"])),
    )


def accumulate(state: dict[str, Any], stats: TaskStats, num_primitives: int) -> None:
    """Add one task's statistics to gsplat's strategy state (creating its tensors on first use, as gsplat does).

    Args:
        state: DefaultStrategy state (``grad2d``, ``count`` and, when present, ``radii``), [N] each.
        stats: the task's statistics.
        num_primitives: N, for first use.
    """
    device = stats.grad2d.device
    if state.get("grad2d") is None:
        state["grad2d"] = torch.zeros(num_primitives, device=device)
    if state.get("count") is None:
        state["count"] = torch.zeros(num_primitives, device=device)
    state["grad2d"].index_add_(0, stats.rows, stats.grad2d)
    state["count"].index_add_(0, stats.rows, torch.ones_like(stats.rows, dtype=torch.float32))
    if "radii" in state:
        if state["radii"] is None:
            state["radii"] = torch.zeros(num_primitives, device=device)
        state["radii"][stats.rows] = torch.maximum(state["radii"][stats.rows], stats.radii)
