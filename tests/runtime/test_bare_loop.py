"""The core trains a model under a bare gsplat-style loop, without nerfstudio: the three hooks by hand.

The loop is what a gsplat user writes (render, ``means2d.retain_grad()``, backward, the strategy's refinement),
with Odin's hooks around it: ``before_read`` gathers the task's candidate rows, ``after_backward`` stages its
gradients and statistics (the step is published once its tasks are staged), and a refinement runs behind
``drain`` / ``remap``. It runs in a fresh interpreter that must not have imported nerfstudio at the end.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from gsplat.strategy import DefaultStrategy

from odin_nerfstudio.adapter.gsplat import GsplatAdapter, apply_structural_change
from odin_nerfstudio.comm.inprocess import VirtualTransport
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.runtime.config import Topology
from odin_nerfstudio.runtime.reads import Read
from odin_nerfstudio.runtime.runtime import OdinRuntime, OdinRuntimeConfig
from odin_nerfstudio.scenes.toy import LRS, camera, make_params, make_schedule, render_gsplat

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12
VIEWS = 6
REFINE_AFTER = 3
STRATEGY = DefaultStrategy(
    refine_start_iter=0,
    refine_every=3,
    reset_every=1000,
    pause_refine_after_reset=0,
    grow_grad2d=5e-3,
    grow_scale2d=0.4,
    prune_opa=0.1,
)


def evaluate(params: dict[str, torch.Tensor]) -> float:
    """Mean loss of the model over every view of the toy scene (the same backgrounds each time)."""
    rows = {name: p.detach() for name, p in params.items()}
    with torch.no_grad():
        losses = [render_gsplat(Task(0, 0, 0, v, camera(v, VIEWS)), rows, torch.Generator())[0] for v in range(VIEWS)]
    return float(torch.stack(losses).mean())


def train() -> tuple[float, float, int, int]:
    """Train the toy scene for STEPS steps of two views with the hooks by hand; returns the mean loss over every
    view before and after, and the Gaussian counts before and after the refinement."""
    params = make_params(60)
    state = STRATEGY.initialize_state(scene_scale=10.0)
    runtime = OdinRuntime(
        OdinRuntimeConfig(mode="quality"),
        params,
        selective_adams(params, LRS),
        [VirtualTransport(1, params).endpoint(0)],
        render_gsplat,
        strategy_state=state,
        adapter=GsplatAdapter(packed=False, absgrad=STRATEGY.absgrad),
        topology=Topology(num_workers=1, views_per_worker=2),
    )
    first_loss, first_count = evaluate(params), runtime.num_primitives
    for step, (tasks,) in enumerate(make_schedule(STEPS, 1, 2, VIEWS)):
        if step == REFINE_AFTER + 1:
            runtime.drain()
            runtime.remap(apply_structural_change(STRATEGY, params, runtime.optimizers, state, REFINE_AFTER, 0))
        for task in tasks:
            read = runtime.before_read(task)
            assert isinstance(read, Read), read
            loss, info = render_gsplat(task, read.leaves, read.generator)
            info["means2d"].retain_grad()
            loss.backward()
            runtime.after_backward(read, info)
    runtime.drain()
    assert runtime.published_through == STEPS - 1
    return first_loss, evaluate(params), first_count, runtime.num_primitives


def test_core_trains_under_a_bare_gsplat_loop_without_nerfstudio() -> None:
    subprocess.run([sys.executable, "-m", "tests.runtime.test_bare_loop"], check=True, cwd=ROOT, timeout=600)


if __name__ == "__main__":
    torch.set_num_threads(1)
    loss_before, loss_after, count_before, count_after = train()
    assert count_after != count_before, "the refinement changed no Gaussian"
    assert loss_after < loss_before, (loss_before, loss_after)
    assert "nerfstudio" not in sys.modules, "the core imported nerfstudio"
    print(f"loss {loss_before:.4f} -> {loss_after:.4f}, Gaussians {count_before} -> {count_after}")
