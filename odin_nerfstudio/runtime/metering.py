"""Metering: what the runtime counts, the time its hooks cost, and the timeline of every worker's spans.

:class:`Meter` owns the counters, the timeline, the open waits per worker and the bookkeeping clock; the other
parts report to it. Odin's own cost (``bookkeeping_ns``) is kept apart from the renderer's work and from
communication, so the benchmarks can show it stays small; ``bookkeeping_cpu_ns`` is the same spans' CPU time on their
thread, which tells the hooks' own work from the time a shared CPU takes them off it. See ``docs/architecture.md``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.core.timeline import Timeline
from odin_nerfstudio.runtime.reads import Read, RenderFn, StaleRead, Wait

_MAX_LOGGED_ROWS = 64
_Hook = TypeVar("_Hook", bound=Callable[..., Any])
_Result = TypeVar("_Result")


RECENT_STALE_READS = 1024
"""How many of the latest stale reads the counters keep as records (``RuntimeCounters.stale`` counts them all)."""


@dataclass
class StaleTally:
    """Every admitted stale read of a run, counted in constant memory: admitted, kept (reached the model), summed
    and largest staleness (steps)."""

    admitted: int = 0
    kept: int = 0
    staleness_sum: int = 0
    max_staleness: int = 0

    def admit(self, read: StaleRead) -> None:
        """Count an admitted stale read (kept already if its mode never re-runs it)."""
        self.admitted += 1
        self.kept += int(read.kept)
        self.staleness_sum += read.staleness
        self.max_staleness = max(self.max_staleness, read.staleness)


@dataclass(frozen=True)
class Decision:
    """One decision of the protocol, as the runtime and the simulator both take it (the decision trace).

    Attributes:
        kind: ``read`` (detail: view, read before the step before was published), ``wait`` (a worker's wait
            begins; detail: view, reason, step waited for), ``rerun`` (detail: view), ``commit`` (detail: early),
            ``publish_first`` or ``publish`` (worker -1); the sharded simulation's traces add ``exchange`` and
            ``render`` (``simulation/sharded.py``).
        step: the step decided on.
        worker: the worker, -1 for a publication.
        detail: what else the kind names.
    """

    kind: str
    step: int
    worker: int
    detail: Any = None


@dataclass
class RuntimeCounters:
    """What the runtime counted.

    Attributes:
        tasks: tasks run, re-runs included.
        waits: Wait answers per reason.
        validation_failures: failures per kind ("stale", "candidate", "escape").
        reruns: tasks re-run on fresh state after a validation failure.
        reordered: reads where dynamic ordering ran a later task of the worker's step first.
        overlapped_reads: reads admitted while the step before theirs was unpublished (the overlap Odin exists for;
            never in barrier mode).
        ran_ahead: reads of a task of the worker's next step while its current step's tasks waited
            (``drivers/step_loop.py``'s running ahead).
        read_behind: steps whose reads waited for the step before to be published before trying
            (``drivers/step_loop.py``'s reading behind, after a streak of conflicts).
        behind_conflicts: reads behind whose C(t) holds a row the step before wrote (read earlier, they would have
            waited on a RAW conflict).
        stale_reads: the latest admitted stale reads (at most about 2 x RECENT_STALE_READS, so a long run's memory
            stays flat), also those of a read later re-run (``kept`` False).
        stale: every admitted stale read, counted (:class:`StaleTally`).
        publications: steps published.
        first_publications: steps whose first part (the rows the next tasks asked for) was published ahead of
            the rest (priority publication).
        early_reads: reads that read rows of such a first part while the rest of its step was unpublished.
        early_commits: worker steps committed (validated and sent) while the step before was published only in its
            first part: two of the worker's exchanges were in flight.
        most_in_flight: the most tasks read and not yet staged at once (``tasks_in_flight`` lanes: up to that many).
        gathers_beside_publication: gathers a lane ran while this process published (the seqlocks were live).
        locked_rereads: rows a gather found held by a publication and read again once it was released.
        bookkeeping_ns: wall time spent in the hooks (before_read, read_next, after_backward, progress,
            publish), the outermost call only, less the render and backward of the re-runs they execute and
            less their time in the transport (``comm_ns``).
        bookkeeping_cpu_ns: the CPU time of the same spans on their thread (``time.thread_time_ns``), less that of
            the same re-runs and transport calls: the hooks' own work. Wall time above it is time the thread was
            off the CPU (other processes, the exchange's progress thread) or, on CUDA, waited for the device.
        projections: views whose writes :class:`~odin_nerfstudio.runtime.culling_index.RemoteTasks` projected
            (a view another process runs, or this one's own not rendered here yet: once per view and run).
        projection_cpu_ns: the CPU time of those projections, part of ``bookkeeping_cpu_ns``: a cost per view and
            run, where the rest of the hooks' time is per task.
        render_ns: wall time in ``render_fn``, re-runs included.
        backward_ns: wall time in ``loss.backward()``, re-runs included.
        comm_ns: wall time inside the transport's calls (``start_exchange``, a handle's ``done`` and ``wait``),
            from the hooks and from ``OdinRuntime.await_publication``: communication and waiting for the other
            workers, not Odin's bookkeeping.
    """

    tasks: int = 0
    waits: dict[str, int] = field(default_factory=dict)
    validation_failures: dict[str, int] = field(default_factory=dict)
    reruns: int = 0
    reordered: int = 0
    overlapped_reads: int = 0
    ran_ahead: int = 0
    read_behind: int = 0
    behind_conflicts: int = 0
    stale_reads: list[StaleRead] = field(default_factory=list)
    stale: StaleTally = field(default_factory=StaleTally)
    publications: int = 0
    first_publications: int = 0
    early_reads: int = 0
    early_commits: int = 0
    most_in_flight: int = 0
    gathers_beside_publication: int = 0
    locked_rereads: int = 0
    bookkeeping_ns: int = 0
    bookkeeping_cpu_ns: int = 0
    projections: int = 0
    projection_cpu_ns: int = 0
    render_ns: int = 0
    backward_ns: int = 0
    comm_ns: int = 0

    @property
    def stale_reads_kept(self) -> int:
        """Admitted stale reads that reached the model (not superseded by a re-run of their task)."""
        return self.stale.kept

    def count_stale(self, read: StaleRead) -> None:
        """Count an admitted stale read and keep its record among the latest ones."""
        self.stale.admit(read)
        self.stale_reads.append(read)
        if len(self.stale_reads) > 2 * RECENT_STALE_READS:
            del self.stale_reads[:RECENT_STALE_READS]


class Meter:
    """Counters, timeline and clocks of one runtime.

    Thread-safe where lanes (``lanes.py``) report: spans and their totals, and the clocks of a hook, which are per
    thread (a hook on the driver's thread subtracts only the renders and transport calls it ran itself, not those
    of lanes beside it).

    Args:
        device: the model's device (spans on CUDA wait for the current stream before their clock stops).
        clock: the timeline's clock in ns (default ``time.perf_counter_ns``; the simulator's is virtual).
        record_decisions: keep the decision trace (:attr:`decisions`), as the decision-trace test compares it.
    """

    def __init__(
        self, device: torch.device, clock: Callable[[], int] | None = None, record_decisions: bool = False
    ) -> None:
        self.device = device
        self.counters = RuntimeCounters()
        self.decisions: list[Decision] | None = [] if record_decisions else None
        """With ``record_decisions``, every decision of the protocol in the order taken (:class:`Decision`)."""
        self.timeline = Timeline() if clock is None else Timeline(clock=clock)
        self.lock = threading.Lock()
        """Guards the counters that lanes add to (render, backward, bookkeeping time, tasks)."""
        self._wait_since: dict[int, tuple[int, Wait]] = {}
        self._thread = threading.local()

    def add(self, **amounts: int) -> None:
        """Add to counters (``render_ns=...``) from any thread; render, backward and transport time also go on this
        thread's clock of time that is not bookkeeping (:func:`bookkeeping` leaves it out of a hook)."""
        with self.lock:
            for name, amount in amounts.items():
                setattr(self.counters, name, getattr(self.counters, name) + amount)
        elsewhere = sum(amounts.get(name, 0) for name in ("render_ns", "backward_ns", "comm_ns"))
        self._thread.elsewhere = self._elsewhere() + elsewhere

    def _elsewhere(self) -> int:
        """This thread's time in renders, backwards and transport calls so far (what a hook leaves out)."""
        return getattr(self._thread, "elsewhere", 0)

    def _elsewhere_cpu(self) -> int:
        """This thread's CPU time in renders, backwards and transport calls so far (what a hook leaves out)."""
        return getattr(self._thread, "elsewhere_cpu", 0)

    def _off_hook_cpu(self, since_ns: int) -> None:
        """Put this thread's CPU time since ``since_ns`` (``time.thread_time_ns``) on its clock of CPU time that is
        not bookkeeping (a render, a backward, a transport call)."""
        self._thread.elsewhere_cpu = self._elsewhere_cpu() + time.thread_time_ns() - since_ns

    def count_wait(self, wait: Wait) -> Wait:
        """Count a Wait answer by its reason."""
        self.counters.waits[wait.reason] = self.counters.waits.get(wait.reason, 0) + 1
        return wait

    def count_failures(self, failures: Sequence[str]) -> None:
        """Count a task's validation failures by kind."""
        for kind in failures:
            self.counters.validation_failures[kind] = self.counters.validation_failures.get(kind, 0) + 1

    def decide(self, kind: str, step: int, worker: int = -1, detail: Any = None) -> None:
        """Record a decision of the protocol (``read``, ``wait``, ``rerun``, ``commit``, ``publish_first``,
        ``publish``) when the trace is kept."""
        if self.decisions is not None:
            self.decisions.append(Decision(kind, step, worker, detail))

    def waiting(self, worker: int, wait: Wait) -> None:
        """``worker`` could not read (a wait begins, unless one is already open)."""
        if worker not in self._wait_since:
            self._wait_since[worker] = (self.timeline.now(), wait)
            self.decide("wait", wait.task.step, worker, (wait.task.view, wait.reason, wait.step))

    def read(self, task: Task, reordered: bool, overlapped: bool = False) -> None:
        """``task`` was admitted: close its worker's open wait on the timeline (with its reason and the
        primitives waited on), count a read that dynamic ordering took out of task order and one that read while
        the step before its own was unpublished."""
        if task.worker in self._wait_since:
            since, wait = self._wait_since.pop(task.worker)
            args = {
                "reason": wait.reason,
                "on_step": wait.step,
                "primitives": wait.rows.numel(),
                "primitive_ids": wait.rows[:_MAX_LOGGED_ROWS].tolist(),
            }
            self.timeline.record("wait", task.worker, task.step, since, args)
        self.counters.reordered += reordered
        self.counters.overlapped_reads += overlapped
        self.decide("read", task.step, task.worker, (task.view, overlapped))

    def render_and_backward(
        self,
        render_fn: RenderFn,
        read: Read,
        before_backward: Callable[[dict[str, Any]], None] | None,
        between: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Render an admitted read with ``render_fn``, call ``before_backward(info)`` if given, then ``between()``
        outside both spans, back-propagate; both spans go on the timeline (with |C(t)| and the image's pixels, what a
        task's cost grows with: the simulator's cost model is fitted on them) and into ``render_ns`` /
        ``backward_ns``. Returns the render's info."""
        task = read.task
        size = {"candidates": read.candidate.numel(), "pixels": task.camera.width * task.camera.height}
        start, cpu = self.timeline.now(), time.thread_time_ns()
        loss, info = render_fn(task, read.leaves, read.generator)
        if before_backward is not None:
            before_backward(info)
        self.add(render_ns=self._span("render", task, start, size))
        self._off_hook_cpu(cpu)
        if between is not None:
            between()
        start, cpu = self.timeline.now(), time.thread_time_ns()
        loss.backward()
        self.add(backward_ns=self._span("backward", task, start, size), tasks=1)
        self._off_hook_cpu(cpu)
        return info

    def _span(self, name: str, task: Task, start_ns: int, size: dict[str, int]) -> int:
        """Record ``name`` of ``task`` since ``start_ns`` once the device is done; returns its length in ns."""
        synchronize(self.device)
        event = self.timeline.record(name, task.worker, task.step, start_ns, {"view": task.view, **size})
        return event.end_ns - event.start_ns

    def in_transport(self, call: Callable[..., _Result], *args: Any) -> _Result:
        """``call(*args)``, a transport call, its wall time counted in ``counters.comm_ns``: sending and waiting
        for the other workers is communication, which the hooks' bookkeeping time leaves out."""
        start, cpu = self.timeline.now(), time.thread_time_ns()
        try:
            return call(*args)
        finally:
            self.add(comm_ns=self.timeline.now() - start)
            self._off_hook_cpu(cpu)


def bookkeeping(hook: _Hook) -> _Hook:
    """Time a runtime hook into ``meter.counters.bookkeeping_ns``: Odin's own cost per step, which must stay small.

    Only the outermost hook call of a thread is timed (after_backward -> progress -> publish and read_next ->
    before_read count once; a lane's gather on its own thread counts apart), and the render and backward time of
    re-runs executed inside it is subtracted, as is its time in the transport (``comm_ns``: sending, and waiting for
    the other workers), so the counter holds the runtime's culling, conflict checks, gathers, staging, validation
    and publications, never the renderer's work nor communication. ``bookkeeping_cpu_ns`` gets the same span's CPU
    time on this thread, less the same parts'. On CUDA the hook's kernels queued on the current stream are waited
    for before the clock stops (the hooks synchronize anyway: ``nonzero``, ``unique``), so they are not billed to
    the next render.
    """

    @functools.wraps(hook)
    def timed(runtime: Any, *args: Any, **kwargs: Any) -> Any:
        meter: Meter = runtime.meter
        local = meter._thread
        if getattr(local, "in_hook", False):
            return hook(runtime, *args, **kwargs)
        local.in_hook = True
        others, others_cpu = meter._elsewhere(), meter._elsewhere_cpu()
        start, cpu = meter.timeline.now(), time.thread_time_ns()
        try:
            return hook(runtime, *args, **kwargs)
        finally:
            synchronize(meter.device)
            elapsed, elapsed_cpu = meter.timeline.now() - start, time.thread_time_ns() - cpu
            meter.add(
                bookkeeping_ns=elapsed - (meter._elsewhere() - others),
                bookkeeping_cpu_ns=elapsed_cpu - (meter._elsewhere_cpu() - others_cpu),
            )
            local.in_hook = False

    return timed  # type: ignore[return-value]


def synchronize(device: torch.device) -> None:
    """Wait for the kernels queued on the device's current stream, so that spans time the work, not its launch.

    Only the current stream: an asynchronous exchange in flight on a communication stream (NCCL) is not waited
    for, so it still overlaps with the next task.
    """
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
