"""odin-train under torchrun: two gloo processes, each one worker with its own replica, train odin-splat through
ns-train's command line and end bit-identical to one process running both workers as virtual workers (barrier).
A diverged replica is caught by the checksum with the ranks and parameters named."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from odin_nerfstudio.ns.checkpoints import allow_nerfstudio_checkpoints
from odin_nerfstudio.comm.replicas import check_replicas
from odin_nerfstudio.scheduling.colmap_model import import_pycolmap
from odin_nerfstudio.scenes.synth import SynthConfig, make_scene
from odin_nerfstudio.ns import command_line
from tests.ns import processes
from tests.ns.processes import finish

ITERATIONS = 14


def train_args(scene: Path, output: Path, name: str) -> list[str]:
    """odin-splat's flags for ITERATIONS steps on ``scene`` into ``output / name`` (no program: the caller's)."""
    options = ["--pipeline.model.num-downscales", "0", "--replica-check-every", "5"]
    return command_line.train_args("odin-splat", scene, output, ITERATIONS, experiment_name=name, options=options)


def train_command(scene: Path, output: Path, name: str, *extra: str, ranks: int | None = None) -> list[str]:
    """:func:`train_args` then ``extra`` under ``ns-train``, or under ``odin-train`` on ``ranks`` torchrun ranks."""
    return [*command_line.launcher(ranks), *train_args(scene, output, name), *extra]


def final_state(output: Path, name: str) -> dict:
    allow_nerfstudio_checkpoints()
    path = output / name / "odin-splat" / "run" / "nerfstudio_models" / f"step-{ITERATIONS - 1:09d}.ckpt"
    return torch.load(path, map_location="cpu")


def run_one_thread(*commands: list[str]) -> list[str]:
    """Run ``commands`` at once, each with one intra-op thread (as each rank has) so that all runs round alike;
    their outputs."""
    return [finish(run) for run in [processes.start(*command, one_thread=True) for command in commands]]


LANES_DENSIFY = [
    "--pipeline.datamanager.views-per-step", "2",
    "--pipeline.model.warmup-length", "16",
    "--pipeline.model.refine-every", "16",
    "--pipeline.model.densify-grad-thresh", "1e-4",
]  # fmt: skip
"""B = 2 views per worker and step; a densification after step 8 (counts in views: 4 per step)."""


@pytest.mark.slow
def test_torchrun_two_gloo_ranks_with_two_tasks_in_flight_equal_two_virtual_workers_across_a_densification(
    tmp_path: Path,
) -> None:
    """Two gloo ranks under torchrun, each rendering its B = 2 tasks of a step at once on two lanes
    (``--runtime.tasks-in-flight 2``) while its driver stages, validates and publishes beside them: quality-first
    ends bit-identical to one process running both workers as virtual workers one task at a time (barrier), across
    a densification; rank 0 alone speaks for the job, and every rank writes its timeline. (The same at B = 1 with one
    lane, in-process over gloo: ``tests/comm/test_transport.py``.)"""
    scene = make_scene(SynthConfig(preset="street", num_views=12, output=tmp_path / "street"))
    lanes = ["--runtime.tasks-in-flight", "2", *LANES_DENSIFY]
    virtual = ["--pipeline.datamanager.num-workers", "2", "--runtime.mode", "barrier", *LANES_DENSIFY]
    on_ranks = train_command(scene, tmp_path, "ranks", *lanes, ranks=2)
    output, _ = run_one_thread(on_ranks, train_command(scene, tmp_path, "virtual", *virtual))
    assert "rank 1 of 2 (gloo)" in output
    assert output.count("Training Finished") == 1, "rank 0 alone speaks for the job"
    assert output.count("LPIPS skipped") <= 1, "rank 0 alone warns that LPIPS is skipped"

    run = tmp_path / "ranks" / "odin-splat" / "run"
    for rank in range(2):
        assert (run / f"odin_timeline_rank{rank}.json").exists()
        counters = json.loads((run / f"odin_counters_rank{rank}.json").read_text())
        assert counters["most_in_flight"] == 2, f"rank {rank} never had two tasks in flight: {counters}"
        assert counters["waits"].get("raw", 0) > 0, f"rank {rank}'s reads never met an unpublished step: {counters}"
        assert counters["overlapped_reads"] > 0, f"rank {rank} never read beside an unpublished step: {counters}"
    ranks, virtual = final_state(tmp_path, "ranks"), final_state(tmp_path, "virtual")
    seeded = import_pycolmap().Reconstruction(str(scene / "sparse" / "0")).num_points3D()
    assert ranks["pipeline"]["_model.gauss_params.means"].shape[0] != seeded, "no densification changed the model"
    params = [key for key in ranks["pipeline"] if "gauss_params" in key]
    assert len(params) == 6
    for key in params:
        assert torch.equal(ranks["pipeline"][key], virtual["pipeline"][key]), key
    for name, state in ranks["optimizers"].items():
        for key, value in state["state"][0].items():
            assert torch.equal(value, virtual["optimizers"][name]["state"][0][key]), (name, key)


def _diverging_rank(rank: int, init_file: str, out_dir: str) -> None:
    """Rank 1 nudges one opacity; both ranks check their replicas."""
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        params = {"means": torch.ones(5, 3), "opacities": torch.zeros(5)}
        check_replicas(params, step=3)
        if rank == 1:
            params["opacities"][2] += 1e-6
        try:
            check_replicas(params, step=7)
            message = "no error"
        except RuntimeError as error:
            message = str(error)
        (Path(out_dir) / f"message{rank}.txt").write_text(message)
    except BaseException:
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def test_replica_check_names_the_step_rank_and_parameter(tmp_path: Path) -> None:
    mp.spawn(_diverging_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    errors = [path.read_text() for path in tmp_path.glob("error*.txt")]
    assert not errors, errors
    for rank in range(2):
        message = (tmp_path / f"message{rank}.txt").read_text()
        assert "by step 7" in message and "{1: ['opacities']}" in message, message
