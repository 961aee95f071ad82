"""What the runtime needs to know about a renderer: the small interface gsplat (or another rasterizer) plugs into.

The runtime core never reads a render's meta itself. A :class:`RenderAdapter` says which gathered rows a render
made active, keeps what its statistics need through backward, turns the render into the task's statistics (a
plain ``dict[str, Tensor]`` the transports carry without knowing its keys) and adds them to the strategy state at
publication. gsplat's is :class:`odin_nerfstudio.adapter.gsplat.GsplatAdapter`; see ``docs/architecture.md``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor


class RenderAdapter(Protocol):
    """A rasterizer's conventions, as the runtime uses them.

    Attributes:
        stats_schema: per statistic name, its dtype on the wire; every statistic of a task is 1-D [M] with one
            entry per visible (camera, row) pair, int64 ones holding global rows.
    """

    stats_schema: dict[str, torch.dtype]

    def world_scales(self, scales: Tensor) -> Tensor:
        """World-space scales [M, 3] of parameter rows ``params["scales"]`` [M, 3] (for the bounding spheres)."""

    def scale_growth(self, step: float) -> float:
        """The most a world-space scale can grow when each element of its parameter row moves by at most ``step``
        (inf where it cannot be bounded)."""

    def before_backward(self, info: dict[str, Any]) -> None:
        """Prepare a render's meta for backward when statistics are collected (gsplat: ``means2d.retain_grad()``)."""

    def active_positions(self, info: dict[str, Any], size: int) -> Tensor | None:
        """Positions in C(t) (``size`` gathered rows) of the active set A(t), sorted int64 [A]; None if the meta
        does not say (the runtime then takes the rows with a non-zero gradient)."""

    def task_stats(self, info: dict[str, Any], candidate: Tensor) -> dict[str, Tensor] | None:
        """The task's statistics in global rows (``candidate`` [M_c] maps gathered rows to global ones), after
        backward; None if the render has none."""

    def accumulate(self, state: dict[str, Any], stats: dict[str, Tensor], num_primitives: int) -> None:
        """Add one task's statistics to the strategy state ([N] tensors, created on first use)."""


def active_positions(adapter: RenderAdapter, info: dict[str, Any] | None, leaves: dict[str, Tensor]) -> Tensor:
    """Positions in C(t) of A(t), sorted int64 [A]: what the adapter reads from the render's ``info``, else the
    gathered rows ``leaves`` ([M, ...] per name) with a non-zero gradient."""
    size = next(iter(leaves.values())).shape[0]
    active = None if info is None else adapter.active_positions(info, size)
    if active is not None:
        return active
    nonzero = torch.zeros(size, dtype=torch.bool, device=next(iter(leaves.values())).device)
    for leaf in leaves.values():
        if leaf.grad is not None:
            nonzero |= (leaf.grad.reshape(size, -1) != 0).any(dim=1)
    return torch.nonzero(nonzero).flatten()
