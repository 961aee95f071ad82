"""Timeline of the runtime's events per task (render, backward, wait, comm, publish), exportable as a Chrome trace.

Each event is a span on one worker's track with the step, the view and, for waits, the primitives waited on. The
export is the Trace Event Format's JSON object (complete events, ``"ph": "X"``, microseconds), which Perfetto
and chrome://tracing open directly.
"""

from __future__ import annotations

import json
import time
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


class Timeline:
    """Recorded events, in the order they ended."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.origin_ns = time.perf_counter_ns()

    @staticmethod
    def now() -> int:
        """The clock events use, in nanoseconds."""
        return time.perf_counter_ns()

    def record(self, name: str, worker: int, step: int, start_ns: int, args: dict[str, Any] | None = None) -> Event:
        """Record a span that started at ``start_ns`` and ends now; returns it."""
        event = Event(name, worker, step, start_ns, self.now(), dict(args or {}))
        self.events.append(event)
        return event

    def total_ns(self, name: str) -> int:
        """Summed duration of the events called ``name``."""
        return sum(e.end_ns - e.start_ns for e in self.events if e.name == name)

    def chrome_trace(self) -> dict[str, Any]:
        """The events in Chrome's Trace Event Format (one track per worker, runtime events on track -1), their times
        from ``origin_ns``, which ``otherData`` keeps (processes of one host share the clock, so their traces align)."""
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
        return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": {"origin_ns": self.origin_ns}}

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write :meth:`chrome_trace` as JSON to ``path``."""
        path = Path(path)
        path.write_text(json.dumps(self.chrome_trace()))
        return path
