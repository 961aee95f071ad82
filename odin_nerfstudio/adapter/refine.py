"""Structural changes of gsplat's DefaultStrategy (densify, prune, opacity reset), applied at a step boundary.

gsplat's `DefaultStrategy.step_post_backward` both accumulates the densification statistics of one render and,
on some steps, edits the model. Odin's runtime accumulates the statistics itself, per task in task order
(`strategy_stats.py`), so only the edits are left for the drain barrier between two steps; they are made here
with the same conditions and ops as gsplat 1.4.0. Every random draw of an edit (the positions of split
Gaussians) comes from a generator seeded by (seed, step), so every worker and every re-run makes the same edit.
"""

from __future__ import annotations

from typing import Any

import torch
from gsplat.strategy import DefaultStrategy
from gsplat.strategy.ops import reset_opa
from torch import Tensor

from odin_nerfstudio.core.tables import index_map_from_uid
from odin_nerfstudio.core.tasks import task_seed

STRUCTURAL_VIEW = -1
"""The view id that seeds a structural change's random stream (no task renders view -1)."""


def refine_due(strategy: DefaultStrategy, step: int) -> bool:
    """Whether gsplat would densify and prune after `step` (the statistics of steps <= `step` are in)."""
    return (
        step < strategy.refine_stop_iter
        and step > strategy.refine_start_iter
        and step % strategy.refine_every == 0
        and step % strategy.reset_every >= strategy.pause_refine_after_reset
    )


def reset_due(strategy: DefaultStrategy, step: int) -> bool:
    """Whether gsplat would reset the opacities after `step`."""
    return step < strategy.refine_stop_iter and step % strategy.reset_every == 0


def structural_change_due(strategy: DefaultStrategy, step: int) -> bool:
    """Whether any structural change follows `step`."""
    return refine_due(strategy, step) or reset_due(strategy, step)


def apply_structural_change(
    strategy: DefaultStrategy,
    params: dict[str, torch.nn.Parameter],
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict[str, Any],
    step: int,
    seed: int,
) -> Tensor:
    """Densify, prune and reset as gsplat would after `step`; returns the index map, int64 [N_new] (new -> old row).

    The statistics in `state` must hold every task of steps <= `step`; they are zeroed after a refinement, as
    gsplat does. An opacity reset changes values, not rows: its index map is the identity.
    """
    device = params["means"].device
    state["uid"] = torch.arange(params["means"].shape[0], device=device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(task_seed(seed, step, STRUCTURAL_VIEW))
        if refine_due(strategy, step):
            strategy._grow_gs(params, optimizers, state, step)
            strategy._prune_gs(params, optimizers, state, step)
            for key in ("grad2d", "count", "radii"):
                if state.get(key) is not None:
                    state[key].zero_()
        if reset_due(strategy, step):
            reset_opa(params=params, optimizers=optimizers, state=state, value=strategy.prune_opa * 2.0)
    return index_map_from_uid(state.pop("uid"))
