"""Timeline of the runtime's events per task (render, backward, wait, comm, publish), exportable as a Chrome trace.

Each event is a span on one worker's track with the step, the view and, for waits, the primitives waited on. The
export is the Trace Event Format's JSON object (complete events, ``"ph": "X"``, microseconds), which Perfetto
and chrome://tracing open directly.

Memory stays flat over long runs: the timeline keeps the most recent ``max_events`` events (a 30k-iteration run
records millions), while the summed duration per event name covers every event ever recorded; the export says how
many older events were dropped.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Event:
    """One span: what happened, on which worker, for which step, from ``start_ns`` to ``end_ns``.

    Attributes:
        name: "render", "backward", "wait", "comm" or "publish".
        worker: the worker's track (-1 for runtime-wide events such as publish).
        step: the step the event belongs to.
        start_ns: ``time.perf_counter_ns()`` at the start.
        end_ns: ``time.perf_counter_ns()`` at the end.
        args: details (view, reason, waited primitives, rows published, ...).
    """

    name: str
    worker: int
    step: int
    start_ns: int
    end_ns: int
    args: dict[str, Any] = field(default_factory=dict)


def events_since(events: Sequence[Event], recorded: int, consumed: int) -> list[Event]:
    """The events of a timeline's window ``events`` (``recorded`` recorded in all) after the first ``consumed``,
    oldest first; those dropped from the window before they were taken are lost."""
    new = max(min(recorded - consumed, len(events)), 0)
    return list(itertools.islice(reversed(events), new))[::-1]


TASK_COST_EVENTS = ("render", "backward")
"""The spans that make a task's cost, wherever it ran: its render and its backward (re-balancing and placement
measure tasks by them)."""


class SpanCursor:
    """A consumer's place in a timeline's events: each take returns the spans of ``names`` recorded since the last
    one, each span once (those dropped from the window before they were taken are lost).

    Args:
        names: the spans taken (default: a task's cost, :data:`TASK_COST_EVENTS`).
    """

    def __init__(self, names: tuple[str, ...] = TASK_COST_EVENTS) -> None:
        self.names = names
        self.consumed = 0
        """How many of the timeline's recorded events have been taken."""

    def take(self, events: Sequence[Event], recorded: int) -> list[Event]:
        """The spans of ``names`` among a timeline's window ``events`` (``recorded`` recorded in all) not taken
        before, oldest first."""
        window = events_since(events, recorded, self.consumed)
        self.consumed = recorded
        return [event for event in window if event.name in self.names]


MAX_EVENTS = 200_000
"""Events a timeline keeps by default (about 60 MB; the last few thousand steps of a run)."""


class Timeline:
    """The most recent ``max_events`` recorded events, in the order they ended, and totals over all of them."""

    def __init__(self, max_events: int = MAX_EVENTS, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        if max_events < 1:
            raise ValueError(f"a timeline keeps at least one event, got max_events = {max_events}")
        self.events: deque[Event] = deque(maxlen=max_events)
        self.recorded = 0
        self._total_ns: dict[str, int] = defaultdict(int)
        self.now = clock
        """The clock events use, in nanoseconds: ``time.perf_counter_ns`` (a simulation passes its virtual clock)."""
        self.origin_ns = clock()
        self._lock = threading.Lock()

    def record(self, name: str, worker: int, step: int, start_ns: int, args: dict[str, Any] | None = None) -> Event:
        """Record a span that started at ``start_ns`` and ends now; returns it."""
        event = Event(name, worker, step, start_ns, self.now(), dict(args or {}))
        with self._lock:  # lanes record from their own threads
            self.events.append(event)
            self.recorded += 1
            self._total_ns[name] += event.end_ns - event.start_ns
        return event

    @property
    def dropped(self) -> int:
        """Events recorded but no longer kept (the oldest)."""
        return self.recorded - len(self.events)

    def total_ns(self, name: str) -> int:
        """Summed duration of every event called ``name`` ever recorded, dropped ones included."""
        return self._total_ns.get(name, 0)

    def chrome_trace(self) -> dict[str, Any]:
        """The kept events in Chrome's Trace Event Format (one track per worker, runtime events on track -1), their
        times from ``origin_ns``, which ``otherData`` keeps (processes of one host share the clock, so their traces
        align) with the count of dropped older events."""
        trace = [
            {
                "name": e.name,
                "cat": "odin",
                "ph": "X",
                "ts": (e.start_ns - self.origin_ns) / 1000.0,
                "dur": (e.end_ns - e.start_ns) / 1000.0,
                "pid": 0,
                "tid": e.worker,
                "args": {"step": e.step, **e.args},
            }
            for e in self.events
        ]
        other = {"origin_ns": self.origin_ns, "dropped_events": self.dropped}
        return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": other}

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write :meth:`chrome_trace` as JSON to ``path``."""
        path = Path(path)
        path.write_text(json.dumps(self.chrome_trace()))
        return path


class StepTotals:
    """Per step, the summed duration of a timeline's task-cost spans (:data:`TASK_COST_EVENTS`), each taken once:
    what a rank spent on a step's tasks, wherever they ran (its loop or a lane).

    Args:
        timeline: the spans' timeline.
    """

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self._cursor = SpanCursor()
        self._ns: dict[int, int] = defaultdict(int)

    def take(self, step: int) -> int:
        """The nanoseconds of step ``step``'s spans recorded so far, the step's and every earlier one's then
        forgotten (no span may be recording meanwhile; those dropped from the timeline's window are lost)."""
        for event in self._cursor.take(self.timeline.events, self.timeline.recorded):
            self._ns[event.step] += event.end_ns - event.start_ns
        for earlier in [s for s in self._ns if s < step]:
            del self._ns[earlier]
        return self._ns.pop(step, 0)
