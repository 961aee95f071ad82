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

    def active_mask(self, info: dict[str, Any], size: int) -> Tensor | None:
        """Which of C(t)'s ``size`` gathered rows are in the active set A(t), bool [size]; None if the meta does not
        say (the runtime then takes the rows with a non-zero gradient)."""

    def task_stats(self, info: dict[str, Any], candidate: Tensor) -> dict[str, Tensor] | None:
        """The task's statistics in global rows (``candidate`` [M_c] maps gathered rows to global ones), after
        backward; None if the render has none."""

    def accumulate(self, state: dict[str, Any], stats: dict[str, Tensor], num_primitives: int) -> None:
        """Add one task's statistics to the strategy state ([N] tensors, created on first use)."""

