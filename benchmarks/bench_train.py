"""Training benchmark: odin-splat through ns-train's command line on W processes, barrier against Odin's modes.

Why: DESIGN.md's measurements from real runs of the product, side by side: throughput (views/s), each worker's
exposed wait and idle share, the conflict rate, the fallback (re-run) rate, stale reads and their staleness, and the
held-out PSNR the mode ends with. Barrier is the synchronous baseline; quality-first must end at the same model;
throughput-first may admit bounded stale reads.

Scene: an ``odin-synth`` street (``--views`` views along ``--street-length`` m, ``--gaussians`` procedural
Gaussians); nerfstudio holds out every 8th view for evaluation.

Run: per mode, ``torchrun --nproc-per-node W --no-python odin-train odin-splat ... --runtime.mode MODE`` (gloo on
CPU, one torch thread per rank, NCCL with ``--device cuda``), ``--iterations`` schedule steps, then ``ns-eval`` on
rank 0's last checkpoint. Figures come from each rank's ``odin_timeline_rank<r>.json`` (Chrome trace) and
``odin_counters_rank<r>.json``: a rank's training span runs from its first render to its last event; views/s is the
views trained over the longest span; exposed wait is the summed "wait" spans (a worker that could not read); idle
share is the part of the span outside render, backward and the runtime's bookkeeping; the conflict rate counts
reads that waited on a conflicting publication (RAW) per task, the fallback rate re-runs per task.

Usage: ``python benchmarks/bench_train.py [--workers 2] [--quick]``; ``--quick`` runs a small scene for a few
steps (for tests) and never writes BENCHMARKS.md. Otherwise the figures replace the section between
``<!-- bench_train:start -->`` and ``<!-- bench_train:end -->``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _report import BENCHMARKS, cpu_name, publish

NAME = "bench_train"
BIN = Path(sys.executable).parent
MODES = ("barrier", "quality", "throughput")


@dataclass
class ModeRun:
    """What one mode's run produced: per rank its trace events and counters, the wall time and the PSNR."""

    mode: str
    events: list[list[dict]]
    counters: list[dict]
    wall_s: float
    psnr: float

    def span_s(self, rank: int) -> float:
        """Rank ``rank``'s training span: first render start to last event end, seconds."""
        events = self.events[rank]
        start = min(e["ts"] for e in events if e["name"] == "render")
        return (max(e["ts"] + e["dur"] for e in events) - start) / 1e6

    def total_s(self, rank: int, name: str) -> float:
        """Summed duration of rank ``rank``'s events called ``name``, seconds."""
        return sum(e["dur"] for e in self.events[rank] if e["name"] == name) / 1e6

    @property
    def views(self) -> int:
        """Views trained over all ranks (re-runs not counted)."""
        return sum(c["tasks"] - c["reruns"] for c in self.counters)

    @property
    def tasks(self) -> int:
        """Renders over all ranks, re-runs included."""
        return sum(c["tasks"] for c in self.counters)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--quick`` shrinks everything and never writes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="W, processes (one schedule worker each)")
    parser.add_argument("--views", type=int, default=64, help="views of the synthetic street")
    parser.add_argument("--street-length", type=float, default=80.0, help="street length (m)")
    parser.add_argument("--gaussians", type=int, default=40_000, help="Gaussians of the procedural world")
    parser.add_argument("--iterations", type=int, default=120, help="schedule steps per mode")
    parser.add_argument("--modes", nargs="*", default=list(MODES), help="runtime modes to run")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per command before it is killed")
    parser.add_argument("--quick", action="store_true", help="small scene, a few steps, print only")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    if args.quick:
        args.views, args.gaussians, args.iterations, args.no_write = 16, 6000, 6, True
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


def free_port() -> int:
    """A TCP port nothing listens on now (torchrun's rendezvous)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_street(args: argparse.Namespace, folder: Path) -> Path:
    """The synthetic street the modes train on."""
    scene = folder / "street"
    command = [str(BIN / "odin-synth"), "--preset", "street", "--output", str(scene)]
    command += ["--num-views", str(args.views), "--street-length", str(args.street_length)]
    command += ["--num-gaussians", str(args.gaussians)]
    run(command, args.timeout)
    return scene


def train_mode(args: argparse.Namespace, scene: Path, folder: Path, mode: str) -> ModeRun:
    """Train ``mode`` on W ranks, evaluate rank 0's checkpoint, read every rank's trace and counters."""
    torchrun = [str(BIN / "torchrun"), "--nproc-per-node", str(args.workers), "--master-port", str(free_port())]
    train = [
        "--no-python",
        str(BIN / "odin-train"),
        "odin-splat",
        "--data",
        str(scene),
        "--machine.device-type",
        args.device,
        "--vis",
        "tensorboard",
        "--viewer.quit-on-train-completion",
        "True",
        "--output-dir",
        str(folder),
        "--experiment-name",
        mode,
        "--timestamp",
        "run",
        "--max-num-iterations",
        str(args.iterations),
        "--steps-per-save",
        str(args.iterations),
        "--steps-per-eval-all-images",
        "0",
        "--steps-per-eval-image",
        "0",
        "--pipeline.model.num-downscales",
        "0",
        "--runtime.mode",
        mode,
    ]
    start = time.perf_counter()
    run([*torchrun, *train], args.timeout)
    wall = time.perf_counter() - start
    run_dir = folder / mode / "odin-splat" / "run"
    eval_json = folder / f"{mode}-eval.json"
    run([str(BIN / "ns-eval"), "--load-config", str(run_dir / "config.yml"), "--output-path", str(eval_json)], 600)
    ranks = range(args.workers)
    events = [json.loads((run_dir / f"odin_timeline_rank{r}.json").read_text())["traceEvents"] for r in ranks]
    counters = [json.loads((run_dir / f"odin_counters_rank{r}.json").read_text()) for r in ranks]
    psnr = json.loads(eval_json.read_text())["results"]["psnr"]
    return ModeRun(mode, events, counters, wall, psnr)


def rank_cells(run: ModeRun, how: str) -> str:
    """Per rank, one figure joined by " / "."""
    cells = []
    for rank, counters in enumerate(run.counters):
        span = run.span_s(rank)
        if how == "wait":
            cells.append(f"{run.total_s(rank, 'wait') / span:.0%}")
        else:
            busy = (counters["render_ns"] + counters["backward_ns"] + counters["bookkeeping_ns"]) / 1e9
            cells.append(f"{max(0.0, 1.0 - busy / span):.0%}")
    return " / ".join(cells)


def failures(run: ModeRun) -> str:
    """Validation failures summed over ranks, by kind."""
    kinds = ("stale", "candidate", "escape")
    return ", ".join(str(sum(c["validation_failures"].get(kind, 0) for c in run.counters)) for kind in kinds)


def mode_rows(run: ModeRun) -> list[tuple[str, str]]:
    """The table's rows for one mode."""
    spans = [run.span_s(r) for r in range(len(run.counters))]
    raw = sum(c["waits"].get("raw", 0) for c in run.counters)
    stale = [s for c in run.counters for s in c["stale_reads"]]
    kept = [s for s in stale if s["kept"]]
    bookkeeping = sum(c["bookkeeping_ns"] for c in run.counters) / 1e6 / max(run.tasks, 1)
    return [
        ("views trained (renders incl. re-runs)", f"{run.views} ({run.tasks})"),
        ("training span, longest rank", f"{max(spans):.1f} s"),
        ("**views/s**", f"**{run.views / max(spans):.2f}**"),
        ("exposed wait share per rank", rank_cells(run, "wait")),
        ("idle share per rank (span outside render, backward, bookkeeping)", rank_cells(run, "idle")),
        ("conflict rate (RAW waits per task)", f"{raw / max(run.tasks, 1):.2f}"),
        ("fallback rate (re-runs per task)", f"{sum(c['reruns'] for c in run.counters) / max(run.tasks, 1):.3f}"),
        ("validation failures by kind (stale read, candidate set moved, escape)", failures(run)),
        (
            "stale reads admitted, kept; max staleness",
            f"{len(stale)}, {len(kept)}; {max((s['staleness'] for s in stale), default=0)}",
        ),
        ("bookkeeping per task", f"{bookkeeping:.1f} ms"),
        ("**held-out PSNR** (ns-eval, rank 0's checkpoint)", f"**{run.psnr:.2f} dB**"),
        ("wall time of the command (start-up included)", f"{run.wall_s:.0f} s"),
    ]


def report(args: argparse.Namespace, command: str, runs: list[ModeRun]) -> str:
    """The markdown section (without markers)."""
    columns = [mode_rows(run) for run in runs]
    lines = [
        "## bench_train: odin-splat on W processes, barrier against Odin's modes",
        "",
        f"Command: `{command}`  ",
        (
            f"Machine: CPU {cpu_name()}, {len(os.sched_getaffinity(0))} cores available, load average "
            f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; Python {platform.python_version()}; "
            f"{args.workers} ranks ({'NCCL' if args.device == 'cuda' else 'gloo'}), one torch thread each  "
        ),
        f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
        "",
        (
            f"Scene: odin-synth street, {args.views} views at 128x96 along {args.street_length:.0f} m, "
            f"{args.gaussians:,} procedural Gaussians; every 8th view held out. {args.iterations} schedule steps per "
            "mode through `torchrun ... odin-train odin-splat`, then `ns-eval`."
        ),
        "",
        f"| figure | {' | '.join(run.mode for run in runs)} |",
        f"|---|{'---|' * len(runs)}",
    ]
    for index, (name, _) in enumerate(columns[0]):
        lines.append(f"| {name} | {' | '.join(column[index][1] for column in columns)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Make the street, train every mode on W ranks, print and record the table."""
    args = parse_args(argv)
    command = "python " + shlex.join(["benchmarks/bench_train.py", *(sys.argv[1:] if argv is None else argv)])
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        folder = Path(tmp)
        scene = make_street(args, folder)
        runs = [train_mode(args, scene, folder, mode) for mode in args.modes]
    text = report(args, command, runs)
    publish(NAME, text, None if args.no_write else args.output)


if __name__ == "__main__":
    main()
