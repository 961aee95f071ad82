"""The batch rule: Grendel's learning rates, betas, eps and decays of a W x B step, schedules counted in views, and
the adaptive gain chosen by the flag."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from nerfstudio.data.scene_box import SceneBox

from odin_nerfstudio.adapter.gsplat import refine_due, reset_due, structural_change_due
from odin_nerfstudio.method_configs.odin_splat import odin_splat_optimizers
from odin_nerfstudio.core.batch_gain import AdaptiveGain
from odin_nerfstudio.ns.batch_scaling import BatchScaling, batch_scaling
from odin_nerfstudio.ns.model import OdinSplatModelConfig

VIEW_SCHEDULE = {"warmup_length": 100, "refine_every": 40, "stop_split_at": 400, "reset_alpha_every": 5}
"""Counts in views that 4 divides: warmup 100, refinement every 40 until 400, opacity reset every 200 views."""


def model_of(num_train_data: int = 8, **overrides) -> torch.nn.Module:
    """A small model (seeded by 50 points) whose strategy counts the given schedule."""
    generator = torch.Generator().manual_seed(0)
    xyz = torch.rand(50, 3, generator=generator) - 0.5
    rgb = (torch.rand(50, 3, generator=generator) * 255).round()
    config = OdinSplatModelConfig(num_downscales=0, **{**VIEW_SCHEDULE, **overrides})
    box = SceneBox(aabb=torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]))
    return config.setup(scene_box=box, num_train_data=num_train_data, seed_points=(xyz, rgb))


def due_steps(model: torch.nn.Module, steps: int, due=structural_change_due) -> set[int]:
    """The steps after which the model's strategy makes a structural change (as the trainer asks it)."""
    return {step for step in range(steps) if due(model.strategy, step)}


def test_the_rule_scales_lr_by_sqrt_betas_by_power_and_eps_for_a_sum() -> None:
    lr, betas, eps = BatchScaling(4).adam(1e-3, (0.9, 0.999), 1e-15)
    assert lr == pytest.approx(2e-3)
    assert betas == pytest.approx((0.9**4, 0.999**4))
    assert eps == pytest.approx(2e-15), "a gradient SUM needs eps x sqrt(S) (Grendel's mean: eps / sqrt(S))"
    assert BatchScaling(1).adam(1e-3, (0.9, 0.999), 1e-15) == (1e-3, (0.9, 0.999), 1e-15)


def test_adam_on_a_sum_with_the_rules_eps_equals_adam_on_the_mean_with_grendels_eps() -> None:
    """The docstring's claim: Adam is scale-invariant but for eps, so sum + eps x sqrt(S) == mean + eps / sqrt(S)."""
    size, eps = 4, 1e-3  # a large eps, so that a wrong scaling of it shows
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(size, 6, generator=generator) for _ in range(5)]
    lr, betas, sum_eps = BatchScaling(size).adam(1e-2, (0.9, 0.999), eps)
    summed = torch.nn.Parameter(torch.zeros(6))
    meaned = torch.nn.Parameter(torch.zeros(6))
    sum_adam = torch.optim.Adam([summed], lr=lr, betas=betas, eps=sum_eps)
    mean_adam = torch.optim.Adam([meaned], lr=lr, betas=betas, eps=eps / math.sqrt(size))
    for grad in grads:
        summed.grad, meaned.grad = grad.sum(dim=0), grad.mean(dim=0)
        sum_adam.step()
        mean_adam.step()
    assert torch.allclose(summed, meaned, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(summed, torch.zeros(6))


def test_optimizers_config_is_scaled_in_a_copy_and_its_decay_counts_views() -> None:
    config = odin_splat_optimizers(max_steps=30000)
    original = copy.deepcopy(config)
    scaled = BatchScaling(4).optimizers(config)
    assert config == original, "the user's config keeps its one-view values"
    for name, group in scaled.items():
        assert group["optimizer"].lr == pytest.approx(2 * original[name]["optimizer"].lr), name
        assert group["optimizer"].betas == pytest.approx((0.9**4, 0.999**4)), name
    decay = scaled["means"]["scheduler"]
    assert decay.max_steps == 7500 and decay.lr_final == pytest.approx(2 * 1.6e-6)
    assert BatchScaling(1).optimizers(config) == original


def test_an_unknown_scheduler_is_refused_naming_the_off_switch() -> None:
    from nerfstudio.engine.schedulers import MultiStepSchedulerConfig

    config = odin_splat_optimizers()
    config["means"]["scheduler"] = MultiStepSchedulerConfig(max_steps=100)
    with pytest.raises(ValueError, match="batch-scaling off"):
        BatchScaling(2).optimizers(config)


def test_four_workers_densify_and_reset_at_the_one_worker_views_over_four() -> None:
    one = model_of()
    four = model_of()
    four.scale_to_batch(num_workers=4, views_per_worker=1)
    views = due_steps(one, 450)
    assert {4 * step for step in due_steps(four, 450 // 4)} == views
    # The schedule above: refinements after views 120, 160, 280, 320, 360 (none within 48 views of a reset: 8 train
    # views + 40), opacity resets after views 0 and 200; so the mechanism was exercised, not an empty set.
    assert {4 * step for step in due_steps(four, 450 // 4, refine_due)} == {120, 160, 280, 320, 360}
    assert {4 * step for step in due_steps(four, 450 // 4, reset_due)} == {0, 200}


def test_two_workers_of_two_views_count_four_views_per_step_and_sh_degrees_follow() -> None:
    model = model_of(sh_degree_interval=100)
    model.scale_to_batch(num_workers=2, views_per_worker=2)
    assert model.strategy.views_per_step == 4 and model.strategy.refine_every == 40, "intervals stay in views"
    assert model.batch.first_view(25) == 100, "step 25 trains views 100 to 103: the SH degree's first raise"


def test_a_batch_that_does_not_divide_an_interval_refines_after_the_one_worker_views() -> None:
    """50 views a refinement at 4 views a step: each refinement falls in the step that trains the view a one-view
    run refines after, and there are as many; 50 rounded to 13 steps refined after views 104, 156, ... (one more
    refinement than one worker's, the first 46 views early)."""
    one = model_of(refine_every=50, stop_split_at=700)
    four = model_of(refine_every=50, stop_split_at=700)
    four.scale_to_batch(num_workers=4, views_per_worker=1)
    views = sorted(due_steps(one, 700, refine_due))
    steps = sorted(due_steps(four, 700 // 4, refine_due))
    assert views == [150, 200, 350, 400, 450, 600, 650], "warmup 100, a reset every 250 views and its 58-view pause"
    assert steps == [view // 4 for view in views]
    assert sorted(due_steps(four, 700 // 4, reset_due)) == [0, 62, 125], "after views 0, 250 and 500"


def test_adaptive_is_the_default_and_only_it_gives_the_runtime_a_gain() -> None:
    assert model_of().config.batch_scaling == "adaptive"
    assert batch_scaling("adaptive", 2, 2).gain() == AdaptiveGain(4)
    assert batch_scaling(True, 4, 1).gain() == AdaptiveGain(4), "True, the old 'on', is the default rule"
    assert batch_scaling("adaptive", 1, 1).gain() is None, "one view per step: nothing to measure"
    sqrt = batch_scaling("sqrt", 4, 1)
    assert sqrt.gain() is None and sqrt.views_per_step == 4, "Grendel's rule alone"
    assert batch_scaling("off", 4, 1) == batch_scaling(False, 4, 1) == BatchScaling(1)
    with pytest.raises(ValueError, match="--pipeline.model.batch-scaling 'grendel': choose one of adaptive, sqrt, off"):
        batch_scaling("grendel", 4, 1)


@pytest.mark.parametrize("off", [False, "off"])
def test_the_off_switch_keeps_every_count_in_iterations(off) -> None:
    off = model_of(batch_scaling=off)
    rule = off.scale_to_batch(num_workers=4, views_per_worker=1)
    assert rule.views_per_step == 1
    assert off.strategy.refine_every == 40 and off.strategy.refine_start_iter == 100
    assert due_steps(off, 450) == due_steps(model_of(), 450)
    assert rule.optimizers(odin_splat_optimizers()) == odin_splat_optimizers()
