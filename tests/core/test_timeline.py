"""The timeline keeps a bounded window of events (flat memory over long runs) and exact totals over all of them."""

from __future__ import annotations

import json
from pathlib import Path

from odin_nerfstudio.core.timeline import Timeline


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
