"""The adaptive batch gain: sqrt(r) from the views' gradients, averaged with Adam's beta1, lagged, clamped, kept."""

from __future__ import annotations

import math

import pytest
import torch
from gsplat.strategy.ops import duplicate

from odin_nerfstudio.core.batch_gain import AdaptiveGain, scaled_lr, squared_norms
from odin_nerfstudio.core.selective_adam import SelectiveAdam
from odin_nerfstudio.core.sparse import SparseUpdate, sum_in_order

BETA1 = 0.9**4
"""The batch's beta1 for 4 views (0.9 per view)."""


def optimizers() -> dict[str, SelectiveAdam]:
    """One selective Adam over a [5, 3] parameter, as the batch rule configures it for 4 views."""
    return {"means": SelectiveAdam([torch.nn.Parameter(torch.zeros(5, 3))], lr=1e-3, betas=(BETA1, 0.999**4))}


def measured(views: list[torch.Tensor]) -> dict[str, tuple[float, float]]:
    """What a published step of these views' gradients measures: (||sum||^2, sum of ||g_i||^2), summed as the
    runtime sums them (each view's squared norm, then in order)."""
    updates = [SparseUpdate(torch.arange(5), {"means": g}, (), squared_norms({"means": g})) for g in views]
    merged = sum_in_order(updates, {"means": torch.zeros(5, 3)})
    return {"means": (float(squared_norms(merged.grads)[0]), float(merged.sq_norms[0]))}


def gain_of(optimizer: SelectiveAdam) -> float:
    return scaled_lr(optimizer.param_groups[0]) / optimizer.param_groups[0]["lr"]


def test_identical_views_give_gain_sqrt_of_the_batch_and_orthogonal_ones_gain_one() -> None:
    grad = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    same = optimizers()
    assert gain_of(same["means"]) == 1.0, "nothing measured yet: Grendel's sqrt(S) alone"
    AdaptiveGain(4).observe(same, measured([grad] * 4))
    assert gain_of(same["means"]) == pytest.approx(2.0), "r = S = 4 for identical views"
    orthogonal = optimizers()
    basis = torch.eye(15).reshape(15, 5, 3)
    AdaptiveGain(4).observe(orthogonal, measured([basis[i] for i in range(4)]))
    assert gain_of(orthogonal["means"]) == pytest.approx(1.0), "r = 1 for orthogonal views"


def test_the_gain_averages_numerator_and_denominator_with_beta1_and_clamps_to_one_and_the_batch() -> None:
    optimizer = optimizers()
    gain = AdaptiveGain(4)
    gain.observe(optimizer, {"means": (3.0, 1.0)})
    assert gain_of(optimizer["means"]) == pytest.approx(math.sqrt(3.0)), "the first step's r, unbiased"
    gain.observe(optimizer, {"means": (1.0, 1.0)})
    expected = (BETA1 * 3.0 + 1.0) / (BETA1 * 1.0 + 1.0)  # both averages start from 0: (1 - beta1) cancels
    assert gain_of(optimizer["means"]) == pytest.approx(math.sqrt(expected))
    gain.observe(optimizer, {"means": (0.0, 0.0)})
    assert gain_of(optimizer["means"]) == pytest.approx(math.sqrt(expected)), "a step without gradient changes nothing"
    for _ in range(40):
        gain.observe(optimizer, {"means": (0.1, 1.0)})
    assert gain_of(optimizer["means"]) == 1.0, "views pulling apart (r < 1) take Grendel's step, not a shorter one"
    assert optimizer["means"].param_groups[0]["lr"] == 1e-3, "the configured (scheduled) rate is left alone"


def test_the_gain_scales_the_step_and_survives_a_checkpoint_and_gsplats_edits() -> None:
    optimizer = optimizers()
    AdaptiveGain(4).observe(optimizer, {"means": (4.0, 1.0)})
    (param,) = optimizer["means"].param_groups[0]["params"]
    optimizer["means"].step_rows(torch.tensor([0]), [torch.ones(1, 3)])
    assert param[0].tolist() == pytest.approx([-2e-3] * 3), "Adam's first step is lr x gain long"
    restored = optimizers()
    restored["means"].load_state_dict(optimizer["means"].state_dict())
    assert restored["means"].param_groups[0]["gain_averages"] == optimizer["means"].param_groups[0]["gain_averages"]
    assert gain_of(restored["means"]) == 2.0
    params = {"means": param}
    duplicate(params, optimizer, {}, torch.tensor([True, False, False, False, False]))
    assert gain_of(optimizer["means"]) == 2.0 and optimizer["means"].param_groups[0]["params"][0].shape[0] == 6
