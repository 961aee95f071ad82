"""Batch benchmark: the same views trained by one worker and by W virtual workers, Grendel's rule on (and off).

Why: a W x B step sums W x B views' gradients into ONE Adam update; without a rule, W workers take W x fewer,
larger updates and densify at other epochs than one worker (``odin_nerfstudio/ns/batch_scaling.py``). With the
rule (lr x sqrt(W x B), betas ** (W x B), schedules counted in views) the held-out PSNR of W workers should match
one worker's: the target is within 0.3 dB.

Runs: ``ns-train odin-splat-quick --machine.device-type cpu`` on the shipped ``tests/data/kermit_320`` (11 views;
``odin-colmap --eval-interval 4`` holds out views 0, 4 and 8, leaving 8 train views so that every step of 4 views
is full), at ``--scale`` of 320x240, ``--views`` views in all: one worker for ``views`` iterations, W workers
(B = 1, in one process) for ``views / W``. The quick schedule's refinement interval is set to ``--refine-every``
views (40 by default: W = 4 divides it and the warmup of 100, so the rule's conversion is exact; 50, the quick
default, would round to 13 steps = 52 views). Then ``ns-eval`` on each final checkpoint. Every run logs its
Gaussian count at every step (``--logging.steps-per-log 1``); the table lists after which views it changed, i.e.
when a refinement grew or pruned (one that changed nothing is not seen).

Usage: ``python benchmarks/bench_batch.py [--views 400] [--workers 4] [--no-off]``; rewrites the section between
``<!-- bench_batch:start -->`` and ``<!-- bench_batch:end -->`` of BENCHMARKS.md unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _report import BENCHMARKS, cpu_name, publish

NAME = "bench_batch"
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
TARGET_DB = 0.3
COUNT_TAG = "Train Metrics Dict/gaussian_count"


@dataclass
class BatchRun:
    """One training run: its workers, whether the rule was on, what it trained, and its held-out metrics."""

    label: str
    workers: int
    rule: bool
    iterations: int
    changed_after_steps: list[int]
    gaussians: int
    train_s: float
    psnr: float
    ssim: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene", type=Path, default=ROOT / "tests" / "data" / "kermit_320", help="COLMAP scene")
    parser.add_argument("--views", type=int, default=400, help="views trained by each run")
    parser.add_argument("--workers", type=int, default=4, help="W, virtual workers of the batched runs (B = 1)")
    parser.add_argument("--scale", type=float, default=0.25, help="camera resolution factor of the 320x240 scene")
    parser.add_argument("--refine-every", type=int, default=40, help="refinement interval, in views of one worker")
    parser.add_argument("--seed", type=int, default=42, help="--machine.seed of every run")
    parser.add_argument("--no-off", action="store_true", help="skip the W-worker run with the rule off")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per command before it is killed")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    if args.views % args.workers:
        parser.error(f"--views {args.views} must be a multiple of --workers {args.workers} (the same views per run)")
    return args


def run(command: list[str], timeout: float) -> str:
    """Run a command; its stdout, or an error with its output's tail when it fails."""
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def train(args: argparse.Namespace, folder: Path, label: str, workers: int, rule: bool) -> BatchRun:
    """Train ``args.views`` views on ``workers`` virtual workers (rule on or off), then evaluate the checkpoint."""
    iterations = args.views // workers
    name = label.replace(" ", "-").replace(",", "")
    command = [
        str(BIN / "ns-train"),
        "odin-splat-quick",
        "--data",
        str(args.scene),
        "--machine.device-type",
        "cpu",
        "--machine.seed",
        str(args.seed),
        "--vis",
        "tensorboard",
        "--viewer.quit-on-train-completion",
        "True",
        "--output-dir",
        str(folder),
        "--experiment-name",
        name,
        "--timestamp",
        "run",
        "--max-num-iterations",
        str(iterations),
        "--steps-per-save",
        str(iterations),
        "--steps-per-eval-all-images",
        "0",
        "--steps-per-eval-image",
        "0",
        "--logging.steps-per-log",
        "1",
        "--pipeline.datamanager.num-workers",
        str(workers),
        "--pipeline.datamanager.camera-res-scale-factor",
        str(args.scale),
        "--pipeline.model.refine-every",
        str(args.refine_every),
        "--pipeline.model.batch-scaling",
        str(rule),
        "odin-colmap",
        "--eval-interval",
        "4",
    ]
    start = time.perf_counter()
    run(command, args.timeout)
    train_s = time.perf_counter() - start
    run_dir = folder / name / "odin-splat-quick" / "run"
    eval_json = folder / f"{name}-eval.json"
    run([str(BIN / "ns-eval"), "--load-config", str(run_dir / "config.yml"), "--output-path", str(eval_json)], 600)
    results = json.loads(eval_json.read_text())["results"]
    changed, gaussians = count_changes(run_dir)
    return BatchRun(label, workers, rule, iterations, changed, gaussians, train_s, results["psnr"], results["ssim"])


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


def report(args: argparse.Namespace, command: str, runs: list[BatchRun]) -> str:
    """The markdown section (without markers): the runs side by side and the verdict against the target."""
    one = runs[0]
    lines = [
        f"## bench_batch: {args.views} views by 1 worker and by {args.workers} virtual workers (Grendel's rule)",
        "",
        f"Command: `{command}`  ",
        (
            f"Machine: CPU {cpu_name()}, {len(os.sched_getaffinity(0))} cores available, load average "
            f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; Python {platform.python_version()}; one process, "
            "OMP_NUM_THREADS=1  "
        ),
        f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
        "",
        (
            f"Scene: `tests/data/kermit_320` at {int(320 * args.scale)}x{int(240 * args.scale)}, 8 train views, views "
            f"0, 4, 8 held out (`odin-colmap --eval-interval 4`). `ns-train odin-splat-quick` with "
            f"`--pipeline.model.refine-every {args.refine_every}` (warmup 100 views, SH degree every 100 views), "
            f"{args.views} views per run (fewer than the quick config's 1,000 to fit the machine; the table shows "
            "after which views each run refined), then `ns-eval`. A step of W workers sums W views' gradients into one "
            "selective-Adam update."
        ),
        "",
        "| run | W x B | iterations | Gaussian count changed (after view) | Gaussians | train s | PSNR | SSIM "
        "| PSNR - 1 worker |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for batch in runs:
        views = ", ".join(str((step + 1) * batch.workers) for step in batch.changed_after_steps)
        delta = "-" if batch is one else f"{batch.psnr - one.psnr:+.2f} dB"
        lines.append(
            f"| {batch.label} | {batch.workers} x 1 | {batch.iterations} | {len(batch.changed_after_steps)} ({views}) "
            f"| {batch.gaussians:,} | {batch.train_s:.0f} | {batch.psnr:.2f} dB | {batch.ssim:.3f} | {delta} |"
        )
    on = next(batch for batch in runs if batch.workers > 1 and batch.rule)
    off = next((batch for batch in runs if not batch.rule), None)
    within = abs(on.psnr - one.psnr) <= TARGET_DB
    lines += [
        "",
        (
            f"Target: {args.workers} workers with the rule within {TARGET_DB} dB of one worker: "
            f"**{'met' if within else 'missed'}** ({on.psnr - one.psnr:+.2f} dB). One seed per run, one eval split of "
            "three views: the difference includes the different view orders of the two schedules, not only the rule."
        ),
        *(
            [
                f"Rule off: {off.psnr - one.psnr:+.2f} dB; its schedules count iterations, so {args.workers} workers "
                f"refine only after {args.workers}x as many views"
                + (" (here: not within the run)." if not off.changed_after_steps else ".")
            ]
            if off is not None
            else []
        ),
        (
            "A change after view v: the Gaussian count logged after a step differs from the step before, i.e. a "
            "refinement ran after the step whose last view is v = (step + 1) x W. "
            "train s: wall time of the ns-train command, start-up included, on a shared machine (see its load)."
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Train one worker, W workers with the rule and (unless --no-off) without it; print and record the table."""
    args = parse_args(argv)
    command = "python " + shlex.join(["benchmarks/bench_batch.py", *(sys.argv[1:] if argv is None else argv)])
    plan = [("1 worker", 1, True), (f"{args.workers} workers, rule on", args.workers, True)]
    if not args.no_off:
        plan.append((f"{args.workers} workers, rule off", args.workers, False))
    with tempfile.TemporaryDirectory(prefix="bench_batch_") as tmp:
        runs = []
        for label, workers, rule in plan:
            runs.append(train(args, Path(tmp), label, workers, rule))
            print(f"{label}: PSNR {runs[-1].psnr:.2f} dB after {runs[-1].train_s:.0f} s", flush=True)
    publish(NAME, report(args, command, runs), None if args.no_write else args.output)


if __name__ == "__main__":
    main()
