"""The timeline keeps a bounded window of events (flat memory over long runs) and exact totals over all of them;
``StepTotals`` sums a step's task-cost spans once each, wherever they were recorded."""

from __future__ import annotations

import json
from pathlib import Path

from odin_nerfstudio.core.timeline import StepTotals, Timeline


def test_the_window_is_bounded_and_totals_cover_every_event(tmp_path: Path) -> None:
    timeline = Timeline(max_events=100)
    total = 0
    for step in range(10_000):
        event = timeline.record("render", 0, step, timeline.now() - 1000)
        total += event.end_ns - event.start_ns
    assert len(timeline.events) == 100 and timeline.dropped == 9_900
    assert timeline.events[0].step == 9_900, "the most recent events are kept"
    assert timeline.total_ns("render") == total and timeline.total_ns("wait") == 0
    trace = json.loads(timeline.export_chrome_trace(tmp_path / "trace.json").read_text())
    assert len(trace["traceEvents"]) == 100 and trace["otherData"]["dropped_events"] == 9_900


def test_step_totals_take_each_steps_spans_once() -> None:
    """Renders of steps 0 and 1 (step 1's run ahead before step 0 was taken), a wait that does not count: step 0
    gets its own spans, step 1's wait until it is taken, and a step taken is forgotten with every earlier one."""
    now = [0]
    timeline = Timeline(clock=lambda: now[0])
    totals = StepTotals(timeline)
    for step, name, length in ((0, "render", 5), (1, "render", 7), (0, "backward", 3), (0, "wait", 100)):
        start = now[0]
        now[0] += length
        timeline.record(name, 0, step, start)
    assert totals.take(0) == 8
    timeline.record("render", 0, 1, now[0] - 2)
    timeline.record("render", 0, 0, now[0] - 50)  # a late span of a step already taken: dropped
    assert totals.take(1) == 9 and totals.take(1) == 0 and totals.take(0) == 0
