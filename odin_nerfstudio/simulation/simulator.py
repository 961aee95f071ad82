"""A discrete-event simulation of Odin on W workers that runs the runtime's own protocol on modeled costs.

Why: users run Odin on 8-64 GPUs; this machine has two cores. The simulator predicts what such a run does
(views/s, idle share, exposed and hidden wait) from a scene's schedule and a fitted cost model, and it predicts
it with the code that trains: each simulated process is a real :class:`~odin_nerfstudio.runtime.runtime.OdinRuntime`
driven by the real :class:`~odin_nerfstudio.drivers.training_loop.TrainingLoop`, so every rule of the protocol
(admission and its gates, RAW against local and predicted writes, dynamic ordering, running ahead, reading
behind, early commits, priority publication, validation and re-runs) is in a prediction as it is in a run. Only
the data plane is modeled (``modeled.py``): C(t) and A(t) are the workload's sets, a task costs the cost model's
time, a step's exchange is delivered when the interconnect model says, and processes take turns on a virtual
clock (``clock.py``). The figures come from each process's timeline through ``core/timeline_metrics``, as a real
run's do.

Imbalance: a task's time is the fitted model's plus a residual drawn from the fit's own residuals (seeded by the
step and view), or, replaying a run, the time that task measured; without it every simulated worker would be
equally fast and the barrier's idle, which comes from local imbalance, would vanish.

What it leaves out: escapes (which views escape; their re-runs are spread over every task as a share of its
time), structural changes, evaluation and checkpoints, contention between processes (or lanes) for one machine's
cores or one GPU, and a GPU's overlap of compute and communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.core.tasks import Task, task_generator
from odin_nerfstudio.core.timeline_metrics import RunMetrics, rank_metrics
from odin_nerfstudio.drivers.sharded_loop import SHARDED_MODES
from odin_nerfstudio.drivers.training_loop import LoopConfig, TrainingLoop
from odin_nerfstudio.runtime.admission import POLICIES
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology
from odin_nerfstudio.runtime.metering import Decision
from odin_nerfstudio.runtime.runtime import OdinRuntime
from odin_nerfstudio.scheduling.balance import BALANCE_TOLERANCE, MIN_BAND_GROUPS
from odin_nerfstudio.scheduling.regions import OrderOption, resolved_order
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig
from odin_nerfstudio.simulation.clock import VirtualClock
from odin_nerfstudio.simulation.costs import CostModel
from odin_nerfstudio.simulation.interconnect import Interconnect
from odin_nerfstudio.simulation.modeled import ModeledRender, ModeledTransport, SetIndex, ViewCamera, VirtualLanes
from odin_nerfstudio.simulation.workload import ROW_BYTES, Workload

LEARNING_RATE = 1e-3
"""The modeled replicas' Adam rate (their values are never read: only which rows move matters)."""


@dataclass
class SimulationConfig:
    """One simulated run.

    Attributes:
        runtime: the runtime's configuration (mode, K = ring_slots, stale-read bounds, priority publication,
            ``tasks_in_flight`` lanes, ...).
        num_workers: W.
        views_per_worker: B.
        steps: schedule steps to run.
        workers_per_process: workers sharing one process (1: a rank each; W: virtual workers in one process).
        loop: the training loop's options (overlap window, running ahead, reading behind, remote writes).
        remote_writes: what stands for another process's unpublished writes: ``drawn`` (the rows its tasks would
            draw, the workload's write sets: a run with the escape check) or ``candidates`` (their candidate sets).
        seed: the schedule's seed (and the residuals' draws).
        row_bytes: bytes per active row of an exchanged update.
        record_decisions: keep each process's decision trace (``SimulationResult.decisions``).
        sharded: the sharded mode (``drivers/sharded_loop.py``: a rank per worker, run by ``sharded.py``).
        schedule_order: the schedule's order, as ``--pipeline.datamanager.schedule-order`` (auto: the regional
            order when sharded, in two halves from 16 workers; the locality schedule otherwise).
        rebalanced: the schedule cut by each view's modeled render + backward time (the cost model's, without the
            drawn residuals), as ``--pipeline.datamanager.rebalance-every`` trains after its first epoch.
        balance_tolerance, band_floor: the schedule's cost bands, as ``--pipeline.datamanager.balance-tolerance``
            and ``--pipeline.datamanager.band-floor`` (``ScheduleConfig``'s).
        straggler: rank 0's tasks take this many times their modeled time (a slower device among equal ones; the
            sharded mode, whose placement can give it the cheaper views).
    """

    runtime: OdinRuntimeConfig = field(default_factory=OdinRuntimeConfig)
    num_workers: int = 2
    views_per_worker: int = 1
    steps: int = 120
    workers_per_process: int = 1
    loop: LoopConfig = field(default_factory=LoopConfig)
    remote_writes: str = "drawn"
    seed: int = 0
    row_bytes: int = ROW_BYTES
    record_decisions: bool = False
    sharded: bool = False
    schedule_order: OrderOption = "auto"
    rebalanced: bool = False
    balance_tolerance: float = BALANCE_TOLERANCE
    band_floor: int = MIN_BAND_GROUPS
    straggler: float = 1.0

    def __post_init__(self) -> None:
        if self.num_workers < 1 or self.views_per_worker < 1 or self.steps < 1:
            raise ValueError("a simulation needs W >= 1, B >= 1 and steps >= 1")
        if self.workers_per_process < 1 or self.num_workers % self.workers_per_process:
            raise ValueError(f"workers_per_process ({self.workers_per_process}) must divide W ({self.num_workers})")
        if self.straggler <= 0 or (self.straggler != 1.0 and not self.sharded):
            raise ValueError(f"straggler must be > 0, and other than 1 only in the sharded mode, got {self.straggler}")
        if self.remote_writes not in ("drawn", "candidates"):
            raise ValueError(f"remote_writes must be 'drawn' or 'candidates', got {self.remote_writes!r}")
        if self.sharded and (self.runtime.mode not in SHARDED_MODES or self.workers_per_process != 1):
            raise ValueError(
                f"the sharded mode runs {', '.join(SHARDED_MODES)} on a rank per worker, got mode "
                f"{self.runtime.mode!r} with {self.workers_per_process} workers per process"
            )

    def schedule_config(self) -> ScheduleConfig:
        """The schedule's W, B, K, seed, order and cost bands."""
        order = resolved_order(self.schedule_order, self.sharded, self.num_workers)
        return ScheduleConfig(
            self.num_workers, self.views_per_worker, self.seed, self.runtime.ring_slots, order=order,
            balance_tolerance=self.balance_tolerance, band_floor=self.band_floor,
        )


@dataclass(frozen=True)
class SimulationResult:
    """What a simulated run predicts: its figures as ``core/timeline_metrics`` computes a real run's."""

    config: SimulationConfig
    metrics: RunMetrics
    decisions: tuple[tuple[Decision, ...], ...] = ()

    views = property(lambda self: self.metrics.views, doc="Distinct tasks trained.")
    span_s = property(lambda self: self.metrics.span_s, doc="The longest process's span.")
    views_per_s = property(lambda self: self.metrics.views_per_s, doc="Throughput: views over the longest span.")
    conflict_rate = property(lambda self: self.metrics.conflict_rate, doc="Conflicting tasks per task.")
    conflicts = property(lambda self: sum(r.conflicts for r in self.metrics.ranks), doc="Conflicting tasks.")
    stale_reads = property(lambda self: self.metrics.stale.admitted, doc="Admitted stale reads.")
    processes = property(lambda self: self.metrics.ranks, doc="Per process, its figures (``RankMetrics``).")

    @property
    def idle_share(self) -> float:
        """Mean idle share over processes."""
        return float(np.mean([rank.idle_share for rank in self.metrics.ranks]))

    @property
    def wait_per_view_s(self) -> float:
        """Exposed wait over every process per view."""
        return self.metrics.exposed_wait_per_view_s

    def hidden_wait(self, barrier: SimulationResult) -> float | None:
        """Share of ``barrier``'s exposed wait per view this run removes (None if the barrier waited none)."""
        return self.metrics.hidden_wait(barrier.metrics)


class Simulation:
    """Runs a :class:`SimulationConfig` on a workload with a cost model and an interconnect (see the module).

    Args:
        workload: the scene's views and sets.
        costs: the fitted costs (with their residuals, for imbalance).
        interconnect: the link and collective a step's exchange takes.
        config: the run.
        measured: optional, per (step, view), the render + backward seconds a real run measured (a replay).
    """

    def __init__(
        self,
        workload: Workload,
        costs: CostModel,
        interconnect: Interconnect,
        config: SimulationConfig,
        measured: dict[tuple[int, int], float] | None = None,
    ) -> None:
        self.workload, self.costs, self.interconnect, self.config = workload, costs, interconnect, config
        self.measured = measured or {}
        self.schedule: Schedule = workload.schedule(config.schedule_config())
        if config.rebalanced:
            modeled = [costs.task_s(workload.size(v), int(workload.pixels[v])) for v in range(workload.num_views)]
            self.schedule = self.schedule.with_view_cost(np.array(modeled))
        self.clock = VirtualClock()
        self._plans = [self.schedule.at(s) for s in range(config.steps)]
        self._cameras = [ViewCamera(int(p)) for p in workload.pixels]
        self._residuals = np.asarray(costs.residuals, dtype=np.float64)
        reruns = POLICIES[config.runtime.mode].of(config.runtime).reruns(["escape"])
        self._rerun_share = costs.rerun_share if reruns else 0.0

    def tasks(self, step: int, worker: int) -> tuple[int, ...]:
        """The views ``worker`` renders in ``step``."""
        return self._plans[step].tasks[worker]

    def task_s(self, task: Task) -> float:
        """A task's modeled time: measured (a replay) or fitted plus a drawn residual, plus bookkeeping and the
        share of escape re-runs."""
        workload, costs = self.workload, self.costs
        seconds = self.measured.get((task.step, task.view))
        if seconds is None:
            seconds = costs.task(workload.size(task.view), int(workload.pixels[task.view]))
            if self._residuals.size:
                generator = task_generator(self.config.seed, task.step, task.view)
                seconds += float(self._residuals[int(torch.randint(self._residuals.size, (1,), generator=generator))])
        return (max(seconds, 0.0) + costs.bookkeeping_s) * (1.0 + self._rerun_share)

    def _step_tasks(self, step: int) -> tuple[list[list[Task]], int]:
        """Every worker's tasks of ``step`` (their cameras: the views' image sizes) and its window's length."""
        plan, cameras = self._plans[step], self._cameras
        tasks = [
            [Task(step, worker, index, view, cameras[view]) for index, view in enumerate(views)]  # type: ignore
            for worker, views in enumerate(plan.tasks)
        ]
        return tasks, len(plan.overlap_window)

    def _process(self, workers: Sequence[int]) -> tuple[OdinRuntime, TrainingLoop]:
        """One process: a replica, a runtime over the modeled data plane, and the training loop."""
        rows = self.workload.num_rows
        params = {name: torch.nn.Parameter(torch.zeros(rows, 3)) for name in ("means", "scales")}
        optimizers = selective_adams(params, {name: LEARNING_RATE for name in params})
        index = SetIndex(self.workload, params, self.clock, self.costs.publish_s)
        render = ModeledRender(self.workload, self.clock, self.task_s, self.config.seed)
        transports = [self.transport.endpoint(w) for w in workers]
        runtime = OdinRuntime(
            self.config.runtime, params, optimizers, transports, render,
            topology=Topology(len(workers), self.config.views_per_worker), seed=self.config.seed, index=index,
            clock=self.clock.now_ns, record_decisions=self.config.record_decisions,
            lane_executor=VirtualLanes(self.clock),
        )
        if self.config.remote_writes == "drawn":  # what RemoteTasks predicts in a run with the escape check
            runtime.remote.predict = lambda task: self.workload.writes[task.view]
        loop = TrainingLoop(runtime, self._step_tasks, workers, self.config.steps - 1, self.config.loop)
        return runtime, loop

    def run(self) -> SimulationResult:
        """Simulate every process to the end of its last step and its last publication."""
        config = self.config
        per = config.workers_per_process
        groups = [list(range(p * per, (p + 1) * per)) for p in range(config.num_workers // per)]
        template = {name: torch.zeros(self.workload.num_rows, 3) for name in ("means", "scales")}
        self.transport = ModeledTransport(config.num_workers, template, self.clock, self.interconnect, config.row_bytes)
        processes = [self._process(workers) for workers in groups]

        def work(loop: TrainingLoop) -> None:
            for step in range(config.steps):
                self.clock.spend(self.costs.step_overhead_s)
                loop.iteration(step, may_run_ahead=True)
            loop.finish()

        self.clock.run([(f"process {p}", lambda loop=loop: work(loop)) for p, (_, loop) in enumerate(processes)])
        ranks = tuple(
            rank_metrics(p, list(runtime.timeline.events), runtime.counters) for p, (runtime, _) in enumerate(processes)
        )
        decisions = tuple(tuple(runtime.meter.decisions or ()) for runtime, _ in processes)
        return SimulationResult(config, RunMetrics(ranks), decisions)


def simulate(
    workload: Workload,
    costs: CostModel,
    interconnect: Interconnect,
    config: SimulationConfig,
    measured: dict[tuple[int, int], float] | None = None,
) -> SimulationResult:
    """Simulate one run (see :class:`Simulation`)."""
    return Simulation(workload, costs, interconnect, config, measured).run()
