"""Per-task losses do not pile up over a long run: late re-runs' losses are dropped when a later step is logged."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from odin_nerfstudio.ns.splat_runtime import SplatTaskRenderer


def test_losses_of_earlier_steps_are_dropped_when_a_step_is_popped() -> None:
    renderer = SimpleNamespace(losses={})
    for step in range(1000):
        renderer.losses[(step, 0, 0)] = torch.tensor(float(step))
        renderer.losses[(step + 1, 0, 0)] = torch.tensor(-1.0)  # the next step, already rendered (overlap)
        assert SplatTaskRenderer.pop_losses(renderer, step) == [torch.tensor(float(step))]
        renderer.losses[(step - 1, 1, 0)] = torch.tensor(0.5)  # a late re-run of the previous step
    assert sorted(renderer.losses) == [(998, 1, 0), (1000, 0, 0)], "only the next step and one late re-run remain"
