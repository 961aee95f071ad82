"""Training benchmark: odin-splat through ns-train's command line on W processes, Odin's modes against the controls.

Why: docs/design.md's measurements from real runs of the product, side by side: throughput (views/s) and its share of
the wait-free bound, each worker's idle and exposed wait share, the barrier's wait each mode hides, the conflict
rate, the fallback (re-run) rate, stale reads and their staleness, and the held-out PSNR the mode ends with.
Quality-first must end at the barrier's model; throughput-first may admit bounded stale reads.

Variants (one flag each, the same code): the paper's controls, ``ddp`` (DDP-style dense barrier: every row read,
dense update and Adam), ``barrier`` (locality without overlap: the RLG schedule behind a barrier),
``quality-random`` (overlap without locality: quality-first on a seeded random order), ``quality-no-priority``
(quality-first without priority publication, to show what it buys), ``hogwild`` (no
synchronization of reads), and Odin's ``quality`` and ``throughput`` (the paper's t = 0.2, K = 4). The sharded
(mixed-parallel) variants, asked for by name, run ``--sharded True`` against ``sharded-barrier`` (Grendel's
synchronization); the ``-locality`` ones train the locality order in place of the sharded mode's regional one,
their ratios against ``sharded-barrier-locality``; the ``-halves`` ones the halves order, against
``sharded-barrier-halves``. The ``-candidates`` ones, replicated and sharded, train the
locality order compiled from an RLG of the views' candidate sets on the initial model
(``--pipeline.datamanager.rlg-points candidates``), their ratios against the barrier of the same kind and RLG. The
``-rebalanced`` ones re-balance the schedule every epoch by the views' measured costs
(``--pipeline.datamanager.rebalance-every 1``), their ratios against the re-balanced barrier of their kind;
``sharded-barrier-evenest`` re-balances into the evenest steps the cost bands give (``EVENEST``).

Scenes: the sparse street, an ``odin-synth`` street (``--views`` views along ``--street-length`` m, ``--gaussians``
procedural Gaussians of which ``--points`` are offered as SfM points), and a dense scene (``--dense``: odin-synth's
object, every view sees most of it), run with ``--dense-modes``; nerfstudio holds out every 8th view.

Run: per scene, interconnect and variant, ``torchrun --nproc-per-node W --no-python odin-train odin-splat ...
--interconnect LINK`` (gloo on CPU, one torch thread per rank, NCCL with ``--device cuda``), ``--iterations``
schedule steps, then ns-eval's ``ComputePSNR`` (in this process) on rank 0's last checkpoint.
``--interconnect none,10gbe`` runs every variant on plain loopback and again behind the emulated 10 GbE-class link
(``odin_nerfstudio.comm.link``: every exchange delayed by latency + bytes / bandwidth, the same for every mode).
Figures come from each rank's ``odin_timeline_rank<r>.json`` (Chrome trace) and ``odin_counters_rank<r>.json``,
computed as ``odin_nerfstudio.core.timeline_metrics`` defines them: views/s over the longest rank's span, the
wait-free bound (views over the largest per-rank compute: render, backward, bookkeeping) and the share of it
reached, idle and exposed wait per rank, the hidden wait (share of the barrier's exposed wait, per view, that a mode
removes, against the barrier run on the same scene and interconnect), conflicting tasks and re-runs per task, stale
reads and their staleness. ``--timeline-dir`` also draws each run's timeline (``odin-timeline``) as a PNG there.

Noise: this machine's speed drifts by 10% and more between runs a minute apart, so ``--repeats R`` runs every
variant R times, in rounds (each round runs every variant once, one after the other; odd rounds run them in the
reverse order, so that a steady drift of the machine's speed favours no variant over an even number of rounds). A
column shows the median of the R values of views/s, bound share and exposed wait; a ratio to the barrier (views/s,
hidden wait) is taken within a round, between runs made minutes apart, and its median over the rounds is shown
with every round's value. The other rows come from the variant's median run (by views/s).

Usage: ``python benchmarks/bench_train.py [--workers 2] [--interconnect none,10gbe] [--repeats 3] [--quick]``;
``--quick`` runs a small scene for a few steps once (for tests; ddp, the barrier, quality-first and hogwild) and
never writes BENCHMARKS.md. Otherwise the figures replace the section between ``<!-- bench_train:start -->`` and
``<!-- bench_train:end -->``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _report import BENCHMARKS, machine, publish

from odin_nerfstudio.comm.link import link_preset
from odin_nerfstudio.core.timeline_cli import draw
from odin_nerfstudio.core.timeline_metrics import RunMetrics, load_run, step_balance
from odin_nerfstudio.ns.command_line import train_command

NAME = "bench_train"
BIN = Path(sys.executable).parent
LOCALITY = ("--pipeline.datamanager.schedule-order", "rlg")
"""The locality order in place of the sharded mode's regional one (fewer steps unsure of the step before; more
bytes)."""
HALVES = ("--pipeline.datamanager.schedule-order", "halves")
"""The halves order (the sharded default from 16 workers) in place of the regional one at 2 ranks: consecutive steps
in opposite halves of the scene (fewer steps unsure of the step before; each step's views in one half, so one owner
serves both workers)."""
CANDIDATE_RLG = ("--pipeline.datamanager.rlg-points", "candidates")
"""The RLG from the views' candidate sets on the initial model, the rows over which a task of the next step waits,
not the SfM points in view (fewer steps unsure of the step before)."""
ASKED_FOR = ("-candidates", "-rebalanced")
"""Suffixes of the replicated variants that run only when asked for by name."""
REBALANCED = ("--pipeline.datamanager.rebalance-every", "1")
"""The schedule re-balanced every epoch by the views' measured render + backward seconds (Grendel balances by measured
time), so that a barrier's ranks finish their steps together."""
EVENEST = ("--pipeline.datamanager.balance-tolerance", "0", "--pipeline.datamanager.band-floor", "1")
"""The evenest steps the cost bands give: no tolerance, bands down to one step (the regions order's floor keeps a
worker's consecutive views apart for quality-first's reads ahead, which a barrier does not make)."""
VARIANTS = {
    "ddp": ("--runtime.mode", "ddp"),
    "barrier": ("--runtime.mode", "barrier"),
    "quality": ("--runtime.mode", "quality"),
    "quality-no-priority": ("--runtime.mode", "quality", "--runtime.priority-publication", "False"),
    "quality-random": ("--runtime.mode", "quality", "--pipeline.datamanager.schedule-order", "random"),
    "throughput": ("--runtime.mode", "throughput"),
    "hogwild": ("--runtime.mode", "hogwild"),
    "barrier-rebalanced": ("--runtime.mode", "barrier", *REBALANCED),
    "quality-rebalanced": ("--runtime.mode", "quality", *REBALANCED),
    "barrier-candidates": ("--runtime.mode", "barrier", *CANDIDATE_RLG),
    "quality-candidates": ("--runtime.mode", "quality", *CANDIDATE_RLG),
    "sharded-barrier": ("--sharded", "True", "--runtime.mode", "barrier"),
    "sharded-quality": ("--sharded", "True", "--runtime.mode", "quality"),
    "sharded-throughput": ("--sharded", "True", "--runtime.mode", "throughput"),
    "sharded-quality-k2": ("--sharded", "True", "--runtime.mode", "quality", "--runtime.ring-slots", "2"),
    "sharded-barrier-locality": ("--sharded", "True", "--runtime.mode", "barrier", *LOCALITY),
    "sharded-quality-locality": ("--sharded", "True", "--runtime.mode", "quality", *LOCALITY),
    "sharded-barrier-halves": ("--sharded", "True", "--runtime.mode", "barrier", *HALVES),
    "sharded-quality-halves": ("--sharded", "True", "--runtime.mode", "quality", *HALVES),
    "sharded-barrier-rebalanced": ("--sharded", "True", "--runtime.mode", "barrier", *REBALANCED),
    "sharded-quality-rebalanced": ("--sharded", "True", "--runtime.mode", "quality", *REBALANCED),
    "sharded-barrier-evenest": ("--sharded", "True", "--runtime.mode", "barrier", *REBALANCED, *EVENEST),
    "sharded-barrier-candidates": ("--sharded", "True", "--runtime.mode", "barrier", *LOCALITY, *CANDIDATE_RLG),
    "sharded-quality-candidates": ("--sharded", "True", "--runtime.mode", "quality", *LOCALITY, *CANDIDATE_RLG),
}
"""Each variant's flags: Odin's modes and the paper's controls, replicated and sharded (mixed parallel)."""
REPLICATED = [name for name in VARIANTS if not name.startswith("sharded-") and not name.endswith(ASKED_FOR)]
"""The variants run by default (the sharded ones, the candidate-set RLG's and the re-balanced ones are asked for by
name, and published in their own sections)."""


def reference(mode: str) -> str:
    """The variant a mode's ratios are taken against: the barrier of its own kind (Grendel's synchronization for
    the sharded modes) and schedule order."""
    barrier = "sharded-barrier" if mode.startswith("sharded-") else "barrier"
    for order in ("-locality", "-halves", "-candidates", "-rebalanced", "-evenest"):
        if mode.endswith(order):
            return barrier + order
    return barrier


@dataclass
class ModeRun:
    """What one mode's run produced: its timeline figures, every rank's counters, the wall time and the PSNR."""

    mode: str
    scene: str
    interconnect: str
    metrics: RunMetrics
    counters: list[dict]
    wall_s: float
    psnr: float
    round: int = 0
    balance: float = float("nan")
    rebalanced_balance: float | None = None


def median(values: list[float]) -> float:
    """The median (the mean of the middle two for an even count)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass
class Variant:
    """One variant's runs on one scene and interconnect, one per round (in round order)."""

    mode: str
    runs: list[ModeRun]

    @property
    def typical(self) -> ModeRun:
        """The median run by views/s (the lower middle one for an even count)."""
        ordered = sorted(self.runs, key=lambda run: run.metrics.views_per_s)
        return ordered[(len(ordered) - 1) // 2]

    def per_round(self, figure) -> tuple[float, list[float]]:
        """``figure(run)`` of every round, and their median."""
        values = [figure(run) for run in self.runs]
        return median(values), values

    def against(self, barrier: Variant, figure) -> tuple[float, list[float]]:
        """``figure(run, barrier's run of the same round)`` of every round both ran, and their median."""
        references = {run.round: run for run in barrier.runs}
        values = [figure(run, references[run.round]) for run in self.runs if run.round in references]
        return (median(values), values) if values else (float("nan"), [])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--quick`` shrinks everything and never writes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="W, processes (one schedule worker each)")
    parser.add_argument("--views", type=int, default=64, help="views of the synthetic street")
    parser.add_argument("--street-length", type=float, default=300.0, help="street length (m)")
    parser.add_argument("--gaussians", type=int, default=100_000, help="Gaussians of the procedural world")
    parser.add_argument("--points", type=int, default=20_000, help="Gaussian centres offered as SfM points")
    parser.add_argument("--iterations", type=int, default=120, help="schedule steps per run")
    parser.add_argument("--modes", nargs="*", default=REPLICATED, choices=list(VARIANTS), help="variants to run")
    parser.add_argument("--dense", action=argparse.BooleanOptionalAction, default=True, help="also the dense scene")
    parser.add_argument("--dense-modes", nargs="*", default=["ddp", "barrier", "quality"], choices=list(VARIANTS))
    parser.add_argument("--city", action=argparse.BooleanOptionalAction, default=False, help="also odin-synth's city")
    parser.add_argument("--city-modes", nargs="*", default=None, choices=list(VARIANTS), help="default: --modes")
    parser.add_argument(
        "--interconnect",
        default="none",
        help="comma-separated links under every exchange: none (loopback) and presets of odin_nerfstudio.comm.link",
    )
    parser.add_argument("--timeline-dir", type=Path, default=None, help="draw each run's timeline PNG here")
    parser.add_argument(
        "--runs-dir", type=Path, default=None,
        help="keep the scenes and runs here, a new or empty folder (default: a temporary one, removed at the end)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per command before it is killed")
    parser.add_argument("--repeats", type=int, default=3, help="rounds: every variant runs once per round")
    parser.add_argument("--quick", action="store_true", help="small scene, a few steps, one round, print only")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument(
        "--section", default=NAME, help="the section of the markdown file to replace (bench_train_sharded: ...)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    args.interconnect = args.interconnect.split(",")
    for name in args.interconnect:
        link_preset(name)
    if args.runs_dir is not None and args.runs_dir.exists() and any(args.runs_dir.iterdir()):
        parser.error(f"--runs-dir {args.runs_dir} is not empty: name a new folder, the runs would collide with its own")
    if args.quick:
        args.views, args.gaussians, args.points, args.iterations, args.no_write = 16, 6000, 2000, 6, True
        args.repeats = 1
        args.street_length, args.dense = 80.0, False
        # Less the variants that are quality-first's code with one flag changed (priority publication, the order),
        # and throughput-first (through torchrun in bench_quality's --quick and tests/ns/test_sharded_training.py)
        left_out = ("quality-no-priority", "quality-random", "throughput")
        args.modes = [mode for mode in args.modes if mode not in left_out]
    return args


def run(command: list[str], timeout: float) -> str:
    """Run a command with one torch thread per process; fail with its output's tail when it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"{command[0]} did not finish within {timeout} s") from error
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return result.stdout


def make_street(args: argparse.Namespace, folder: Path) -> Path:
    """The sparse synthetic street."""
    scene = folder / "street"
    command = [str(BIN / "odin-synth"), "--preset", "street", "--output", str(scene)]
    command += ["--num-views", str(args.views), "--street-length", str(args.street_length)]
    command += ["--num-gaussians", str(args.gaussians), "--num-points", str(args.points)]
    run(command, args.timeout)
    return scene


def make_object(args: argparse.Namespace, folder: Path) -> Path:
    """The dense scene: odin-synth's object (the quickstart's scene), every view sees most of it."""
    scene = folder / "object"
    run([str(BIN / "odin-synth"), "--preset", "object", "--output", str(scene)], args.timeout)
    return scene


def make_city(args: argparse.Namespace, folder: Path) -> Path:
    """The city: odin-synth's city preset (a grid of streets, each view seeing its own street), at its defaults."""
    scene = folder / "city"
    run([str(BIN / "odin-synth"), "--preset", "city", "--output", str(scene)], args.timeout)
    return scene


def run_name(scene: Path, mode: str, interconnect: str, round_: int = 0) -> str:
    """The experiment name (and folder) of one run: scene, variant, interconnect, round."""
    return f"{scene.name}-{mode}-{interconnect}-{round_}"


def train_mode(
    args: argparse.Namespace, scene: Path, folder: Path, mode: str, interconnect: str, round_: int = 0
) -> ModeRun:
    """Train variant ``mode`` on W ranks behind ``interconnect``, evaluate rank 0's checkpoint, read every rank's
    trace and counters."""
    name = run_name(scene, mode, interconnect, round_)
    options = ["--pipeline.model.num-downscales", "0", *VARIANTS[mode], "--interconnect", interconnect]
    command = train_command(
        "odin-splat",
        scene,
        folder,
        args.iterations,
        ranks=args.workers,
        device_type=args.device,
        experiment_name=name,
        options=options,
    )
    start = time.perf_counter()
    run(command, args.timeout)
    wall = time.perf_counter() - start
    run_dir = folder / name / "odin-splat" / "run"
    eval_json = folder / f"{name}-eval.json"
    evaluate(run_dir / "config.yml", eval_json)
    metrics, events = load_run(run_dir)
    if args.timeline_dir is not None:
        args.timeline_dir.mkdir(parents=True, exist_ok=True)
        draw(metrics, events, args.timeline_dir / f"bench_train_{name}.png")
    counters = [json.loads((run_dir / f"odin_counters_rank{r}.json").read_text()) for r in range(args.workers)]
    psnr = json.loads(eval_json.read_text())["results"]["psnr"]
    rebalanced = None
    record = run_dir / "odin_rebalance_rank0.json"
    if record.exists():  # the steps trained by measured costs: from the first re-balance on
        first = json.loads(record.read_text())[0]["step"]
        rebalanced = step_balance([[event for event in rank if event.step >= first] for rank in events])
    balances = (step_balance(events), rebalanced)
    return ModeRun(mode, scene.name, interconnect, metrics, counters, wall, psnr, round_, *balances)


def evaluate(config: Path, output: Path) -> None:
    """ns-eval's ``ComputePSNR`` on a run's last checkpoint, in this process: the command's own code, without
    paying nerfstudio's start-up (over 10 s on 2 cores) once per run."""
    from nerfstudio.scripts.eval import ComputePSNR

    ComputePSNR(load_config=config, output_path=output).main()


def _last_error(text: str) -> str:
    """The most telling line of a failed command's output: the last one naming an error."""
    lines = [line.strip() for line in text.splitlines() if "Error" in line or "error" in line]
    return (lines[-1] if lines else text.strip().splitlines()[-1])[:300]


def per_rank(values: list[float]) -> str:
    """Shares per rank, joined by " / "."""
    return " / ".join(f"{value:.0%}" for value in values)


def failures(run: ModeRun) -> str:
    """Validation failures summed over ranks, by kind."""
    kinds = ("stale", "candidate", "escape")
    if not all("validation_failures" in c for c in run.counters):  # sharded: only stale reads fail, and re-run
        return f"{sum(c['reruns'] for c in run.counters)}, -, -"
    return ", ".join(str(sum(c["validation_failures"].get(kind, 0) for c in run.counters)) for kind in kinds)


def _rounds(median_value: float, values: list[float], form: str) -> str:
    """A median, then every round's value when there are several."""
    text = form.format(median_value)
    if len(values) > 1:
        text += " (" + ", ".join(form.format(value) for value in values) + ")"
    return text


def early(run: ModeRun) -> str:
    """Priority publication's counters over the ranks: first parts published ahead of the rest, reads that used
    one, worker steps committed while the step before was published only in its first part; in the sharded mode,
    owners' early publications (the rows only their own rank writes) and the tasks they settled ("-": none)."""
    if all("published_early" in c for c in run.counters):
        names = ("published_early", "settled_locally")
        return "; ".join(str(sum(c[name] for c in run.counters)) for name in names) + "; -"
    names = ("first_publications", "early_reads", "early_commits")
    return "; ".join(str(sum(c.get(name, 0) for c in run.counters)) for name in names)


def behind(run: ModeRun) -> str:
    """Steps read behind (waiting for the step before without trying first) over the ranks, and how many of their
    reads would have met a conflict ("-" where the mode does not read behind)."""
    if not all("read_behind" in c for c in run.counters):
        return "-"
    return f"{sum(c['read_behind'] for c in run.counters)}; {sum(c['behind_conflicts'] for c in run.counters)}"


def ms_per_task(run: ModeRun, counter: str, renders: int) -> float | None:
    """A nanosecond counter summed over the ranks, in ms per task; None where the counters do not hold it."""
    if not all(counter in c for c in run.counters):
        return None
    return sum(c[counter] for c in run.counters) / 1e6 / max(renders, 1)


def bookkeeping_cpu(run: ModeRun, renders: int) -> str:
    """The hooks' CPU time per task over the ranks (``bookkeeping_cpu_ns``; "-" where the counters hold none): with
    the wall time beside it, it tells the hooks' own work from time their thread spent off a shared CPU."""
    cpu_ms = ms_per_task(run, "bookkeeping_cpu_ns", renders)
    return "-" if cpu_ms is None else f"{cpu_ms:.1f} ms"


def projection_cpu(run: ModeRun, renders: int) -> str:
    """Of the hooks' CPU time per task, the projections of views' predicted writes (``projection_cpu_ns``, once per
    view and run, so their share per task falls as a run grows) and how many views were projected, over the ranks."""
    cpu_ms = ms_per_task(run, "projection_cpu_ns", renders)
    return "-" if cpu_ms is None else f"{cpu_ms:.2f} ms ({sum(c['projections'] for c in run.counters)} views)"


def mode_rows(variant: Variant, barrier: Variant | None) -> list[tuple[str, str]]:
    """The table's rows for one variant (``barrier``: the barrier's runs on the same interconnect, round by round,
    for the ratios and the hidden wait)."""
    run = variant.typical
    metrics, ranks = run.metrics, run.metrics.ranks
    renders = sum(r.renders for r in ranks)
    stale = metrics.stale
    mean_staleness = stale.staleness_sum / stale.admitted if stale.admitted else 0.0
    bookkeeping = sum(r.bookkeeping_s for r in ranks) * 1e3 / max(renders, 1)
    views_per_s = _rounds(*variant.per_round(lambda r: r.metrics.views_per_s), "{:.2f}")
    bound = _rounds(*variant.per_round(lambda r: r.metrics.bound_share), "{:.0%}")
    exposed = _rounds(*variant.per_round(lambda r: r.metrics.exposed_wait_per_view_s * 1e3), "{:.1f} ms")
    relative = equal = hidden = "-"
    if barrier is not None and barrier is not variant:
        ratio = variant.against(barrier, lambda r, b: r.metrics.views_per_s / b.metrics.views_per_s)
        relative = _rounds(*ratio, "{:.2f}x")
        share = variant.against(barrier, lambda r, b: r.metrics.bound_share / b.metrics.bound_share)
        equal = _rounds(*share, "{:.2f}x")
        share = variant.against(barrier, lambda r, b: r.metrics.hidden_wait(b.metrics) or 0.0)
        hidden = _rounds(*share, "**{:.0%}**")
    return [
        ("views trained (renders incl. re-runs), median run", f"{metrics.views} ({renders})"),
        ("training span, longest rank, median run", f"{metrics.span_s:.1f} s"),
        ("**views/s**, median (each round)", f"**{views_per_s}**"),
        ("views/s relative to barrier, same round: median (each round)", relative),
        ("**at equal compute**: share of own wait-free bound relative to barrier's, same round", f"**{equal}**"),
        ("wait-free bound (views / largest rank compute), median run", f"{metrics.wait_free_views_per_s:.2f} views/s"),
        ("**share of the wait-free bound**, median (each round)", f"**{bound}**"),
        ("measured step balance (max / mean rank render + backward per step; from the first re-balance on), median run",
         balance(run)),
        ("idle share per rank (outside compute), median run", per_rank([r.idle_share for r in ranks])),
        ("exposed wait share per rank, median run", per_rank([r.exposed_wait_share for r in ranks])),
        ("exposed wait per view, median (each round)", exposed),
        ("**hidden wait** (share of the same round's barrier exposed wait removed), median (each round)", hidden),
        ("conflict rate (conflicting tasks per task)", f"{metrics.conflict_rate:.2f}"),
        ("fallback rate (re-runs per task)", f"{metrics.fallback_rate:.3f}"),
        ("validation failures by kind (stale read, candidate set moved, escape)", failures(run)),
        (
            "stale reads admitted, kept; max (mean) staleness",
            f"{stale.admitted}, {stale.kept}; {stale.max_staleness} ({mean_staleness:.1f})",
        ),
        ("tasks run ahead (next step's, while this one waited)", str(sum(c["ran_ahead"] for c in run.counters))),
        ("steps read behind (after a streak of conflicts), those that met one", behind(run)),
        (
            "priority publication: steps published in two parts; reads of a first part (sharded: tasks settled by "
            "it); steps committed early",
            early(run),
        ),
        ("bookkeeping per task", f"{bookkeeping:.1f} ms"),
        ("bookkeeping per task, CPU time on the hooks' thread (the rest: off the CPU)", bookkeeping_cpu(run, renders)),
        ("of it, other ranks' views' writes projected (once per view and rank: views)", projection_cpu(run, renders)),
        ("sharded: bytes sent per rank per step (to the collectives); rows served, fetched per step", shard_bytes(run)),
        ("sharded: rows served per rank, max / mean; render + backward per rank", owner_balance(run)),
        ("**held-out PSNR** (ns-eval, rank 0's checkpoint), median run", f"**{run.psnr:.2f} dB**"),
        ("PSNR relative to barrier", "-" if barrier is None else f"{run.psnr / barrier.typical.psnr - 1:+.1%}"),
        ("wall time of the command (start-up included), median run", f"{run.wall_s:.0f} s"),
    ]


def balance(run: ModeRun) -> str:
    """The measured step balance over the run and, where it re-balanced, over the steps from its first re-balance."""
    text = f"{run.balance:.3f}"
    return text if run.rebalanced_balance is None else f"{text} ({run.rebalanced_balance:.3f})"


def shard_bytes(run: ModeRun) -> str:
    """A sharded run's bytes sent per rank per step and rows served and fetched per step (over the ranks); "-" for a
    replicated run."""
    if not all("bytes_sent" in c for c in run.counters):
        return "-"
    steps = max(max(c["publications"] for c in run.counters), 1)
    sent = sum(c["bytes_sent"] for c in run.counters) / len(run.counters) / steps
    served = sum(c["rows_served"] for c in run.counters) / steps
    fetched = sum(c["rows_fetched"] for c in run.counters) / steps
    return f"{sent / 1024:.0f} KiB; {served:.0f}, {fetched:.0f}"


def owner_balance(run: ModeRun) -> str:
    """A sharded run's slowest owner against the mean (rows served) and each rank's render + backward seconds; "-"
    for a replicated run."""
    if not all("rows_served" in c for c in run.counters):
        return "-"
    served = [c["rows_served"] for c in run.counters]
    mean = sum(served) / len(served)
    compute = " / ".join(f"{r.render_s + r.backward_s:.1f} s" for r in run.metrics.ranks)
    return f"{max(served) / mean if mean else 1.0:.2f}; {compute}"


def table(variants: list[Variant]) -> list[str]:
    """One interconnect's variants side by side, a column per variant; ratios against the barrier of each one's kind."""
    by_mode = {variant.mode: variant for variant in variants}
    columns = [mode_rows(variant, by_mode.get(reference(variant.mode))) for variant in variants]
    lines = [f"| figure | {' | '.join(variant.mode for variant in variants)} |", f"|---|{'---|' * len(variants)}"]
    for index, (name, _) in enumerate(columns[0]):
        lines.append(f"| {name} | {' | '.join(column[index][1] for column in columns)} |")
    return lines


def interconnect_title(name: str) -> str:
    """A heading naming the interconnect and, for a preset, its model."""
    link = link_preset(name)
    if link is None:
        return "Interconnect: none (gloo over loopback)"
    return (
        f"Interconnect: `{name}` emulated ({link.name}: {link.latency_s * 1e3:g} ms + bytes / "
        f"{link.bandwidth_bytes_per_s / 1e6:g} MB/s per message)"
    )


def report(args: argparse.Namespace, command: str, runs: list[ModeRun]) -> str:
    """The markdown section (without markers): one table per scene and interconnect."""
    title = "Odin's modes against the paper's controls"
    sharded = {run.mode.startswith("sharded-") for run in runs}
    if sharded == {True}:
        title = "sharded (mixed parallel) modes against the sharded barrier (Grendel's synchronization)"
    elif sharded == {True, False}:
        title = "replicated and sharded modes, each against the barrier of its kind and schedule"
    lines = [
        f"## {args.section}: odin-splat on W processes, {title}",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}; {args.workers} ranks ({'NCCL' if args.device == 'cuda' else 'gloo'}), "
        "one torch thread each  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
        "",
        (
            f"Scenes: the sparse street, odin-synth's street preset, {args.views} views at 128x96 along "
            f"{args.street_length:.0f} m, {args.gaussians:,} procedural Gaussians, {args.points:,} offered as SfM "
            "points; the city (with --city), odin-synth's city preset (80 views along a 2 x 2 grid of streets, 100,000 "
            "Gaussians, 20,000 offered as SfM points); the dense scene, odin-synth's object preset (24 views around a "
            "torus and a ball). Every 8th view "
            f"held out. {args.iterations} schedule steps per run through `torchrun ... odin-train odin-splat`, then "
            "ns-eval's `ComputePSNR`. Variants: "
            + ", ".join(f"`{name}` ({' '.join(VARIANTS[name])})" for name in dict.fromkeys(run.mode for run in runs))
            + ". Figures as `odin_nerfstudio.core.timeline_metrics` defines them; ratios are taken against the barrier "
            "of the variant's kind and schedule (sharded variants against `sharded-barrier`, the `-locality`, "
            "`-halves`, `-candidates`, `-rebalanced` and `-evenest` ones against the barrier of the same suffix). At "
            "equal compute: each run's share of its own wait-free bound over the barrier's, which factors out how fast "
            "the machine computed in each run."
        ),
    ]
    for scene in dict.fromkeys(run.scene for run in runs):
        for interconnect in args.interconnect:
            here = [run for run in runs if run.interconnect == interconnect and run.scene == scene]
            modes = dict.fromkeys(run.mode for run in here)
            variants = [Variant(mode, [run for run in here if run.mode == mode]) for mode in modes]
            lines += ["", f"Scene: {scene}. {interconnect_title(interconnect)}", ""]
            lines += table(variants)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Make the scenes, train every variant on W ranks, print and record the tables."""
    args = parse_args(argv)
    command = "python " + shlex.join(["benchmarks/bench_train.py", *(sys.argv[1:] if argv is None else argv)])
    if args.runs_dir is not None:
        args.runs_dir.mkdir(parents=True, exist_ok=True)
    runs_dir = (
        contextlib.nullcontext(str(args.runs_dir)) if args.runs_dir is not None
        else tempfile.TemporaryDirectory(prefix="bench_train_")
    )
    with runs_dir as tmp:
        folder = Path(tmp)
        plans = [(make_street(args, folder), args.modes)]
        if args.city:
            plans.append((make_city(args, folder), args.city_modes or args.modes))
        if args.dense:
            plans.append((make_object(args, folder), args.dense_modes))
        runs, failed = [], []
        for scene, modes in plans:
            for link in args.interconnect:
                for round_ in range(args.repeats):
                    for mode in modes if round_ % 2 == 0 else modes[::-1]:
                        try:
                            runs.append(train_mode(args, scene, folder, mode, link, round_))
                        except RuntimeError as error:  # one failed run is reported, not the end of the benchmark
                            failed.append(f"{scene.name} {mode} {link} round {round_}: {_last_error(str(error))}")
    text = report(args, command, runs)
    if failed:
        text += "\n\nRuns that failed (their error's last line):\n\n" + "\n".join(f"- {line}" for line in failed)
    publish(args.section, text, None if args.no_write else args.output)


if __name__ == "__main__":
    main()
