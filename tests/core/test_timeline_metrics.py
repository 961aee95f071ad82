"""Timeline metrics on hand-built timelines: spans, compute, idle, exposed wait (overlaps with compute and between
virtual workers' waits counted once), views and re-runs, conflicts from waits and counters, stale reads, the
wait-free bound, hidden wait against a barrier run; an incremental meter equals a one-shot one; Chrome traces and
run folders read back to the same figures."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from odin_nerfstudio.core.timeline import Event, Timeline
from odin_nerfstudio.runtime.sharding import ShardCounters
from odin_nerfstudio.core.timeline_metrics import (
    RunMetrics,
    TimelineMeter,
    events_from_chrome_trace,
    live_scalars,
    load_run,
    rank_metrics,
    step_balance,
)

MS = 1_000_000


def span(name: str, start_ms: float, end_ms: float, step: int = 0, worker: int = 0, **args) -> Event:
    """An event from ``start_ms`` to ``end_ms`` (milliseconds)."""
    return Event(name, worker, step, round(start_ms * MS), round(end_ms * MS), args)


def task(start_ms: float, render_ms: float, backward_ms: float, step: int, view: int, worker: int = 0) -> list[Event]:
    """A task's render then backward, back to back."""
    middle = start_ms + render_ms
    return [
        span("render", start_ms, middle, step, worker, view=view),
        span("backward", middle, middle + backward_ms, step, worker, view=view),
    ]


def by_end(events: list[Event]) -> list[Event]:
    """Recording order: each event is recorded when it ends."""
    return sorted(events, key=lambda e: e.end_ns)


def barrier_ranks() -> tuple[list[Event], list[Event]]:
    """Two ranks, two steps. Rank 0 computes 20 ms per step, rank 1 40 ms; rank 0 waits 20 ms at the barrier."""
    rank0 = by_end(
        [
            *task(0, 10, 10, step=0, view=0),
            span("comm", 20, 41, step=0),
            span("publish", 40, 41, step=0, worker=-1),
            span("wait", 20, 41, step=1, reason="barrier"),
            *task(41, 10, 10, step=1, view=2),
        ]
    )
    rank1 = by_end(
        [
            *task(0, 30, 10, step=0, view=1),
            span("publish", 40, 41, step=0, worker=-1),
            *task(41, 30, 10, step=1, view=3),
        ]
    )
    return rank0, rank1


def test_spans_compute_idle_and_exposed_wait_of_two_ranks() -> None:
    rank0, rank1 = barrier_ranks()
    first, second = rank_metrics(0, rank0), rank_metrics(1, rank1)
    assert first.span_s == pytest.approx(0.061) and second.span_s == pytest.approx(0.081)
    assert first.compute_s == pytest.approx(0.041), "render + backward + publish (no counters: bookkeeping)"
    assert first.idle_share == pytest.approx(1 - 41 / 61)
    assert first.exposed_wait_s == pytest.approx(0.020), "the wait minus the publication inside it"
    assert first.waits == {"barrier": 1} and first.conflicts == 0 and first.comm_s == pytest.approx(0.021)
    assert second.exposed_wait_s == 0 and second.views == 2 and second.reruns == 0
    run = RunMetrics((first, second))
    assert run.views == 4 and run.span_s == pytest.approx(0.081)
    assert run.views_per_s == pytest.approx(4 / 0.081)
    assert run.wait_free_views_per_s == pytest.approx(4 / 0.081), "rank 1's compute is its whole span"
    assert run.bound_share == pytest.approx(1.0)


def test_hidden_wait_is_the_share_of_the_barrier_exposed_wait_removed() -> None:
    barrier = RunMetrics(tuple(rank_metrics(r, events) for r, events in enumerate(barrier_ranks())))
    rank0 = by_end([*task(0, 10, 10, 0, 0), span("wait", 20, 25, 1, reason="raw"), *task(25, 10, 10, 1, 2)])
    rank1 = by_end([*task(0, 30, 10, 0, 1), *task(40, 30, 10, 1, 3)])
    odin = RunMetrics((rank_metrics(0, rank0), rank_metrics(1, rank1)))
    assert odin.hidden_wait(barrier) == pytest.approx(1 - 5 / 20)
    assert odin.conflict_rate == pytest.approx(1 / 4), "one raw wait among four tasks"
    assert barrier.hidden_wait(odin) == pytest.approx(1 - 20 / 5)
    assert odin.hidden_wait(RunMetrics((rank_metrics(1, rank1),))) is None


def test_overlapping_waits_of_virtual_workers_count_once_and_exclude_compute() -> None:
    """Worker 0 waits 10-30 ms, worker 1 renders 15-20 then waits 25-40: the process waited 10-40 except 15-20."""
    events = by_end(
        [
            *task(0, 5, 5, 0, 0, worker=0),
            span("render", 15, 20, 0, 1, view=1),
            span("wait", 10, 30, 1, 0, reason="raw"),
            span("wait", 25, 40, 1, 1, reason="ring"),
            *task(40, 5, 5, 1, 2, worker=0),
        ]
    )
    metrics = rank_metrics(0, events)
    assert metrics.exposed_wait_s == pytest.approx(0.025)
    assert metrics.waits == {"raw": 1, "ring": 1} and metrics.views == 3


def test_a_lanes_render_recorded_after_the_loops_wait_is_not_exposed_wait() -> None:
    """The sharded loop waits 10-40 ms for a return while its lane renders a task read ahead 12-35 and backs it 35-45
    (recorded after the wait ends), and the loop publishes 40-42 while the lane still computes: only 10-12 is
    exposed. A meter that judged the wait when it was recorded, by the compute recorded so far, counted 30 ms."""
    events = by_end(
        [
            *task(0, 5, 5, 0, 0),
            span("wait", 10, 40, 0, reason="return"),
            *task(12, 23, 10, 1, 1, worker=1),
            span("publish", 40, 42, 0, worker=-1),
            *task(45, 5, 5, 1, 2),
        ]
    )
    assert [e.name for e in events].index("wait") < [e.name for e in events].index("backward", 2), "wait first"
    metrics = rank_metrics(0, events)
    assert metrics.exposed_wait_s == pytest.approx(0.002)
    assert metrics.compute_s == pytest.approx(0.010 + 0.033 + 0.002 + 0.010), "compute is the work, summed"


def test_exposed_wait_is_the_waits_less_the_compute_whatever_the_spans_overlap_and_their_order() -> None:
    """Random spans of several threads, in recording order: the meter, fed one event at a time, equals the union of
    the waits less the union of the compute spans, counted on a millisecond grid."""
    rng = random.Random(7)
    for _ in range(200):
        events = []
        for _ in range(rng.randint(1, 12)):
            start = rng.randint(0, 60)
            name = rng.choice(["render", "backward", "publish", "wait", "comm"])
            events.append(span(name, start, start + rng.randint(1, 25), worker=rng.randint(0, 2), reason="raw"))
        events = by_end(events)
        meter = TimelineMeter()
        for count in range(1, len(events) + 1):
            meter.consume(events[:count])
        grid = range(0, 100)
        inside = lambda ms, names: any(  # noqa: E731
            e.name in names and e.start_ns <= ms * MS < e.end_ns for e in events
        )
        exposed = sum(1 for ms in grid if inside(ms, ("wait",)) and not inside(ms, ("render", "backward", "publish")))
        assert meter.metrics().exposed_wait_s == pytest.approx(exposed / 1000)


def test_reruns_conflicts_and_stale_reads_from_counters() -> None:
    events = by_end(
        [
            *task(0, 10, 10, 0, 5),
            span("wait", 20, 22, 1, reason="raw"),
            *task(22, 10, 10, 1, 6),
            *task(42, 10, 10, 1, 6),
        ]
    )
    counters = {
        "bookkeeping_ns": 4 * MS,
        "validation_failures": {"stale": 1, "escape": 2},
        "stale_reads": [{"staleness": 2, "kept": True}, {"staleness": 1, "kept": False}],
    }
    metrics = rank_metrics(0, events, counters)
    assert metrics.views == 2 and metrics.renders == 3 and metrics.reruns == 1
    assert metrics.bookkeeping_s == pytest.approx(0.004) and metrics.compute_s == pytest.approx(0.064)
    assert metrics.conflicts == 1 + 2 + 1, "a raw wait, two admitted stale reads, one stale failure (not escapes)"
    assert (metrics.stale.admitted, metrics.stale.kept, metrics.stale.max_staleness) == (2, 1, 2)
    run = RunMetrics((metrics,))
    assert run.fallback_rate == pytest.approx(0.5) and run.conflict_rate == pytest.approx(2.0)
    scalars = live_scalars(metrics)
    assert scalars["odin/fallback_rate"] == pytest.approx(0.5) and scalars["odin/stale_reads_kept"] == 1.0


def test_a_sharded_ranks_counters_give_its_stale_reads_and_the_publish_spans_as_bookkeeping() -> None:
    """The sharded mode's counters (``runtime/sharding.ShardCounters``) count stale reads and re-runs, and hold no
    bookkeeping time or validation failures: the figures still come out (``odin-timeline`` on a sharded run)."""
    events = by_end(
        [
            *task(0, 10, 10, 0, 5),
            span("wait", 20, 22, 1, reason="fetch"),
            span("publish", 22, 23, 0, worker=-1),
            *task(23, 10, 10, 1, 6),
        ]
    )
    counters = dataclasses.asdict(ShardCounters(stale_reads=3, reruns=1, ran_ahead=2))
    metrics = rank_metrics(0, events, counters)
    assert (metrics.stale.admitted, metrics.stale.kept, metrics.stale.max_staleness) == (3, 2, 1)
    assert metrics.bookkeeping_s == pytest.approx(0.001), "the publish span, a lower bound"


def test_incremental_meter_equals_one_shot() -> None:
    rank0, _ = barrier_ranks()
    meter = TimelineMeter(0)
    for end in range(1, len(rank0) + 1):
        meter.consume(rank0[:end])
    assert meter.metrics() == rank_metrics(0, rank0)


def test_incremental_meter_reads_a_windowed_timeline() -> None:
    """A timeline that keeps only its latest events (a long run): the meter takes each new event once, by count."""
    rank0, _ = barrier_ranks()
    timeline = Timeline(max_events=3)
    meter = TimelineMeter(0)
    for event in rank0:
        timeline.events.append(event)
        timeline.recorded += 1
        meter.consume(timeline.events, timeline.recorded)
    assert len(timeline.events) == 3 < len(rank0) and meter.consumed == len(rank0)
    assert meter.metrics() == rank_metrics(0, rank0)


def test_chrome_trace_and_run_folder_read_back_to_the_same_figures(tmp_path: Path) -> None:
    rank0, rank1 = barrier_ranks()
    folder = tmp_path / "run"
    folder.mkdir()
    for rank, events in enumerate((rank0, rank1)):
        timeline = Timeline()
        timeline.origin_ns = 3 * MS * rank
        timeline.events = list(events)
        timeline.export_chrome_trace(folder / f"odin_timeline_rank{rank}.json")
        assert events_from_chrome_trace(timeline.chrome_trace()) == events, "each rank's origin is added back"
    (folder / "odin_counters_rank1.json").write_text(
        json.dumps({"bookkeeping_ns": 0, "validation_failures": {}, "stale_reads": []})
    )
    run, events = load_run(tmp_path)
    assert [r.rank for r in run.ranks] == [0, 1] and events == [rank0, rank1]
    assert run.ranks[0] == rank_metrics(0, rank0)
    assert run.ranks[1].bookkeeping_s == 0 and run.ranks[1].publish_s == pytest.approx(0.001)
    single, _ = load_run(folder / "odin_timeline_rank0.json")
    assert single.ranks == (rank_metrics(0, rank0),)
    with pytest.raises(FileNotFoundError, match="no odin_timeline"):
        load_run(tmp_path / "run" / "missing")


def test_odin_timeline_draws_a_png_of_every_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from odin_nerfstudio.core.timeline_cli import main

    for rank, events in enumerate(barrier_ranks()):
        timeline = Timeline()
        timeline.origin_ns = 0
        timeline.events = list(events)
        timeline.export_chrome_trace(tmp_path / f"odin_timeline_rank{rank}.json")
    main([str(tmp_path)])
    png = tmp_path / "odin_timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "4 views" in printed and "rank 0: idle 33%, exposed wait 33%" in printed and "rank 1" in printed
    main([str(tmp_path / "odin_timeline_rank0.json"), "--output", str(tmp_path / "zoom.png"), "--end", "0.03"])
    assert (tmp_path / "zoom.png").stat().st_size > 0


def test_step_balance_is_the_slowest_ranks_compute_over_the_mean_in_steps_every_rank_rendered() -> None:
    """Step 0: 30 ms against 10 ms (1.5); step 1: even (1.0, a re-run adds to its rank's time); step 2: one rank."""
    rank0 = [*task(0, 20, 10, step=0, view=0), *task(40, 5, 5, step=1, view=2), *task(60, 5, 5, step=2, view=4)]
    rank1 = [*task(0, 5, 5, step=0, view=1), *task(20, 4, 1, step=1, view=3), *task(30, 4, 1, step=1, view=3)]
    assert step_balance([rank0, rank1]) == pytest.approx((1.5 + 1.0) / 2)
    assert step_balance([rank0]) == 1.0
