"""Odin's runtime: primitive-level synchronization of training tasks through three hooks (arXiv 2607.19893).

:class:`OdinRuntime` is a facade over parts that each own one job (``docs/architecture.md`` draws them): the
culling index, admission (one policy per mode), the Shadow Graph (gathers, staging ring), validation, exchange
bookkeeping, publication and metering. A renderer is seen only through a ``runtime.adapter.RenderAdapter``.

The three hooks, and the names drivers call (``drivers/step_loop.py``):

1. ``before_read(task)``: cull C(t), check it against unpublished writes (RAW), gather it into task-local leaves
   (:class:`Read`) or say what to wait for (:class:`Wait`). Drivers call :meth:`read_next`, which tries a
   worker's remaining tasks of a step in task order (dynamic ordering) through ``before_read``.
2. ``after_backward(read, info)``: stage A(t), its gradients and statistics in the ring slot of t's step, then
   :meth:`progress`: once a worker's tasks of the step are staged and every earlier step is published, validate
   them (re-running failures on the synchronous state) and start the worker's exchange. Drivers call
   :meth:`finish` (render, backward, ``after_backward``), or :meth:`start` and :meth:`collect`: the gather,
   render and backward on a lane (``lanes.py``, ``tasks_in_flight`` at once), ``after_backward`` when collected.
3. ``publish(step)``: once every worker's part has arrived, apply selective Adam to the union of active rows,
   advance their versions, free the slot. :meth:`progress` calls it for every complete exchange, and
   :meth:`await_publication` after blocking on the next one (a remote rank). Rows a waiting reader needs go first
   (:meth:`publish_first`): each exchange asks for the rows the next step's local tasks would read
   (:meth:`upcoming`), and those are published as soon as they arrive, before the rest of the update.

Structural changes run behind :meth:`drain`; :meth:`remap` carries the tables. One runtime holds W virtual workers,
or one worker per rank (other ranks' writes are caught by validation or predicted with :meth:`expect`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from odin_nerfstudio.adapter.gsplat import GsplatAdapter
from odin_nerfstudio.comm.protocol import FirstPart, Transport
from odin_nerfstudio.core.batch_gain import AdaptiveGain
from odin_nerfstudio.core.conflicts import Conflicts, StepRows, isin_sorted, raw, union_sorted
from odin_nerfstudio.core.heap import keep_freed_memory
from odin_nerfstudio.core.row_order import restore_spatial_order
from odin_nerfstudio.core.selective_adam import SelectiveAdam
from odin_nerfstudio.core.sparse import densified
from odin_nerfstudio.core.tables import PrimitiveTables
from odin_nerfstudio.core.tasks import Task, task_generator
from odin_nerfstudio.kernels import ops
from odin_nerfstudio.runtime.adapter import RenderAdapter
from odin_nerfstudio.runtime.admission import POLICIES
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology
from odin_nerfstudio.runtime.culling_index import CullingIndex, RemoteTasks
from odin_nerfstudio.runtime.exchange import ExchangeBook
from odin_nerfstudio.runtime.lanes import Lanes
from odin_nerfstudio.runtime.metering import Meter, bookkeeping
from odin_nerfstudio.runtime.publication import Publisher
from odin_nerfstudio.runtime.reads import EscapeCheck, Read, ReadRecord, RenderFn, VisibilityFn, Wait
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
        self.tables = PrimitiveTables.create(self.num_primitives, device=self.device)
        self.shadow = ShadowGraph(config.ring_slots, device=self.device, measure_norms=batch_gain is not None)
        self.meter = Meter(self.device)
        self.index = CullingIndex(params, self.adapter, config.candidate_margin, config.near_plane)
        self.policy = POLICIES[config.mode].of(config)
        finder = None if visibility_fn is None else escape_finder(visibility_fn, self.index, params)
        drawn = drawn_finder(visibility_fn, self.index, params) if isinstance(visibility_fn, EscapeCheck) else None
        self.remote = RemoteTasks(self.index, drawn)
        drawable = visibility_fn.drawable if isinstance(visibility_fn, EscapeCheck) else None
        self.validator = Validator(config.ring_slots, self.index, finder, drawable)
        self.log = ReadLog(config.record_reads)
        self.exchange = ExchangeBook(transports, self.topology.views_per_worker, self.meter)
        self.publisher = Publisher(
            params, optimizers, self.adapter, strategy_state, start_step - 1, config.record_reads, batch_gain
        )
        self.lanes = Lanes(self._lane_work, config.tasks_in_flight, self.device, config.wait_timeout_s)
        self._publishing = 0
        """Publications begun so far; odd while one writes (a lane's gather beside it counts as such)."""
        self._upcoming: dict[int, list[Task]] = {}
        self._unsure: set[tuple[int, int]] = set()
        """(step, worker) parts whose early commit was refused: committed once the step before is published."""

    device = property(lambda self: self.params["means"].device, doc="The model's device (and every index's).")
    num_primitives = property(lambda self: self.params["means"].shape[0], doc="N, the rows of the model now.")
    counters = property(lambda self: self.meter.counters, doc="What the runtime counted (:class:`RuntimeCounters`).")
    timeline = property(lambda self: self.meter.timeline, doc="Every worker's spans (render, backward, wait, ...).")
    published_through = property(lambda self: self.publisher.published_through, doc="The last published step.")
    final_reads = property(lambda self: self.log.final_reads, doc="Per task, its exchanged read (record_reads).")
    published_rows = property(lambda self: self.publisher.published_rows, doc="Per step, its rows (record_reads).")

    def expect(self, tasks: Sequence[Task]) -> None:
        """Tasks not read here yet (other processes' tasks, or local ones a read runs ahead of): their predicted
        writes (the rows they would draw, or C(t) without an escape check) count as pending writes of their step
        until it is published (``culling_index.RemoteTasks``)."""
        self.remote.expect(tasks)

    def upcoming(self, tasks: Sequence[Task]) -> None:
        """This process's tasks of a coming step: the exchange of the step before theirs asks for their candidate
        sets (culled when it starts) first, and those rows are published as soon as they arrive
        (:meth:`publish_first`). A request only: a read still waits for every row it conflicts with."""
        for task in tasks:
            self._upcoming.setdefault(task.step, []).append(task)

    @property
    def _publishes_first(self) -> bool:
        """Whether exchanges ask for rows first: priority publication on, in a mode whose reads overlap."""
        return self.config.priority_publication and self.policy.publishes_first

    def plan_step(self, step: int, tasks_per_worker: Sequence[int]) -> None:
        """Declare each worker's task count in a short ``step`` (a worker without one still sends an empty part)."""
        self.exchange.plan(step, tasks_per_worker)

    @bookkeeping
    def before_read(self, task: Task, gather: bool = True) -> Read | Wait:
        """Hook 1: cull C(t) and check it against the unpublished writes (RAW): a :class:`Read` (C(t) declared as
        the task's possible writes and gathered into leaves, unless not ``gather``: then :meth:`start` gathers it on
        a lane) or a :class:`Wait` (rows and publication to wait for).

        Unpublished writes: per open step before t's, the local tasks' candidate sets (the active sets once
        staged), and the predicted candidate sets of the tasks other processes run (:meth:`expect`); for a step
        whose first part is published, the rest of its rows instead of both.
        """
        step, meter = task.step, self.meter
        gate = self.policy.gate(task, self.published_through, self.config.ring_slots)
        if gate is not None:
            empty = torch.empty(0, dtype=torch.int64, device=self.device)
            return meter.count_wait(Wait(task, gate[0], gate[1], empty))
        # Once a step's first part is published, its pending writes are exactly the rest of its rows (the first
        # part tells every row it writes), whoever writes them: they replace the local sets and the predictions.
        early = self.publisher.early
        predicted = [w for w in self.remote.writes(step, self.published_through) if w.step not in early]
        predicted += [StepRows(s, rows.pending) for s, rows in early.items() if s < step]
        writes = [slot.writes() for slot in self.shadow.open_slots() if slot.step < step and slot.step not in early]
        writes += predicted
        candidate, conflicts = self._candidates_and_conflicts(task, writes)
        admitted: tuple[StepRows, ...] = ()
        if conflicts.any:
            params, slots = self.params, self.shadow.open_slots()
            admission = self.policy.admit_stale(task, candidate, conflicts, slots, params, predicted)
            if admission is None:
                return meter.count_wait(Wait(task, "raw", conflicts.wait_step, conflicts.rows))
            admitted, stale = admission
            meter.counters.count_stale(stale)
        return self._admit(task, candidate, admitted, gather)

    def _candidates_and_conflicts(self, task: Task, writes: list[StepRows]) -> tuple[Tensor, Conflicts]:
        """C(t) and its rows with a write in ``writes`` (RAW): culled and checked in one op (the index's
        ``cull_conflicts``), or every row and the check apart for a policy that reads every row."""
        if not self.policy.reads_every_row:
            return self.index.candidates_and_conflicts(task, writes)
        candidate = self._candidates(task)
        return candidate, raw(candidate, task.step, writes)

    def _candidates(self, task: Task) -> Tensor:
        """C(t) on the current state: culled by the index, or every row for a policy that reads every row."""
        if self.policy.reads_every_row:
            return torch.arange(self.num_primitives, dtype=torch.int64, device=self.device)
        return self.index.candidates(task)

    def _admit(self, task: Task, candidate: Tensor, admitted: tuple[StepRows, ...] = (), gather: bool = True) -> Read:
        """Let ``task`` read ``candidate`` (a first read, or a re-run on the synchronous state): declare it as the
        task's possible writes, log the read and gather it (unless not ``gather``)."""
        self.shadow.declare(task.key, candidate)
        ops.declare_rows(self.tables, candidate, task.step)
        early = self.publisher.early.get(self.published_through + 1)
        record = ReadRecord(candidate, self.published_through, admitted, None if early is None else early.published)
        if early is not None and bool(isin_sorted(early.published, candidate).any()):
            self.counters.early_reads += 1
        self.log.add(task, record)
        read = Read(task, record, {}, task_generator(self.seed, task.step, task.view))
        if gather:
            self.gather(read)
        return read

    @bookkeeping
    def gather(self, read: Read) -> None:
        """Gather an admitted read's C(t) into its leaves (once). On a lane a publication may run beside it: a row
        it holds is read again once released, and the gather is counted as beside a publication."""
        if read.leaves:
            return
        concurrent, begun = self.lanes.count > 1, self._publishing
        leaves, rereads = self.shadow.gather(
            self.params, read.candidate, self.tables.seq, concurrent, self.config.wait_timeout_s
        )
        read.leaves.update(leaves)
        if concurrent:
            beside = begun % 2 == 1 or self._publishing != begun
            self.meter.add(locked_rereads=rereads, gathers_beside_publication=int(beside))

    @bookkeeping
    def read_next(self, tasks: Sequence[Task], gather: bool = True) -> Read | Wait:
        """``before_read`` of one worker's remaining tasks of a step, in task order: the first admitted one reads
        (dynamic ordering; its gradients are still summed in task order), else the first task's :class:`Wait`.
        A worker's wait is recorded on the timeline when it ends, with the reason and the primitives waited on.
        ``gather`` False leaves the gather to :meth:`start`."""
        first_wait = None
        for position, task in enumerate(tasks):
            result = self.before_read(task, gather)
            if isinstance(result, Wait):
                first_wait = first_wait or result
                continue
            self.meter.read(task, reordered=position > 0, overlapped=task.step - 1 > self.published_through)
            return result
        self.meter.waiting(tasks[0].worker, first_wait)
        return first_wait

    @bookkeeping
    def conflicted_with_step_before(self, read: Read) -> bool:
        """Whether ``read``'s C(t) holds a row the publication of the step before its task's wrote: read before
        that publication, it would have waited for it (asked by the driver's reading behind, ``step_loop.py``)."""
        written = self.tables.published_step.index_select(0, read.candidate)
        # a host synchronization on CUDA, needed: the driver decides on it how the next step reads
        return bool((written == read.task.step - 1).any())

    def finish(self, read: Read) -> None:
        """Render an admitted task with ``render_fn``, back-propagate, and run :meth:`after_backward`, on this
        thread (gathering it first if it was not)."""
        self.after_backward(read, self._lane_work(read, True))

    def start(self, read: Read) -> None:
        """Put an admitted read in flight on a lane (gather, render, backward); :meth:`collect` stages it. With one
        lane it renders now, on this thread, as :meth:`finish` would."""
        self.lanes.start(read)
        self.counters.most_in_flight = max(self.counters.most_in_flight, self.lanes.in_flight)

    def collect(self, block: bool = False) -> bool:
        """Run :meth:`after_backward` for every read whose lane finished (``block``: wait for one first, bounded by
        ``wait_timeout_s``); returns whether any did."""
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

    def run_next(self, tasks: Sequence[Task]) -> Task | Wait:
        """:meth:`read_next` then :meth:`finish`: run one of a worker's remaining tasks, or say why none can."""
        result = self.read_next(tasks)
        if isinstance(result, Wait):
            return result
        self.finish(result)
        return result.task

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
        self._stage(read, info)
        self.progress()

    def _stage(self, read: Read, info: dict[str, Any] | None) -> None:
        """Stage A(t), its gradients and its statistics (A(t) is also the view's next predicted writes); then free the
        task's leaves and grads."""
        stats = None
        if self.strategy_state is not None and info is not None:
            stats = self.adapter.task_stats(info, read.candidate)
        active = None if info is None else self.adapter.active_mask(info, read.candidate.numel())
        task_stats = () if stats is None else (stats,)
        staged = self.shadow.stage_task(read.task.key, read.candidate, read.leaves, active, task_stats)
        self.remote.saw(read.task.view, staged)

    @bookkeeping
    def progress(self) -> None:
        """Commit every worker step that can be validated (an empty part of the next step included) and publish
        every step whose exchange is complete."""
        changed = True
        while changed:
            changed = False
            step = self.published_through + 1
            if self.exchange.no_local_task(step) and self.shadow.slot(step) is None:
                self.shadow.open(step)  # no read opens it, yet this runtime still sends its (empty) part
            for slot in self.shadow.open_slots():
                early = False
                if self.policy.validates and slot.step > self.published_through + 1:
                    if not self._may_commit_early(slot.step):
                        break
                    early = True
                for worker in range(self.exchange.num_workers):
                    after_published = self.policy.validates and not early
                    if not self.exchange.ready(slot, worker, self.published_through, after_published):
                        continue
                    if not early:
                        self._commit(slot.step, worker)
                        changed = True
                    elif (slot.step, worker) not in self._unsure:
                        changed = self._commit_early(slot.step, worker) or changed
            step = self.published_through + 1
            if self.exchange.complete(step):
                self.publish(step)
                changed = True
            elif self.exchange.asked(step) and step not in self.publisher.early:
                first = self.exchange.first(step)
                if first is not None:
                    self.publish_first(step, first)
                    changed = True

    def _commit(self, step: int, worker: int) -> None:
        """Validate the worker's tasks of ``step`` on the synchronous state, re-run failures, start the exchange."""
        slot = self.shadow.slot(step)
        for key in sorted(k for k in slot.staged if k[1] == worker):
            if not self.policy.validates:
                self.log.final(key)
                continue
            task = self.log.tasks[key]
            failures, escaped = self.validator.validate(task, self.log.reads[key])
            self.meter.count_failures(failures)
            rerun = bool(failures) and self.policy.reruns(failures)
            if self.policy.settled(key, rerun):
                self.counters.stale.kept += 1
            if rerun:
                self.counters.reruns += 1
                candidate = union_sorted([self._candidates(task), escaped], self.device)
                read = self._admit(task, candidate)
                self._stage(read, self._render_and_backward(read))
            self.log.final(key)
        self._send(step, worker)

    def _send(self, step: int, worker: int) -> None:
        """Start the exchange of the worker's staged part of ``step`` (densified for a policy that reads every
        row), asking for the rows of its next tasks first."""
        update = self.shadow.local_update(step, worker, self.params)
        if self.policy.reads_every_row:
            update = densified(update, self.num_primitives)
        self.exchange.start(step, worker, update, self._asked_rows(step, worker))

    def _may_commit_early(self, step: int) -> bool:
        """Whether ``step`` may be committed before the step before it is wholly published: that step is the next
        to publish and its first part is published, in a mode that commits early."""
        before = self.published_through + 1
        return self.policy.commits_early and step == before + 1 and before in self.publisher.early

    def _commit_early(self, step: int, worker: int) -> bool:
        """Commit the worker's tasks of ``step`` while the rest of step - 1 is still on its way, if every read is
        surely valid whatever that rest holds (``Validator.surely_valid``); else leave it for :meth:`_commit` once
        step - 1 is published. Two exchanges are then in flight. Returns whether it committed."""
        slot, early = self.shadow.slot(step), self.publisher.early[step - 1]
        reach = self.index.reach(*self.publisher.rest_movement())
        keys = sorted(k for k in slot.staged if k[1] == worker)
        for key in keys:
            if not self.validator.surely_valid(self.log.tasks[key], self.log.reads[key], step - 1, early, reach):
                self._unsure.add((step, worker))
                return False
        for key in keys:
            self.log.final(key)
        self.counters.early_commits += 1
        self._send(step, worker)
        return True

    def _asked_rows(self, step: int, worker: int) -> Tensor | None:
        """The rows ``worker``'s exchange of ``step`` asks for first: the candidate sets, on the current state, of
        its upcoming tasks of step + 1 that have not read yet (None without priority publication, or without such a
        task: then only the other workers' asks make a first part)."""
        if not self._publishes_first:
            return None
        for earlier in [s for s in self._upcoming if s <= step]:
            del self._upcoming[earlier]
        tasks = [t for t in self._upcoming.get(step + 1, []) if t.worker == worker and t.key not in self.log.tasks]
        if not tasks:
            return None
        return union_sorted([self.index.candidates(task) for task in tasks], self.device)

    @bookkeeping
    def publish(self, step: int) -> None:
        """Hook 3: apply selective Adam to the union of step ``step``'s active rows, accumulate every worker's task
        statistics (worker order, then task order), advance the rows' versions and free the slot. Publications run
        in step order; WAW and WAR hold by construction (``publication.py``). Every worker's part must be sent."""
        self.publisher.check_order(step)
        start = self.timeline.now()
        merged = self.exchange.collect(step, self.config.wait_timeout_s)
        with self._publication():
            rows, means, scales = self.publisher.apply(step, merged, self.tables.seq)
        self.index.update(rows, means, scales)
        slot = self.shadow.free(step)
        ops.settle_rows(self.tables, merged.rows, slot.declared_sets(), step)
        for key in slot.candidates:
            self.log.forget(key)
        self.validator.published(step, merged.rows)
        self._unsure = {part for part in self._unsure if part[0] > step + 1}
        self.publisher.done(step, merged.rows)
        self.counters.publications += 1
        self.timeline.record("publish", -1, step, start, {"rows": merged.rows.numel()})

    @bookkeeping
    def publish_first(self, step: int, first: FirstPart) -> None:
        """Priority publication: apply selective Adam to the first part of the next step (the rows the workers'
        next tasks asked for) before the rest of its update has arrived; the step's other rows stay pending
        (exactly known now) until :meth:`publish`. A read then sees these rows' new values; validation knows it
        (``ReadRecord.early``)."""
        start = self.timeline.now()
        with self._publication():
            rows, means, scales = self.publisher.apply_first(step, first, self.tables.seq)
        self.index.update(rows, means, scales)
        self.counters.first_publications += 1
        self.timeline.record("publish", -1, step, start, {"rows": rows.numel(), "first": True})

    @contextlib.contextmanager
    def _publication(self) -> Iterator[None]:
        """Mark a publication writing the model (``_publishing`` odd meanwhile), for gathers beside it."""
        self._publishing += 1
        try:
            yield
        finally:
            self._publishing += 1

    def await_publication(self, timeout: float) -> bool:
        """Block until the next step's first part (where it was asked for and is not published yet) or its whole
        exchange arrives and publish it, if every local worker has sent its part (only a remote transport blocks:
        the other ranks may still compute); returns whether it did."""
        step = self.published_through + 1
        if not self.exchange.all_sent(step):
            return False
        if self.exchange.asked(step) and step not in self.publisher.early:
            self.exchange.wait_first(step, timeout)
        else:
            self.exchange.wait(step, timeout)
        self.progress()
        return True

    def drain(self) -> None:
        """The barrier before a structural change: every staged step published, nothing in flight; raises if a
        task has read but not been staged, or a worker's step is incomplete."""
        if self.lanes.in_flight:
            raise RuntimeError(f"drain: {self.lanes.in_flight} tasks still in flight (collect them first: join)")
        self.progress()
        if self.shadow.open_slots() or self.exchange.in_flight():
            steps = [slot.step for slot in self.shadow.open_slots()]
            raise RuntimeError(f"drain: steps {steps} are not published (every worker must finish its tasks first)")

    def remap(self, index_map: Tensor) -> None:
        """Carry the per-primitive tables through a structural change (``index_map`` int64 [N_new]: new row -> old
        row, -1 fresh), after :meth:`drain` and gsplat's edits of the parameters, optimizers and strategy state.
        With ``spatial_order`` the rows are put back in Z-order; the recent publications (old ids) are dropped."""
        self.drain()
        if index_map.numel() != self.num_primitives:
            raise ValueError(f"index map has {index_map.numel()} rows, the model {self.num_primitives}")
        if self.config.spatial_order:
            index_map = index_map[restore_spatial_order(self.params, self.optimizers, self.strategy_state)]
        self.tables = self.tables.remap(index_map)
        self.remote.forget_rows()
        self.index.rebuild()
        self.validator.forget()
        self.published_rows.clear()

    def memory_report(self) -> dict[str, int]:
        """The Shadow Graph's peak and current extra bytes, the peak's make-up, and the model's bytes."""
        return self.shadow.memory_report(self.params)
