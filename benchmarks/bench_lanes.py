"""Lanes benchmark: two tasks in flight per process (``--runtime.tasks-in-flight 2``) against one, in the trainer.

Why: the paper runs B_gpu = 2 tasks per GPU. With two lanes (``odin_nerfstudio/runtime/lanes.py``) a process
gathers, renders and back-propagates two tasks at once on two threads (two CUDA streams on a GPU) while its driver
stages, validates and publishes beside them. On the CPU, torch releases the GIL inside its ops, so one task's
Python-bound stretches (the pure-torch rasterizer's many small ops) overlap the other task's ops. Quality-first
with two lanes must still end bit-identical to the barrier with one.

Run: odin-splat through ``OdinTrainer`` (what ``ns-train`` runs), in this process, on ``--workers`` virtual
workers with B = 1 (W = 1, odin-splat's default in one process: a step's task and the next step's reads beside it;
W = 2: also a step's two tasks at once), at this machine's default torch thread count (each lane runs at the same
count), no viewer or evaluation, ``--iterations`` schedule steps, its densification and
escape checks as configured. Variants: barrier and quality, each with 1 and 2 lanes, in ``--rounds`` rounds (odd
rounds in the reverse order, so a drift of the machine's speed favours neither). Figures per variant (medians
over rounds): views/s from the run's timeline (views over the span from the first event to the last), render +
backward per task (summed over the lanes: two renders side by side each take longer), bookkeeping per task, and
the lanes' counters (most tasks in flight, reads made while the step before was unpublished, gathers that ran
beside a publication, rows read again because a publication held them); the speed-up is 2 lanes over 1 within each round, its median with every round's value.
Scenes: the synthetic street (``odin-synth`` street, 24 views) and fern (the shared COLMAP scene, where present).

Usage: ``python benchmarks/bench_lanes.py [--iterations 40] [--rounds 3] [--quick]``; ``--quick`` runs the street
for a few steps once and never writes BENCHMARKS.md. Otherwise the figures replace the section between
``<!-- bench_lanes:start -->`` and ``<!-- bench_lanes:end -->``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from _report import BENCHMARKS, identical, machine, model_state, publish

from odin_nerfstudio.core.timeline_metrics import load_run
from odin_nerfstudio.scenes.synth import SynthConfig, make_scene

NAME = "bench_lanes"
SHARED_DATA = Path(os.environ.get("ODIN_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
VARIANTS = (("barrier", 1), ("quality", 1), ("quality", 2), ("barrier", 2))
"""(mode, tasks in flight) of each run."""


@dataclass
class LaneRun:
    """One training run: its variant and round, the timeline's views/s, the counters, the final model state."""

    mode: str
    lanes: int
    round: int
    views_per_s: float
    wall_s: float
    counters: dict
    state: dict[str, torch.Tensor]

    @property
    def name(self) -> str:
        return f"{self.mode} x{self.lanes}"

    def per_task_ms(self, *names: str) -> float:
        """The counters ``names`` (ns) summed, per task, in ms."""
        return sum(self.counters[name] for name in names) / 1e6 / max(self.counters["tasks"], 1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=40, help="schedule steps per run")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="W, virtual workers (B = 1)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds: every variant runs once per round")
    parser.add_argument("--fern", type=Path, default=SHARED_DATA / "fern", help="the fern COLMAP scene ('' skips)")
    parser.add_argument("--quick", action="store_true", help="the street for a few steps, one round, print only")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.rounds, args.fern, args.workers, args.no_write = 6, 1, None, [2], True
    elif args.fern is not None and str(args.fern) and not (args.fern / "sparse" / "0").is_dir():
        print(f"fern skipped: no COLMAP model at {args.fern}/sparse/0 (set ODIN_SHARED_DATA)")
        args.fern = None
    return args


def trainer_config(scene: Path, output: Path, iterations: int, workers: int, mode: str, lanes: int):
    """odin-splat on CPU on ``workers`` virtual workers, its other defaults, no viewer, evaluation or checkpoint
    before the end."""
    from odin_nerfstudio.method_configs.odin_splat import odin_splat

    config = copy.deepcopy(odin_splat.config)
    config.pipeline.datamanager.data = scene
    config.pipeline.datamanager.num_workers = workers
    config.runtime.mode = mode
    config.runtime.tasks_in_flight = lanes
    config.machine.device_type = "cpu"
    config.vis = "tensorboard"
    config.output_dir = output
    config.max_num_iterations = iterations
    config.steps_per_eval_all_images = config.steps_per_eval_image = config.steps_per_eval_batch = 0
    config.steps_per_save = iterations
    config.set_timestamp()
    return config


def train(scene: Path, folder: Path, args: argparse.Namespace, workers: int, variant: tuple, round_: int) -> LaneRun:
    """One run of ``variant`` (mode, tasks in flight) on ``workers`` workers; its figures and final state."""
    mode, lanes = variant
    output = folder / f"{scene.name}-{workers}-{mode}-{lanes}-{round_}"
    config = trainer_config(scene, output, args.iterations, workers, mode, lanes)
    torch.manual_seed(0)
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    metrics, _ = load_run(trainer.base_dir)
    state = model_state(trainer.pipeline.model.gauss_params, trainer.optimizers.optimizers)
    counters = dataclasses.asdict(trainer.runtime.counters)
    return LaneRun(mode, lanes, round_, metrics.views_per_s, wall, counters, state)


def run_scene(scene: Path, args: argparse.Namespace, folder: Path, workers: int) -> list[LaneRun]:
    """Every variant once per round on ``scene`` with ``workers`` workers, odd rounds reversed."""
    runs = []
    for round_ in range(args.rounds):
        order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            run = train(scene, folder, args, workers, variant, round_)
            print(f"{scene.name} W={workers} round {round_} {run.name}: {run.views_per_s:.2f} views/s", flush=True)
            runs.append(run)
    return runs


def median_of(runs: list[LaneRun], figure) -> float:
    return statistics.median(figure(run) for run in runs)


def speedups(runs: list[LaneRun], mode: str) -> list[float]:
    """Per round, views/s of ``mode`` with 2 lanes over 1."""
    by = {(r.mode, r.lanes, r.round): r for r in runs}
    rounds = sorted({r.round for r in runs})
    return [by[(mode, 2, k)].views_per_s / by[(mode, 1, k)].views_per_s for k in rounds]


def scene_table(name: str, runs: list[LaneRun]) -> list[str]:
    """One scene's variants side by side, with the speed-ups and the bit-identity check."""
    variants = [[r for r in runs if (r.mode, r.lanes) == variant] for variant in VARIANTS]
    rows = [
        ("views/s (median)", lambda rs: f"{median_of(rs, lambda r: r.views_per_s):.2f}"),
        ("render + backward per task (ms, summed over lanes)",
         lambda rs: f"{median_of(rs, lambda r: r.per_task_ms('render_ns', 'backward_ns')):.1f}"),
        ("bookkeeping per task (ms)", lambda rs: f"{median_of(rs, lambda r: r.per_task_ms('bookkeeping_ns')):.2f}"),
        ("most tasks in flight", lambda rs: str(max(r.counters["most_in_flight"] for r in rs))),
        ("reads beside an unpublished step, per task",
         lambda rs: f"{median_of(rs, lambda r: r.counters['overlapped_reads'] / r.counters['tasks']):.2f}"),
        ("gathers beside a publication (all rounds)",
         lambda rs: str(sum(r.counters["gathers_beside_publication"] for r in rs))),
        ("rows re-read, held by a publication", lambda rs: str(sum(r.counters["locked_rereads"] for r in rs))),
        ("re-runs per task", lambda rs: f"{median_of(rs, lambda r: r.counters['reruns'] / r.counters['tasks']):.3f}"),
    ]  # fmt: skip
    header = " | ".join(f"{mode} x{lanes}" for mode, lanes in VARIANTS)
    lines = [f"**{name}**", "", f"| figure | {header} |", f"|---|{'---|' * len(VARIANTS)}"]
    lines += [f"| {label} | " + " | ".join(cell(rs) for rs in variants) + " |" for label, cell in rows]
    barrier_one = next(r for r in runs if (r.mode, r.lanes) == ("barrier", 1))
    quality_two = [r for r in runs if (r.mode, r.lanes) == ("quality", 2)]
    same = all(identical(r.state, barrier_one.state) for r in quality_two)
    lines.append("")
    for mode in ("quality", "barrier"):
        values = speedups(runs, mode)
        listed = ", ".join(f"{v:.2f}x" for v in values)
        lines.append(f"- {mode}: 2 lanes / 1 lane, views/s: **{statistics.median(values):.2f}x** (rounds: {listed})")
    lines.append(f"- quality x2 bit-identical to barrier x1 in every round: **{'yes' if same else 'NO'}**")
    return lines


def report(args: argparse.Namespace, command: str, scenes: dict[str, list[LaneRun]]) -> str:
    lines = [
        "## Lanes: two tasks in flight per process (bench_lanes)",
        "",
        f"Machine: {machine(torch)}.",
        f"Command: `{command}`; {time.strftime('%Y-%m-%d %H:%M')}.",
        "",
        f"odin-splat through the trainer on W virtual workers (B = 1) for {args.iterations} schedule steps, "
        f"medians over {args.rounds} rounds; views/s from each run's timeline.",
        "",
    ]
    for name, runs in scenes.items():
        lines += [*scene_table(name, runs), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join(["python benchmarks/bench_lanes.py", shlex.join(argv if argv is not None else sys.argv[1:])]).strip()
    scenes = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        street = make_scene(SynthConfig(preset="street", output=folder / "street"))
        for workers in args.workers:
            scenes[f"synthetic street (24 views), W = {workers}"] = run_scene(street, args, folder, workers)
            if args.fern is not None:
                scenes[f"fern (20 views), W = {workers}"] = run_scene(args.fern, args, folder, workers)
    publish(NAME, report(args, command, scenes), None if args.no_write else args.output)


if __name__ == "__main__":
    main()
