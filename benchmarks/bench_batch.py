"""Batch benchmark: the same views trained by one worker and by W virtual workers, the batch rule on (and off).

Why: a W x B step sums W x B views' gradients into ONE Adam update; without a rule, W workers take W x fewer,
larger updates and densify at other epochs than one worker (``odin_nerfstudio/ns/batch_scaling.py``). With the
rule (``--rule adaptive``, the default: lr x sqrt(W x B) x sqrt(r), r measured on the steps; ``--rule sqrt``:
Grendel's lr x sqrt(W x B); both with betas ** (W x B) and schedules counted in views) the held-out PSNR of W
workers should match one worker's: the target is within 0.3 dB, judged on the difference of the medians over several
seeds per side and its 90% bootstrap interval: met when the whole interval lies within 0.3 dB, missed when none of
it does, not resolved otherwise (the means are shown too: a run now and then loses one held-out view to a floater,
which moves a mean by a few dB and a median not at all).

Runs: ``ns-train odin-splat-quick --machine.device-type cpu`` at ``--scale`` of the scene's images, ``--views``
views in all: one worker for ``views`` iterations, W workers (B = 1, in one process) for ``views / W``; each side
once per ``--seeds`` value, which seeds both the model (``--machine.seed``) and the schedule's view order
(``--pipeline.datamanager.schedule-seed``), so the spread includes the view order. Scenes: the shipped
``tests/data/kermit_320`` (11 views; ``--eval-interval 4`` holds out 0, 4 and 8, leaving 8 train views: a step of
4 views is half the scene) or ``--scene /work/shared/data/fern`` (20 views; ``--eval-interval 5`` leaves 16).
The quick schedule's refinement interval is set to ``--refine-every`` views (40 by default, which W = 4 divides, as it
does the warmup of 100: the refinements fall after exactly the same views on 1 and 4 workers; with another interval,
within a step of them, as the schedules count views: ``adapter/gsplat.py``'s ``ViewCountedStrategy``). Then
``ns-eval`` on each final checkpoint. Every run logs its Gaussian count at every step (``--logging.steps-per-log
1``); the table counts the steps after which it changed, i.e. the refinements that grew or pruned.

Usage: ``python benchmarks/bench_batch.py [--rule adaptive|sqrt] [--views 400] [--workers 4] [--seeds 1 2 3 4]
[--no-off] [--jobs 2]``; rewrites the
section between ``<!-- bench_batch:start -->`` and ``<!-- bench_batch:end -->`` of BENCHMARKS.md unless
``--no-write`` (another ``--scene`` than the default writes ``bench_batch_<its folder name>``'s section: fern's
is made by ``--scene /work/shared/data/fern --eval-interval 5 --scale 0.16 --seeds 1 2 3 4 5 6 7 8 --no-off
--jobs 2``, where that folder exists).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from _report import BENCHMARKS, cpu_name, publish

from odin_nerfstudio.ns.command_line import train_command

NAME = "bench_batch"
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCENE = ROOT / "tests" / "data" / "kermit_320"
TARGET_DB = 0.3
COUNT_TAG = "Train Metrics Dict/gaussian_count"


@dataclass
class BatchRun:
    """One training run: its workers, rule and seed, what it trained, and its held-out metrics."""

    workers: int
    rule: str
    seed: int
    iterations: int
    changed_after_steps: list[int]
    gaussians: int
    train_s: float
    psnr: float
    ssim: float
    independence: dict[int, dict[str, float]]
    """:func:`view_independence` by step, then by parameter group (empty when not measured)."""
    gains: dict[str, float]
    """The adaptive rule's final gain sqrt(r) per parameter group (1 where it did not run)."""
    view_psnrs: list[float]
    """Each held-out view's PSNR, from ns-eval's 8-bit side-by-side images (a diagnostic: the mean is ns-eval's)."""

    @property
    def label(self) -> str:
        """The run's side: '1 worker' or 'W workers, rule <adaptive|sqrt|off>'."""
        if self.workers == 1:
            return "1 worker"
        return f"{self.workers} workers, rule {self.rule}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scene", type=Path, default=DEFAULT_SCENE, help="COLMAP scene (another than the default: its own section)"
    )
    parser.add_argument("--eval-interval", type=int, default=4, help="odin-colmap holds out every n-th view")
    parser.add_argument(
        "--rule", choices=("adaptive", "sqrt"), default="adaptive", help="the batch rule of the W-worker runs"
    )
    parser.add_argument("--views", type=int, default=400, help="views trained by each run")
    parser.add_argument("--workers", type=int, default=4, help="W, virtual workers of the batched runs (B = 1)")
    parser.add_argument("--scale", type=float, default=0.25, help="camera resolution factor of the scene's images")
    parser.add_argument("--refine-every", type=int, default=40, help="refinement interval, in views of one worker")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[1, 2, 3, 4], help="seeds of the model and the view order, per side"
    )
    parser.add_argument("--no-off", action="store_true", help="skip the W-worker run with the rule off (first seed)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (each trains on one torch thread)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per command before it is killed")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    if not (args.scene / "images").is_dir():
        parser.error(f"--scene {args.scene}: no images/ folder (a COLMAP scene has images/ and sparse/)")
    if args.views % args.workers:
        parser.error(f"--views {args.views} must be a multiple of --workers {args.workers} (the same views per run)")
    if len(args.seeds) < 2:
        parser.error("--seeds needs at least two seeds: the target is judged on medians with their spread")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs} must be at least 1")
    return args


def run(command: list[str], timeout: float) -> str:
    """Run a command; its stdout, or an error with its output's tail when it fails."""
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def train(args: argparse.Namespace, folder: Path, workers: int, rule: str, seed: int, measure: bool) -> BatchRun:
    """Train ``args.views`` views on ``workers`` virtual workers under ``rule``, then evaluate the final checkpoint
    (and, when ``measure``, how independent the views' gradients are at :func:`measured_steps`)."""
    iterations = args.views // workers
    measure_at = measured_steps(iterations) if measure else []
    name = f"w{workers}-{rule}-seed{seed}"
    options = [
        "--machine.seed", str(seed),
        "--save-only-latest-checkpoint", str(not measure),
        "--logging.steps-per-log", "1",
        "--pipeline.datamanager.num-workers", str(workers),
        "--pipeline.datamanager.schedule-seed", str(seed),
        "--pipeline.datamanager.camera-res-scale-factor", str(args.scale),
        "--pipeline.model.refine-every", str(args.refine_every),
        "--pipeline.model.batch-scaling", rule,
    ]  # fmt: skip
    command = train_command(
        "odin-splat-quick",
        args.scene,
        folder,
        iterations,
        experiment_name=name,
        steps_per_save=measure_at[0] if measure else iterations,
        options=options,
        dataparser=["odin-colmap", "--eval-interval", str(args.eval_interval)],
    )
    start = time.perf_counter()
    run(command, args.timeout)
    train_s = time.perf_counter() - start
    run_dir = folder / name / "odin-splat-quick" / "run"
    eval_json = folder / f"{name}-eval.json"
    renders = folder / f"{name}-renders"
    evaluate = [str(BIN / "ns-eval"), "--load-config", str(run_dir / "config.yml"), "--output-path", str(eval_json)]
    run([*evaluate, "--render-output-path", str(renders)], 600)
    results = json.loads(eval_json.read_text())["results"]
    changed, gaussians = count_changes(run_dir)
    independence = {step: view_independence(run_dir / "config.yml", step, args.workers) for step in measure_at}
    return BatchRun(
        workers,
        rule,
        seed,
        iterations,
        changed,
        gaussians,
        train_s,
        results["psnr"],
        results["ssim"],
        independence,
        final_gains(run_dir),
        view_psnrs(renders),
    )


def view_psnrs(renders: Path) -> list[float]:
    """Each held-out view's PSNR from ns-eval's side-by-side images (ground truth left, render right; 8-bit)."""
    import numpy as np
    from PIL import Image

    values = []
    for path in sorted(renders.glob("*_img_*.png")):
        image = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64) / 255.0
        half = image.shape[1] // 2
        error = np.mean((image[:, :half] - image[:, half : 2 * half]) ** 2)
        values.append(float(-10.0 * np.log10(max(error, 1e-12))))
    return values


def final_gains(run_dir: Path) -> dict[str, float]:
    """Per parameter group, the learning-rate gain its optimizer held at the run's last checkpoint."""
    import torch

    from odin_nerfstudio.ns.checkpoints import allow_nerfstudio_checkpoints

    allow_nerfstudio_checkpoints()
    newest = max((run_dir / "nerfstudio_models").glob("step-*.ckpt"))
    optimizers = torch.load(newest, map_location="cpu")["optimizers"]
    return {name: state["param_groups"][0].get("lr_gain", 1.0) for name, state in optimizers.items()}


def count_changes(run_dir: Path) -> tuple[list[int], int]:
    """The steps after which the logged Gaussian count changed, and the last count, from the run's tensorboard log.

    The count logged at step s is taken after the structural change due after step s - 1, so a change between the
    logs of s - 1 and s is a refinement after step s - 1.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    counts = [(scalar.step, int(scalar.value)) for scalar in events.Scalars(COUNT_TAG)]
    changed = [step - 1 for (_, before), (step, after) in zip(counts, counts[1:]) if after != before]
    return changed, counts[-1][1]


def measured_steps(iterations: int) -> list[int]:
    """Where the first run measures the views' independence: near the start, after a quarter, at the end."""
    early = max(1, iterations // 16)
    return sorted({early, iterations // 4, iterations - 1})


def view_independence(config: Path, step: int, size: int, draws: int = 200) -> dict[str, float]:
    """Grendel's independent-gradients hypothesis, measured at the checkpoint of ``step``: per parameter group, the
    mean over random sets of ``size`` train views of ||sum of their gradients||^2 / sum of their ||gradient||^2.

    1 when the views' gradients are uncorrelated (then Adam's step on their sum matches ``size`` one-view steps at
    lr x sqrt(size), the rule's scale), ``size`` when they are identical (then it takes lr x size).
    """
    import torch
    from nerfstudio.utils.eval_utils import eval_setup

    def at_step(trainer_config):
        trainer_config.load_step = step
        return trainer_config

    _, pipeline, _, step = eval_setup(config, test_mode="test", update_config_callback=at_step)
    model, datamanager = pipeline.model, pipeline.datamanager
    model.train()
    model.step, model.optimizers = step, {}  # the strategy's pre-backward hook reads them; nothing is stepped
    images = datamanager.cached_train  # caching undistorts the images and sets the cameras' intrinsics to match
    grads = []
    for view, data in enumerate(images):
        model.zero_grad(set_to_none=True)
        outputs = model.get_outputs(datamanager.train_dataset.cameras[view : view + 1])
        sum(model.get_loss_dict(outputs, data, {}).values()).backward()
        grads.append({name: param.grad.flatten().clone() for name, param in model.gauss_params.items()})
    generator = torch.Generator().manual_seed(0)
    sets = [torch.randperm(len(grads), generator=generator)[:size].tolist() for _ in range(draws)]
    ratios = {}
    for name in grads[0]:
        if not any(grad[name].any() for grad in grads):
            continue  # no gradient yet (features_rest before the first SH degree)
        values = [
            (sum(grads[v][name] for v in views).square().sum() / sum(grads[v][name].square().sum() for v in views))
            for views in sets
        ]
        ratios[name] = float(torch.stack(values).nanmean())
    return ratios


def mean_spread(values: list[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def median_gap(ours: list[float], theirs: list[float], draws: int = 10_000) -> tuple[float, float, float]:
    """median(ours) - median(theirs), and its 90% bootstrap interval (both sides resampled, seeded: reproducible).

    Why the median: a run now and then ends with one held-out view spoiled by a floater, a few dB off the mean of a
    handful of views, on either side at random; the median is not moved by such a run, the mean is.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = np.asarray(ours), np.asarray(theirs)
    gaps = np.median(rng.choice(a, (draws, a.size)), axis=1) - np.median(rng.choice(b, (draws, b.size)), axis=1)
    low, high = np.quantile(gaps, [0.05, 0.95])
    return float(np.median(a) - np.median(b)), float(low), float(high)


def verdict(low: float, high: float) -> str:
    """An equivalence verdict on the interval of the gap: "met" when all of it lies within the target, "missed" when
    none of it does, else "not resolved" (these seeds cannot tell)."""
    if -TARGET_DB <= low and high <= TARGET_DB:
        return "met"
    if high < -TARGET_DB or low > TARGET_DB:
        return "missed"
    return "not resolved"


def scene_line(args: argparse.Namespace) -> str:
    """What the runs trained on: the scene, its resolution, its split and the schedule."""
    views = sorted(path for path in (args.scene / "images").iterdir() if path.is_file())
    held = len(range(0, len(views), args.eval_interval))
    try:
        scene = f"`{args.scene.resolve().relative_to(ROOT)}`"
    except ValueError:
        scene = f"`{args.scene}` (outside the repository: a clone without it skips this scene)"
    return (
        f"Scene: {scene}, {len(views)} views at {args.scale} of their resolution, {len(views) - held} train views and "
        f"{held} held out (`odin-colmap --eval-interval {args.eval_interval}`): a step of {args.workers} views is "
        f"{args.workers / (len(views) - held):.0%} of the train views. `ns-train odin-splat-quick` with "
        f"`--pipeline.model.refine-every {args.refine_every}` (warmup 100 views, SH degree every 100 views), "
        f"{args.views} views per run, then `ns-eval`. A step of W workers sums W views' gradients into one "
        "selective-Adam update."
    )


def report(args: argparse.Namespace, command: str, runs: list[BatchRun]) -> str:
    """The markdown section (without markers): every run, each side's mean and spread, and the verdict."""
    lines = [
        (
            f"## bench_batch ({args.scene.resolve().name}): {args.views} views by 1 worker and by {args.workers} "
            f"virtual workers (batch rule: {args.rule})"
        ),
        "",
        f"Command: `{command}`  ",
        (
            f"Machine: CPU {cpu_name()}, {len(os.sched_getaffinity(0))} cores available, load average "
            f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} at the end; Python {platform.python_version()}; one "
            "process, OMP_NUM_THREADS=1  "
        ),
        f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
        "",
        scene_line(args),
        "",
        (
            "| run | seed | iterations | refinements that changed the count | Gaussians | train s | PSNR | SSIM "
            "| held-out views' PSNR (8-bit images) |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for batch in runs:
        views = ", ".join(f"{value:.1f}" for value in batch.view_psnrs)
        lines.append(
            f"| {batch.label} | {batch.seed} | {batch.iterations} | {len(batch.changed_after_steps)} "
            f"| {batch.gaussians:,} | {batch.train_s:.0f} | {batch.psnr:.2f} dB | {batch.ssim:.3f} | {views} |"
        )
    sides = {}
    for batch in runs:
        sides.setdefault(batch.label, []).append(batch)
    lines += [
        "",
        "| side | runs | PSNR median | PSNR mean +- std | SSIM mean | median - 1 worker's | mean - 1 worker's |",
        "|---|---|---|---|---|---|---|",
    ]
    one = [batch.psnr for batch in sides["1 worker"]]
    one_mean, one_std = mean_spread(one)
    for label, batches in sides.items():
        values = [batch.psnr for batch in batches]
        mean, std = mean_spread(values)
        ssim = statistics.fmean(batch.ssim for batch in batches)
        deltas = ("-", "-") if label == "1 worker" else (
            f"{statistics.median(values) - statistics.median(one):+.2f} dB", f"{mean - one_mean:+.2f} dB"
        )
        spread = f" +- {std:.2f}" if len(batches) > 1 else ""
        lines.append(
            f"| {label} | {len(batches)} | {statistics.median(values):.2f} dB | {mean:.2f}{spread} dB | {ssim:.3f} "
            f"| {deltas[0]} | {deltas[1]} |"
        )
    on_label, off_label = f"{args.workers} workers, rule {args.rule}", f"{args.workers} workers, rule off"
    on = [batch.psnr for batch in sides[on_label]]
    on_mean, on_std = mean_spread(on)
    gap, low, high = median_gap(on, one)
    # The standard error of a difference of two independent means: sqrt(s1^2 / n1 + s2^2 / n2).
    error = (one_std**2 / len(one) + on_std**2 / len(on)) ** 0.5
    lines += [
        "",
        (
            f"Target: {args.workers} workers with the {args.rule} rule within {TARGET_DB} dB of one worker, on the "
            f"medians of {len(args.seeds)} seeds per side: **{verdict(low, high)}** "
            f"({gap:+.2f} dB; 90% bootstrap interval {low:+.2f} to {high:+.2f} dB). The means differ by "
            f"{on_mean - one_mean:+.2f} dB (standard error {error:.2f} dB). Each seed draws the model's initialisation "
            "and the schedule's view order, so the spread is run-to-run noise of this setting; a run whose held-out "
            "views include one far below the others (last column) met a floater in front of that view, which moves "
            "its mean by a few dB and its side's mean with it, not the median."
        ),
        *(
            [
                f"Rule off (first seed only): {sides[off_label][0].psnr - one_mean:+.2f} dB from one worker's mean; "
                f"its schedules count iterations, so {args.workers} workers refine only after {args.workers}x as many "
                f"views and take {args.workers}x fewer updates of the configured size."
            ]
            if off_label in sides
            else []
        ),
        (
            f"Grendel's hypothesis (its sqrt(batch) scaling is exact when the views' gradients are independent), "
            f"measured on checkpoints of the first run: over random sets of {args.workers} train views, ||sum of the "
            f"gradients||^2 / sum of ||gradient||^2 is 1 when they are independent (then lr x sqrt({args.workers}) "
            f"matches {args.workers} one-view steps) and {args.workers} when identical (then lr x {args.workers} "
            "would): "
            + "; ".join(
                f"after {step + 1} views "
                + ", ".join(f"{name} {ratio:.2f}" for name, ratio in ratios.items())
                for step, ratios in runs[0].independence.items()
            )
            + "."
        ),
        *(
            [
                f"The adaptive rule's gain sqrt(r) at the end of each {args.workers}-worker run, per group: "
                + "; ".join(
                    f"seed {batch.seed}: " + ", ".join(f"{name} {gain:.2f}" for name, gain in batch.gains.items())
                    for batch in sides[on_label]
                )
                + "."
            ]
            if args.rule == "adaptive"
            else []
        ),
        (
            "Refinements that changed the count: steps after which the Gaussian count logged differs from the step "
            "before. train s: wall time of the ns-train command, start-up included, on a shared machine (see its load)."
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Train one worker and W workers with the rule per seed, and (unless --no-off) W workers without one once."""
    args = parse_args(argv)
    command = "python " + shlex.join(["benchmarks/bench_batch.py", *(sys.argv[1:] if argv is None else argv)])
    plan = [(workers, args.rule, seed) for seed in args.seeds for workers in (1, args.workers)]
    if not args.no_off:
        plan.append((args.workers, "off", args.seeds[0]))
    with tempfile.TemporaryDirectory(prefix="bench_batch_") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        # The first run also measures the views' independence on its checkpoints; the others may run side by side.
        futures = [
            pool.submit(train, args, Path(tmp), workers, rule, seed, index == 0)
            for index, (workers, rule, seed) in enumerate(plan)
        ]
        runs = []
        for future in futures:
            runs.append(future.result())
            done = runs[-1]
            print(f"{done.label}, seed {done.seed}: PSNR {done.psnr:.2f} dB after {done.train_s:.0f} s", flush=True)
    name = NAME if args.scene.resolve() == DEFAULT_SCENE else f"{NAME}_{args.scene.resolve().name}"
    publish(name, report(args, command, runs), None if args.no_write else args.output)


if __name__ == "__main__":
    main()
