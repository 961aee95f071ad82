"""Ahead-of-time compile benchmark: RLG + one epoch of schedule for a 50,000-view synthetic city.

Odin (arXiv 2607.19893) compiles the Relative Locality Graph and schedule of 50k images in under 10 s; the
target here is under 5 s and under 4 GiB peak memory. The city is generated first (timed separately, not part
of the compile), then the build is timed ``--repeat`` times and its peak resident memory measured by resetting
the kernel's high-water mark (``/proc/self/clear_refs``) just before the first build.

Prints the machine, the command and the figures, and rewrites its own section of ``BENCHMARKS.md`` at the repo
root (between ``<!-- bench_compile:start -->`` and ``<!-- bench_compile:end -->``) under an exclusive file lock
(``_report.write_section``), leaving the other benchmarks' sections untouched.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy
from _report import BENCHMARKS, machine, write_section

from odin_nerfstudio.scenes.citygen import CityConfig, city_point_sets
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig

ROOT = Path(__file__).resolve().parents[1]
NAME = "bench_compile"
TARGET_SECONDS, TARGET_GIB = 5.0, 4.0


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, default=50_000, help="cameras in the synthetic city")
    parser.add_argument("--workers", type=int, default=8, help="W, workers per step")
    parser.add_argument("--views-per-worker", type=int, default=1, help="B, views per worker per step")
    parser.add_argument("--seed", type=int, default=0, help="city and schedule seed")
    parser.add_argument("--repeat", type=int, default=3, help="timed builds; the median is the headline")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    return parser.parse_args()


def memory_kib(field: str) -> int:
    """A VmRSS/VmHWM-style field of /proc/self/status, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss() -> bool:
    """Reset the process's peak RSS (VmHWM) to its current RSS; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def build(point_sets: list[np.ndarray], config: ScheduleConfig) -> tuple[float, float, Schedule]:
    """Build the RLG and the first epoch of the schedule: (RLG seconds, schedule seconds, schedule)."""
    start = time.perf_counter()
    rlg = RelativeLocalityGraph.from_point_sets(point_sets)
    middle = time.perf_counter()
    schedule = Schedule(rlg, config)
    schedule.epoch(0)
    return middle - start, time.perf_counter() - middle, schedule


def run(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Generate the city, time the builds, return (figure, value) rows."""
    start = time.perf_counter()
    city = city_point_sets(CityConfig(num_views=args.views, seed=args.seed))
    generate_s = time.perf_counter() - start
    config = ScheduleConfig(num_workers=args.workers, views_per_worker=args.views_per_worker, seed=args.seed)
    baseline_kib = memory_kib("VmRSS")
    peak_is_build_only = reset_peak_rss()
    timings, schedule = [], None
    for _ in range(args.repeat):
        schedule = None  # free the previous build so the peak is one build's
        rlg_s, schedule_s, schedule = build(city.point_sets, config)
        timings.append((rlg_s, schedule_s))
    peak_kib = memory_kib("VmHWM") if peak_is_build_only else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    totals = [rlg_s + schedule_s for rlg_s, schedule_s in timings]
    summary = schedule.summary()
    observations = sum(len(ids) for ids in city.point_sets)
    median = statistics.median(totals)
    peak_label = "peak RSS during the builds" if peak_is_build_only else "peak RSS of the process (reset unavailable)"
    return [
        (
            "city",
            f"{args.views:,} views, {city.num_points:,} points, {observations:,} observations, "
            f"mean track length {city.mean_track_length:.2f}",
        ),
        ("city generation (not part of the compile)", f"{generate_s:.2f} s"),
        ("RLG", f"{schedule.rlg.num_edges:,} edges, mean degree {schedule.rlg.degree.mean():.1f}"),
        ("schedule", f"W={args.workers}, B={args.views_per_worker}, one epoch of {schedule.steps_per_epoch:,} steps"),
        (
            "compile time, median (RLG + schedule)",
            f"{median:.2f} s (target < {TARGET_SECONDS:.0f} s: {'met' if median < TARGET_SECONDS else 'NOT met'})",
        ),
        ("compile times, each run", ", ".join(f"{r:.2f} + {s:.2f} = {r + s:.2f} s" for r, s in timings)),
        (
            peak_label,
            f"{peak_kib / 2**20:.2f} GiB (target < {TARGET_GIB:.0f} GiB: "
            f"{'met' if peak_kib / 2**20 < TARGET_GIB else 'NOT met'})",
        ),
        ("RSS delta of the build (peak - RSS before)", f"{(peak_kib - baseline_kib) / 2**20:.2f} GiB"),
        (
            "conflict mass, scheduled / random order",
            f"{summary['conflict_mass']:.3f} / {summary['random_conflict_mass']:.3f} (ratio {summary['ratio']:.3f})",
        ),
        ("balance (max/mean worker cost per step)", f"{summary['balance']:.3f}"),
        ("mean overlap window (steps)", f"{summary['mean_overlap_window']:.2f}"),
    ]


def section(rows: list[tuple[str, str]], command: str, machine_line: str) -> str:
    """The markdown section, without its markers."""
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return (
        "## bench_compile: RLG + schedule for a 50k-view synthetic city\n\n"
        f"Command: `{command}`  \nMachine: {machine_line}  \nDate: {time.strftime('%Y-%m-%d %H:%M %Z')}\n\n"
        f"| figure | value |\n|---|---|\n{table}"
    )


def main() -> None:
    """Run the benchmark, print it, update BENCHMARKS.md."""
    args = parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    machine_line = machine(np, scipy, memory=True)
    rows = run(args)
    print(f"command: {command}\nmachine: {machine_line}")
    for name, value in rows:
        print(f"{name}: {value}")
    if not args.no_write:
        write_section(NAME, section(rows, command, machine_line), args.output)
        print(f"updated {args.output}")


if __name__ == "__main__":
    main()
