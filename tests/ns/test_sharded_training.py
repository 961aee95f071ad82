"""``--sharded`` through what users run: odin-train under torchrun (2 gloo ranks, one shard each) on the shipped
kermit_320 capture, across a densification, against the replicated barrier of ns-train with 2 virtual workers;
resume from a shard checkpoint; ns-eval and ns-export on the consolidated checkpoint; errors that name the file."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from odin_nerfstudio.ns import command_line
from odin_nerfstudio.ns.checkpoints import allow_nerfstudio_checkpoints
from odin_nerfstudio.ns.sharded_training import find_sharded_checkpoint, scheduled_rates
from odin_nerfstudio.scenes.synth import SynthConfig, make_scene
from tests.ns import processes
from tests.ns.processes import Started, finish
from tests.ns.test_training import real_scene

ITERATIONS = 10
SAVE_EVERY = 5
REGIONS = ("--pipeline.datamanager.schedule-order", "regions")
"""The replicated reference runs the sharded mode's order (its default, auto, is regions with --sharded)."""
DENSIFY = [
    "--pipeline.model.num-downscales", "0",
    "--pipeline.datamanager.views-per-step", "2",
    "--pipeline.model.warmup-length", "8",
    "--pipeline.model.refine-every", "8",
    "--pipeline.model.densify-grad-thresh", "1e-4",
    "--save-only-latest-checkpoint", "False",
]  # fmt: skip
"""B = 2 views per worker and step (4 views a step); a refinement every 2 steps after the first 2; every checkpoint
kept (a resume starts from the middle one)."""


def start(scene: Path, output: Path, name: str, *options: str, ranks: int | None = None, **flags) -> Started:
    """Start training ``name`` (ITERATIONS steps, a checkpoint every SAVE_EVERY) with one intra-op thread per process.
    Runs started together overlap their start-ups and waits (the suite's time on 2 cores)."""
    command = command_line.train_command(
        "odin-splat", scene, output, flags.pop("iterations", ITERATIONS), ranks=ranks, experiment_name=name,
        steps_per_save=SAVE_EVERY, options=[*DENSIFY, *options], **flags,
    )  # fmt: skip
    return replace(processes.start(*command, one_thread=True), name=name)


def evaluate(output: Path, name: str) -> Started:
    """Start ns-eval on run ``name``'s latest checkpoint, writing ``output / name.json``, with one intra-op thread
    (as :func:`psnr_here`: a mean over another number of threads may differ in its last bit)."""
    config = run_folder(output, name) / "config.yml"
    return processes.start(
        "ns-eval", "--load-config", str(config), "--output-path", str(output / f"{name}.json"), one_thread=True
    )


def psnr_here(output: Path, name: str) -> float:
    """ns-eval's held-out PSNR of run ``name``'s latest checkpoint, by ns-eval's own code in this process with one
    intra-op thread: for the references a test compares with, without a command's start-up (about 11 s of CPU on
    2 cores) each."""
    from nerfstudio.scripts.eval import ComputePSNR

    path, threads = output / f"{name}-here.json", torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ComputePSNR(load_config=run_folder(output, name) / "config.yml", output_path=path).main()
    finally:
        torch.set_num_threads(threads)
    return json.loads(path.read_text())["results"]["psnr"]


def run_folder(output: Path, name: str) -> Path:
    return output / name / "odin-splat" / "run"


def checkpoint(output: Path, name: str, step: int = ITERATIONS - 1) -> dict:
    allow_nerfstudio_checkpoints()
    path = run_folder(output, name) / "nerfstudio_models" / f"step-{step:09d}.ckpt"
    return torch.load(path, map_location="cpu")


def params_of(state: dict) -> dict[str, torch.Tensor]:
    return {key: value for key, value in state["pipeline"].items() if "gauss_params" in key}


def shard_moments(output: Path, name: str, step: int = ITERATIONS - 1) -> dict[str, torch.Tensor]:
    """Every shard's Adam moments of ``step``, concatenated in rank order (global-id order)."""
    folder = run_folder(output, name) / "odin_shards"
    manifest = json.loads((folder / f"step-{step:09d}.json").read_text())
    shards = [torch.load(folder / file, map_location="cpu") for file in manifest["files"]]
    return {
        f"{param}.{key}": torch.cat([shard["optimizers"][param]["state"][0][key] for shard in shards])
        for param in shards[0]["optimizers"]
        for key in ("exp_avg", "exp_avg_sq")
    }


def assert_same_params(a: dict, b: dict) -> None:
    first, second = params_of(a), params_of(b)
    assert first.keys() == second.keys() and len(first) == 6
    for key in first:
        assert torch.equal(first[key], second[key]), key


@pytest.mark.slow
def test_sharded_ranks_equal_the_replicated_barrier_resume_and_serve_every_verb(tmp_path: Path) -> None:
    scene = real_scene("kermit_320")
    runs = [
        start(scene, tmp_path, "virtual", "--pipeline.datamanager.num-workers", "2", "--runtime.mode", "barrier",
              *REGIONS),
        start(scene, tmp_path, "barrier", "--sharded", "True", "--runtime.mode", "barrier", ranks=2),
    ]  # fmt: skip
    _, out = map(finish, runs)
    assert "Odin sharded: rank 1 owns rows" in out

    virtual = checkpoint(tmp_path, "virtual")
    assert params_of(virtual)["_model.gauss_params.means"].shape[0] != 649, "the run should densify"
    assert_same_params(checkpoint(tmp_path, "barrier"), virtual)
    moments = shard_moments(tmp_path, "barrier")
    for param, state in virtual["optimizers"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(moments[f"{param}.{key}"], state["state"][0][key]), (param, key)
    counters = json.loads((run_folder(tmp_path, "barrier") / "odin_counters_rank0.json").read_text())
    assert counters["restructures"] > 0 and counters["rows_fetched"] > 0
    # After training, everything else at once (the suite's time: each command is mostly its start-up): the timeline;
    # resuming the sharded barrier from its middle checkpoint, across the later refinements; ns-eval and
    # ns-export on the consolidated checkpoint (the whole model), ns-eval's PSNR the replicated run's; and a resume
    # that must be refused, with a shard of the last step missing.
    folder, models = run_folder(tmp_path, "barrier"), run_folder(tmp_path, "barrier") / "nerfstudio_models"
    last = ITERATIONS - 1
    shutil.move(folder / "odin_shards" / f"step-{last:09d}.rank-1-of-2.ckpt", tmp_path / "moved.ckpt")
    sharded = ["--sharded", "True", "--runtime.mode", "barrier", "--load-dir", str(models)]
    later = [
        processes.start("odin-timeline", str(run_folder(tmp_path, "barrier"))),
        start(scene, tmp_path, "resumed", *sharded, "--load-step", str(SAVE_EVERY), ranks=2,
              iterations=ITERATIONS - SAVE_EVERY - 1),
        evaluate(tmp_path, "barrier"),
        processes.start("ns-export", "gaussian-splat", "--load-config", str(folder / "config.yml"), "--output-dir",
                        str(tmp_path / "export")),
        start(scene, tmp_path, "lost", *sharded, "--load-step", str(last), ranks=2, iterations=2),
    ]  # fmt: skip
    # While they run, in this process: the check every rank makes before it trains refuses a resume with another W.
    with pytest.raises(ValueError, match="saved by 2 shards and this run has 1: .*--nproc-per-node 2"):
        find_sharded_checkpoint(SimpleNamespace(load_dir=models, load_step=SAVE_EVERY), rank=0, num_shards=1)
    reference = psnr_here(tmp_path, "virtual")
    drawn, *_ = map(finish, later[:4])
    assert "views/s" in drawn and (run_folder(tmp_path, "barrier") / "odin_timeline.png").exists()
    assert_same_params(checkpoint(tmp_path, "resumed"), virtual)
    assert json.loads((tmp_path / "barrier.json").read_text())["results"]["psnr"] == reference, "the whole model's"
    ply = (tmp_path / "export" / "splat.ply").read_bytes()
    vertices = int(ply.split(b"element vertex ")[1].split(b"\n")[0])
    assert vertices == params_of(virtual)["_model.gauss_params.means"].shape[0]
    with pytest.raises(AssertionError, match="rank-1-of-2.ckpt of .* are missing"):
        finish(later[4])


@pytest.mark.slow
def test_three_sharded_ranks_on_a_sparse_street_equal_the_barrier_and_read_ahead(tmp_path: Path) -> None:
    """W = 3 (uneven shards) on an odin-synth street: sharded quality-first (behind the emulated PCIe link) equals the
    replicated barrier of 3 virtual workers bit for bit, and its reads ran ahead of unpublished steps, some of them on
    rows their own owner published early (``Owner.publish_early``); sharded throughput-first, its bounds lifted, keeps
    stale values (its model is not the barrier's) and its PSNR is within 1% of that barrier's. (The sharded barrier
    equals the replicated one at W = 3 in ``tests/runtime/test_sharded.py``, through the CLI at W = 2 above.)"""
    # The locality order, K = 2 for quality-first (one step fetched ahead): on this small street, in the regional
    # order (the sharded default) a worker's next view overlaps what the step before writes, and at K = 4 a task
    # must be clear of three unpublished steps' writes; in either case no read runs ahead. A step runs ahead only
    # where no task of it waits for the rest of its rows: 24 views along 90 m, so that some steps do.
    scene = make_scene(SynthConfig(preset="street", num_views=24, street_length=90.0, output=tmp_path / "street"))
    street = ["--pipeline.datamanager.views-per-step", "1", "--save-only-latest-checkpoint", "True"]
    street += ["--pipeline.datamanager.schedule-order", "rlg", "--runtime.ring-slots", "2"]  # K orders the steps
    virtual = ["--pipeline.datamanager.num-workers", "3", "--runtime.mode", "barrier"]
    steps = 14  # 9 tasks ran ahead and 2 were settled locally here (3 and 1 in 10 steps)
    runs = [start(scene, tmp_path, "virtual", *street, *virtual, iterations=steps)]
    lifted = ["--runtime.stale-fraction", "1", "--runtime.stale-grad-ratio", "1000"]  # every stale read admitted
    for mode, link, bounds in (("quality", "pcie", []), ("throughput", "none", lifted)):
        sharded = ["--sharded", "True", "--runtime.mode", mode, "--interconnect", link, *bounds]
        runs.append(start(scene, tmp_path, mode, *street, *sharded, ranks=3, iterations=steps))
    for run in runs:
        finish(run)
    last = steps - 1
    assert_same_params(checkpoint(tmp_path, "quality", last), checkpoint(tmp_path, "virtual", last))
    folder = run_folder(tmp_path, "quality")
    counters = [json.loads((folder / f"odin_counters_rank{r}.json").read_text()) for r in range(3)]
    assert sum(c["ran_ahead"] for c in counters) > 0
    assert sum(c["settled_locally"] for c in counters) > 0, "an owner's early publication settled a task locally"
    assert len({c["rest_fetches"] for c in counters}) == 1, "every rank fetched the rest of the same steps"
    assert all(c["placed"] > 0 for c in counters), "workers ran on other ranks than their numbers"

    # Throughput-first, its bounds lifted: stale reads admitted at the owners, and kept, so that the model is not the
    # barrier's (with the default bounds this short run kept none that read a changed row: it ended at the barrier's
    # model bit for bit); its held-out PSNR within 1% of the barrier's (ns-eval's code in this process: ns-eval
    # itself on a sharded run is the first test's).
    folder = run_folder(tmp_path, "throughput")
    counters = [json.loads((folder / f"odin_counters_rank{r}.json").read_text()) for r in range(3)]
    print("throughput stale reads", [c["stale_reads"] for c in counters], "re-runs", [c["reruns"] for c in counters])
    assert sum(c["stale_reads"] for c in counters) > 0, "a PSNR band met without stale reads says nothing of them"
    stale_model, barrier_model = params_of(checkpoint(tmp_path, "throughput", last)), params_of(checkpoint(
        tmp_path, "virtual", last))
    assert not all(torch.equal(stale_model[key], barrier_model[key]) for key in barrier_model), "no stale value kept"
    psnr = {name: psnr_here(tmp_path, name) for name in ("virtual", "throughput")}
    print("PSNR", psnr)
    assert abs(psnr["throughput"] - psnr["virtual"]) <= 0.01 * psnr["virtual"]
    manifest = json.loads((folder / "odin_shards" / f"step-{last:09d}.json").read_text())
    assert len(set(torch.tensor(manifest["bounds"]).diff().tolist())) > 1, "cut by load, the shards are uneven"
    kept = sorted(path.name for path in (folder / "odin_shards").iterdir())
    assert kept == [f"step-{last:09d}.json", *manifest["files"]], "only the latest checkpoint is kept"
    assert [p.name for p in (folder / "nerfstudio_models").iterdir()] == [f"step-{last:09d}.ckpt"]


@pytest.mark.slow
def test_kermit_on_three_ranks_equals_the_replicated_barrier_across_re_cuts(tmp_path: Path) -> None:
    """kermit_320 at W = 3 (uneven shards of a real scene; the street at W = 3 and kermit_320 at W = 2 are the tests
    above): sharded quality-first against the replicated barrier of 3 virtual workers, across densifications after
    which the shards were re-cut by load, alike on every rank, with steps fetched ahead of the publication before
    them (their rest fetched after it). 6 views a step: a refinement every 6 views after the first 6 (after every
    step from step 2), so that the loads drift apart."""
    scene, iterations = real_scene("kermit_320"), 9
    every_step = ["--pipeline.model.warmup-length", "6", "--pipeline.model.refine-every", "6"]
    virtual = ["--pipeline.datamanager.num-workers", "3", "--runtime.mode", "barrier", *REGIONS, *every_step]
    sharded = ["--sharded", "True", "--runtime.mode", "quality", *every_step]
    runs = [start(scene, tmp_path, "virtual", *virtual, iterations=iterations)]
    runs.append(start(scene, tmp_path, "sharded", *sharded, ranks=3, iterations=iterations))
    for run in runs:
        finish(run)
    last = iterations - 1
    assert_same_params(checkpoint(tmp_path, "sharded", last), checkpoint(tmp_path, "virtual", last))
    folder = run_folder(tmp_path, "sharded")
    counters = [json.loads((folder / f"odin_counters_rank{r}.json").read_text()) for r in range(3)]
    assert all(c["restructures"] > 0 for c in counters)
    assert len({c["recuts"] for c in counters}) == 1, "every rank re-cuts alike"
    assert counters[0]["recuts"] > 0, "the shards were re-cut by load"
    assert len({c["rest_fetches"] for c in counters}) == 1 and counters[0]["rest_fetches"] > 0, (
        "quality-first fetched steps ahead of the publication before them, then their rest, alike on every rank"
    )


def test_the_rates_ahead_are_the_schedulers_own() -> None:
    """The learning rates that bound the steps fetched ahead: nerfstudio's exponential decay (a ``LambdaLR``) k
    scheduler steps on, the current rate without a scheduler, unbounded under a scheduler it cannot read ahead."""
    from nerfstudio.engine.schedulers import ExponentialDecaySchedulerConfig

    def optimizer(lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=lr)

    means, scales, quats = optimizer(1.6e-4), optimizer(5e-3), optimizer(1e-3)
    decay = ExponentialDecaySchedulerConfig(lr_final=1.6e-6, max_steps=100).setup().get_scheduler(means, 1.6e-4)
    for _ in range(3):
        means.step()
        decay.step()
    step = torch.optim.lr_scheduler.StepLR(quats, step_size=1)
    rates = scheduled_rates(SimpleNamespace(optimizers={"means": means, "scales": scales, "quats": quats},
                                            schedulers={"means": decay, "quats": step}))
    ahead = [rates("means", k) for k in range(4)]
    seen = [means.param_groups[0]["lr"]]
    for _ in range(3):
        means.step()
        decay.step()
        seen.append(means.param_groups[0]["lr"])
    assert ahead == pytest.approx(seen, rel=1e-12) and ahead[3] < ahead[0]
    assert rates("scales", 2) == 5e-3
    assert rates("quats", 1) == float("inf") and rates("quats", 0) == 1e-3
