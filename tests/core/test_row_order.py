"""The spatial row order: a permutation that moves every per-row tensor together, changes no result beyond the
permutation, makes a view's rows a few runs of consecutive rows, and survives structural changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gsplat.strategy import DefaultStrategy

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion
from odin_nerfstudio.core.row_order import morton_codes, permute_rows, spatial_order
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.scenes.synth import look_at, street_world
from odin_nerfstudio.drivers.virtual import run_virtual
from tests.runtime.test_runtime import DENSE, schedule_of
from odin_nerfstudio.scenes.toy import LRS, make_params, make_runtime, render_gsplat, snapshot

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_permute_rows_moves_parameters_moments_and_strategy_state_together() -> None:
    params = make_params(50)
    optimizers = selective_adams(params, LRS)
    rows = torch.arange(0, 50, 3)
    optimizers["means"].step_rows(rows, [torch.randn(rows.numel(), 3)])
    state = DefaultStrategy().initialize_state()
    state.update(grad2d=torch.rand(50), count=torch.arange(50.0), scene_scale=2.0)
    before = {name: p.detach().clone() for name, p in params.items()}
    moment = optimizers["means"].state[params["means"]]["exp_avg"].clone()
    identities = {name: id(p) for name, p in params.items()}
    order = torch.randperm(50, generator=torch.Generator().manual_seed(3))

    permute_rows(params, optimizers, state, order)

    for name, param in params.items():
        assert id(param) == identities[name], "a parameter must stay the same tensor (models and optimizers hold it)"
        assert torch.equal(param.detach(), before[name][order])
    adam = optimizers["means"].state[params["means"]]
    assert torch.equal(adam["exp_avg"], moment[order])
    assert float(adam["step"]) == 1.0
    assert torch.equal(state["count"], torch.arange(50.0)[order]) and state["scene_scale"] == 2.0


def test_permute_rows_rejects_an_order_of_the_wrong_size() -> None:
    params = make_params(10)
    with pytest.raises(ValueError, match="10 rows"):
        permute_rows(params, {}, None, torch.arange(9))


def test_spatial_order_is_a_permutation_that_sorts_morton_codes() -> None:
    means = torch.randn(1000, 3) * torch.tensor([30.0, 2.0, 1.0])
    means[7] = float("nan")
    order = spatial_order(means)
    assert torch.equal(torch.sort(order).values, torch.arange(1000))
    codes = morton_codes(means[order].T)
    assert bool((codes[1:] >= codes[:-1]).all())
    assert spatial_order(torch.empty(0, 3)).numel() == 0


def test_a_view_reads_few_runs_of_rows_in_spatial_order() -> None:
    """Why the order exists: on a street in random row order a side view's candidate rows are scattered; in
    Z-order they fall into runs of consecutive rows, at least 8 rows per run on average."""
    world = street_world(40_000, np.random.default_rng(0), 120.0)
    means, scales = world.means, world.scales
    viewmat = torch.tensor(
        look_at(np.array([[60.0, 0.0, 1.6]]), np.array([[60.0, 4.0, 1.6]]), np.array([0, 0, 1.0]))[0]
    )
    camera = Camera(viewmat.float(), torch.tensor([[80.0, 0, 64], [0, 80.0, 48], [0, 0, 1]]), 128, 96)
    region = CullRegion.candidates(camera, 0.1)

    def mean_run(means: torch.Tensor, scales: torch.Tensor) -> float:
        rows = BoundingSpheres.of(means, scales).rows_in(region)
        assert rows.numel() > 500
        runs = 1 + int((rows[1:] != rows[:-1] + 1).sum())
        return rows.numel() / runs

    order = spatial_order(means)
    assert mean_run(means, scales) < 1.5
    assert mean_run(means[order], scales[order]) >= 8.0


def test_spatial_order_changes_nothing_but_the_row_order() -> None:
    """A run in Z-order ends with the values, moments and steps of one in the given order, row for row.

    Not bit for bit: the rasterizer composites in depth order, never in row order, but CPU matrix products round
    a row by its position in the kernel's blocks (the last partial block takes another path), so a moved row may
    differ in the last bit; after 8 steps that stays within 1e-5 of each tensor's largest value.
    """
    results = {}
    for ordered in (False, True):
        config = OdinRuntimeConfig(mode="barrier", spatial_order=ordered)
        runtime = make_runtime(
            config, make_params(), render_fn=render_gsplat, lr_scale=DENSE["lr_scale"], topology=Topology(2, 1)
        )
        run_virtual(runtime, schedule_of(DENSE, 2, 1))
        results[ordered] = snapshot(runtime)
    order = spatial_order(make_params()["means"])
    assert not torch.equal(order, torch.arange(order.numel()))
    for key, value in results[False].items():
        expected = value if value.dim() == 0 else value[order]
        torch.testing.assert_close(results[True][key], expected, rtol=1e-5, atol=1e-5 * float(value.abs().max()))
