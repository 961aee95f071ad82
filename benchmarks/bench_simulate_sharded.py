"""Sharded simulator benchmark: odin-simulate's sharded mode against real 2-rank sharded runs, then its predictions
for 8, 16 and 64 workers on the city generator's scene, a scan-rig street and a dense object.

Why: the mixed-parallel claim (the paper: up to 1.89x over Grendel at 64 GPUs, up to 82% of the critical path's wait
hidden) is about many workers; this machine has two cores. The simulator runs the sharded loop's own code
(``simulation/sharded.py``), so it is worth its predictions if it reproduces the sharded runs measurable here.

Validation. ``odin-train --sharded True`` under torchrun on 2 gloo ranks (one torch thread each), per mode (barrier,
quality, throughput), on a small bench_train street (``--views`` views along ``--street-length`` m, ``--gaussians``
procedural Gaussians), no link (the emulated link sits under the replicated exchange only). Each run is replayed:
its costs fitted on its own timeline (task, publication, trainer time per step; the all-to-all's own time from its
fetch waits), each task with the render + backward time it measured. Target: views/s within 15%.

Predictions. Costs pooled over the real runs; W = 8, 16 and 64 ranks of one worker each, B = 1, K = 4,
``--predict-steps`` steps, behind the ``10gbe`` preset: the sharded modes' row all-to-all with one link per rank
(``Interconnect.all_to_all_s``: two collectives, one latency each, the most bytes a rank sends or receives), and the
replicated barrier and quality-first beside them at the same W with the same costs (each step's exchange chosen by its
bytes, as the transport chooses it). The sharded modes run the order a sharded run picks
(``--pipeline.datamanager.schedule-order auto``: the regional order, in two halves from 16 workers), and the sharded
barrier and quality-first the other regional order and the locality order too; quality-first is also compared with
the fastest of those barriers. The replicated ones run the locality order. Scenes: a ``citygen`` city of
``--big-views`` views (its SfM points as rows, in the generator's id order, which follows the streets),
bench_simulate's scan-rig street and its dense ``odin-synth`` object (both from the runtime's culling, rows in Z-order
as the runtime keeps them).

Placement by measured time. On the first scene at the largest W, the sharded barrier and quality-first placed by the
ranks' measured time (the default) and by candidate rows alone (``--runtime.placement-by-time False``), with equal
ranks and with rank 0 computing ``STRAGGLER`` times slower (a slower device among equal ones).

Usage: ``python benchmarks/bench_simulate_sharded.py [--runs-dir DIR] [--scenes city street object] [--workers 8 16 64]
[--big-views 1024] [--predict-steps 40] [--real-modes barrier quality throughput] [--quick]``; ``--runs-dir`` keeps
the real runs there and reuses those it finds; ``--quick`` shrinks everything (quality-first alone runs for real)
and never writes. Otherwise the figures replace the section between ``<!-- bench_simulate_sharded:start -->``
and ``<!-- bench_simulate_sharded:end -->``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from _report import BENCHMARKS, cpu_name, publish
from bench_simulate import dense_workload, scan_rig_workload, street_scene
from bench_train import make_street, run

from odin_nerfstudio.core.row_order import spatial_order
from odin_nerfstudio.core.timeline_metrics import RunMetrics, load_run
from odin_nerfstudio.ns.command_line import train_command
from odin_nerfstudio.runtime.config import OdinRuntimeConfig
from odin_nerfstudio.scenes.citygen import CityConfig, city_point_sets
from odin_nerfstudio.scenes.synth import object_world
from odin_nerfstudio.scheduling.regions import resolved_order
from odin_nerfstudio.simulation.costs import CostModel, recorded_durations, recorded_sizes
from odin_nerfstudio.simulation.interconnect import Interconnect
from odin_nerfstudio.simulation.sharded import predict
from odin_nerfstudio.simulation.simulator import SimulationConfig, SimulationResult
from odin_nerfstudio.simulation.workload import Workload

NAME = "bench_simulate_sharded"
MODES = ("barrier", "quality", "throughput")
"""The sharded loop's modes, simulated and measured."""
REPLICATED = ("barrier", "quality")
"""The replicated modes predicted beside them."""
LOCALITY = ("barrier", "quality")
"""The sharded modes also predicted in the locality order (the sharded default is the regional order)."""
WORKERS = (8, 16, 64)
SCENES = ("city", "street", "object")
"""The predicted scenes (``--scenes``): the citygen city, the scan-rig street, the dense object."""
TARGET_ERROR = 0.15
TARGET_SPEEDUP_64 = 1.5
TARGET_HIDDEN = 0.70
PAPER_SPEEDUP_64 = 1.89
STRAGGLER = 1.3
"""How many times slower rank 0 computes in the straggler runs."""


@dataclass
class Replay:
    """One real sharded run and its simulation."""

    mode: str
    measured: RunMetrics
    predicted: SimulationResult
    costs: CostModel

    @property
    def error(self) -> float:
        """Predicted over measured views/s, less one."""
        return self.predicted.views_per_s / self.measured.views_per_s - 1.0

    @property
    def measured_idle(self) -> float:
        """Mean measured idle share over ranks."""
        return float(np.mean([rank.idle_share for rank in self.measured.ranks]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--quick`` shrinks everything and never writes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", type=Path, default=None, help="keep (and reuse) the real runs here")
    parser.add_argument("--views", type=int, default=32, help="views of the real runs' street")
    parser.add_argument("--street-length", type=float, default=40.0, help="street length (m)")
    parser.add_argument("--gaussians", type=int, default=10_000, help="Gaussians of the procedural world")
    parser.add_argument("--points", type=int, default=1000, help="Gaussian centres offered as SfM points")
    parser.add_argument("--iterations", type=int, default=60, help="schedule steps per real run")
    parser.add_argument("--big-views", type=int, default=1024, help="views of the predicted city and street")
    parser.add_argument("--object-views", type=int, default=256, help="views of the predicted dense object")
    parser.add_argument("--predict-steps", type=int, default=40, help="schedule steps per predicted run")
    parser.add_argument("--scenes", nargs="+", choices=SCENES, default=list(SCENES), help="the predicted scenes")
    parser.add_argument("--workers", type=int, nargs="+", default=list(WORKERS), help="the predicted W")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per command before it is killed")
    parser.add_argument("--real-modes", nargs="+", choices=MODES, default=list(MODES), help="the modes run for real")
    parser.add_argument("--quick", action="store_true", help="small scenes, a few steps, W = 8, print only")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    if args.quick:
        args.views, args.gaussians, args.iterations = 16, 6000, 4
        args.big_views, args.object_views, args.predict_steps, args.no_write = 128, 32, 4, True
        args.workers, args.real_modes = [8], ["quality"]
    return args


def real_runs(args: argparse.Namespace, folder: Path) -> tuple[Path, dict[str, Path], list[str]]:
    """The street and each mode's sharded 2-rank run folder (made now unless ``folder`` holds it)."""
    scene = folder / "street"
    if not (scene / "sparse" / "0").is_dir():
        scene = make_street(args, folder)
    runs, reused = {}, []
    for mode in args.real_modes:
        name = f"street-sharded-{mode}"
        path = folder / name / "odin-splat" / "run"
        if list(path.glob("odin_timeline_rank*.json")):
            reused.append(mode)
        else:
            print(f"training sharded {mode} on 2 gloo ranks ...", flush=True)
            options = ["--pipeline.model.num-downscales", "0", "--sharded", "True", "--runtime.mode", mode]
            command = train_command(
                "odin-splat", scene, folder, args.iterations, ranks=2, device_type="cpu", experiment_name=name,
                options=options,
            )  # fmt: skip
            run(command, args.timeout)
        runs[mode] = path
    return scene, runs, reused


def replay(mode: str, run_dir: Path, workload: Workload, steps: int) -> Replay:
    """Simulate one real sharded run from its own fitted costs, recorded sizes and measured task times."""
    costs = CostModel.fit([run_dir])
    config = SimulationConfig(OdinRuntimeConfig(mode=mode), num_workers=2, steps=steps, sharded=True)  # type: ignore
    interconnect = Interconnect.preset("none", "emulated", costs.base_s)
    sized = workload.with_sizes(recorded_sizes([run_dir]))
    predicted = predict(sized, costs, interconnect, config, measured=recorded_durations([run_dir]))
    return Replay(mode, load_run(run_dir)[0], predicted, costs)


def prediction_scenes(args: argparse.Namespace) -> list[Workload]:
    """The city, the scan-rig street and the dense object (see the module), those of ``--scenes``."""
    workloads = []
    if "city" in args.scenes:
        city = city_point_sets(CityConfig(num_views=args.big_views))
        workloads.append(Workload.from_point_sets(f"citygen city, {args.big_views} views", city.point_sets))
    if "street" in args.scenes:
        street, length, spacing = street_scene(args.big_views)
        workloads.append(scan_rig_workload(z_ordered(street), length, spacing, args.big_views))
    if "object" in args.scenes:
        object_points = object_world(2000, np.random.default_rng([0, 0])).means.numpy()
        workloads.append(dense_workload(z_ordered(object_points), args.object_views))
    return workloads


def z_ordered(points: np.ndarray) -> np.ndarray:
    """``points`` in Z-order, as the runtime keeps its rows (``core/row_order``): a shard is a compact piece."""
    return points[spatial_order(torch.as_tensor(points, dtype=torch.float32)).numpy()]


def other_regional(workers: int) -> str:
    """The regional order a sharded run at ``workers`` does not pick (``regions.resolved_order``'s ``auto``)."""
    return "regions" if resolved_order("auto", True, workers) == "halves" else "halves"


def predict_all(workload: Workload, costs: CostModel, workers: int, steps: int) -> dict[str, SimulationResult]:
    """Every sharded mode in its default order (``auto``: the regional order, in two halves from 16 workers), the
    sharded barrier and quality-first in the other regional order and in the locality order, and the replicated
    barrier and quality-first (locality order), on ``workers`` ranks behind 10gbe."""
    other = other_regional(workers)
    runs = [(True, mode, "auto") for mode in MODES] + [(True, mode, other) for mode in LOCALITY]
    runs += [(True, mode, "rlg") for mode in LOCALITY] + [(False, mode, "auto") for mode in REPLICATED]
    results = {}
    for sharded, mode, order in runs:
        link = Interconnect.preset("10gbe", "allgather" if sharded else "chosen", costs.base_s, workload.num_rows)
        config = SimulationConfig(
            OdinRuntimeConfig(mode=mode),  # type: ignore[arg-type]
            num_workers=workers,
            steps=steps,
            sharded=sharded,
            schedule_order=order,  # type: ignore[arg-type]
        )
        suffix = {"auto": "", "rlg": " (locality)"}.get(order, " (other regional)")
        results[f"{'sharded' if sharded else 'replicated'} {mode}{suffix}"] = predict(workload, costs, link, config)
    return results


def placement_runs(workload: Workload, costs: CostModel, workers: int, steps: int) -> dict[tuple, SimulationResult]:
    """The sharded barrier and quality-first in the default order, placed by measured time and by candidate rows,
    with equal ranks and with rank 0 :data:`STRAGGLER` times slower; keyed by (mode, by time, straggler)."""
    link = Interconnect.preset("10gbe", "allgather", costs.base_s, workload.num_rows)
    results = {}
    for straggler in (1.0, STRAGGLER):
        for by_time in (True, False):
            for mode in ("barrier", "quality"):
                runtime = OdinRuntimeConfig(mode=mode, placement_by_time=by_time)  # type: ignore[arg-type]
                config = SimulationConfig(runtime, workers, 1, steps, sharded=True, straggler=straggler)
                results[mode, by_time, straggler] = predict(workload, costs, link, config)
    return results


def placement_table(workload: Workload, workers: int, results: dict[tuple, SimulationResult]) -> list[str]:
    """Views/s of the placement runs, quality-first over the barrier of the same placement, rank 0's compute."""

    def cell(straggler: float, by_time: bool) -> str:
        quality, barrier = results["quality", by_time, straggler], results["barrier", by_time, straggler]
        compute = [rank.compute_s for rank in quality.processes]
        return (
            f"{barrier.views_per_s:.1f} | {quality.views_per_s:.1f} (**{quality.views_per_s / barrier.views_per_s:.2f}"
            f"x**) | {compute[0] / np.mean(compute):.3f}, {max(compute) / np.mean(compute):.3f}"
        )

    name = workload.name.split(",")[0]
    return [
        "| placement | sharded barrier views/s | sharded quality views/s (over the barrier) | quality-first: rank 0's "
        "compute, the slowest rank's, over the mean rank's |",
        "|---|---|---|---|",
        *(
            f"| {name}, {workers} workers{', rank 0 ' + str(STRAGGLER) + 'x slower' if straggler != 1 else ''}: "
            f"by {'measured time (default)' if by_time else 'candidate rows'} | {cell(straggler, by_time)} |"
            for straggler in (1.0, STRAGGLER)
            for by_time in (True, False)
        ),
    ]


def validation_table(replays: list[Replay]) -> list[str]:
    """Predicted against measured views/s per real run."""
    lines = [
        "| sharded run (2 gloo ranks) | measured views/s | **predicted** | **error** (target within 15%) | "
        "idle measured (per rank) | idle predicted | exchange base (fitted) | task fit R^2 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in replays:
        idle = " / ".join(f"{rank.idle_share:.0%}" for rank in r.measured.ranks)
        lines.append(
            f"| {r.mode} | {r.measured.views_per_s:.2f} | **{r.predicted.views_per_s:.2f}** | **{r.error:+.0%}** | "
            f"{idle} | {r.predicted.idle_share:.0%} | {r.costs.base_s * 1e3:.1f} ms | {r.costs.task.r2:.2f} |"
        )
    return lines


def overtakes(rows: list[tuple[Workload, int, dict[str, SimulationResult]]], workload: Workload) -> str:
    """The smallest predicted W at which sharded quality-first's views/s exceeds replicated quality-first's."""
    for scene, workers, results in rows:
        if scene is workload and results["sharded quality"].views_per_s > results["replicated quality"].views_per_s:
            return f"W = {workers}"
    return f"not by W = {max(w for s, w, _ in rows if s is workload)}"


BARRIERS = ("sharded barrier", "sharded barrier (other regional)", "sharded barrier (locality)")
"""The sharded barrier in each order: quality-first is also measured against the fastest of them."""


def fastest_barrier(results: dict[str, SimulationResult]) -> SimulationResult:
    """The sharded barrier with the most views/s over the orders predicted."""
    return max((results[k] for k in BARRIERS), key=lambda r: r.views_per_s)


def prediction_table(rows: list[tuple[Workload, int, dict[str, SimulationResult]]]) -> list[str]:
    """Per scene and W: each mode's views/s (idle) in the default order, sharded quality over the sharded barrier,
    the barrier's exposed wait hidden, the replicated modes beside them, and the other orders."""
    lines = [
        "| scene (mean \\|C\\|/N) | W | default order | sharded barrier views/s (idle) | sharded quality (idle) | "
        "sharded throughput (idle) | **sharded quality / sharded barrier** (target >= 1.5x at 64) | **barrier's "
        "exposed wait hidden** quality / throughput (target >= 70%) | replicated barrier (idle) | replicated quality "
        "(idle) | sharded quality / replicated quality | other regional order: sharded barrier, quality (idle) | "
        "locality order: sharded barrier, quality (idle) | **sharded quality / the fastest sharded barrier** |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for workload, workers, results in rows:
        barrier = results["sharded barrier"]
        cells = [f"{results[k].views_per_s:.1f} ({results[k].idle_share:.0%})" for k in (
            "sharded barrier", "sharded quality", "sharded throughput")]  # fmt: skip
        hidden = [results[k].hidden_wait(barrier) for k in ("sharded quality", "sharded throughput")]
        replicated = [f"{results[k].views_per_s:.1f} ({results[k].idle_share:.0%})" for k in (
            "replicated barrier", "replicated quality")]  # fmt: skip
        quality = results["sharded quality"].views_per_s
        versus = quality / results["replicated quality"].views_per_s
        others = []
        for order in ("other regional", "locality"):
            runs = [results[f"sharded {mode} ({order})"] for mode in LOCALITY]
            others.append(", ".join(f"{r.views_per_s:.1f} ({r.idle_share:.0%})" for r in runs))
        default = resolved_order("auto", True, workers)
        lines.append(
            f"| {workload.name} ({workload.mean_candidate_share():.1%}) | {workers} | {default} | "
            f"{' | '.join(cells)} | "
            f"**{quality / barrier.views_per_s:.2f}** | "
            f"**{' / '.join('-' if h is None else f'{h:.0%}' for h in hidden)}** | {' | '.join(replicated)} | "
            f"{versus:.2f} | {others[0]} ({other_regional(workers)}) | {others[1]} | "
            f"**{quality / fastest_barrier(results).views_per_s:.2f}** |"
        )
    return lines


def report(
    args: argparse.Namespace,
    command: str,
    replays: list[Replay],
    pooled: CostModel,
    rows: list[tuple[Workload, int, dict[str, SimulationResult]]],
    placed: list[str],
    seconds: float,
    reused: list[str],
) -> str:
    """The markdown section (without markers)."""
    within = sum(abs(r.error) <= TARGET_ERROR for r in replays)
    scenes = list(dict.fromkeys(workload for workload, _, _ in rows))
    at_64 = [(w, res) for w, workers, res in rows if workers == max(args.workers)]

    def ratio(res: dict[str, SimulationResult], run: str, barrier: str) -> str:
        """``run``'s views/s over ``barrier``'s."""
        return f"{res[run].views_per_s / res[barrier].views_per_s:.2f}x"

    speedups = "; ".join(
        f"{w.name.split(',')[0]}: {ratio(res, 'sharded quality', 'sharded barrier')} (against the fastest sharded "
        f"barrier of the three orders: {res['sharded quality'].views_per_s / fastest_barrier(res).views_per_s:.2f}x)"
        for w, res in at_64
    )
    made = f"Real runs reused from `--runs-dir` ({', '.join(reused)})." if reused else "Real runs made now."
    return "\n".join([
        "## bench_simulate_sharded: the simulator's sharded mode against real sharded runs, and at 8-64 workers",
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
            f"Validation: `odin-train --sharded True` on 2 gloo ranks, {args.iterations} steps per mode on a street "
            f"of {args.views} views at 128x96 along {args.street_length:.0f} m ({args.gaussians:,} procedural "
            "Gaussians), no link; each run replayed by `simulation/sharded.py` (the sharded loop's own `ShardedLoop`, "
            "`Owner` and `Reader` over a workload's sets and a modeled row all-to-all) from the costs fitted on its "
            "own timeline, each task with the time it measured. "
            f"**{within} of {len(replays)} runs within {TARGET_ERROR:.0%}.** {made}"
        ),
        "",
        *validation_table(replays),
        "",
        f"Costs pooled over {len(replays)} real run{'s' if len(replays) > 1 else ''} (used below): "
        f"{pooled.describe()}.",
        "",
        (
            f"Predictions: B = 1, K = 4 (one step fetched ahead), {args.predict_steps} steps per mode, a rank per "
            "worker, behind 10gbe "
            "(`comm/link.py`'s preset, 3.75 ms a message); the sharded modes' row all-to-all two collectives of one "
            "latency each, the payload at 260 B a fetched row and 244 B a returned one (`docs/architecture.md`), the "
            "most bytes one rank sends or receives; the replicated modes beside them with the same costs. Shards are "
            "cut by load; no structural change (no re-cut) is simulated, in either mode. Order: the sharded modes the "
            "order a sharded run picks (`auto`: the regional order, in two halves from 16 workers, "
            "`scheduling/regions.py`), the sharded barrier and quality-first the other regional order and the locality "
            "order too; the replicated modes the locality order (a replicated run's default)."
        ),
        "",
        *prediction_table(rows),
        "",
        (
            f"Sharded quality-first over the sharded barrier at {max(args.workers)} workers, both in the order a "
            f"sharded run picks there ({resolved_order('auto', True, max(args.workers))}): "
            f"{speedups} (target >= {TARGET_SPEEDUP_64}x; the paper: {PAPER_SPEEDUP_64}x over Grendel). Where sharded "
            "quality-first overtakes replicated quality-first: "
            + "; ".join(f"{w.name.split(',')[0]}: {overtakes(rows, w)}" for w in scenes)
            + "."
        ),
        "",
        (
            "Placement by measured time: the sharded barrier and quality-first in that order, placed by the ranks' "
            "measured time (every rank's rides on each step's return; `runtime/placement.py`) and by candidate rows "
            f"alone, with equal ranks and with rank 0 computing {STRAGGLER}x slower than the others:"
        ),
        "",
        *placed,
        "",
        *notes(pooled, rows),
    ])


def pace(rows: list[tuple[Workload, int, dict[str, SimulationResult]]]) -> str:
    """The note on sharded quality-first's bound at the largest W: its slowest rank's compute."""
    most = max(workers for _, workers, _ in rows)
    figures = []
    for workload, workers, results in rows:
        if workers == most:
            run, barrier = results["sharded quality"], results["sharded barrier"]
            compute = [rank.compute_s for rank in run.processes]
            figures.append(
                f"{workload.name.split(',')[0]} {max(compute) / np.mean(compute):.3f}, "
                f"{run.metrics.wait_free_views_per_s / barrier.views_per_s:.2f}x, {run.metrics.bound_share:.0%}"
            )
    return (
        f"- At {most} workers sharded quality-first can go no faster than its slowest rank computes (its wait-free "
        "bound). Per scene, that rank's compute over the mean rank's, the bound over the sharded barrier's views/s, "
        f"and the share of the bound reached: {'; '.join(figures)}. Where the share is high, the slowest rank sets "
        "the pace. The placement gives workers that read as many rows locally on any of several ranks to the ranks "
        "that have spent less time so far, as measured (`runtime/placement.py`), which evens out the views' costs and "
        "their drawn residuals in the steps after; it cannot move the workers that locality places. Where the share "
        "is low, the waits of the bullet above set it."
    )


def notes(pooled: CostModel, rows: list[tuple[Workload, int, dict[str, SimulationResult]]]) -> list[str]:
    """What falls short and why, with this run's figures."""
    link = Interconnect.preset("10gbe")
    task = pooled.task_s(int(np.mean([w.size(v) for w, _, _ in rows[:1] for v in range(w.num_views)])), 128 * 96)
    ratios = [r["sharded quality"].views_per_s / r["sharded barrier"].views_per_s for _, _, r in rows]
    hidden = [h for _, _, r in rows if (h := r["sharded quality"].hidden_wait(r["sharded barrier"])) is not None]
    idle = {k: np.mean([r[k].idle_share for _, _, r in rows]) for k in ("sharded quality", "replicated quality")}
    latency = 2 * link.latency_s
    cause = (
        f"the ranks' imbalance (each task's variation drawn from the pooled fit's residuals), not the link: a task "
        f"takes {task * 1e3:.0f} ms, an all-to-all's latency {latency * 1e3:.1f} ms"
        if task > 10 * latency
        else f"the link as much as imbalance: an all-to-all's latency {latency * 1e3:.1f} ms, a task "
        f"{task * 1e3:.0f} ms"
    )
    return [
        "What falls short and why:",
        "",
        f"- Sharded quality-first reached {min(ratios):.2f}x to {max(ratios):.2f}x the sharded barrier of its "
        f"order over these scenes and W, and hid {min(hidden, default=0):.0%} to {max(hidden, default=0):.0%} of its "
        f"exposed wait (negative: it waited more). The barrier's wait here is {cause}. Every all-to-all pairs all "
        "ranks, so each exchange of a step is a synchronization of every rank and a step's publication needs every "
        "rank's return. A rank's lag is absorbed by the tasks of the next step that the other ranks render on their "
        "lanes while it works, sure of their C(t) before the step before is published; a task whose rows that step "
        "may write (unsure) waits for its publication, after the slowest rank's return, as under the barrier. Which "
        "tasks are unsure is the schedule's doing. In the regional order (worker w the views of region w) a worker's "
        "consecutive views lie in its own region; with many workers a region is a few views all in sight of each "
        "other (a 1,024-view city at 64 workers: 16 views), so nearly every task read ahead is unsure and quality-"
        "first gains little over the barrier. The halves order (`auto` from 16 workers) cuts the scene into 2W "
        "regions and alternates the steps between its two halves, each region swept in key order, so consecutive "
        "steps share rows only across the border between the halves. Its cost: each step's views lie in half the "
        "shards, so half the workers read another rank's shard and the barrier is slower than in the regional order "
        "at few workers (hence `auto` keeps the regional order below 16). Replicated quality-first, whose reads wait "
        f"for no other rank, kept a mean idle of {idle['replicated quality']:.0%} against sharded quality-first's "
        f"{idle['sharded quality']:.0%} on the same costs.",
        pace(rows),
        "- The validation covers 2 ranks on loopback: the per-collective latency and the bandwidth term of the model "
        "are checked by no run here (the runs use no emulated link; `--interconnect` now delays sharded exchanges "
        "too, so a run behind it could).",
        "- Costs are this CPU's, fitted on 2-rank runs. The trainer's time per step (which holds an owner's culling "
        "and serving) is taken as constant in W, where an owner culls W x B tasks a step. The replicated predictions "
        "use the same costs (without the replicated runtime's own bookkeeping), so the comparison is of the protocols "
        "and exchanges, not of each mode's overheads.",
        "- Left out: structural changes (densification, re-cuts and row moves), the adaptive batch rule's tables, "
        "contention between ranks, a GPU's overlap of compute and communication.",
    ]


def main(argv: list[str] | None = None) -> None:
    """Real sharded runs, their replays, the predictions; print and record."""
    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    command = "python " + shlex.join(["benchmarks/bench_simulate_sharded.py", *given])
    start = time.perf_counter()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench_simulate_sharded_") as tmp:
        folder = args.runs_dir if args.runs_dir is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        scene, runs, reused = real_runs(args, folder)
        workload = Workload.from_colmap(scene)
        replays = []
        for mode, run_dir in runs.items():
            replays.append(replay(mode, run_dir, workload, args.iterations))
            print(validation_table(replays)[-1], flush=True)
        pooled = CostModel.fit(list(runs.values()))
    rows = []
    for scene_workload in prediction_scenes(args):
        for workers in args.workers:
            if workers * 2 > scene_workload.num_views:
                continue
            rows.append((scene_workload, workers, predict_all(scene_workload, pooled, workers, args.predict_steps)))
            print(prediction_table(rows)[-1], flush=True)
    first, most = rows[0][0], max(workers for _, workers, _ in rows)
    placed = placement_table(first, most, placement_runs(first, pooled, most, args.predict_steps))
    print("\n".join(placed), flush=True)
    text = report(args, command, replays, pooled, rows, placed, time.perf_counter() - start, reused)
    publish(NAME, text, None if args.no_write else args.output)


if __name__ == "__main__":
    main()
