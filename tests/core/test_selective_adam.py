"""Selective Adam: torch's Adam formula on the selected rows, bit for bit, and no change at all elsewhere."""

from __future__ import annotations

import warnings

import pytest
import torch
from gsplat.strategy.ops import duplicate, remove

from odin_nerfstudio.core.selective_adam import SelectiveAdam, selective_adams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPES = [(37, 3), (101,), (16, 15, 3), (5, 4)]


@pytest.mark.parametrize("shape", SHAPES)
def test_full_mask_is_bit_identical_to_torch_adam(shape: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(0)
    theirs = torch.nn.Parameter(torch.randn(shape, generator=generator))
    ours = torch.nn.Parameter(theirs.detach().clone())
    adam = torch.optim.Adam([theirs], lr=0.01, eps=1e-15, foreach=False)
    selective = SelectiveAdam([ours], lr=0.01, eps=1e-15)
    for _ in range(25):
        grad = torch.randn(shape, generator=generator)
        theirs.grad = grad.clone()
        adam.step()
        selective.step_rows(torch.arange(shape[0]), [grad.clone()])
    assert torch.equal(theirs, ours)
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(adam.state[theirs][key], selective.state[ours][key]), key


def test_selected_rows_follow_adam_with_global_bias_correction_and_others_stay() -> None:
    """Each step's selected rows equal torch's Adam started from their state at the global step count."""
    generator = torch.Generator().manual_seed(1)
    n = 50
    param = torch.nn.Parameter(torch.randn(n, 3, generator=generator))
    selective = SelectiveAdam([param], lr=0.02, betas=(0.8, 0.99), eps=1e-15)
    for step in range(1, 16):
        rows = torch.nonzero(torch.rand(n, generator=generator) < 0.3).flatten()
        grad = torch.randn(rows.numel(), 3, generator=generator)
        before = {"value": param.detach().clone()}
        if step > 1:
            before.update({k: selective.state[param][k].clone() for k in ("exp_avg", "exp_avg_sq")})
        selective.step_rows(rows, [grad])

        reference = torch.nn.Parameter(before["value"][rows].clone())
        adam = torch.optim.Adam([reference], lr=0.02, betas=(0.8, 0.99), eps=1e-15, foreach=False)
        if step > 1:
            adam.state[reference] = {
                "step": torch.tensor(float(step - 1)),
                "exp_avg": before["exp_avg"][rows].clone(),
                "exp_avg_sq": before["exp_avg_sq"][rows].clone(),
            }
        reference.grad = grad.clone()
        adam.step()
        assert torch.equal(param.detach()[rows], reference.detach())
        assert torch.equal(selective.state[param]["exp_avg"][rows], adam.state[reference]["exp_avg"])
        untouched = torch.ones(n, dtype=torch.bool)
        untouched[rows] = False
        assert torch.equal(param.detach()[untouched], before["value"][untouched])
        if step > 1:
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(selective.state[param][key][untouched], before[key][untouched])
        assert selective.state[param]["step"].item() == step


def test_empty_step_counts_and_changes_nothing() -> None:
    param = torch.nn.Parameter(torch.randn(4, 2))
    value = param.detach().clone()
    selective = SelectiveAdam([param], lr=0.1)
    selective.step_rows(torch.empty(0, dtype=torch.int64), [torch.empty(0, 2)])
    assert torch.equal(param.detach(), value)
    assert selective.state[param]["step"].item() == 1


def test_step_without_rows_is_refused() -> None:
    selective = SelectiveAdam([torch.nn.Parameter(torch.randn(3))], lr=0.1)
    with pytest.raises(RuntimeError, match="step_rows"):
        selective.step()


def test_gsplat_ops_remap_selective_adam_state() -> None:
    """gsplat's duplicate/remove carry our exp_avg rows like Adam's: parents' rows kept, new rows zero."""
    params = {"means": torch.nn.Parameter(torch.randn(6, 3)), "opacities": torch.nn.Parameter(torch.randn(6))}
    optimizers = selective_adams(params, {"means": 0.1, "opacities": 0.1})
    for name, optimizer in optimizers.items():
        optimizer.step_rows(torch.arange(6), [torch.randn_like(params[name])])
    exp_avg = optimizers["means"].state[params["means"]]["exp_avg"].clone()
    state = {"uid": torch.arange(6)}
    duplicate(params, optimizers, state, torch.tensor([False, True, False, False, True, False]))
    remove(params, optimizers, state, torch.tensor([True, False, False, False, False, False, False, False]))
    assert state["uid"].tolist() == [1, 2, 3, 4, 5, 1, 4]
    moved = optimizers["means"].state[params["means"]]
    assert torch.equal(moved["exp_avg"][:5], exp_avg[1:])
    assert torch.equal(moved["exp_avg"][5:], torch.zeros(2, 3))
    assert moved["step"].item() == 1
    optimizers["means"].step_rows(torch.tensor([0, 6]), [torch.ones(2, 3)])
    assert moved["step"].item() == 2


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.4, 0.99)])
def test_sign_of_a_zero_gradient_changes_no_bit(betas: tuple[float, float]) -> None:
    """A -0.0 gradient updates values and moments exactly as +0.0 does (both lerp branches), which is why a
    single staged update may be exchanged without the ``0 + g`` that would turn its -0.0 into +0.0."""
    generator = torch.Generator().manual_seed(2)
    start = torch.randn(64, 3, generator=generator)
    grads = [torch.randn(64, 3, generator=generator) * (torch.rand(64, 3, generator=generator) < 0.5) for _ in range(6)]
    states = []
    for sign in (1.0, -1.0):
        param = torch.nn.Parameter(start.clone())
        selective = SelectiveAdam([param], lr=0.01, betas=betas)
        for grad in grads:
            zero_signed = torch.where(grad == 0, torch.full_like(grad, sign * 0.0), grad)
            selective.step_rows(torch.arange(64), [zero_signed])
        state = selective.state[param]
        states.append([t.view(torch.int32) for t in (param.detach(), state["exp_avg"], state["exp_avg_sq"])])
    assert all(torch.equal(a, b) for a, b in zip(*states, strict=True))


def test_step_rows_runs_step_hooks_so_an_lr_scheduler_follows_publications() -> None:
    """A trainer steps its LR scheduler from the optimizer's step hook: each step_rows (a publication) then uses
    the rate of its own step, and torch's scheduler sees a step before its own (no order warning)."""
    param = torch.nn.Parameter(torch.zeros(4, 2))
    optimizer = SelectiveAdam([param], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    optimizer.register_step_post_hook(lambda *_: scheduler.step())
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step_rows(torch.tensor([1]), [torch.ones(1, 2)])
    assert rates == [1.0, 0.5, 0.25]
