"""What a run's timeline says about its speed, measured as the Odin paper measures: throughput, the wait-free bound,
idle and exposed wait per rank, the barrier's wait a mode hides, conflict and fallback rates, stale reads.

Why here: the same definitions serve the trainer's live ``odin/*`` scalars, the ``odin-timeline`` command and
bench_train, so a figure means one thing wherever it is read. Input: per rank (one process, one trace file), its
timeline's events (:class:`~odin_nerfstudio.core.timeline.Event`: render, backward, wait with its reason, comm,
publish) in the order they were recorded, and from the runtime's counters what the timeline does not hold: the
bookkeeping time and the stale reads.

Definitions (per rank r; a rank's W virtual workers, when one process holds several, are one rank):

- span_r: from its first render's start to its last event's end.
- compute_r: render + backward + bookkeeping (the runtime's hooks: culling, checks, gathers, staging, validation,
  publication; the counters' ``bookkeeping_ns``, else the publish spans as a lower bound).
- idle share_r = 1 - compute_r / span_r.
- exposed wait_r: the time inside r's wait spans (a worker that could not read, for any reason) during which r
  computed nothing (no render, backward or publish span, on any of its threads): the wait on r's critical path.
  Waits of several virtual workers count once where they overlap; so do compute spans of several threads (a lane
  renders while the loop waits for an exchange, and its render may end after that wait is recorded). A block the
  driver does not record as a wait (it records waits that end in a read) is idle, not exposed wait.
- views: distinct tasks (worker, step, view) rendered; tasks rendered again are re-runs.
- throughput = views over the longest span; wait-free bound = views / max_r compute_r (no rank ever waiting, the
  slowest rank's compute alone); bound share = throughput / bound.
- hidden wait of a mode against barrier (:meth:`RunMetrics.hidden_wait`): 1 - its exposed wait per view / the
  barrier's, the share of the barrier's critical-path wait the mode removes (the paper's 82%).
- conflict rate: conflicting tasks per task. A task conflicts when its read met an earlier step's pending write:
  its worker waited on it (a "raw" wait, counted once however often the read was re-polled; read behind, a row
  of its C(t) written by the step before: the counters' ``behind_conflicts``), read past it (an admitted stale
  read), or missed it ("stale" or "candidate" validation failure). A throughput-first read admitted
  stale and re-run after validation counts twice (at most the stale reads not kept).
- fallback rate: re-runs per task.
- stale reads: admitted, kept (reached the model), and their staleness (steps), max and mean.
- step balance (:func:`step_balance`, over the ranks): per step that every rank rendered in, max_r / mean_r of r's
  render + backward time in it (re-runs included), averaged over those steps; how much longer a barrier step's
  slowest rank computes than the average one (1.0: even), as the schedule's balance says it by predicted costs.

Events must come in recording order (each is recorded when it ends). :class:`TimelineMeter` consumes events
incrementally (O(log n) each where spans are recorded near the present), so a trainer can log these figures live at
any step.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from odin_nerfstudio.core.timeline import TASK_COST_EVENTS, Event, events_since

COMPUTE_EVENTS = ("render", "backward", "publish")
"""Spans during which a process computes (a wait overlapping them is not exposed)."""
CONFLICT_FAILURES = ("stale", "candidate")
"""Validation failures that mean a read missed an earlier step's write."""


@dataclass(frozen=True)
class StaleReadSummary:
    """Stale reads of a rank: admitted, kept (reached the model), summed and largest staleness (steps)."""

    admitted: int = 0
    kept: int = 0
    staleness_sum: int = 0
    max_staleness: int = 0

    @classmethod
    def of_counters(cls, counters: Mapping[str, Any] | Any) -> StaleReadSummary:
        """From a runtime's counters (or their JSON dict): their tally of every stale read, else their records; a
        sharded run's counters count them (each one step stale, those re-run not kept)."""
        tally = _field(counters, "stale", None)
        reads = _field(counters, "stale_reads")
        if tally is None and isinstance(reads, int):
            return cls(reads, reads - _field(counters, "reruns", 0), reads, int(reads > 0))
        if tally is None:
            return cls.of(reads)
        return cls(*(_field(tally, name) for name in ("admitted", "kept", "staleness_sum", "max_staleness")))

    @classmethod
    def of(cls, reads: Sequence[Any]) -> StaleReadSummary:
        """From the counters' stale reads (``StaleRead`` objects or their dicts: ``staleness``, ``kept``)."""
        values = [(_field(r, "staleness"), bool(_field(r, "kept"))) for r in reads]
        return cls(
            admitted=len(values),
            kept=sum(kept for _, kept in values),
            staleness_sum=sum(s for s, _ in values),
            max_staleness=max((s for s, _ in values), default=0),
        )


_REQUIRED = object()


def _field(record: Any, name: str, default: Any = _REQUIRED) -> Any:
    """``record[name]`` of a dict or ``record.name`` of an object; ``default`` where it has no such field, if given
    (counters written before the field existed)."""
    if default is _REQUIRED:
        return record[name] if isinstance(record, Mapping) else getattr(record, name)
    return record.get(name, default) if isinstance(record, Mapping) else getattr(record, name, default)


@dataclass(frozen=True)
class RankMetrics:
    """One rank's figures (seconds, counts); see the module for the definitions."""

    rank: int
    views: int
    renders: int
    span_s: float
    render_s: float
    backward_s: float
    bookkeeping_s: float
    publish_s: float
    comm_s: float
    exposed_wait_s: float
    waits: dict[str, int]
    conflicts: int
    stale: StaleReadSummary = field(default_factory=StaleReadSummary)

    @property
    def compute_s(self) -> float:
        """Render + backward + bookkeeping."""
        return self.render_s + self.backward_s + self.bookkeeping_s

    @property
    def reruns(self) -> int:
        """Tasks rendered again after a validation failure."""
        return self.renders - self.views

    @property
    def idle_share(self) -> float:
        """Share of the span outside compute."""
        return max(0.0, 1.0 - self.compute_s / self.span_s) if self.span_s > 0 else 0.0

    @property
    def exposed_wait_share(self) -> float:
        """Share of the span in exposed wait."""
        return self.exposed_wait_s / self.span_s if self.span_s > 0 else 0.0


@dataclass(frozen=True)
class RunMetrics:
    """A run's figures over its ranks; see the module for the definitions."""

    ranks: tuple[RankMetrics, ...]

    @property
    def views(self) -> int:
        """Distinct tasks trained over every rank."""
        return sum(r.views for r in self.ranks)

    @property
    def span_s(self) -> float:
        """The longest rank's span."""
        return max((r.span_s for r in self.ranks), default=0.0)

    @property
    def views_per_s(self) -> float:
        """Throughput: views over the longest span."""
        return self.views / self.span_s if self.span_s > 0 else 0.0

    @property
    def wait_free_views_per_s(self) -> float:
        """Views over the largest per-rank compute: the throughput if no rank ever waited."""
        slowest = max((r.compute_s for r in self.ranks), default=0.0)
        return self.views / slowest if slowest > 0 else 0.0

    @property
    def bound_share(self) -> float:
        """Throughput as a share of the wait-free bound."""
        bound = self.wait_free_views_per_s
        return self.views_per_s / bound if bound > 0 else 0.0

    @property
    def exposed_wait_s(self) -> float:
        """Exposed wait summed over ranks."""
        return sum(r.exposed_wait_s for r in self.ranks)

    @property
    def exposed_wait_per_view_s(self) -> float:
        """Exposed wait over every rank per view trained (comparable between runs of different lengths)."""
        return self.exposed_wait_s / self.views if self.views else 0.0

    @property
    def conflict_rate(self) -> float:
        """Conflicting tasks per task."""
        return sum(r.conflicts for r in self.ranks) / self.views if self.views else 0.0

    @property
    def fallback_rate(self) -> float:
        """Re-runs per task."""
        return sum(r.reruns for r in self.ranks) / self.views if self.views else 0.0

    @property
    def stale(self) -> StaleReadSummary:
        """Stale reads over every rank."""
        parts = [r.stale for r in self.ranks]
        return StaleReadSummary(
            admitted=sum(p.admitted for p in parts),
            kept=sum(p.kept for p in parts),
            staleness_sum=sum(p.staleness_sum for p in parts),
            max_staleness=max((p.max_staleness for p in parts), default=0),
        )

    def hidden_wait(self, barrier: RunMetrics) -> float | None:
        """Share of ``barrier``'s exposed wait (per view) this run removes; None if the barrier exposed none."""
        reference = barrier.exposed_wait_per_view_s
        return 1.0 - self.exposed_wait_per_view_s / reference if reference > 0 else None


class SpanUnion:
    """The union of spans [start, end) added in any order, as sorted disjoint runs: how much of a span it covers, and
    which parts of a span added are new (spans are added near the latest ones, so each costs O(log n) there)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def add(self, start: int, end: int) -> list[tuple[int, int]]:
        """Add [start, end); returns its parts not covered before."""
        first = bisect.bisect_left(self._ends, start)  # the runs that meet or touch it: first .. last - 1
        last = bisect.bisect_right(self._starts, end)
        fresh, cursor = [], start
        for low, high in zip(self._starts[first:last], self._ends[first:last]):
            if low > cursor:
                fresh.append((cursor, low))
            cursor = max(cursor, high)
        if cursor < end:
            fresh.append((cursor, end))
        if first < last:
            start, end = min(start, self._starts[first]), max(end, self._ends[last - 1])
        self._starts[first:last] = [start]
        self._ends[first:last] = [end]
        return fresh

    def covered(self, start: int, end: int) -> int:
        """How much of [start, end) the union covers."""
        total = 0
        for run in range(bisect.bisect_right(self._ends, start), len(self._starts)):
            low, high = self._starts[run], self._ends[run]
            if low >= end:
                break
            total += min(high, end) - max(low, start)
        return total


class TimelineMeter:
    """One rank's figures, fed its timeline's events as they are recorded (each event once, in recording order)."""

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self.consumed = 0
        self._tasks: set[tuple[int, int, int]] = set()
        self._renders = 0
        self._totals = dict.fromkeys(("render", "backward", "publish", "comm"), 0)
        self._first_ns: int | None = None
        self._last_ns: int | None = None
        self._waits: dict[str, int] = {}
        self._waiting = SpanUnion()
        self._busy = SpanUnion()
        self._exposed_ns = 0  # |waiting| - |waiting and busy|, kept as either union grows

    def consume(self, events: Sequence[Event], recorded: int | None = None) -> None:
        """Take the events of ``events`` not yet consumed: a timeline's events, passed again and again as they grow.

        Args:
            events: the latest events, oldest first (a timeline may keep only a window of them).
            recorded: how many events the timeline has recorded in all (``Timeline.recorded``; default
                ``len(events)``): the last ``recorded - consumed`` of ``events`` are new. Events dropped from the
                window before they were consumed are not counted.
        """
        recorded = len(events) if recorded is None else recorded
        for event in events_since(events, recorded, self.consumed):
            self._take(event)
        self.consumed = recorded

    def _take(self, event: Event) -> None:
        duration = event.end_ns - event.start_ns
        if event.name == "render":
            self._renders += 1
            self._tasks.add((event.worker, event.step, int(event.args.get("view", -1))))
            self._first_ns = event.start_ns if self._first_ns is None else min(self._first_ns, event.start_ns)
        if event.name in self._totals:
            self._totals[event.name] += duration
        if event.name in COMPUTE_EVENTS:
            # A compute span recorded after a wait it overlaps (another thread's) un-exposes that part of the wait.
            for start, end in self._busy.add(event.start_ns, event.end_ns):
                self._exposed_ns -= self._waiting.covered(start, end)
        if event.name == "wait":
            reason = str(event.args.get("reason", "unknown"))
            self._waits[reason] = self._waits.get(reason, 0) + 1
            for start, end in self._waiting.add(event.start_ns, event.end_ns):
                self._exposed_ns += end - start - self._busy.covered(start, end)
        self._last_ns = event.end_ns if self._last_ns is None else max(self._last_ns, event.end_ns)

    def metrics(self, counters: Mapping[str, Any] | Any | None = None) -> RankMetrics:
        """The figures so far; ``counters`` (the runtime's counters, or their JSON dict) add the bookkeeping time,
        the stale reads and the validation failures that the timeline does not hold."""
        totals = self._totals
        span = (self._last_ns - self._first_ns) if self._first_ns is not None and self._last_ns is not None else 0
        # A sharded run's counters hold neither the bookkeeping time nor validation failures (its owners judge).
        publish_ns = totals["publish"]
        bookkeeping_ns = publish_ns if counters is None else _field(counters, "bookkeeping_ns", publish_ns)
        stale = StaleReadSummary() if counters is None else StaleReadSummary.of_counters(counters)
        failures = {} if counters is None else _field(counters, "validation_failures", {})
        conflicts = self._waits.get("raw", 0) + stale.admitted + sum(failures.get(k, 0) for k in CONFLICT_FAILURES)
        if counters is not None:
            conflicts += _field(counters, "behind_conflicts", 0)
        return RankMetrics(
            rank=self.rank,
            views=len(self._tasks),
            renders=self._renders,
            span_s=span / 1e9,
            render_s=totals["render"] / 1e9,
            backward_s=totals["backward"] / 1e9,
            bookkeeping_s=bookkeeping_ns / 1e9,
            publish_s=totals["publish"] / 1e9,
            comm_s=totals["comm"] / 1e9,
            exposed_wait_s=self._exposed_ns / 1e9,
            waits=dict(self._waits),
            conflicts=conflicts,
            stale=stale,
        )


def rank_metrics(rank: int, events: Sequence[Event], counters: Mapping[str, Any] | Any | None = None) -> RankMetrics:
    """One rank's figures from all of its events (in recording order) and, optionally, its counters."""
    meter = TimelineMeter(rank)
    meter.consume(events)
    return meter.metrics(counters)


def events_from_chrome_trace(trace: Mapping[str, Any]) -> list[Event]:
    """The events of a Chrome trace written by :meth:`Timeline.chrome_trace` (microseconds back to nanoseconds of
    the clock, from the trace's ``origin_ns`` when it has one), in recording order (by end, ties in file order)."""
    origin = int(trace.get("otherData", {}).get("origin_ns", 0))
    events = []
    for entry in trace["traceEvents"]:
        if entry.get("ph") != "X":
            continue
        args = dict(entry.get("args", {}))
        step = int(args.pop("step", -1))
        start = origin + round(entry["ts"] * 1000)
        events.append(Event(entry["name"], int(entry["tid"]), step, start, start + round(entry["dur"] * 1000), args))
    return sorted(events, key=lambda e: e.end_ns)


@dataclass(frozen=True)
class RankFiles:
    """One rank's files in a run folder: its Chrome trace and, when written, its counters."""

    rank: int
    trace: Path
    counters: Path | None


def rank_files(path: Path) -> list[RankFiles]:
    """The ranks' trace files of a run folder (``odin_timeline.json`` or ``odin_timeline_rank<r>.json``, searched
    below ``path``), or the one trace ``path`` names; their counters (``odin_counters...``) beside them."""
    path = Path(path)
    if path.is_file():
        traces = [path]
    else:
        traces = sorted(path.rglob("odin_timeline_rank*.json")) or sorted(path.rglob("odin_timeline.json"))
    if not traces:
        raise FileNotFoundError(f"no odin_timeline.json or odin_timeline_rank<r>.json under {path}")
    files = []
    for index, trace in enumerate(traces):
        stem = trace.stem
        rank = int(stem.rsplit("rank", 1)[1]) if "_rank" in stem else index
        counters = trace.with_name(trace.name.replace("odin_timeline", "odin_counters"))
        files.append(RankFiles(rank, trace, counters if counters.exists() else None))
    return sorted(files, key=lambda f: f.rank)


def load_run(path: Path) -> tuple[RunMetrics, list[list[Event]]]:
    """A run's figures and every rank's events, from its folder or one trace file (see :func:`rank_files`)."""
    ranks, events = [], []
    for files in rank_files(path):
        rank_events = events_from_chrome_trace(json.loads(files.trace.read_text()))
        counters = json.loads(files.counters.read_text()) if files.counters else None
        ranks.append(rank_metrics(files.rank, rank_events, counters))
        events.append(rank_events)
    return RunMetrics(tuple(ranks)), events


def step_balance(events: Sequence[Sequence[Event]]) -> float:
    """The measured step balance (see the module) of every rank's ``events``; nan where no step has every rank's."""
    per_rank = []
    for rank_events in events:
        compute: dict[int, int] = defaultdict(int)
        for event in rank_events:
            if event.name in TASK_COST_EVENTS:
                compute[event.step] += event.end_ns - event.start_ns
        per_rank.append(compute)
    shared = set.intersection(*(set(compute) for compute in per_rank)) if per_rank else set()
    ratios = []
    for step in shared:
        times = [compute[step] for compute in per_rank]
        ratios.append(max(times) * len(times) / sum(times))
    return sum(ratios) / len(ratios) if ratios else float("nan")


def live_scalars(metrics: RankMetrics) -> dict[str, float]:
    """A rank's figures as the trainer's ``odin/*`` scalars (this rank's view; shares of its own span)."""
    run = RunMetrics((metrics,))
    return {
        "odin/views_per_s": run.views_per_s,
        "odin/wait_free_bound_share": run.bound_share,
        "odin/idle_share": metrics.idle_share,
        "odin/exposed_wait_share": metrics.exposed_wait_share,
        "odin/conflict_rate": run.conflict_rate,
        "odin/fallback_rate": run.fallback_rate,
        "odin/stale_reads_kept": float(metrics.stale.kept),
        "odin/max_staleness": float(metrics.stale.max_staleness),
    }
