"""--memory-cap-gib: a model over the per-process budget is refused before training with the command that trains it
(--sharded, how many processes); under the cap, or sharded across enough processes, it trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from odin_nerfstudio.ns.memory_cap import GIB, MemoryCapError, check_memory_cap
from odin_nerfstudio.runtime.ownership import row_bytes
from odin_nerfstudio.scenes.synth import SynthConfig, make_scene
from tests.ns.processes import finish
from tests.ns.test_sharded_training import run_folder, start

PARAMS = {"means": torch.zeros(1, 3), "scales": torch.zeros(1, 3), "opacities": torch.zeros(1, 1)}


def test_a_row_costs_its_parameters_twice_more_for_adam_plus_tables_and_bounds() -> None:
    assert row_bytes(PARAMS) == 3 * 7 * 4 + 24 + 48


def test_the_cap_refuses_a_replicated_model_naming_the_sharded_flag_and_the_processes() -> None:
    rows = 1_000_000
    cap = rows * row_bytes(PARAMS) / GIB / 3  # a third of what one replica needs
    with pytest.raises(MemoryCapError, match=r"--sharded True under torchrun --nproc-per-node 4 "):
        check_memory_cap(cap, PARAMS, rows, rows, sharded=False, when="before training")
    with pytest.raises(MemoryCapError, match=r"largest shard.*torchrun --nproc-per-node 4"):
        check_memory_cap(cap, PARAMS, rows // 2, rows, sharded=True, when="after the densification of step 9")
    check_memory_cap(cap, PARAMS, rows // 4, rows, sharded=True, when="before training")
    check_memory_cap(0.0, PARAMS, rows, rows, sharded=False, when="before training")


@pytest.mark.slow
def test_a_scene_over_one_process_budget_trains_sharded_on_four_ranks(tmp_path: Path) -> None:
    """odin-synth's object (its SfM points start the model): refused replicated before any step, trained by 4
    sharded gloo ranks under the same cap."""
    scene = make_scene(SynthConfig(preset="object", num_views=12, output=tmp_path / "object"))
    cap = ["--memory-cap-gib", "0.0008"]  # about 0.7 of the initial model's 0.0011 GiB
    cap += ["--pipeline.model.warmup-length", "1000"]  # no densification in these few steps
    replicated = start(scene, tmp_path, "replicated", *cap, iterations=4)
    finish(start(scene, tmp_path, "sharded", *cap, "--sharded", "True", ranks=4, iterations=4))
    with pytest.raises(AssertionError, match="--memory-cap-gib 0.0008. Train the scene sharded"):
        finish(replicated)
    assert not list((run_folder(tmp_path, "replicated") / "nerfstudio_models").glob("*.ckpt"))
    counters = json.loads((run_folder(tmp_path, "sharded") / "odin_counters_rank3.json").read_text())
    assert counters["publications"] == 4
