"""The trainer's step driver on two gloo ranks: one step per call, blocking only when no local worker can read; the
schedule's read gate (``read_after``) holding a step's reads until the steps before its overlap window are
published; the other rank's expected tasks turning optimistic reads that would be re-run into waits; and running
ahead (a worker whose task waits runs its next step's task first) and priority publication (the rows the next
tasks read published before the rest of their step), still equal to the barrier."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from odin_nerfstudio.core.batch_gain import AdaptiveGain
from odin_nerfstudio.runtime.config import Topology
from odin_nerfstudio.runtime.runtime import OdinRuntime, OdinRuntimeConfig
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.drivers.step_loop import Ahead, ConflictStreak, run_step, settle
from odin_nerfstudio.comm.link import LinkModel, linked_distributed
from odin_nerfstudio.comm.distributed import DistributedTransport
from odin_nerfstudio.drivers.virtual import run_virtual
from odin_nerfstudio.scenes.toy import LRS, assert_identical, make_params, make_runtime, make_schedule, render, snapshot

SCHEDULE = {"num_steps": 6, "num_workers": 2, "per_worker": 1, "num_views": 12, "focal_scale": 2.0}
LR_SCALE = 8.0


def slow_render(task, leaves, generator):
    """Rank 1 renders slowly, so rank 0 could read ahead of rank 1's publications."""
    time.sleep(0.3)
    return render(task, leaves, generator)


def _rank(rank: int, init_file: str, out_dir: str, gated: bool, expect: bool) -> None:
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        params = make_params()
        runtime = OdinRuntime(
            OdinRuntimeConfig(mode="quality", record_reads=True, wait_timeout_s=60.0),
            params,
            selective_adams(params, {name: lr * LR_SCALE for name, lr in LRS.items()}),
            [DistributedTransport(params, timeout=60.0)],
            slow_render if rank == 1 else render,
        )
        for step, per_worker in enumerate(make_schedule(**SCHEDULE)):
            if expect:
                runtime.expect(per_worker[1 - rank])
            tasks = [[dataclasses.replace(task, worker=0) for task in per_worker[rank]]]
            run_step(runtime, step, tasks, read_after=step - 1 if gated else -1)
        settle(runtime)
        marks = {f"{key[0]}": record.read_mark for key, record in runtime.final_reads.items()}
        (Path(out_dir) / f"marks{rank}.json").write_text(json.dumps(marks))
        counters = runtime.counters
        failures = {"stale": counters.validation_failures.get("stale", 0), "raw": counters.waits.get("raw", 0)}
        for reason in ("window", "settle"):
            blocks = [e for e in runtime.timeline.events if e.name == "wait" and e.args.get("reason") == reason]
            failures[reason] = len(blocks)
        (Path(out_dir) / f"counters{rank}.json").write_text(json.dumps(failures))
        torch.save(snapshot(runtime), Path(out_dir) / f"snapshot{rank}.pt")
    except BaseException:
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def train(tmp_path: Path, gated: bool, expect: bool = False) -> tuple[dict[int, int], dict]:
    """Both ranks; returns rank 0's read mark per step and its final snapshot (each run checked against barrier)."""
    mp.spawn(_rank, args=(str(tmp_path / "init"), str(tmp_path), gated, expect), nprocs=2, join=True)
    errors = [path.read_text() for path in tmp_path.glob("error*.txt")]
    assert not errors, errors
    marks = {int(step): mark for step, mark in json.loads((tmp_path / "marks0.json").read_text()).items()}
    final = torch.load(tmp_path / "snapshot0.pt")
    barrier = make_runtime(OdinRuntimeConfig(mode="barrier"), make_params(), lr_scale=LR_SCALE, topology=Topology(2))
    run_virtual(barrier, make_schedule(**SCHEDULE))
    assert_identical(final, snapshot(barrier))
    return marks, final


def counters(tmp_path: Path) -> list[dict[str, int]]:
    """Per rank: its stale validation failures, RAW waits, and the driver's blocks on the timeline (window, settle)."""
    return [json.loads((tmp_path / f"counters{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("gated", [False, True])
def test_read_gate_holds_reads_until_the_previous_step_is_published(tmp_path: Path, gated: bool) -> None:
    marks, _ = train(tmp_path, gated)
    late = [step for step, mark in marks.items() if mark < step - 1]
    if gated:
        assert not late, f"steps {late} read before step - 1 was published"
        assert counters(tmp_path)[0]["window"] > 0, "the fast rank's blocks at the gate are on its timeline as waits"
    else:
        assert late, "without the gate the fast rank reads ahead of the slow rank's publications"
        assert counters(tmp_path)[0]["stale"] > 0, "reading ahead of a conflicting publication ends in a re-run"


def test_expected_remote_writes_turn_stale_reruns_into_waits(tmp_path: Path) -> None:
    """With the other rank's tasks expected (from the schedule), the fast rank waits for a conflicting publication
    instead of reading early: no stale read to re-run, and still the barrier's result."""
    train(tmp_path, gated=False, expect=True)
    fast = counters(tmp_path)[0]
    assert fast["stale"] == 0 and fast["raw"] > 0


LINK = LinkModel("test link", 0.05, 1e6)
NARROW_LINK = LinkModel("narrow test link", 0.005, 2e4)
"""Bytes dominate (a task's update of about 1 KB takes about 60 ms): a step's first part arrives well before the
rest."""


@dataclasses.dataclass(frozen=True)
class LinkedRun:
    """A run of two ranks behind a link: the mode, running ahead, priority publication (the rank's next tasks
    declared upcoming, their rows asked for first), the link, the learning rates' scale and the adaptive batch
    rule's gain (for the 2 views of a step)."""

    mode: str
    run_ahead: bool = False
    priority: bool = False
    link: LinkModel = LINK
    lr_scale: float = LR_SCALE
    gain: bool = False
    read_behind_after: int = 0
    focal_scale: float = SCHEDULE["focal_scale"]

    def batch_gain(self) -> AdaptiveGain | None:
        """The runtime's gain: the adaptive rule's for a step of 2 views, or none."""
        return AdaptiveGain(2) if self.gain else None

    def schedule(self) -> list:
        """The toy schedule, its cameras' focal scale this run's (wider views share more rows)."""
        return make_schedule(**{**SCHEDULE, "focal_scale": self.focal_scale})

    def barrier(self) -> OdinRuntime:
        """The barrier's run of the same schedule, learning rates and batch rule, in one process."""
        config, gain = OdinRuntimeConfig(mode="barrier"), self.batch_gain()
        runtime = make_runtime(config, make_params(), lr_scale=self.lr_scale, topology=Topology(2), batch_gain=gain)
        run_virtual(runtime, self.schedule())
        return runtime


def _linked_rank(rank: int, init_file: str, out_dir: str, run: LinkedRun) -> None:
    """A rank of ``run``, the other rank's tasks expected; records its reads' marks, its counters, its exchanges'
    spans and the most exchanges its transport had in flight at once."""
    mode, run_ahead, priority, lr_scale = run.mode, run.run_ahead, run.priority, run.lr_scale
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        params = make_params()
        transport = linked_distributed(DistributedTransport(params, timeout=60.0), run.link)
        runtime = OdinRuntime(
            OdinRuntimeConfig(mode=mode, record_reads=True, wait_timeout_s=60.0, priority_publication=priority),
            params,
            selective_adams(params, {name: lr * lr_scale for name, lr in LRS.items()}),
            [transport],
            slow_render if rank == 1 else render,
            batch_gain=run.batch_gain(),
        )
        most_in_flight, schedule, ahead = 0, run.schedule(), None
        streak = ConflictStreak(run.read_behind_after)
        local = [[[dataclasses.replace(task, worker=0) for task in per_worker[rank]]] for per_worker in schedule]
        for step, per_worker in enumerate(schedule):
            runtime.expect(per_worker[1 - rank])
            started = ahead.started if ahead is not None else set()
            ahead = Ahead(step + 1, local[step + 1]) if run_ahead and step + 1 < len(schedule) else None
            if priority and step + 1 < len(schedule) and not streak.reads_behind():
                runtime.upcoming(local[step + 1][0])
            run_step(runtime, step, local[step], ahead=ahead, started=started, streak=streak)
            most_in_flight = max(most_in_flight, len(transport.inner.in_flight()))
        settle(runtime)
        marks = {f"{key[0]}": record.read_mark for key, record in runtime.final_reads.items()}
        counters = runtime.counters
        result = {
            "marks": marks,
            "most_in_flight": most_in_flight,
            "raw_waits": counters.waits.get("raw", 0),
            "ran_ahead": counters.ran_ahead,
            "reruns": counters.reruns,
            "first_publications": counters.first_publications,
            "early_reads": counters.early_reads,
            "early_commits": counters.early_commits,
            "read_behind": counters.read_behind,
            "behind_conflicts": counters.behind_conflicts,
            "behind_waits": sum(1 for e in runtime.timeline.events if e.args.get("reason") == "behind"),
            "exchanges": [
                (e.step, e.start_ns, e.end_ns) for e in runtime.timeline.events if e.name == "comm" and e.worker == 0
            ],
            "read_order": [[e.step for e in runtime.timeline.events if e.name == "render"]],
            "gains": [optimizer.param_groups[0].get("lr_gain", 1.0) for optimizer in runtime.optimizers.values()],
        }
        (Path(out_dir) / f"linked{rank}.json").write_text(json.dumps(result))
        torch.save(snapshot(runtime), Path(out_dir) / f"snapshot{rank}.pt")
        transport.inner.close()
    except BaseException:
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def train_linked(tmp_path: Path, run: LinkedRun) -> list[dict]:
    """Both ranks of ``run``; returns each rank's record (and leaves rank 0's snapshot in ``tmp_path``)."""
    mp.spawn(_linked_rank, args=(str(tmp_path / "init"), str(tmp_path), run), nprocs=2, join=True)
    errors = [path.read_text() for path in tmp_path.glob("error*.txt")]
    assert not errors, errors
    return [json.loads((tmp_path / f"linked{rank}.json").read_text()) for rank in range(2)]


def test_quality_behind_a_link_overlaps_steps_and_still_equals_barrier(tmp_path: Path) -> None:
    """Behind an emulated link the fast rank reads step s + 1 while step s is unpublished (its read mark lags by
    more than one step), and the run still ends at the barrier's model bit for bit."""
    run = LinkedRun("quality")
    records = train_linked(tmp_path, run)
    assert_identical(torch.load(tmp_path / "snapshot0.pt"), snapshot(run.barrier()))
    overlapped = [step for r in records for step, mark in r["marks"].items() if mark < int(step) - 1]
    assert overlapped, "no rank read a step while the one before it was unpublished"


def test_hogwild_keeps_several_exchanges_in_flight_behind_a_link(tmp_path: Path) -> None:
    """A mode that does not validate commits each step at once: behind the link its exchanges are in flight side
    by side (the transport's progress thread runs them in step order)."""
    records = train_linked(tmp_path, LinkedRun("hogwild"))
    assert max(r["most_in_flight"] for r in records) >= 2


def test_running_ahead_renders_the_next_step_first_and_still_equals_barrier(tmp_path: Path) -> None:
    """Behind the link, with the next step's task offered (``Ahead``), the fast rank renders a task of step s + 1
    before its own task of step s whenever that one waits; its gradients are exchanged in step order, validated
    once step s is published, so the run still ends at the barrier's model bit for bit."""
    run = LinkedRun("quality", run_ahead=True)
    records = train_linked(tmp_path, run)
    assert_identical(torch.load(tmp_path / "snapshot0.pt"), snapshot(run.barrier()))
    assert sum(r["ran_ahead"] for r in records) > 0, "no rank ran ahead"
    out_of_order = [r for r in records if r["read_order"][0] != sorted(r["read_order"][0])]
    assert out_of_order, "running ahead must render a later step before an earlier one"


def test_priority_publication_lets_a_waiting_read_go_before_the_rest_of_its_step(tmp_path: Path) -> None:
    """Behind the link, each step's exchange asks for the rows of the ranks' next tasks first: they are published
    as soon as that part arrives, a conflicting read of the next step reads them while the rest of the step is
    still crossing the link, and the run still ends at the barrier's model bit for bit, the adaptive batch rule's
    gain included (both parts of a step publish at the gain of the steps before it, on each rank alike)."""
    run = LinkedRun("quality", priority=True, link=NARROW_LINK, gain=True)
    records = train_linked(tmp_path, run)
    barrier = run.barrier()
    assert_identical(torch.load(tmp_path / "snapshot0.pt"), snapshot(barrier))
    gains = [optimizer.param_groups[0]["lr_gain"] for optimizer in barrier.optimizers.values()]
    assert records[0]["gains"] == records[1]["gains"] == gains and any(gain != 1.0 for gain in gains), gains
    assert all(r["first_publications"] > 0 for r in records), "no step's first part was published ahead of the rest"
    assert sum(r["early_reads"] for r in records) > 0, "no read used rows published ahead of the rest of their step"


def test_quality_commits_a_step_while_the_rest_of_the_one_before_crosses_the_link(tmp_path: Path) -> None:
    """With priority publication, a rank validates and sends step s + 1 once step s is published in its first
    part, when its reads are surely valid whatever the rest holds (the rest's rows farther from the task's regions
    than Adam can move them, at the step's gain): two of its exchanges are then in flight at once, and the run still
    ends at the barrier's model bit for bit, the adaptive batch rule's gain included. (Small learning rates: Adam's
    bound on a step is about 30 x lr.)"""
    run = LinkedRun("quality", priority=True, link=NARROW_LINK, lr_scale=0.05, gain=True)
    records = train_linked(tmp_path, run)
    assert_identical(torch.load(tmp_path / "snapshot0.pt"), snapshot(run.barrier()))
    assert sum(r["early_commits"] for r in records) > 0, "no step was committed before the one before was published"
    overlapping = [
        (s, t)
        for r in records
        for (s, start_s, end_s), (t, start_t, _) in zip(r["exchanges"], r["exchanges"][1:])
        if t == s + 1 and start_t < end_s
    ]
    assert overlapping, "no rank had step s + 1's exchange in flight beside step s's"


def test_a_streak_of_conflicts_reads_behind_until_a_read_would_not_have_waited() -> None:
    """The driver's rule: after ``after`` conflicting steps the next ones read behind; a step without a conflict
    ends the streak; 0 never reads behind."""
    streak = ConflictStreak(after=2)
    for conflicted, behind in [(True, False), (True, True), (True, True), (False, False), (True, False)]:
        streak.saw(conflicted)
        assert streak.reads_behind() is behind
    never = ConflictStreak(after=0)
    for _ in range(5):
        never.saw(True)
    assert not never.reads_behind()


def test_a_dense_scene_reads_behind_the_step_before_and_still_equals_barrier(tmp_path: Path) -> None:
    """Wide views (every task conflicts with the step before), the slow rank 1 behind the link: after two
    conflicting steps both ranks read behind (wait for the step before without culling first; those waits are on
    the timeline), each such read finds the conflict it would have waited on, and the run still ends at the
    barrier's model bit for bit."""
    run = LinkedRun("quality", priority=True, read_behind_after=2, focal_scale=0.75)
    records = train_linked(tmp_path, run)
    assert_identical(torch.load(tmp_path / "snapshot0.pt"), snapshot(run.barrier()))
    for rank, record in enumerate(records):
        assert record["read_behind"] > 0, f"rank {rank} never read behind"
        assert record["behind_waits"] > 0, f"rank {rank}'s waits behind are not on its timeline"
        assert record["behind_conflicts"] > 0, f"rank {rank}'s reads behind met no conflict"
