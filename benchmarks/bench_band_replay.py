"""Band replay: a re-balanced regional schedule cut again at other cost-band floors and tolerances, judged on the
run's own measured renders.

Why: a run re-balanced by measured costs (``--pipeline.datamanager.rebalance-every 1``) cuts each epoch's steps by
the views' render + backward times of the epoch before, and its measured step balance (max / mean rank render +
backward per step, ``core/timeline_metrics.step_balance``) adds to what that cut predicted what the times did after
(the model grows, a view's renders spread). In the regional orders (``scheduling/regions.py``) a cut is the cost
bands of ``regions.cost_banded``: the fewest that bring the steps within the balance tolerance, each at least
``min_groups`` steps' worth of views (``balance.MIN_BAND_GROUPS``, so that a worker's consecutive views stay apart
for quality-first's reads ahead). This replays, for every epoch e >= 1 of kept runs, the cut from epoch e - 1's
measured times at each floor and tolerance, and gives its balance by those times and on epoch e's own renders: how
far a tighter cut would take the barrier's measured balance, without a run per setting. Per scene it also gives how
far a view's time moves from one epoch to the next and the balance that movement alone leaves, were it noise
(:func:`noise_floors`): the floor under any cut by the epoch before's times.

Input: run folders kept by ``bench_train.py --runs-dir`` in the regional order with one view per worker a step (B = 1,
the sharded variants' default), each with ``odin_schedule.json`` and ``odin_timeline_rank<r>.json``. A region is
the views its worker trained in epoch 0 (the regional order keeps a worker's region), in epoch 0's order (the
order within a band, as the schedule's strided order, only pairs views of like cost differently). Each view's cost
in an epoch is its render + backward there, in seconds (``balance.ViewTimes``, as the re-balance measures it: the
mean of its tasks); an epoch counts where every view has one in it and the one before.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

from _report import BENCHMARKS, machine, publish
from odin_nerfstudio.core.timeline import TASK_COST_EVENTS
from odin_nerfstudio.core.timeline_metrics import events_from_chrome_trace, step_balance
from odin_nerfstudio.scheduling.balance import BALANCE_TOLERANCE, MIN_BAND_GROUPS, ViewTimes
from odin_nerfstudio.scheduling.regions import aligned_balance, cost_banded

FLOORS = (MIN_BAND_GROUPS, 2, 1)
"""The band floors replayed (steps' worth of views a band holds at least), the shipped one first."""
TOLERANCES = (BALANCE_TOLERANCE, 0.02, 0.0)
"""The balance tolerances replayed (``ScheduleConfig.balance_tolerance``), the shipped one first."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run folders, or folders holding them (bench_train's)")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    return parser.parse_args(argv)


def run_folders(paths: list[Path]) -> list[Path]:
    """Every run folder (one holding ``odin_schedule.json``) at or under ``paths``, sorted."""
    found = {schedule.parent for path in paths for schedule in path.rglob("odin_schedule.json")}
    if not found:
        raise SystemExit(f"no run folder (with odin_schedule.json) under {', '.join(map(str, paths))}")
    return sorted(found)


class ReplayedRun:
    """One kept run: its regions, each view's measured cost per epoch, and its measured re-balanced balance."""

    def __init__(self, folder: Path) -> None:
        schedule = json.loads((folder / "odin_schedule.json").read_text())
        if schedule["config"]["order"] != "regions" or schedule["config"]["views_per_worker"] != 1:
            raise SystemExit(f"{folder}: the replay takes the regions order with one view per worker a step")
        self.folder, self.steps_per_epoch = folder, int(schedule["steps_per_epoch"])
        workers = int(schedule["config"]["num_workers"])
        regions: list[list[int]] = [[] for _ in range(workers)]
        for step in schedule["epochs"][0]["steps"]:
            for worker, views in enumerate(step["tasks"]):
                regions[worker] += views
        self.regions = [np.array(views, dtype=np.int64) for views in regions]
        events = [
            events_from_chrome_trace(json.loads(trace.read_text()))
            for trace in sorted(folder.glob("odin_timeline_rank*.json"))
        ]
        spans = [event for rank in events for event in rank if event.name in TASK_COST_EVENTS]
        epochs = max(event.step for event in spans) // self.steps_per_epoch + 1
        per_epoch = [ViewTimes(int(schedule["num_views"])) for _ in range(epochs)]
        for epoch, times in enumerate(per_epoch):
            times.add_spans([event for event in spans if event.step // self.steps_per_epoch == epoch])
        self.cost = np.stack([np.where(t.count > 0, t.seconds / np.maximum(t.count, 1), np.nan) for t in per_epoch])
        self.measured = step_balance([[e for e in rank if e.step >= self.steps_per_epoch] for rank in events])

    def epochs(self) -> list[int]:
        """The epochs e >= 1 where every view of the regions has a cost in e and in e - 1."""
        views = np.concatenate(self.regions)
        return [e for e in range(1, len(self.cost)) if not np.isnan(self.cost[e - 1 : e + 1][:, views]).any()]

    def changes(self) -> np.ndarray:
        """Each view's log change of cost from epoch e - 1 to e, for every epoch e the replay judges, less that
        epoch's mean change (the model's growth): how far a view's own time moves between two epochs."""
        views = np.concatenate(self.regions)
        moved = [np.log(self.cost[e, views] / self.cost[e - 1, views]) for e in self.epochs()]
        return np.concatenate([change - change.mean() for change in moved]) if moved else np.empty(0)

    def replay(self, floor: int, tolerance: float) -> tuple[list[float], list[float]]:
        """Per epoch, the balance of the cut from the epoch before's costs, by those costs and on its own."""
        planned, realised = [], []
        for epoch in self.epochs():
            before, now = self.cost[epoch - 1], self.cost[epoch]
            banded = cost_banded(self.regions, before, tolerance, 1, min_groups=floor)
            planned.append(aligned_balance(banded, before, 1))
            realised.append(aligned_balance(banded, now, 1))
        return planned, realised


def noise_floors(spread: float) -> tuple[float, float]:
    """The mean balance (max / mean) of a step of two views under timing noise whose epoch-to-epoch log change has
    standard deviation ``spread`` (s), to first order in s, were that change noise (independent per view and epoch):
    two views of equal cost, 1 + s / sqrt(2 pi); two views equal by the epoch before's times, judged on the next
    epoch's, 1 + s / sqrt(pi) (each time is its cost x exp(n), n ~ N(0, s^2 / 2); max / mean ~ 1 + |d| / 2 for
    the log difference d of the two, whose sd is s in the first case and s sqrt(2) in the second)."""
    return 1 + spread / math.sqrt(2 * math.pi), 1 + spread / math.sqrt(math.pi)


def scene_of(run: ReplayedRun) -> str:
    """The scene a bench_train run folder belongs to (its experiment name's first word)."""
    name = run.folder.parents[1].name if run.folder.name == "run" else run.folder.name
    return name.split("-", 1)[0]


def report(command: str, runs: list[ReplayedRun]) -> str:
    """The section: per scene, the measured balance and the replayed cuts."""
    lines = [
        "## bench_band_replay: a re-balanced regional schedule cut again at other band floors and tolerances",
        "",
        f"Command: `{command}`  ",
        f"Machine (the replay's; the runs are bench_train's): {machine(torch)}",
        "",
        "Each epoch e >= 1 of the runs cut again from epoch e - 1's measured render + backward times (as the "
        "re-balance cuts), its mean step balance (max / mean worker cost) by those times and on epoch e's own "
        f"renders; the shipped cut is floor {MIN_BAND_GROUPS}, tolerance {BALANCE_TOLERANCE}. Measured: the runs' "
        "own step balance from epoch 1 on (`step_balance`), which the shipped row's replay should come near.",
    ]
    for scene in dict.fromkeys(scene_of(run) for run in runs):
        here = [run for run in runs if scene_of(run) == scene]
        epochs = sum(len(run.epochs()) for run in here)
        measured = ", ".join(f"{run.measured:.3f}" for run in here)
        lines += ["", f"Scene: {scene}, {len(here)} runs, {epochs} epochs replayed; measured: {measured}", ""]
        lines += ["| band floor (steps) | tolerance | by the costs cut with | on the next epoch's renders |"]
        lines += ["|---|---|---|---|"]
        for floor in FLOORS:
            for tolerance in TOLERANCES:
                planned, realised = (sum(lists, []) for lists in zip(*(run.replay(floor, tolerance) for run in here)))
                lines.append(f"| {floor} | {tolerance:.2f} | {np.mean(planned):.3f} | **{np.mean(realised):.3f}** |")
        spread = float(np.concatenate([run.changes() for run in here]).std())
        equal, by_before = noise_floors(spread)
        lines += [
            "",
            f"Timing noise: a view's render + backward changes from one epoch to the next by s = {spread:.3f} "
            "(standard deviation of the log change, less the epoch's mean). Were that change noise, independent per "
            f"view and epoch, a step of two views of equal cost would average {equal:.3f}, and a cut by the epoch "
            f"before's times, however even on them, {by_before:.3f} on the next epoch's renders (`noise_floors`).",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Replay every kept run, print and record the tables."""
    args = parse_args(argv)
    command = "python " + shlex.join(["benchmarks/bench_band_replay.py", *(sys.argv[1:] if argv is None else argv)])
    runs = [ReplayedRun(folder) for folder in run_folders(args.runs)]
    publish("bench_band_replay", report(command, runs), None if args.no_write else args.output)


if __name__ == "__main__":
    main()
