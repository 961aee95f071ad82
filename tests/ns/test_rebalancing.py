"""Re-balancing by measured costs (``--pipeline.datamanager.rebalance-every``) under torchrun: two gloo ranks add up
what each measured, train the same re-balanced schedule, and a resumed run trains it too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from odin_nerfstudio.ns import command_line
from odin_nerfstudio.ns.checkpoints import allow_nerfstudio_checkpoints
from odin_nerfstudio.ns.rebalancing import REBALANCE_KEY
from odin_nerfstudio.scenes.synth import SynthConfig, make_scene
from tests.ns import processes
from tests.ns.processes import finish

ITERATIONS = 15
"""Three epochs of 5 steps (10 train views, W = 2): re-balances before steps 5 and 10, the next one due at 15."""
REBALANCE = ["--pipeline.datamanager.rebalance-every", "1", "--pipeline.model.num-downscales", "0"]


def odin_train(scene: Path, output: Path, name: str, iterations: int, *extra: str) -> list[str]:
    """odin-train on two torchrun ranks, re-balancing every epoch, into ``output / name``."""
    options = [*REBALANCE, *extra]
    args = command_line.train_args("odin-splat", scene, output, iterations, experiment_name=name, options=options)
    return [*command_line.launcher(2), *args]


def checkpoint(run: Path, step: int) -> dict:
    allow_nerfstudio_checkpoints()
    return torch.load(run / "nerfstudio_models" / f"step-{step:09d}.ckpt", map_location="cpu")


@pytest.mark.slow
def test_two_ranks_rebalance_by_every_ranks_measurements_and_a_resumed_run_keeps_the_schedule(tmp_path: Path) -> None:
    """Each rank measures only its own tasks, so a view measured on every rank's record shows the all-reduce ran;
    the ranks' costs are equal (digest), the re-balanced epochs differ from the predicted ones, and the checkpoint's
    costs are the last re-balance's, which a run resumed from it trains by."""
    scene = make_scene(SynthConfig(preset="street", num_views=12, output=tmp_path / "street"))
    finish(processes.start(*odin_train(scene, tmp_path, "first", ITERATIONS), one_thread=True))
    run = tmp_path / "first" / "odin-splat" / "run"
    records = [json.loads((run / f"odin_rebalance_rank{rank}.json").read_text()) for rank in range(2)]
    steps_per_epoch, views = records[0][0]["step"], records[0][0]["views"]
    assert (steps_per_epoch, views) == (5, 10), records[0]
    assert [entry["step"] for entry in records[0]] == list(range(steps_per_epoch, ITERATIONS, steps_per_epoch))
    for entry, other in zip(*records):
        assert entry == other, "both ranks re-balance by the same sums (cost digest) at the same step"
        assert entry["views_measured"] == views, f"a rank measured half the views; the sums hold all: {entry}"
        assert entry["tasks_measured"] >= views, entry
    assert sum(entry["steps_changed"] for entry in records[0]) > 0, f"the measured costs changed no step: {records}"

    last = checkpoint(run, ITERATIONS - 1)[REBALANCE_KEY]
    assert last["epoch"] == records[0][-1]["epoch"] and len(last["view_cost"]) == views
    # Resumed right at the next re-balance: nothing measured yet, so every view keeps the costs it resumed with.
    resume = odin_train(scene, tmp_path, "resumed", 1, "--load-dir", str(run / "nerfstudio_models"))
    finish(processes.start(*resume, one_thread=True))
    resumed = tmp_path / "resumed" / "odin-splat" / "run"
    (entry,) = json.loads((resumed / "odin_rebalance_rank0.json").read_text())
    assert entry["step"] == ITERATIONS and entry["tasks_measured"] == 0, entry
    assert entry["cost_digest"] == records[0][-1]["cost_digest"], "the resumed run trains the re-balanced schedule"
    assert checkpoint(resumed, ITERATIONS)[REBALANCE_KEY]["view_cost"] == last["view_cost"]


@pytest.mark.slow
def test_sharded_ranks_rebalance_between_steps_run_ahead_and_a_resumed_run_keeps_the_schedule(tmp_path: Path) -> None:
    """``--sharded``, quality-first: each rank measures the tasks it rendered (its own shard's reads), both re-balance
    by the same sums at each epoch's first step, while tasks ran ahead within the epochs (so the loop stopped
    fetching ahead at each re-balance: it refuses one otherwise); each shard file holds the costs, which a run
    resumed from them trains by."""
    scene = make_scene(SynthConfig(preset="street", num_views=12, output=tmp_path / "street"))
    sharded = ["--sharded", "True", "--runtime.mode", "quality"]
    finish(processes.start(*odin_train(scene, tmp_path, "first", ITERATIONS, *sharded), one_thread=True))
    run = tmp_path / "first" / "odin-splat" / "run"
    records = [json.loads((run / f"odin_rebalance_rank{rank}.json").read_text()) for rank in range(2)]
    assert [entry["step"] for entry in records[0]] == [5, 10], records[0]
    for entry, other in zip(*records):
        assert entry == other, "both ranks re-balance by the same sums (cost digest) at the same step"
        assert entry["views_measured"] == entry["views"] == 10, f"the sums hold every rank's views: {entry}"
    counters = [json.loads((run / f"odin_counters_rank{rank}.json").read_text()) for rank in range(2)]
    assert sum(c["ran_ahead"] for c in counters) > 0, counters

    allow_nerfstudio_checkpoints()
    shard = torch.load(run / "odin_shards" / f"step-{ITERATIONS - 1:09d}.rank-1-of-2.ckpt", map_location="cpu")
    assert shard[REBALANCE_KEY]["epoch"] == records[1][-1]["epoch"]
    resume = odin_train(scene, tmp_path, "resumed", 1, *sharded, "--load-dir", str(run / "nerfstudio_models"))
    finish(processes.start(*resume, one_thread=True))
    resumed = tmp_path / "resumed" / "odin-splat" / "run"
    (entry,) = json.loads((resumed / "odin_rebalance_rank1.json").read_text())
    assert entry["step"] == ITERATIONS and entry["tasks_measured"] == 0, entry
    assert entry["cost_digest"] == records[1][-1]["cost_digest"], "the resumed shards train the re-balanced schedule"
