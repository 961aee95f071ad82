"""`odin-simulate`: predict Odin's throughput on W workers from a real run's fitted costs and a scene's schedule.

Inputs: ``--run`` one or more run folders of odin-splat (their ``odin_timeline*.json`` and ``odin_counters*.json``;
the task, publication, exchange and trainer costs are fitted on them, ``costs.py``), or ``--costs`` a cost model
saved by ``--save-costs``; and ``--scene`` the COLMAP scene to replay (default: the first run's, from its
config.yml; an ``odin-synth`` scene, fern). For each W of ``--workers`` and each mode of ``--modes`` it simulates
``--steps`` schedule steps (``simulator.py``) behind ``--interconnect`` and prints views/s, the speed-up over the
barrier, the idle share, the exposed wait per view, the hidden wait and the conflict rate. ``--replay`` instead
simulates the first run as it ran (its mode, W, B, K, steps, processes, interconnect, recorded |C(t)|) and prints
the measured and predicted views/s side by side. ``--sharded`` simulates the sharded mode (``sharded.py``: a shard
of the Gaussians per rank, rows fetched from their owners and gradients returned over a row all-to-all, the modes
barrier, quality and throughput); a replay of a run trained with ``--sharded True`` is simulated sharded.

Example: ``odin-simulate --run outputs/street/odin-splat/run --scene data/synth/street --workers 2 8 64
--interconnect 10gbe --collective allgather``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import tyro

from odin_nerfstudio.core.help_text import reflow_help_texts
from odin_nerfstudio.core.timeline_metrics import load_run
from odin_nerfstudio.culling.initial import RlgPointSets
from odin_nerfstudio.drivers.sharded_loop import SHARDED_MODES
from odin_nerfstudio.runtime.config import Mode, OdinRuntimeConfig
from odin_nerfstudio.scheduling.regions import OrderOption
from odin_nerfstudio.simulation.costs import CostModel, recorded_durations, recorded_sizes
from odin_nerfstudio.simulation.interconnect import Collective, Interconnect
from odin_nerfstudio.simulation.run_folder import RunSettings, read_run_settings
from odin_nerfstudio.simulation.sharded import predict
from odin_nerfstudio.simulation.simulator import SimulationConfig, SimulationResult
from odin_nerfstudio.simulation.workload import Workload


@dataclass
class SimulateCliConfig:
    """Simulate Odin's modes on W workers from a real run's costs and a scene's schedule."""

    run: list[Path] = field(default_factory=list)
    """Run folders (or trace files) whose timelines the costs are fitted on."""
    scene: Optional[Path] = None
    """COLMAP scene folder (holding sparse/0/) whose training views and schedule are replayed (default: the first
    run's, from its config.yml)."""
    costs: Optional[Path] = None
    """A cost model saved by --save-costs, instead of fitting one on --run."""
    save_costs: Optional[Path] = None
    """Write the fitted cost model here (JSON)."""
    replay: bool = False
    """Simulate the first --run as it ran (each task with the time it measured) and compare with what it measured."""
    workers: list[int] = field(default_factory=lambda: [2, 8, 64])
    """W values to simulate."""
    modes: list[Mode] = field(default_factory=lambda: ["barrier", "quality", "throughput"])
    """Runtime modes to simulate."""
    views_per_worker: int = 1
    """B, views per worker per step."""
    ring_slots: int = 4
    """K, steps staged at once (and the schedule's overlap reach)."""
    fetch_ahead: int = 1
    """Sharded quality-first: steps fetched ahead of the one being published (1 to K - 1)."""
    steps: int = 120
    """Schedule steps per simulated run."""
    interconnect: Literal["none", "10gbe", "pcie"] = "none"
    """The link under every exchange (comm/link.py's presets)."""
    collective: Collective = "emulated"
    """How a step's parts travel: emulated (comm/link.py's model), allgather (ring), ring-allreduce (dense), chosen
    (per step the fastest by predicted bytes and latencies among the sparse all-gather, union-then-reduce and dense,
    as the transport chooses)."""
    virtual: bool = False
    """Every worker in one process (virtual workers sharing one thread), else one process per worker."""
    remote_writes: Literal["drawn", "candidates"] = "drawn"
    """Another process's predicted unpublished writes: the rows its tasks would draw (today's runtime with an
    escape check) or their candidate sets (without one; runs made before main's d26e6ae)."""
    replay_sizes: bool = False
    """Cost each view's task with the |C(t)| the run recorded for it (the run's own scene), not the culled one."""
    downscale: int = 1
    """Divide the scene's image sides by this (as the datamanager's camera-res-scale-factor would)."""
    rlg_points: RlgPointSets = "in-view"
    """The RLG's point sets, as the run's --pipeline.datamanager.rlg-points (runs before main's 5084c83: observed)."""
    seed: int = 0
    """The schedule's seed."""
    schedule_order: OrderOption = "auto"
    """The schedule's order, as the run's --pipeline.datamanager.schedule-order (auto: regions with --sharded, halves
    from 16 workers; the locality schedule rlg otherwise)."""
    sharded: bool = False
    """Simulate the sharded mode (odin-train's --sharded: a shard per rank; barrier, quality and throughput), its
    row all-to-all behind --interconnect (one link per pair with emulated, one per rank otherwise)."""
    rebalanced: bool = False
    """Cut the schedule by each view's modeled time, as a run with --pipeline.datamanager.rebalance-every trains from
    its second epoch on (in the rlg, random, regions and halves orders, either mode)."""


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console entry point `odin-simulate`: parse, simulate, print the table."""
    reflow_help_texts()  # --help: each option's text as one paragraph, not cut where the source wraps
    config = tyro.cli(SimulateCliConfig, args=argv, prog="odin-simulate")
    try:
        lines = run(config)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"odin-simulate: error: {error}") from None
    print("\n".join(lines))


def run(config: SimulateCliConfig) -> list[str]:
    """Fit, build the workload, simulate every (W, mode); the lines to print.

    Raises:
        FileNotFoundError: a --run or --scene folder without what it must hold.
        ValueError: invalid options, or a --costs file that is not a cost model.
    """
    if any(w < 1 for w in config.workers) or config.steps < 1 or config.downscale < 1:
        raise ValueError("--workers, --steps and --downscale must be >= 1")
    if config.sharded and (config.virtual or set(config.modes) - set(SHARDED_MODES)):
        raise ValueError(f"--sharded runs a rank per worker (no --virtual) and the modes {', '.join(SHARDED_MODES)}")
    if not config.run and (config.costs is None or config.scene is None or config.replay):
        raise ValueError("pass --run (a run folder), or --costs with --scene (--replay needs --run)")
    costs = CostModel.load(config.costs) if config.costs is not None else CostModel.fit(config.run)
    if config.save_costs is not None:
        costs.save(config.save_costs)
    scene = config.scene if config.scene is not None else read_run_settings(config.run[0]).scene
    workload = Workload.from_colmap(scene, downscale=config.downscale, rlg_points=config.rlg_points)
    if config.replay:
        return replay(config, costs, workload)
    if config.replay_sizes:
        workload = workload.with_sizes(recorded_sizes(config.run))
    interconnect = Interconnect.preset(config.interconnect, config.collective, costs.base_s, workload.num_rows)
    lines = [
        f"costs ({', '.join(str(r) for r in config.run) or config.costs}): {costs.describe()}",
        f"scene {scene}: {workload.num_views} training views, N = {workload.num_rows}, mean |C(v)| / N "
        f"{workload.mean_candidate_share():.1%}; interconnect {interconnect.name} ({interconnect.collective})",
        "",
        "| W | mode | views/s | x barrier | idle share | exposed wait / view | hidden wait | conflict rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workers in config.workers:
        results = {
            mode: predict(workload, costs, interconnect, simulation_config(config, mode, workers))
            for mode in config.modes
        }
        barrier = results.get("barrier")
        lines += [row(workers, mode, result, barrier) for mode, result in results.items()]
    return lines


def replay_config(settings: RunSettings, remote_writes: str) -> SimulationConfig:
    """The simulation of a run as it ran (its settings, ``read_run_settings``), ``remote_writes`` as asked."""
    return SimulationConfig(
        runtime=OdinRuntimeConfig(
            mode=settings.mode,  # type: ignore[arg-type]
            ring_slots=settings.ring_slots,
            fetch_ahead=settings.fetch_ahead,
        ),
        num_workers=settings.num_workers,
        views_per_worker=settings.views_per_worker,
        steps=settings.steps,
        workers_per_process=settings.num_workers // settings.processes,
        remote_writes=remote_writes,
        seed=settings.seed,
        sharded=settings.sharded,
        schedule_order=settings.schedule_order,  # type: ignore[arg-type]
        balance_tolerance=settings.balance_tolerance,
        band_floor=settings.band_floor,
    )


def replay(config: SimulateCliConfig, costs: CostModel, workload: Workload) -> list[str]:
    """The first run simulated as it ran, beside what it measured."""
    run = config.run[0]
    settings = read_run_settings(run)
    if settings.rebalance_every:
        raise ValueError(
            f"--replay: {run} re-balanced its schedule by measured costs (--pipeline.datamanager.rebalance-every "
            f"{settings.rebalance_every}), whose epochs a replay does not rebuild; replay a run without it"
        )
    simulation = replay_config(settings, config.remote_writes)
    interconnect = Interconnect.preset(settings.interconnect, "emulated", costs.base_s)
    sized = workload.with_sizes(recorded_sizes([run]))
    predicted = predict(sized, costs, interconnect, simulation, measured=recorded_durations([run]))
    measured = load_run(run)[0]
    error = predicted.views_per_s / measured.views_per_s - 1.0
    return [
        f"costs: {costs.describe()}",
        f"{run}: {'sharded ' if settings.sharded else ''}{settings.mode}, W = {settings.num_workers} in "
        f"{settings.processes} process(es), B = "
        f"{settings.views_per_worker}, K = {settings.ring_slots}, {settings.steps} steps, interconnect "
        f"{settings.interconnect}",
        f"views/s measured {measured.views_per_s:.2f}, predicted {predicted.views_per_s:.2f} ({error:+.0%}); idle "
        f"share measured {' / '.join(f'{r.idle_share:.0%}' for r in measured.ranks)}, predicted "
        f"{predicted.idle_share:.0%}",
    ]


def simulation_config(config: SimulateCliConfig, mode: str, workers: int) -> SimulationConfig:
    """The simulation of ``mode`` on ``workers`` workers the options ask for."""
    return SimulationConfig(
        runtime=OdinRuntimeConfig(
            mode=mode, ring_slots=config.ring_slots, fetch_ahead=config.fetch_ahead  # type: ignore[arg-type]
        ),
        num_workers=workers,
        views_per_worker=config.views_per_worker,
        steps=config.steps,
        workers_per_process=workers if config.virtual else 1,
        remote_writes=config.remote_writes,
        seed=config.seed,
        sharded=config.sharded,
        schedule_order=config.schedule_order,
        rebalanced=config.rebalanced,
    )


def row(workers: int, mode: str, result: SimulationResult, barrier: SimulationResult | None) -> str:
    """One table row."""
    speedup = "-" if barrier is None else f"{result.views_per_s / barrier.views_per_s:.2f}"
    hidden = None if barrier is None or barrier is result else result.hidden_wait(barrier)
    return (
        f"| {workers} | {mode} | {result.views_per_s:.1f} | {speedup} | {result.idle_share:.0%} | "
        f"{result.wait_per_view_s * 1e3:.1f} ms | {'-' if hidden is None else f'{hidden:.0%}'} | "
        f"{result.conflict_rate:.2f} |"
    )


if __name__ == "__main__":
    main()
