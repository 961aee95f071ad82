"""bench_startup: how long an ns-* command takes to start, with and without the plugin's quicker method catalogue.

Every ns-* command imports nerfstudio's method catalogue, whose installable external methods each walk the stack
(``inspect.stack()``) at import; the plugin tests the caller's frame instead (``skip_catalogue_stack_walk`` in
``odin_nerfstudio/ns/startup.py``). Both variants run ``ns-train --help`` through nerfstudio's own entry point in a
fresh process; the baseline only turns that one step off, so the difference is the step's. Every second round
reverses the order of the variants, so that a drift of the machine's speed favours neither; figures are medians.
"""

from __future__ import annotations

import argparse
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _report import BENCHMARKS, machine, publish

NAME = "bench_startup"
ROOT = Path(__file__).resolve().parents[1]
COMMAND = """
import sys
sys.argv = ["ns-train", "--help"]
from odin_nerfstudio.ns import startup
if {baseline}:
    startup.skip_catalogue_stack_walk = lambda: None  # nerfstudio's own catalogue: one stack walk per entry
from nerfstudio.scripts.train import entrypoint
entrypoint()
"""
VARIANTS = {"plugin (frame test)": False, "nerfstudio's own (stack walks)": True}


def timed(baseline: bool) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one ``ns-train --help`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", COMMAND.format(baseline=baseline)], capture_output=True, text=True, cwd=ROOT
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or "odin-splat" not in done.stdout:
        raise RuntimeError(f"ns-train --help failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def report(command: str, times: dict[str, list[tuple[float, float]]]) -> str:
    """The section: each variant's median wall and CPU time, and what the plugin's step saves."""
    import torch

    median = {name: [statistics.median(column) for column in zip(*runs)] for name, runs in times.items()}
    (ours, theirs) = (median[name] for name in VARIANTS)
    rounds = len(next(iter(times.values())))
    lines = [
        "## bench_startup: an ns-* command's start-up, with the plugin's quicker method catalogue and without",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine(torch)}  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"`ns-train --help` through nerfstudio's entry point in a fresh process, {rounds} rounds, every second one in "
        "the reverse order; medians. The baseline turns off `skip_catalogue_stack_walk` alone "
        "(`odin_nerfstudio/ns/startup.py`).",
        "",
        "| variant | wall time, median (each round) | CPU time, median |",
        "|---|---|---|",
    ]
    for name, runs in times.items():
        each = ", ".join(f"{wall:.2f}" for wall, _ in runs)
        lines.append(f"| {name} | {median[name][0]:.2f} s ({each}) | {median[name][1]:.2f} s |")
    lines += [
        "",
        f"Saved per ns-* command: **{theirs[0] - ours[0]:.2f} s of wall time, {theirs[1] - ours[1]:.2f} s of CPU "
        f"time** ({1 - ours[0] / theirs[0]:.0%} of the command's start-up).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both variants")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    command = "python " + shlex.join(["benchmarks/bench_startup.py", *(sys.argv[1:] if argv is None else argv)])
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds):
        order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            times[name].append(timed(VARIANTS[name]))
            print(f"round {round_ + 1}, {name}: {times[name][-1][0]:.2f} s wall", flush=True)
    publish(NAME, report(command, times), None if args.no_write else args.output)


if __name__ == "__main__":
    main()
