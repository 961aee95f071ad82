"""Simulator benchmark: odin-simulate's views/s against real runs on this machine, then its predictions for 8 and 64
workers on a street, a city and a dense scene.

Why: users run Odin on 8-64 GPUs; this machine has two cores. The simulator (``odin_nerfstudio.simulation``) is only
worth its predictions if it reproduces what can be measured here, from the same fitted costs and the same rules.

Validation. Real runs of odin-splat on bench_train's street (``--views`` views along ``--street-length`` m,
``--gaussians`` procedural Gaussians): per mode (barrier, quality, throughput), 2 gloo ranks through
``bench_train.train_mode`` (torchrun + odin-train, then ns-eval), with ``--interconnect none`` and ``10gbe``; and one
run of 4 virtual workers in one process (``ns-train odin-splat --machine.device-type cpu
--pipeline.datamanager.num-workers 4``, quality-first). Each run is replayed by the simulator on the same scene
and configuration: its task, publication, bookkeeping and trainer costs fitted on its own timeline (the weather of a
shared machine changes from run to run), each view costed with the |C(t)| the run recorded, the exchange's base time
fitted on the loopback run of the same mode (so the 10gbe runs test the link model, not a fit of it). The table
gives predicted against measured views/s and the error (target: within 15%), and the idle shares.

Predictions. Costs fitted on the three loopback runs together; W = 2, 8 and 64 ranks of one worker each, B = 1,
K = 4, 120 steps per mode, behind the ``10gbe`` preset, each step's exchange the fastest by predicted time (bytes and
latencies) as the transport chooses it (sparse all-gather, union-then-reduce or dense all-reduce, each a ring).
Scenes, each with its views' candidate sets culled by the runtime's index on the model odin-splat starts from: the
synthetic street at bench_train's density, lengthened to ``--big-views`` views (so that a step of 64 fits); a
``citygen`` city of ``--big-views`` views (its SfM points as rows); and a dense ``odin-synth`` object (views around
one object). Beside them, the paper's 1.22x over the barrier at 8 GPUs.

Usage: ``python benchmarks/bench_simulate.py [--runs-dir DIR] [--quick]``; ``--runs-dir`` keeps the real runs there
and reuses those it finds; ``--quick`` shrinks everything and never writes. Otherwise the figures replace the
section between ``<!-- bench_simulate:start -->`` and ``<!-- bench_simulate:end -->``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from _report import BENCHMARKS, cpu_name, publish
from bench_train import BIN, make_street, run, run_name, train_mode

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.core.timeline_metrics import RunMetrics, load_run
from odin_nerfstudio.runtime.config import OdinRuntimeConfig
from odin_nerfstudio.scenes.citygen import CityConfig, city_point_sets
from odin_nerfstudio.scenes.synth import (
    PRESETS,
    intrinsics,
    object_cameras,
    object_world,
    street_cameras,
    street_rig_cameras,
    street_world,
)
from odin_nerfstudio.simulation.costs import CostModel, recorded_durations, recorded_sizes
from odin_nerfstudio.simulation.interconnect import Interconnect
from odin_nerfstudio.simulation.simulator import SimulationConfig, SimulationResult, simulate
from odin_nerfstudio.simulation.workload import Workload, initial_model

NAME = "bench_simulate"
MODES = ("barrier", "quality", "throughput")
"""Odin's modes, simulated and measured."""
PAPER_SPEEDUP_8 = 1.22
"""The Odin paper's throughput over the barrier at 8 GPUs."""
POINTS_PER_METRE = 12.2
"""SfM points per metre of bench_train's street (976 points3D kept of 2000 offered along 80 m)."""


@dataclass
class Replay:
    """One real run and its simulation."""

    label: str
    measured: RunMetrics
    predicted: SimulationResult
    costs: CostModel
    pooled: SimulationResult | None = None

    @property
    def error(self) -> float:
        """Predicted over measured views/s, less one."""
        return self.predicted.views_per_s / self.measured.views_per_s - 1.0

    @property
    def idle_gap(self) -> float:
        """Predicted idle share less the mean measured one (over ranks)."""
        return self.predicted.idle_share - float(np.mean([rank.idle_share for rank in self.measured.ranks]))

    @property
    def pooled_error(self) -> float:
        """The same from the pooled costs."""
        assert self.pooled is not None
        return self.pooled.views_per_s / self.measured.views_per_s - 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--quick`` shrinks everything and never writes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", type=Path, default=None, help="keep (and reuse) the real runs here")
    parser.add_argument("--views", type=int, default=64, help="views of the synthetic street")
    parser.add_argument("--street-length", type=float, default=80.0, help="street length (m)")
    parser.add_argument("--gaussians", type=int, default=40_000, help="Gaussians of the procedural world")
    parser.add_argument("--points", type=int, default=2000, help="Gaussian centres offered as SfM points")
    parser.add_argument(
        "--remote-writes",
        choices=("drawn", "candidates"),
        default="drawn",
        help="what the runs predicted of the other ranks' writes: drawn rows (today's runtime) or candidate sets "
        "(the runtime before main d26e6ae: pass it to replay runs made then)",
    )
    parser.add_argument("--iterations", type=int, default=120, help="schedule steps per 2-rank run")
    parser.add_argument("--virtual-iterations", type=int, default=60, help="schedule steps of the 4-worker run")
    parser.add_argument("--big-views", type=int, default=1024, help="views of the predicted street and city")
    parser.add_argument("--object-views", type=int, default=256, help="views of the predicted dense object")
    parser.add_argument("--predict-steps", type=int, default=120, help="schedule steps per predicted run")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per command before it is killed")
    parser.add_argument("--quick", action="store_true", help="small scene, a few steps, print only")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    # bench_train's helpers read these
    args.workers, args.device, args.interconnect, args.modes = 2, "cpu", ["none", "10gbe"], MODES
    args.timeline_dir = None
    if args.quick:
        args.views, args.gaussians, args.iterations, args.virtual_iterations = 16, 6000, 6, 3
        args.big_views, args.object_views, args.predict_steps, args.no_write = 128, 64, 12, True
    return args


def train_virtual(args: argparse.Namespace, scene: Path, folder: Path, name: str) -> Path:
    """4 virtual workers in one process (ns-train, quality-first); returns the run folder."""
    command = [str(BIN / "ns-train"), "odin-splat", "--data", str(scene), "--machine.device-type", "cpu"]
    command += ["--pipeline.datamanager.num-workers", "4", "--vis", "tensorboard"]
    command += ["--viewer.quit-on-train-completion", "True", "--output-dir", str(folder), "--experiment-name", name]
    command += ["--timestamp", "run", "--max-num-iterations", str(args.virtual_iterations)]
    command += ["--steps-per-save", str(args.virtual_iterations), "--steps-per-eval-all-images", "0"]
    command += ["--steps-per-eval-image", "0", "--pipeline.model.num-downscales", "0", "--runtime.mode", "quality"]
    run(command, args.timeout)
    return folder / name / "odin-splat" / "run"


def real_runs(args: argparse.Namespace, folder: Path) -> tuple[Path, dict[str, Path], list[str]]:
    """The street, every real run's folder (made now unless ``folder`` already holds it) and the runs reused."""
    scene = folder / "street"
    if not (scene / "sparse" / "0").is_dir():
        scene = make_street(args, folder)
    runs, reused = {}, []
    for link in args.interconnect:
        for mode in MODES:
            path = folder / run_name(scene, mode, link) / "odin-splat" / "run"
            if list(path.glob("odin_timeline_rank*.json")):
                reused.append(f"{mode}-{link}")
            else:
                print(f"training {mode} on 2 ranks behind {link} ...", flush=True)
                train_mode(args, scene, folder, mode, link)
            runs[f"{mode}-{link}"] = path
    path = folder / "virtual4-none" / "odin-splat" / "run"
    if (path / "odin_timeline.json").exists():
        reused.append("virtual4-none")
    else:
        print("training quality on 4 virtual workers ...", flush=True)
        train_virtual(args, scene, folder, "virtual4-none")
    runs["virtual4-none"] = path
    return scene, runs, reused


def runs_wall_s(runs: dict[str, Path]) -> float:
    """Seconds from the first run's config.yml to the last run's last file: the real runs' wall time."""
    starts = [(path / "config.yml").stat().st_mtime for path in runs.values()]
    ends = [max(f.stat().st_mtime for f in path.iterdir()) for path in runs.values()]
    return max(ends) - min(starts)


def replay(
    label: str, run_dir: Path, workload: Workload, base_s: float, pooled: CostModel, args: argparse.Namespace
) -> Replay:
    """Simulate one real run from its own fitted costs, recorded sizes and measured task times (its imbalance;
    ``base_s``: the exchange's base time), and again from the ``pooled`` costs (their residuals drawn)."""
    mode, link = label.rsplit("-", 1)
    virtual = mode.startswith("virtual")
    costs = replace(CostModel.fit([run_dir]), base_s=base_s)
    workers = 4 if virtual else 2
    config = SimulationConfig(
        OdinRuntimeConfig(mode="quality" if virtual else mode),  # type: ignore[arg-type]
        num_workers=workers,
        steps=args.virtual_iterations if virtual else args.iterations,
        workers_per_process=workers if virtual else 1,
        remote_writes=args.remote_writes,
    )
    interconnect = Interconnect.preset(link, "emulated", base_s)
    sized = workload.with_sizes(recorded_sizes([run_dir]))
    predicted = simulate(sized, costs, interconnect, config, measured=recorded_durations([run_dir]))
    return Replay(label, load_run(run_dir)[0], predicted, costs, simulate(sized, pooled, interconnect, config))


def rig(viewmats: np.ndarray, width: int, height: int, fov_deg: float) -> list[Camera]:
    """Runtime cameras for world-to-camera matrices [V, 4, 4] of one pinhole."""
    K = torch.as_tensor(intrinsics(width, height, fov_deg), dtype=torch.float32)
    return [Camera(torch.as_tensor(m, dtype=torch.float32), K, width, height) for m in viewmats]


def tracks(cameras: list[Camera], points: torch.Tensor, writes: list[torch.Tensor], max_depth: float) -> list:
    """SfM-like tracks: the drawn points a camera sees within ``max_depth`` (the preset's matching range)."""
    sets = []
    for camera, rows in zip(cameras, writes):
        depth = (points[rows] @ camera.viewmat[:3, :3].T + camera.viewmat[:3, 3])[:, 2]
        sets.append(rows[depth <= max_depth].numpy())
    return sets


def synthetic_workload(name: str, points: np.ndarray, viewmats: np.ndarray, preset: str) -> Workload:
    """A workload on the initial model of ``points``, viewed by ``viewmats`` through the preset's pinhole."""
    spec = PRESETS[preset]
    cameras = rig(viewmats, 128, 96, spec.horizontal_fov_deg)
    params = initial_model(points)
    drawn = Workload.from_model(name, params, cameras)
    sets = tracks(cameras, params["means"], drawn.writes, spec.max_depth)
    return Workload.from_model(name, params, cameras, sets)


def prediction_scenes(args: argparse.Namespace) -> list[Workload]:
    """The street two ways (bench_train's panning path lengthened, and a side-looking scan rig), the city and the
    dense object (see the module)."""
    street_points, length, spacing = street_scene(args.big_views)
    panning = synthetic_workload(
        f"street, bench_train's panning path, {args.big_views} views along {length:.0f} m",
        street_points,
        street_cameras(args.big_views, length),
        "street",
    )
    scan = scan_rig_workload(street_points, length, spacing, args.big_views)
    city = city_point_sets(CityConfig(num_views=args.big_views))
    city_workload = Workload.from_point_sets(f"citygen city, {args.big_views} views", city.point_sets)
    dense = dense_workload(object_world(2000, np.random.default_rng([0, 0])).means.numpy(), args.object_views)
    return [panning, scan, city_workload, dense]


def street_scene(views: int) -> tuple[np.ndarray, float, float]:
    """The predicted street's SfM points (bench_train's density), its length and the scan rig's spacing (m), long
    enough for ``views`` views."""
    spacing = 2.5
    length = spacing * views / 2 + 4.0
    rng = np.random.default_rng([0, 0])
    return street_world(int(POINTS_PER_METRE * length), rng, length=length).means.numpy(), length, spacing


def scan_rig_workload(points: np.ndarray, length: float, spacing: float, views: int) -> Workload:
    """The street seen by a side-looking scan rig, ``views`` views."""
    cameras = street_rig_cameras(length, spacing)[:views]
    name = f"street, scan rig (side views every {spacing} m), {views} views"
    return synthetic_workload(name, points, cameras, "street")


def dense_workload(points: np.ndarray, views: int) -> Workload:
    """The dense odin-synth object of ``points``, ``views`` views around it."""
    return synthetic_workload(f"odin-synth object (dense), {views} views", points, object_cameras(views), "object")


def predict(
    workload: Workload, costs: CostModel, workers: int, args: argparse.Namespace
) -> dict[str, SimulationResult]:
    """Every mode on ``workers`` ranks behind 10gbe, each step's exchange chosen by its bytes as the transport does;
    the barrier and quality-first again on a schedule re-balanced by the modeled costs (``rebalanced``, as
    ``--pipeline.datamanager.rebalance-every`` trains); and the barrier as a dense data-parallel baseline would
    exchange (a ring all-reduce of every row's gradient, DDP's)."""
    interconnect = Interconnect.preset("10gbe", "chosen", costs.base_s, workload.num_rows)
    results = {}
    for mode in MODES:
        runtime = OdinRuntimeConfig(mode=mode)  # type: ignore[arg-type]
        config = SimulationConfig(runtime, num_workers=workers, steps=args.predict_steps)
        results[mode] = simulate(workload, costs, interconnect, config)
    for mode in ("barrier", "quality"):
        runtime = OdinRuntimeConfig(mode=mode)  # type: ignore[arg-type]
        config = SimulationConfig(runtime, num_workers=workers, steps=args.predict_steps, rebalanced=True)
        results[f"{mode}-rebalanced"] = simulate(workload, costs, interconnect, config)
    dense = replace(interconnect, collective="ring-allreduce")
    config = SimulationConfig(OdinRuntimeConfig(mode="barrier"), num_workers=workers, steps=args.predict_steps)
    results["dense"] = simulate(workload, costs, dense, config)
    return results


def validation_table(replays: list[Replay]) -> list[str]:
    """Predicted against measured views/s per real run."""
    lines = [
        "| run | measured views/s | **predicted** (own costs) | **error** | idle share measured (per rank) | "
        "idle share predicted | **idle gap** (points) | task fit R^2 | predicted from pooled costs (error) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in replays:
        measured_idle = " / ".join(f"{rank.idle_share:.0%}" for rank in r.measured.ranks)
        pooled = "-" if r.pooled is None else f"{r.pooled.views_per_s:.2f} ({r.pooled_error:+.0%})"
        lines.append(
            f"| {r.label} | {r.measured.views_per_s:.2f} | **{r.predicted.views_per_s:.2f}** | **{r.error:+.0%}** | "
            f"{measured_idle} | {r.predicted.idle_share:.0%} | **{r.idle_gap * 100:+.0f}** | {r.costs.task.r2:.2f} "
            f"| {pooled} |"
        )
    return lines


def prediction_table(predictions: list[tuple[Workload, int, dict[str, SimulationResult]]]) -> list[str]:
    """Views/s, speed-up over the barrier, idle share, hidden wait and conflict rate per scene, W and mode."""
    lines = [
        "| scene (mean \\|C\\|/N) | W | barrier views/s (idle) | quality views/s (idle) | throughput views/s (idle) | "
        "quality / barrier | throughput / barrier | hidden wait quality / throughput | RAW conflict rate quality | "
        "dense all-reduce barrier views/s (idle) | re-balanced barrier views/s (idle) | re-balanced quality "
        "views/s (idle) | **re-balanced quality / re-balanced barrier** | quality / re-balanced barrier |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for workload, workers, results in predictions:
        barrier, quality, throughput = (results[m] for m in MODES)
        balanced, balanced_quality = results["barrier-rebalanced"], results["quality-rebalanced"]
        cells = [f"{r.views_per_s:.1f} ({r.idle_share:.0%})" for r in (barrier, quality, throughput)]
        hidden = [r.hidden_wait(barrier) for r in (quality, throughput)]
        hidden_text = " / ".join("-" if h is None else f"{h:.0%}" for h in hidden)
        lines.append(
            f"| {workload.name} ({workload.mean_candidate_share():.1%}) | {workers} | {' | '.join(cells)} | "
            f"**{quality.views_per_s / barrier.views_per_s:.2f}** | "
            f"{throughput.views_per_s / barrier.views_per_s:.2f} | "
            f"{hidden_text} | {quality.conflict_rate:.2f} | "
            f"{results['dense'].views_per_s:.1f} ({results['dense'].idle_share:.0%}) | "
            f"{balanced.views_per_s:.1f} ({balanced.idle_share:.0%}) | "
            f"{balanced_quality.views_per_s:.1f} ({balanced_quality.idle_share:.0%}) | "
            f"**{balanced_quality.views_per_s / balanced.views_per_s:.2f}** | "
            f"{quality.views_per_s / balanced.views_per_s:.2f} |"
        )
    return lines


def report(
    args: argparse.Namespace,
    command: str,
    replays: list[Replay],
    pooled: CostModel,
    predictions: list[tuple[Workload, int, dict[str, SimulationResult]]],
    seconds: float,
    reused: list[str],
    runs: dict[str, Path],
) -> str:
    """The markdown section (without markers)."""
    within = sum(abs(r.error) <= 0.15 for r in replays)
    idle_within = sum(abs(r.idle_gap) <= 0.05 for r in replays)
    walls = [r.measured.span_s for r in replays]
    made = (
        f"Real runs reused from `--runs-dir` ({', '.join(reused)}), made earlier by this benchmark's commands "
        f"(their files span {runs_wall_s(runs) / 60:.0f} min of wall time on this machine)."
        if reused
        else f"Real runs made now (training spans {min(walls):.0f}-{max(walls):.0f} s)."
    )
    return "\n".join(
        [
            "## bench_simulate: odin-simulate against real runs, and its predictions for 8 and 64 workers",
            "",
            f"Command: `{command}` ({seconds / 60:.0f} min)  ",
            (
                f"Machine: CPU {cpu_name()}, {len(os.sched_getaffinity(0))} cores available, shared with other jobs "
                f"(load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} at the end: every timing is noisy); "
                f"Python {platform.python_version()}; gloo, one torch thread per rank  "
            ),
            f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
            "",
            (
                f"Validation on bench_train's street ({args.views} views at 128x96 along {args.street_length:.0f} m, "
                f"{args.gaussians:,} procedural Gaussians; {args.iterations} steps on 2 ranks, "
                f"{args.virtual_iterations} steps on 4 virtual workers): each run replayed from the costs fitted on "
                "its own timeline and the exchange base of the loopback run of its mode; the 10gbe runs' link is the "
                f"simulator's model of `comm/link.py`; the other ranks' writes predicted by their {args.remote_writes} "
                f"rows, as the runs did; each task replayed with the render + backward time it measured (the run's own "
                f"imbalance). **{within} of {len(replays)} runs within 15%; {idle_within} of {len(replays)} idle "
                f"shares within 5 points.** {made}"
            ),
            "",
            (
                "What a prediction includes: the simulator runs the runtime's own `OdinRuntime` and the trainer's "
                "`TrainingLoop` (one protocol, `docs/architecture.md`), so every mechanism of the runs: admission and "
                "its gates, RAW against local and predicted writes, dynamic ordering, running ahead, reading behind, "
                "priority publication (first parts), early commits, validation and its re-runs, stale reads with the "
                "gradient rule (on modeled gradients), and lanes (`tasks_in_flight`). Only the data plane is modeled."
            ),
            "",
            *validation_table(replays),
            "",
            f"Costs pooled over the three loopback runs (used below): {pooled.describe()}.",
            "",
            (
                f"Predictions: B = 1, K = 4, {args.predict_steps} steps per mode, one rank per worker, 10gbe "
                "(`comm/link.py`'s preset: 10 GbE slowed like this CPU's compute), each step's exchange the fastest "
                "by predicted time (bytes and latencies), as `DistributedTransport` chooses it (the sparse all-gather, "
                "union-then-reduce or the dense all-reduce, each timed as a ring), the other ranks' writes predicted "
                "by the rows they would draw (today's runtime); "
                "quality-first's row is the paper's comparison, **1.22x at 8 GPUs** in the paper. The dense column is "
                "the barrier exchanging as dense data parallelism does (a ring all-reduce of all N rows); the "
                "re-balanced ones train a schedule cut by each view's modeled time (the pooled fit's, without the "
                "drawn residuals: what `--pipeline.datamanager.rebalance-every` measures), the best barrier this "
                "code runs, Grendel's balance by measured time."
            ),
            "",
            *prediction_table(predictions),
            "",
            paper_line(predictions),
            "",
            *breakdown_notes(replays),
        ]
    )


def paper_line(predictions: list[tuple[Workload, int, dict[str, SimulationResult]]]) -> str:
    """Quality-first over the barrier at W = 8 per scene, beside the paper's 1.22x."""
    ratios = [
        f"{workload.name.split(',')[0] if workload.name.startswith('citygen') else workload.name}: "
        f"{results['quality'].views_per_s / results['barrier'].views_per_s:.2f}x"
        for workload, workers, results in predictions
        if workers == 8
    ]
    return f"Quality-first over the barrier at 8 workers: {'; '.join(ratios)}; the paper: {PAPER_SPEEDUP_8}x at 8 GPUs."


def breakdown_notes(replays: list[Replay]) -> list[str]:
    """Where the predictions stop holding, with this run's figures."""
    two_rank = [r for r in replays if not r.label.startswith("virtual")]
    idle_gap = np.mean([r.idle_gap for r in two_rank])
    worst_pooled = max((abs(r.pooled_error) for r in replays if r.pooled is not None), default=0.0)
    return [
        "Where the prediction breaks down:",
        "",
        "- Costs: the task fit's R^2 is low on this shared machine (the other jobs' load, not |C(t)|, decides most "
        "of a task's time), so the fit predicts a mean, and a run replays well only from its own costs: from the "
        f"costs pooled over the loopback runs the error reaches {worst_pooled:.0%}, because the machine's speed "
        "drifted between runs (the measured ratios between modes on 2 ranks here are mostly that drift).",
        f"- Idle: on 2 ranks the predicted idle share is {idle_gap:+.0%} against the measured (predicted less "
        "measured, mean over runs): each task replays the time it measured, so the barrier's wait on the slower "
        "rank is in the prediction; what is not is the two ranks sharing 2 cores with each other, gloo's threads "
        "and other jobs (one processor per rank in the simulator), and nerfstudio's per-step time, fitted as a mean.",
        "- 4 virtual workers share one thread: their views/s is their work over its time, and the costs are fitted on "
        "that work, so this replay checks the accounting (bookkeeping, publications, trainer time), not the waits.",
        "- Escape re-runs are spread over every task as a measured share; structural changes (none before step 500), "
        "evaluation and checkpoints are not simulated.",
        "- 8 and 64 workers: the ring formulas are not validated here (two ranks cannot tell a ring from no "
        "contention); the GPU's overlap of compute and communication streams, NCCL's real latency and a GPU's "
        "ratio of render to bookkeeping time are outside the model, whose costs are this CPU's; the ratios (x "
        "barrier) travel better than the views/s.",
        "- bench_train's panning street, lengthened, is no city: its cameras have no far plane, so the views that "
        "look down the street read up to the whole model, and the schedule, which balances workers by SfM points "
        "within 12 m, cannot see it: one such view per step sets the step's time and conflicts with everything, so "
        "no mode gains on it. Cut by measured costs (the re-balanced columns) the schedule gives those views steps "
        "of their own and every mode speeds up. The scan rig and the city are the regime Odin is for; the "
        "dense object (every view reads every row) gains nothing, as the paper says of dense captures.",
        "- The exchange at scale: a sparse all-gather's bytes grow with W, a dense all-reduce's do not, so where "
        "active sets are large (the dense object, the panning street's long views) the chosen exchange turns "
        "dense at many workers, as the transport's choice does; the simulator times each choice as a ring with "
        "one latency per hop and no contention, which no run here checks. The choice weighs each collective's "
        "latencies with its bytes (`comm/exchange_choice.py`, at the link's latency x bandwidth): union-then-reduce "
        "takes 3 (W - 1) latencies against the sparse all-gather's W - 1, so behind a high-latency link (10gbe here: "
        "3.75 ms a message) union-then-reduce is chosen only where it saves more bytes than its 2 (W - 1) extra "
        "latencies would move.",
        "- Throughput-first's gradient-size rule decides on modeled gradients (per view, exponential weights of "
        "mean 1 on its write rows), not the run's: its admitted stale reads are the rule's on that distribution.",
        "- Predictions at 8 and 64 workers draw each task's variation from the pooled fit's residuals (this "
        "machine's noise included), so their barrier idle holds this CPU's imbalance, not a GPU's.",
    ]


def main(argv: list[str] | None = None) -> None:
    """Real runs, their replays, the predictions; print and record."""
    args = parse_args(argv)
    command = "python " + shlex.join(["benchmarks/bench_simulate.py", *(sys.argv[1:] if argv is None else argv)])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_simulate_") as tmp:
        folder = args.runs_dir if args.runs_dir is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        scene, runs, reused = real_runs(args, folder)
        workload = Workload.from_colmap(scene)
        bases = {mode: CostModel.fit([runs[f"{mode}-none"]]).base_s for mode in MODES}
        pooled = CostModel.fit([runs[f"{mode}-none"] for mode in MODES])
        replays = []
        for label, run_dir in runs.items():
            base = bases.get(label.rsplit("-", 1)[0], 0.0)
            replays.append(replay(label, run_dir, workload, base, pooled, args))
            print(validation_table(replays)[-1], flush=True)
    predictions = []
    for scene_workload in prediction_scenes(args):
        for workers in (2, 8, 64):
            if workers * 2 > scene_workload.num_views:
                continue
            predictions.append((scene_workload, workers, predict(scene_workload, pooled, workers, args)))
            print(prediction_table(predictions)[-1], flush=True)
    text = report(args, command, replays, pooled, predictions, time.perf_counter() - start, reused, runs)
    publish(NAME, text, None if args.no_write else args.output)


if __name__ == "__main__":
    main()
