"""Quality-first equals the barrier baseline bit for bit on real and synthetic scenes with OdinSplatModel.

68 schedule steps on W = 4 virtual workers, including one densification (grow and prune) and opacity resets,
under run-ahead and random interleavings: parameters and Adam moments are `torch.equal`. (W = 2: kermit_320 for 20
steps in the escape test below; the street through the trainer across a densification in ``tests/ns/test_trainer.py``,
where in one process no read meets an unpublished step: it checks the trainer's path, not reads ahead.)
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from nerfstudio.pipelines.base_pipeline import VanillaPipelineConfig

from odin_nerfstudio.method_configs.odin_splat import odin_splat_optimizers
from odin_nerfstudio.ns.datamanager import OdinDatamanagerConfig
from odin_nerfstudio.ns.dataparser import OdinColmapDataParserConfig
from odin_nerfstudio.ns.model import OdinSplatModelConfig
from odin_nerfstudio.ns.splat_runtime import splat_learning_rates, train_virtual
from odin_nerfstudio.adapter.gsplat import refine_due, reset_due
from odin_nerfstudio.runtime.runtime import OdinRuntimeConfig
from odin_nerfstudio.scenes.synth import SynthConfig, make_scene
from tests.conftest import real_scene
from odin_nerfstudio.scenes.toy import snapshot

STEPS = 68


def pipeline_config(scene: Path, workers: int, scale: float) -> VanillaPipelineConfig:
    """odin-splat at low resolution with densification at step 44 and opacity resets at steps 0 and 66.

    gsplat densifies at multiples of refine_every (22) outside the pause after a reset (the train views + 22): 44
    for up to 22 train views, 22 never (kermit_320 has 9, the street 21)."""
    return VanillaPipelineConfig(
        datamanager=OdinDatamanagerConfig(
            dataparser=OdinColmapDataParserConfig(data=scene),
            camera_res_scale_factor=scale,
            num_workers=workers,
            cache_images_type="uint8",
        ),
        model=OdinSplatModelConfig(
            num_downscales=0, warmup_length=20, refine_every=22, reset_alpha_every=3, densify_grad_thresh=2e-4
        ),
    )


def interleavings(workers: int) -> dict[str, list[int]]:
    """The last worker running ahead, and a seeded random order of turns. Left out, each for a fifth of this test's
    time: round robin (the order the baseline itself takes turns in: it tries least) and the first worker ahead
    (one worker far ahead of the others, as the last worker ahead already tries)."""
    return {
        "last-ahead": [workers - 1] * 40 + [0] * 10,
        "random": random.Random(workers).choices(range(workers), k=300),
    }


@pytest.fixture(scope="module")
def street(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic street scene (sparse overlap)."""
    return make_scene(SynthConfig(preset="street", output=tmp_path_factory.mktemp("street")))


@pytest.mark.slow
@pytest.mark.parametrize(("scene_name", "workers"), [("kermit_320", 4), ("street", 4)])
def test_quality_first_is_bit_identical_to_barrier(
    scene_name: str, workers: int, request: pytest.FixtureRequest, default_torch_threads: int
) -> None:
    real = scene_name != "street"
    scene, scale = (real_scene(scene_name), 0.25) if real else (request.getfixturevalue("street"), 0.5)
    config = pipeline_config(scene, workers, scale)
    lrs = splat_learning_rates(odin_splat_optimizers())
    baseline, baseline_runtime = train_virtual(
        config, OdinRuntimeConfig(mode="barrier"), STEPS, lrs
    )
    strategy = baseline.model.strategy
    assert any(refine_due(strategy, s) for s in range(STEPS - 1)) and any(
        reset_due(strategy, s) for s in range(1, STEPS - 1)
    )
    expected = snapshot(baseline_runtime)
    initial = baseline.datamanager.train_dataparser_outputs.metadata["points3D_xyz"].shape[0]
    assert expected["means"].shape[0] != initial, "the densification must change the number of Gaussians"

    conflicts = 0
    for name, turns in interleavings(workers).items():
        pipeline, runtime = train_virtual(
            config, OdinRuntimeConfig(mode="quality"), STEPS, lrs, turns
        )
        actual = snapshot(runtime)
        assert actual.keys() == expected.keys()
        for key in expected:
            assert torch.equal(actual[key], expected[key]), f"{name}: {key} differs from the barrier baseline"
        conflicts += runtime.counters.waits.get("raw", 0) + runtime.counters.reruns
    assert torch.get_num_threads() == default_torch_threads > 1
    assert conflicts > 0, "the interleavings must make quality-first wait or re-run, or the test proves nothing"


@pytest.mark.slow
def test_escapes_from_too_narrow_candidate_sets_are_caught_and_rerun(default_torch_threads: int) -> None:
    """With a negative culling margin, candidate sets miss Gaussians the rasterizer draws: every such task is
    counted as an escape and re-run on its widened set, so quality-first still equals the barrier baseline."""
    config = pipeline_config(real_scene("kermit_320"), 2, 0.25)
    lrs = splat_learning_rates(odin_splat_optimizers())
    narrow = {"candidate_margin": -0.3}
    baseline, baseline_runtime = train_virtual(config, OdinRuntimeConfig(mode="barrier", **narrow), 20, lrs)
    pipeline, runtime = train_virtual(config, OdinRuntimeConfig(mode="quality", **narrow), 20, lrs, [1] * 30)
    assert runtime.counters.validation_failures.get("escape", 0) > 0
    assert runtime.counters.reruns >= runtime.counters.validation_failures["escape"]
    expected, actual = snapshot(baseline_runtime), snapshot(runtime)
    assert all(torch.equal(actual[key], expected[key]) for key in expected)
    assert torch.get_num_threads() == default_torch_threads > 1
