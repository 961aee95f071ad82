"""Odin's runtime: primitive-level synchronization of training tasks through three hooks (arXiv 2607.19893).

:class:`OdinRuntime` is a facade over parts that each own one job (``docs/architecture.md`` draws them): the
culling index, the read gate (``reading.py``: who may read; admission, one policy per mode), the Shadow Graph
(gathers, staging ring), validation, commits (``commit.py``: when a step is validated, sent and published),
exchange bookkeeping, publication, lanes and metering. A renderer is seen only through a ``RenderAdapter``.

1. ``before_read(task)``: C(t) against the unpublished writes; a :class:`Read` (gathered into task-local leaves)
   or a :class:`Wait`. Drivers call :meth:`read_next` (dynamic ordering over a worker's remaining tasks).
2. ``after_backward(read, info)``: stage A(t), its gradients and statistics in the ring slot of t's step, then
   :meth:`progress` (commit, exchange, publish). Drivers call :meth:`finish`, or :meth:`start` and
   :meth:`collect` (the render on a lane, ``tasks_in_flight`` at once).
3. ``publish(step)``: once every worker's part has arrived, selective Adam on the union of active rows; rows a
   waiting reader needs first (:meth:`publish_first`, asked for by :meth:`upcoming`).

Structural changes run behind :meth:`drain`; :meth:`remap` carries the tables. One runtime holds W virtual workers,
or one worker per rank (other ranks' writes are caught by validation or predicted with :meth:`expect`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from odin_nerfstudio.adapter.gsplat import GsplatAdapter
from odin_nerfstudio.comm.protocol import FirstPart, Transport
from odin_nerfstudio.core.batch_gain import AdaptiveGain
from odin_nerfstudio.core.conflicts import StepRows, union_sorted
from odin_nerfstudio.core.heap import keep_freed_memory
from odin_nerfstudio.core.row_order import restore_spatial_order
from odin_nerfstudio.core.selective_adam import SelectiveAdam
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.kernels import ops
from odin_nerfstudio.runtime.adapter import RenderAdapter
from odin_nerfstudio.runtime.admission import POLICIES
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology
from odin_nerfstudio.runtime.culling_index import CullingIndex, RemoteTasks
from odin_nerfstudio.runtime.commit import Commits
from odin_nerfstudio.runtime.data_plane import DataPlane
from odin_nerfstudio.runtime.exchange import ExchangeBook
from odin_nerfstudio.runtime.lanes import LaneExecutor, Lanes
from odin_nerfstudio.runtime.metering import Meter, bookkeeping
from odin_nerfstudio.runtime.publication import Publisher
from odin_nerfstudio.runtime.reading import ReadGate
from odin_nerfstudio.runtime.reads import EscapeCheck, Read, RenderFn, VisibilityFn, Wait
from odin_nerfstudio.runtime.shadow import ShadowGraph
from odin_nerfstudio.runtime.validation import ReadLog, Validator, drawn_finder, escape_finder


class OdinRuntime:
    """Runs training tasks of W workers against one replica with primitive-level synchronization.

    Args:
        config: the runtime's hyperparameters.
        params: per name, the model's parameter [N, ...] (``means``, ``scales`` [N, 3] required); the dict is
            shared, and gsplat's ops may edit it behind :meth:`drain`.
        optimizers: per name, its :class:`SelectiveAdam` (gsplat's layout).
        transports: per worker, its end of the exchange.
        render_fn: (task, gathered leaves, generator) -> (loss, info), for first runs and re-runs.
        visibility_fn: optional escape check: a VisibilityFn (every row projected) or an :class:`EscapeCheck`.
        strategy_state: optional; every worker's task statistics are accumulated into it at publication.
        start_step: the first step; a resumed run's earlier steps count as published, its rows keep their order.
        adapter: the renderer's conventions (default: gsplat's, non-packed, log-scales).
        topology: W (one transport each) and B (default: W = the transports, B = 1).
        seed: the run's seed; every random draw of a task comes from ``task_generator(seed, step, view)``.
        batch_gain: the adaptive batch rule (``core/batch_gain.py``): each wholly published step sets the
            optimizers' learning-rate gains of the steps after it; None keeps their rates as they are.
        index: where candidate sets come from (default: the :class:`CullingIndex` of ``params``; the simulator's
            holds a workload's sets).
        clock: the timeline's clock in ns (default: the wall clock; the simulator's is virtual).
        record_decisions: keep the decision trace (``meter.decisions``).
        lane_executor: where lane threads' work runs (default: threads; the simulator's lanes are virtual).
    """

    def __init__(
        self,
        config: OdinRuntimeConfig,
        params: dict[str, Tensor],
        optimizers: dict[str, SelectiveAdam],
        transports: Sequence[Transport],
        render_fn: RenderFn,
        visibility_fn: VisibilityFn | EscapeCheck | None = None,
        strategy_state: dict[str, Any] | None = None,
        start_step: int = 0,
        adapter: RenderAdapter | None = None,
        topology: Topology | None = None,
        seed: int = 0,
        batch_gain: AdaptiveGain | None = None,
        index: CullingIndex | None = None,
        clock: Callable[[], int] | None = None,
        record_decisions: bool = False,
        lane_executor: LaneExecutor | None = None,
    ) -> None:
        self.topology = topology if topology is not None else Topology(num_workers=len(transports))
        if len(transports) != self.topology.num_workers:
            raise ValueError(f"{len(transports)} transports for {self.topology.num_workers} workers")
        self.config = config
        self.seed = seed
        self.params = params
        self.optimizers = optimizers
        self.render_fn = render_fn
        self.strategy_state = strategy_state
        self.adapter = adapter if adapter is not None else GsplatAdapter()
        if config.keep_freed_memory and self.device.type == "cpu":
            keep_freed_memory()
        if config.spatial_order and start_step == 0:
            restore_spatial_order(params, optimizers, strategy_state)
        self.shadow = ShadowGraph(config.ring_slots, device=self.device, measure_norms=batch_gain is not None)
        self.meter = Meter(self.device, clock, record_decisions)
        drawable = visibility_fn.drawable if isinstance(visibility_fn, EscapeCheck) else None
        self.index = index or CullingIndex(params, self.adapter, config.candidate_margin, config.near_plane, drawable)
        self.policy = POLICIES[config.mode].of(config)
        finder = None if visibility_fn is None else escape_finder(visibility_fn, self.index, params)
        drawn = drawn_finder(visibility_fn, self.index, params) if isinstance(visibility_fn, EscapeCheck) else None
        self.remote = RemoteTasks(self.index, self.meter, drawn)
        self.validator = Validator(config.ring_slots, self.index, finder, drawable)
        self.log = ReadLog(config.record_reads)
        self.exchange = ExchangeBook(transports, self.topology.views_per_worker, self.meter)
        publisher = Publisher(params, optimizers, self.adapter, strategy_state, start_step - 1, config.record_reads,
                              batch_gain)
        self.publisher, stats, timeout = publisher, strategy_state is not None, config.wait_timeout_s
        self.data = DataPlane(params, self.shadow, self.log, self.remote, publisher, self.meter, self.adapter, seed,
                              stats, timeout)
        self.lanes = Lanes(self._lane_work, config.tasks_in_flight, self.device, timeout, lane_executor)
        self.gate = ReadGate(self.policy, config.ring_slots, publisher, self.remote, self.shadow, self.index,
                             self.meter, params)
        self.commits = Commits(
            self.policy, config.priority_publication, self.shadow, self.exchange, self.validator, self.log,
            self.meter, self.publisher, self.index, params, self._rerun, self.publish, self.publish_first,
        )

    tables = property(lambda self: self.data.tables, doc="The per-primitive tables (versions, pending marks).")
    device = property(lambda self: self.params["means"].device, doc="The model's device (and every index's).")
    num_primitives = property(lambda self: self.params["means"].shape[0], doc="N, the rows of the model now.")
    counters = property(lambda self: self.meter.counters, doc="What the runtime counted (:class:`RuntimeCounters`).")
    timeline = property(lambda self: self.meter.timeline, doc="Every worker's spans (render, backward, wait, ...).")
    published_through = property(lambda self: self.publisher.published_through, doc="The last published step.")
    final_reads = property(lambda self: self.log.final_reads, doc="Per task, its exchanged read (record_reads).")
    published_rows = property(lambda self: self.publisher.published_rows, doc="Per step, its rows (record_reads).")

    def expect(self, tasks: Sequence[Task]) -> None:
        """Tasks not read here yet (other processes', or local ones a read runs ahead of): their predicted writes
        count as pending writes of their step until it is published (``culling_index.RemoteTasks``)."""
        self.remote.expect(tasks)

    def upcoming(self, tasks: Sequence[Task]) -> None:
        """This process's tasks of a coming step: the step before's exchange asks for their rows first
        (:meth:`publish_first`). A request only: a read still waits for every row it conflicts with."""
        self.commits.ask(tasks)

    def plan_step(self, step: int, tasks_per_worker: Sequence[int]) -> None:
        """Declare each worker's task count in a short ``step`` (a worker without one still sends an empty part)."""
        self.exchange.plan(step, tasks_per_worker)

    @bookkeeping
    def before_read(self, task: Task, gather: bool = True) -> Read | Wait:
        """Hook 1: cull C(t) and check it against the unpublished writes (``reading.ReadGate``): a :class:`Read`
        (C(t) declared as the task's possible writes and gathered into leaves, unless not ``gather``: then
        :meth:`start` gathers it on a lane) or a :class:`Wait` (rows and publication to wait for)."""
        decided = self.gate.decide(task)
        if isinstance(decided, Wait):
            return decided
        return self._admit(task, *decided, gather)

    def _admit(self, task: Task, candidate: Tensor, admitted: tuple[StepRows, ...] = (), gather: bool = True) -> Read:
        """Declare, log and (unless not ``gather``) gather a read of ``candidate`` (``DataPlane.admit``)."""
        read = self.data.admit(task, candidate, admitted)
        if gather:
            self.gather(read)
        return read

    @bookkeeping
    def gather(self, read: Read) -> None:
        """Gather an admitted read's C(t) into its leaves, once (on a lane, beside publications)."""
        self.data.gather(read, self.lanes.count > 1, lambda: self.commits.publishing)

    @bookkeeping
    def read_next(self, tasks: Sequence[Task], gather: bool = True) -> Read | Wait:
        """``before_read`` of one worker's remaining tasks of a step, first admitted first (dynamic ordering,
        ``ReadGate.first_read``); a worker's wait goes on the timeline when it ends. ``gather`` False leaves the
        gather to :meth:`start`."""
        return self.gate.first_read(tasks, lambda task: self.before_read(task, gather))

    @bookkeeping
    def conflicted_with_step_before(self, read: Read) -> bool:
        """Whether ``read``'s C(t) holds a row the publication of the step before its task's wrote: read before
        that publication, it would have waited for it (asked by the driver's reading behind, ``step_loop.py``)."""
        return self.data.conflicted_with_step_before(read)

    def count(self, **amounts: int) -> None:
        """Add to the runtime's counters (a driver's: ``read_behind``, ``behind_conflicts``, ``ran_ahead``)."""
        self.meter.add(**amounts)

    lane_free = property(lambda self: self.lanes.free, doc="Whether another read may start on a lane.")
    in_flight = property(lambda self: self.lanes.in_flight, doc="Reads started on lanes and not yet staged.")

    def close(self) -> None:
        """Stop the lanes' threads (after training)."""
        self.lanes.close()

    def finish(self, read: Read) -> None:
        """Gather (if not yet), render and back-propagate an admitted task on this thread; :meth:`after_backward`."""
        self.after_backward(read, self._lane_work(read, True))

    def start(self, read: Read) -> None:
        """Put an admitted read in flight on a lane (with one lane: now, on this thread); :meth:`collect` stages it."""
        self.lanes.start(read)
        self.counters.most_in_flight = max(self.counters.most_in_flight, self.lanes.in_flight)

    def collect(self, block: bool = False) -> bool:
        """:meth:`after_backward` for every read whose lane finished (``block``: wait for one); whether any did."""
        finished = self.lanes.finished(block)
        for read, info in finished:
            self.after_backward(read, info)
        return bool(finished)

    def join(self) -> None:
        """Collect every read in flight (each wait bounded by ``wait_timeout_s``)."""
        while self.lanes.in_flight:
            self.collect(block=True)

    def _lane_work(self, read: Read, inline: bool) -> dict[str, Any]:
        """What a lane runs for a read: its gather, render and backward (inline, on the driver's thread, with
        :meth:`progress` between render and backward); returns the render's info."""
        self.gather(read)
        return self._render_and_backward(read, between=self.progress if inline else None)

    def _render_and_backward(self, read: Read, between: Callable[[], None] | None = None) -> dict[str, Any]:
        """Render and back-propagate a read (timed by the meter), calling ``between()`` in between; returns the
        render's info. :meth:`finish` passes :meth:`progress`: an exchange that arrived during the render is
        published, and the next step committed, a backward earlier (a re-run inside progress passes nothing)."""
        keep = self.adapter.before_backward if self.strategy_state is not None else None
        return self.meter.render_and_backward(self.render_fn, read, keep, between)

    @bookkeeping
    def after_backward(self, read: Read, info: dict[str, Any] | None = None) -> None:
        """Hook 2: stage A(t) (the adapter reads it from the meta ``info``, else the rows with a gradient), its
        gradients and statistics; once the worker's step is complete, validate and exchange it (:meth:`progress`)."""
        self.data.stage(read, info)
        self.progress()

    @bookkeeping
    def progress(self) -> None:
        """Commit every worker step that can be validated and publish every step whose exchange is complete
        (``commit.Commits.progress``)."""
        self.commits.progress()

    def _rerun(self, task: Task, escaped: Tensor) -> None:
        """Re-run ``task`` on the synchronous state, the rows that escaped its first C(t) added."""
        read = self._admit(task, union_sorted([self.gate.candidates(task), escaped], self.device))
        self.data.stage(read, self._render_and_backward(read))

    @bookkeeping
    def publish(self, step: int) -> None:
        """Hook 3: apply selective Adam to the union of step ``step``'s active rows, advance their versions and free
        the slot (``Commits.publish``). Every worker's part must be sent."""
        self.commits.publish(step, self.data.tables, self.config.wait_timeout_s)

    @bookkeeping
    def publish_first(self, step: int, first: FirstPart) -> None:
        """Priority publication of the first part of the next step (``Commits.publish_first``)."""
        self.commits.publish_first(step, first, self.data.tables)

    def await_publication(self, timeout: float) -> bool:
        """Block until the next step's first part or whole exchange arrives and publish it, if every local worker
        has sent its part (``Commits.await_next``); returns whether it did."""
        if not self.commits.await_next(timeout):
            return False
        self.progress()
        return True

    def drain(self) -> None:
        """The barrier before a structural change: every staged step published, nothing in flight (else raises)."""
        if self.lanes.in_flight:
            raise RuntimeError(f"drain: {self.lanes.in_flight} tasks still in flight (collect them first: join)")
        self.progress()
        self.commits.check_drained()

    def remap(self, index_map: Tensor) -> None:
        """Carry the per-primitive tables through a structural change (``index_map`` int64 [N_new]: new row -> old
        row, -1 fresh), after :meth:`drain` and gsplat's edits of the parameters, optimizers and strategy state.
        With ``spatial_order`` the rows are put back in Z-order; the recent publications (old ids) are dropped."""
        self.drain()
        if index_map.numel() != self.num_primitives:
            raise ValueError(f"index map has {index_map.numel()} rows, the model {self.num_primitives}")
        if self.config.spatial_order:
            index_map = index_map[restore_spatial_order(self.params, self.optimizers, self.strategy_state)]
        self.data.remap(index_map)
        self.remote.remap(index_map)
        self.index.rebuild()
        self.validator.forget()
        self.published_rows.clear()

    def memory_report(self) -> dict[str, int]:
        """The Shadow Graph's peak and current extra bytes, the peak's make-up, and the model's bytes."""
        return self.shadow.memory_report(self.params)
