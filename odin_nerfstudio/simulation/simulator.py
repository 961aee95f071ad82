"""A discrete-event simulation of Odin's runtime on W workers: the step loop, admission and exchange of a real run,
with task costs from a fitted model instead of rendering.

Why: users run Odin on 8-64 GPUs; this machine has two cores. The simulator replays a scene's schedule
(:class:`~odin_nerfstudio.simulation.workload.Workload`) through the rules the runtime applies, so the figures it
predicts (views/s, idle share, exposed and hidden wait) come from the same decisions:

- processes: each holds ``workers_per_process`` consecutive workers (1: one rank per worker, as ``torchrun``; W:
  virtual workers sharing one process and its one thread) and runs ``drivers/step_loop.run_step`` per step: the
  overlap-window gate (``read_after``), workers taking turns, a worker reading the first of its remaining tasks
  that may read (dynamic ordering), and, when no local worker can, a block on the next publication;
- admission: the mode's real policy (``runtime/admission.POLICIES``) decides the ring and barrier gates; RAW is
  ``core/conflicts.raw`` of C(t) against the unpublished steps' writes as the process sees them: its own staged
  tasks' active sets, and the other processes' tasks' predicted writes (``remote_writes``: the rows they would
  draw, what ``RemoteTasks`` predicts today with an escape check, or their candidate sets, without one). Throughput-first admits a read
  past conflicts within the policy's ``stale_fraction`` and ``max_staleness`` when every conflicting row is its own
  staged write (its gradient-size test cannot be replayed without gradients: assumed to pass); a row another
  process is predicted to write waits, as the policy does (its producer's gradient is unknown there);
- exchange: a worker commits step s once its tasks of s are staged and step ``s - exchanges_in_flight`` is
  published (today 1: ``ExchangeBook.ready``), in a ``progress`` call; the step is delivered when the
  :class:`~odin_nerfstudio.simulation.interconnect.Interconnect` says, and each process publishes it (a cost on
  its own thread) at its next ``progress`` after that, in step order;
- costs (:class:`~odin_nerfstudio.simulation.costs.CostModel`): a task's render + backward + bookkeeping from its
  |C(t)| and pixels (plus the measured share of escape re-runs, in the modes whose policy re-runs them), a
  publication from its rows, the trainer's own time per step.

What it leaves out: which tasks escape (their re-runs are spread over every task), structural changes (none
before splatfacto's step 500), evaluation and checkpoints, contention between processes for one machine's cores,
and the GPU's stream overlap of compute and communication.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from odin_nerfstudio.core.conflicts import StepRows, isin_sorted, raw, union_sorted
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.runtime.admission import POLICIES, ThroughputPolicy
from odin_nerfstudio.runtime.config import OdinRuntimeConfig
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig
from odin_nerfstudio.simulation.costs import CostModel
from odin_nerfstudio.simulation.interconnect import Interconnect
from odin_nerfstudio.simulation.workload import ROW_BYTES, Workload


@dataclass
class SimulationConfig:
    """One simulated run.

    Attributes:
        runtime: the runtime's configuration (mode, K = ring_slots, stale-read bounds) whose policy decides.
        num_workers: W.
        views_per_worker: B.
        steps: schedule steps to run.
        workers_per_process: workers sharing one process (1: a rank each; W: virtual workers in one process).
        follow_overlap_window: read a step only once the steps before its overlap window are published.
        remote_writes: what stands for another process's unpublished writes: ``drawn`` (the rows its tasks would
            draw, the workload's write sets: today's ``RemoteTasks`` with an escape check) or ``candidates`` (their
            candidate sets: ``RemoteTasks`` without one, and every run before main's d26e6ae).
        exchanges_in_flight: a worker commits step s once step s - exchanges_in_flight is published (today 1).
        payload_on_poll: the exchange is two-phase, as ``comm/distributed.DistributedTransport``'s: the header
            all_gather starts at the commit, the payload only at each process's first poll of the step (a
            ``progress`` call, or a block on it) after every header arrived, so a process busy rendering delays
            everyone's delivery until its task ends: the transport before its progress thread. Default off:
            ``DistributedTransport``'s thread issues the payload as soon as the headers arrived; on replays runs
            made before it.
        seed: the schedule's seed.
        row_bytes: bytes per active row of an exchanged update.
    """

    runtime: OdinRuntimeConfig = field(default_factory=OdinRuntimeConfig)
    num_workers: int = 2
    views_per_worker: int = 1
    steps: int = 120
    workers_per_process: int = 1
    follow_overlap_window: bool = False
    remote_writes: Literal["drawn", "candidates"] = "drawn"
    exchanges_in_flight: int = 1
    payload_on_poll: bool | None = None
    seed: int = 0
    row_bytes: int = ROW_BYTES

    @property
    def two_phase(self) -> bool:
        """Whether the payload waits for every process's poll (``payload_on_poll``, defaulted)."""
        return bool(self.payload_on_poll)

    def __post_init__(self) -> None:
        if self.num_workers < 1 or self.views_per_worker < 1 or self.steps < 1:
            raise ValueError("a simulation needs W >= 1, B >= 1 and steps >= 1")
        if self.workers_per_process < 1 or self.num_workers % self.workers_per_process:
            raise ValueError(f"workers_per_process ({self.workers_per_process}) must divide W ({self.num_workers})")
        if self.exchanges_in_flight < 1:
            raise ValueError(f"exchanges_in_flight must be >= 1, got {self.exchanges_in_flight}")
        if self.remote_writes not in ("drawn", "candidates"):
            raise ValueError(f"remote_writes must be 'drawn' or 'candidates', got {self.remote_writes!r}")

    def schedule_config(self) -> ScheduleConfig:
        """The schedule's W, B, K and seed."""
        return ScheduleConfig(self.num_workers, self.views_per_worker, self.seed, self.runtime.ring_slots)


@dataclass(frozen=True)
class ProcessFigures:
    """One simulated process's times (seconds) and counts, as ``core/timeline_metrics`` defines them."""

    views: int
    span_s: float
    compute_s: float
    wait_s: float

    @property
    def idle_share(self) -> float:
        """Share of the span outside compute (render, backward, bookkeeping, publications)."""
        return max(0.0, 1.0 - self.compute_s / self.span_s) if self.span_s > 0 else 0.0


@dataclass(frozen=True)
class SimulationResult:
    """What a simulated run predicts."""

    config: SimulationConfig
    processes: tuple[ProcessFigures, ...]
    conflicts: int
    stale_reads: int

    @property
    def conflict_rate(self) -> float:
        """Tasks that met a pending write (waited on it or read past it), per task."""
        return self.conflicts / max(self.views, 1)

    @property
    def views(self) -> int:
        """Distinct tasks trained."""
        return sum(p.views for p in self.processes)

    @property
    def span_s(self) -> float:
        """The longest process's span."""
        return max(p.span_s for p in self.processes)

    @property
    def views_per_s(self) -> float:
        """Throughput: views over the longest span."""
        return self.views / self.span_s if self.span_s > 0 else 0.0

    @property
    def idle_share(self) -> float:
        """Mean idle share over processes."""
        return float(np.mean([p.idle_share for p in self.processes]))

    @property
    def wait_per_view_s(self) -> float:
        """Exposed wait over every process per view."""
        return sum(p.wait_s for p in self.processes) / max(self.views, 1)

    def hidden_wait(self, barrier: SimulationResult) -> float | None:
        """Share of ``barrier``'s exposed wait per view this run removes (None if the barrier waited none)."""
        reference = barrier.wait_per_view_s
        return 1.0 - self.wait_per_view_s / reference if reference > 0 else None


Command = tuple[str, float]
"""What a process asks the engine: ("busy", seconds) or ("delivery", step)."""


class Simulation:
    """Runs a :class:`SimulationConfig` on a workload with a cost model and an interconnect (see the module)."""

    def __init__(
        self, workload: Workload, costs: CostModel, interconnect: Interconnect, config: SimulationConfig
    ) -> None:
        self.workload = workload
        self.costs = costs
        self.interconnect = interconnect
        self.config = config
        self.schedule: Schedule = workload.schedule(config.schedule_config())
        self.policy = POLICIES[config.runtime.mode].of(config.runtime)
        self.now = 0.0
        self._sends: dict[int, dict[int, float]] = {}
        self._parts: dict[int, dict[int, Tensor]] = {}
        self.delivery: dict[int, float] = {}
        self._link: dict[int, float] = {}
        self.headers: dict[int, float] = {}
        self._polls: dict[int, dict[int, float]] = {}
        self._blocked: dict[int, list[int]] = {}
        self._waiting: dict[int, list[int]] = {}
        self._heap: list[tuple[float, int, int]] = []
        self._sequence = 0
        self._plans = [self.schedule.at(s) for s in range(config.steps)]
        self._predicted: dict[int, Tensor] = {}
        self._rows: dict[int, int] = {}
        self._publications: dict[int, int] = {}
        self.conflicting: set[tuple[int, int, int]] = set()
        self.stale_reads = 0
        per = config.workers_per_process
        self.processes = [
            _Process(self, p, list(range(p * per, (p + 1) * per))) for p in range(config.num_workers // per)
        ]

    def tasks(self, step: int, worker: int) -> tuple[int, ...]:
        """The views ``worker`` renders in ``step``."""
        return self._plans[step].tasks[worker]

    def read_after(self, step: int) -> int:
        """The last step that must be published before ``step`` reads (the overlap-window gate)."""
        if not self.config.follow_overlap_window:
            return -1
        return step - len(self._plans[step].overlap_window) - 1

    def predicted(self, step: int) -> Tensor:
        """Per row, how many workers' predicted writes of ``step`` hold it, int32 [N] (candidate or active sets)."""
        if step not in self._predicted:
            counts = torch.zeros(self.workload.num_rows, dtype=torch.int32)
            sets = self.workload.candidates if self.config.remote_writes == "candidates" else self.workload.writes
            for worker in range(self.config.num_workers):
                for view in self.tasks(step, worker):
                    counts[sets[view]] += 1
            self._predicted[step] = counts
        return self._predicted[step]

    def published_rows(self, step: int) -> int:
        """Rows of ``step``'s publication: the union of its tasks' write sets."""
        if step not in self._rows:
            views = [v for w in range(self.config.num_workers) for v in self.tasks(step, w)]
            self._rows[step] = union_sorted([self.workload.writes[v] for v in views]).numel() if views else 0
        return self._rows[step]

    def published(self, step: int) -> None:
        """A process published ``step``; once every one has, the step's predicted writes are dropped (memory stays
        flat over long runs: an [N] count per unpublished step)."""
        self._publications[step] = self._publications.get(step, 0) + 1
        if self._publications[step] == len(self.processes):
            del self._publications[step]
            self._predicted.pop(step, None)

    def commit(self, step: int, worker: int, rows: Tensor) -> None:
        """``worker`` sends its part of ``step`` (its active rows, sorted int64) now; with every part sent, the
        link's delivery is known and, for a two-phase exchange, the header has arrived (processes blocked on the
        step poll it at once)."""
        self._sends.setdefault(step, {})[worker] = self.now
        self._parts.setdefault(step, {})[worker] = rows
        if len(self._sends[step]) < self.config.num_workers:
            return
        order = range(self.config.num_workers)
        sends, parts = self._sends.pop(step), self._parts.pop(step)
        sizes = [parts[w].numel() * self.config.row_bytes for w in order]
        union = union_sorted([parts[w] for w in order]).numel() if self.interconnect.collective == "chosen" else 0
        self._link[step] = self.interconnect.delivery_s([sends[w] for w in order], sizes, union)
        self.headers[step] = self.now
        if not self.config.two_phase:
            self._deliver(step, self._link.pop(step))
            return
        for process in self._blocked.pop(step, []):
            self.poll(step, process)

    def poll(self, step: int, process: int) -> None:
        """``process`` polls ``step``'s exchange now (its header arrived): it issues its payload; once every process
        has, the step is delivered the transport's base time later (and not before the link delivers it)."""
        if step in self.delivery:
            return
        polls = self._polls.setdefault(step, {})
        if process in polls:
            return
        polls[process] = self.now
        if len(polls) == len(self.processes):
            payload = max(polls.values()) + self.interconnect.base_s
            self._deliver(step, max(payload, self._link.pop(step)))
            del self._polls[step]

    def block(self, step: int, process: int) -> None:
        """``process`` blocks on ``step``'s exchange: it polls as soon as the header arrives."""
        if not self.config.two_phase:
            return
        if step in self.headers:
            self.poll(step, process)
        else:
            self._blocked.setdefault(step, []).append(process)

    def _deliver(self, step: int, time: float) -> None:
        """Step ``step`` is delivered at ``time``: wake the processes blocked on it."""
        self.delivery[step] = time
        for process in self._waiting.pop(step, []):
            self._schedule(max(self.now, time), process)

    def run(self) -> SimulationResult:
        """Simulate every process to the end of its last step and its last publication."""
        runners: list[Iterator[Command]] = [process.run() for process in self.processes]
        for index in range(len(runners)):
            self._schedule(0.0, index)
        while self._heap:
            self.now, _, index = heapq.heappop(self._heap)
            command = next(runners[index], None)
            if command is None:
                continue
            kind, value = command
            if kind == "busy":
                self._schedule(self.now + value, index)
            elif int(value) in self.delivery:
                self._schedule(max(self.now, self.delivery[int(value)]), index)
            else:
                self._waiting.setdefault(int(value), []).append(index)
        if self._waiting:
            raise RuntimeError(f"simulation stuck: processes wait on the deliveries of steps {sorted(self._waiting)}")
        figures = tuple(process.figures() for process in self.processes)
        return SimulationResult(self.config, figures, len(self.conflicting), self.stale_reads)

    def _schedule(self, time: float, process: int) -> None:
        self._sequence += 1
        heapq.heappush(self._heap, (time, self._sequence, process))


@dataclass
class _Read:
    """An admitted task: its index in the worker's step and its view."""

    index: int
    view: int


class _Process:
    """One process: its local workers' steps through ``run_step``'s loop, its replica's published step."""

    def __init__(self, sim: Simulation, index: int, workers: list[int]) -> None:
        self.sim = sim
        self.index = index
        self.workers = workers
        self.published = -1
        self.started = -1
        self.staged: dict[tuple[int, int], list[_Read]] = {}
        self.committed: set[tuple[int, int]] = set()
        self._pending: dict[int, Tensor] = {}
        self.views = 0
        self.compute_s = 0.0
        self.wait_s = 0.0
        self.first: float | None = None
        self.last = 0.0

    def run(self) -> Generator[Command, None, None]:
        """The trainer's iterations: ``run_step`` per step, then ``settle``."""
        sim = self.sim
        for step in range(sim.config.steps):
            self.started = step
            yield from self._busy(sim.costs.step_overhead_s, compute=False)
            yield from self._await_published(sim.read_after(step))
            remaining = {w: list(enumerate(sim.tasks(step, w))) for w in self.workers}
            while any(remaining.values()):
                published, progressed = self.published, False
                for worker in self.workers:
                    read = self._read_next(step, worker, remaining[worker]) if remaining[worker] else None
                    if read is None:
                        continue
                    remaining[worker].remove((read.index, read.view))
                    yield from self._task(step, worker, read)
                    yield from self._progress()
                    progressed = True
                yield from self._progress()
                if not progressed and self.published == published:
                    yield from self._await_publication(f"step {step}: no local worker can read")
            yield from self._progress()
        while self.published < sim.config.steps - 1:
            yield from self._await_publication("settle")

    def _task(self, step: int, worker: int, read: _Read) -> Generator[Command, None, None]:
        """Render, backward and stage one task."""
        if self.first is None:
            self.first = self.sim.now
        yield from self._busy(self._task_s(read.view))
        self.views += 1
        self.staged.setdefault((step, worker), []).append(read)

    def _task_s(self, view: int) -> float:
        """A task's time, with the share of re-runs validation adds in the modes that re-run escapes."""
        sim, workload = self.sim, self.sim.workload
        reruns = sim.costs.rerun_share if sim.policy.reruns(["escape"]) else 0.0
        return sim.costs.task_s(workload.size(view), int(workload.pixels[view])) * (1.0 + reruns)

    def _busy(self, seconds: float, compute: bool = True) -> Generator[Command, None, None]:
        if seconds > 0:
            yield ("busy", seconds)
            if compute:
                self.compute_s += seconds
        self.last = self.sim.now

    def _read_next(self, step: int, worker: int, remaining: list[tuple[int, int]]) -> _Read | None:
        """``read_next``: the first of the worker's remaining tasks the policy admits (ring, barrier, RAW)."""
        sim = self.sim
        for index, view in remaining:
            task = Task(step, worker, index, view, None)  # type: ignore[arg-type]  # the gates read the step only
            if sim.policy.gate(task, self.published, sim.config.runtime.ring_slots) is not None:
                continue
            candidate = sim.workload.candidates[view]
            writes = [StepRows(u, self._pending_writes(u)) for u in range(self.published + 1, step)]
            conflicts = raw(candidate, step, writes)
            if not conflicts.any:
                return _Read(index, view)
            if isinstance(sim.policy, ThroughputPolicy):
                fraction = conflicts.rows.numel() / max(candidate.numel(), 1)
                staleness = int((step - conflicts.first_step).max())
                within = fraction <= sim.policy.stale_fraction and staleness <= sim.policy.max_staleness
                if within and self._only_own_writes(conflicts.rows, step):
                    sim.stale_reads += 1
                    sim.conflicting.add(task.key)
                    return _Read(index, view)
            sim.conflicting.add(task.key)
        return None

    def _pending_writes(self, step: int) -> Tensor:
        """Step ``step``'s unpublished writes as this process sees them, sorted int64 [M]: the other processes'
        predicted writes and its own staged active sets (all staged: a process reads step s after its step s - 1)."""
        if step not in self._pending:
            sim, workload = self.sim, self.sim.workload
            sets = workload.candidates if sim.config.remote_writes == "candidates" else workload.writes
            counts = sim.predicted(step).clone()
            for worker in self.workers:
                for view in sim.tasks(step, worker):
                    counts[sets[view]] -= 1
            mask = counts > 0
            for worker in self.workers:
                for read in self.staged.get((step, worker), []):
                    mask[workload.writes[read.view]] = True
            self._pending[step] = torch.nonzero(mask).flatten()
        return self._pending[step]

    def _only_own_writes(self, rows: Tensor, step: int) -> bool:
        """Whether every one of ``rows`` is written by this process's own staged tasks of an unpublished step
        before ``step`` (throughput-first admits no stale read past another process's predicted write)."""
        own = [
            self.sim.workload.writes[read.view]
            for u in range(self.published + 1, step)
            for worker in self.workers
            for read in self.staged.get((u, worker), [])
        ]
        return bool(isin_sorted(rows, union_sorted(own)).all())

    def _progress(self) -> Generator[Command, None, None]:
        """``OdinRuntime.progress``: commit every ready worker step, publish every delivered one, in step order."""
        sim = self.sim
        changed = True
        while changed:
            changed = False
            last = min(self.started, self.published + sim.config.exchanges_in_flight)
            for step in range(self.published + 1, last + 1):
                for worker in self.workers:
                    if (step, worker) in self.committed:
                        continue
                    staged = self.staged.get((step, worker), [])
                    if len(staged) == len(sim.tasks(step, worker)):
                        self.committed.add((step, worker))
                        sim.commit(step, worker, union_sorted([sim.workload.writes[read.view] for read in staged]))
                        changed = True
            step = self.published + 1
            if sim.config.two_phase and sim.headers.get(step, float("inf")) <= sim.now:
                sim.poll(step, self.index)
            if sim.delivery.get(step, float("inf")) <= sim.now:
                yield from self._busy(sim.costs.publish_s(sim.published_rows(step)))
                self.published = step
                self._pending.pop(step, None)
                sim.published(step)
                changed = True

    def _await_publication(self, why: str) -> Generator[Command, None, None]:
        """Block until the next step is delivered and publish it; every local part of it must be sent."""
        step = self.published + 1
        if any((step, worker) not in self.committed for worker in self.workers):
            raise RuntimeError(f"{why}: waiting for step {step}, whose local part is not sent (a simulator bug)")
        since = self.sim.now
        self.sim.block(step, self.index)
        yield ("delivery", step)
        self.wait_s += self.sim.now - since
        self.last = self.sim.now
        yield from self._progress()

    def _await_published(self, step: int) -> Generator[Command, None, None]:
        """``await_published``: block until ``step`` is published."""
        yield from self._progress()
        while self.published < step:
            yield from self._await_publication(f"waiting for step {step}")

    def figures(self) -> ProcessFigures:
        """The process's span (first task to last publication), compute, wait and counts."""
        span = self.last - (self.first or 0.0)
        return ProcessFigures(self.views, span, self.compute_s, self.wait_s)


def simulate(
    workload: Workload, costs: CostModel, interconnect: Interconnect, config: SimulationConfig
) -> SimulationResult:
    """Simulate one run (see :class:`Simulation`)."""
    return Simulation(workload, costs, interconnect, config).run()
