"""Odin's runtime: primitive-level synchronization of training tasks through three hooks and an index remap.

Odin (arXiv 2607.19893) replaces the global barrier per step with synchronization on the primitives two pieces of
work share. A training step is seen only through

1. :meth:`OdinRuntime.before_read` (task): compute the candidate set C(t) on the current state, check it against
   unpublished writes (RAW) and either gather the rows into task-local leaves (:class:`Read`) or say what to wait
   for (:class:`Wait`: the conflicting primitives and the publication that resolves them);
2. :meth:`OdinRuntime.after_backward` (read, info): collect the active set A(t) and its gradients, stage them in
   the ring slot of t's step, and once the worker's B tasks of the step are staged, validate them and start the
   asynchronous exchange of the worker's sparse update;
3. :meth:`OdinRuntime.publish` (step): once every worker's contribution has arrived, apply selective Adam to the
   union of active rows, advance their versions and free the slot.

Modes (:class:`OdinRuntimeConfig`):

- ``"barrier"``: the reference. A task of step s reads only after step s - 1 is published (a global wait per
  step). theta_{s+1}[p] = Adam(theta_s[p], sum_t g_t[p]) for p in the union of the active sets, the sum in task
  order: each worker sums its tasks in task order, the workers' sums are added in worker order.
- ``"quality"``: a task waits exactly for the publications of the rows in C(t) with a pending write from an
  earlier step (RAW: rows in a candidate set read by, or the active set staged by, an earlier unpublished step),
  nothing else. Writes of earlier tasks that have not read yet are unknown, so the read is optimistic about
  them: every task is validated before its worker's update of the step is exchanged, once all earlier steps are
  published. The rows it read must still hold the value it read ("stale"), and C(t) must equal the candidate
  set of the synchronous state ("candidate": a pending row outside C(t) moved into the frustum). What changed
  since the read comes from the rows of the last K publications, kept sparse (a read lags at most K - 1 steps
  behind, by the ring). A failed task is re-run on that state (counted). The result is bit-identical to
  ``"barrier"`` for any interleaving.
- ``"throughput"``: as quality, but admits a stale read when |C n pending| / |C| <= stale_fraction, the
  producers' gradient magnitude on each of those rows < stale_grad_ratio x the mean over the producer's staged
  active set, and no row is more than max_staleness steps stale; every admitted stale read is counted with its
  staleness and size. Validation checks every missed write against the admitted (row, step) pairs, so a write
  that was unknown at admission (an earlier task that had not read yet) is a "stale" failure and is re-run: no
  final read exceeds the bounds. "candidate" and "escape" failures are counted, not re-run.

Validation also checks A(t) against C(t) when a ``visibility_fn`` is given (the rows the rasterizer would see on
the synchronous state, outside C(t)): an escape is a counted validation failure, and the re-run adds the escaped
rows to the task's candidate set, in every mode that re-runs, so barrier and quality stay equal. A plain
``VisibilityFn`` is asked about every row; an :class:`EscapeCheck` also bounds what it can report visible
(:meth:`~odin_nerfstudio.culling.candidates.CullRegion.drawable`), so only the rows of that bound outside C(t) are
projected, found with the culling index in O(|C(t)|).

Cost: the hooks are O(|C(t)|) per task and O(|union of A(t)|) per publication, not O(N): culling goes through the
block index of :class:`~odin_nerfstudio.culling.candidates.BoundingSpheres` (built with the runtime and after each
structural change, rebuilt in O(N log N) only once its blocks have grown by a quarter), gathers and scatters touch
the rows they name, and the write sets of open steps are merged once per change, not per reader. Only a plain
VisibilityFn (every row projected) and structural changes are O(N). With ``spatial_order`` the rows follow the
Z-order of their centres (``row_order.py``), so the rows a task names are a few runs of consecutive rows.

Dynamic ordering: :meth:`OdinRuntime.run_next` runs, among a worker's remaining tasks of a step, the first whose
candidate set has no pending conflict; the gradient sum keeps task order, so quality stays exact.

Structural changes (densify, prune, opacity reset) run behind :meth:`OdinRuntime.drain`; gsplat's ops edit the
parameters, optimizers and strategy state, and :meth:`OdinRuntime.remap` carries the per-primitive tables.

Deterministic: every random draw of a task comes from ``task_generator(seed, step, view)``; densification
statistics are staged per task with its gradients, travel with the step's exchange (``SparseUpdate.stats``) and
are accumulated at publication task by task, in worker order then task order, so every replica's strategy state
holds every worker's tasks and is the same bit for bit.

Empty steps: a schedule's short last step may leave a worker, or a whole rank, without a task. :meth:`plan_step`
declares it; a worker with no task sends an empty update once its step can commit, and a runtime none of whose
workers has a task opens the step's slot itself when the previous step is published, so it still takes part in
the step's exchange, in step order, and publishes it like any other.

Scope: one runtime holds the tables of the workers that share its process and its replica. Virtual workers: W
workers, one runtime, an in-process transport. Distributed: one runtime per rank with ``num_workers=1`` (tasks
carry ``worker=0``) and a :class:`~odin_nerfstudio.comm.transport.DistributedTransport`, which merges the ranks'
updates (and their tasks' statistics) in rank order; the RAW check then sees only the rank's own pending writes,
and the other ranks' writes are caught by the validation against the merged publications (re-run in
quality-first), so the result is still the barrier's. Candidate sets are not exchanged between ranks; a rank that
knows the other ranks' tasks from the shared schedule can :meth:`OdinRuntime.expect` them, and their candidate sets,
culled on its own replica, then count as pending writes, so its reads wait for a conflicting publication instead of
being re-run after it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor

from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion
from odin_nerfstudio.core.conflicts import Conflicts, StepRows, isin_sorted, raw, union_sorted, war, waw
from odin_nerfstudio.core.row_order import permute_rows, spatial_order
from odin_nerfstudio.core.selective_adam import SelectiveAdam
from odin_nerfstudio.runtime.shadow import MEMORY_KINDS, ShadowGraph, model_bytes
from odin_nerfstudio.core.sparse import SparseUpdate
from odin_nerfstudio.adapter.strategy_stats import TaskStats, accumulate, task_stats
from odin_nerfstudio.core.tables import PrimitiveTables
from odin_nerfstudio.core.tasks import Task, task_generator
from odin_nerfstudio.core.timeline import Timeline
from odin_nerfstudio.comm.transport import ExchangeHandle, Transport

Mode = Literal["quality", "throughput", "barrier"]
RenderFn = Callable[[Task, dict[str, Tensor], torch.Generator], tuple[Tensor, dict[str, Any]]]
"""(task, gathered leaves [M, ...] per name, generator) -> (loss, info); info may hold the rasterizer's meta."""
VisibilityFn = Callable[[Task, dict[str, Tensor]], Tensor]
"""(task, parameter rows [M, ...] per name) -> bool [M]: the rows the rasterizer would see (radii > 0), each row
decided on its own (whatever other rows are passed with it). Given alone, the runtime passes every row (M = N,
detached views, never a copy) and keeps those outside C(t); see :class:`EscapeCheck` for the cheap form."""
DrawableFn = Callable[[Task], CullRegion]
"""task -> a region outside which the VisibilityFn it comes with reports no row visible (``CullRegion.drawable``
of the camera it projects with)."""


@dataclass(frozen=True)
class EscapeCheck:
    """A visibility function with a sound bound of what it can report: the escape check then costs O(|C(t)|).

    The runtime projects only the rows whose bounding sphere meets ``drawable(task)`` and that are outside C(t)
    (found with the culling index, gathered). Sound because ``visible`` reports a row visible only inside that
    region (for gsplat's projection, :meth:`~odin_nerfstudio.culling.candidates.CullRegion.drawable` proves it) and
    decides each row on its own, so the rows skipped are exactly rows it would report invisible.

    Attributes:
        visible: which of the given parameter rows the rasterizer would see for a task.
        drawable: per task, the region outside which ``visible`` reports nothing.
    """

    visible: VisibilityFn
    drawable: DrawableFn


_MAX_LOGGED_ROWS = 64


@dataclass
class OdinRuntimeConfig:
    """Hyperparameters of the runtime.

    Attributes:
        mode: "quality" (exact, waits on conflicting rows), "throughput" (admits bounded stale reads) or
            "barrier" (global wait per step, the reference).
        num_workers: W, the workers sharing this runtime.
        tasks_per_worker: B, views per worker per step.
        ring_slots: K, steps that may be staged at once (step s may read once step s - K is published).
        stale_fraction: t, the largest admitted |C n pending| / |C| (throughput).
        stale_grad_ratio: the admitted producer gradient magnitude, as a fraction of its active-set mean.
        max_staleness: the most steps a stale row may lag behind (throughput).
        seed: the run's seed (task generators derive from it).
        candidate_margin: widening of the culling frustum and bounding spheres, see ``candidates.py``.
        near_plane: the rasterizer's near plane.
        log_scales: whether ``params["scales"]`` holds log-scales (gsplat's convention) rather than scales.
        packed: whether the rasterizer runs packed (for the densification statistics).
        absgrad: whether the statistics use ``means2d.absgrad``.
        wait_timeout_s: timeout of every blocking wait on the transport.
        record_reads: keep, per task, its final read and, per step, its published rows (for tests and audits).
        spatial_order: keep the model's rows in the Z-order of their centres (``row_order.py``): permuted when the
            runtime is built and after every structural change, so that a view's rows are a few runs of
            consecutive rows (cache-friendly gathers, scatters and Adam). The runtime then owns the row order.
    """

    mode: Mode = "quality"
    num_workers: int = 1
    tasks_per_worker: int = 1
    ring_slots: int = 4
    stale_fraction: float = 0.2
    stale_grad_ratio: float = 0.2
    max_staleness: int = 4
    seed: int = 0
    candidate_margin: float = 0.1
    near_plane: float = 0.01
    log_scales: bool = True
    packed: bool = False
    absgrad: bool = False
    wait_timeout_s: float = 60.0
    record_reads: bool = False
    spatial_order: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("quality", "throughput", "barrier"):
            raise ValueError(f"unknown mode {self.mode!r}")
        if self.ring_slots < 1 or self.num_workers < 1 or self.tasks_per_worker < 1:
            raise ValueError("ring_slots, num_workers and tasks_per_worker must be >= 1")


@dataclass
class Read:
    """A task admitted to read: its candidate set, gathered leaves and random stream.

    Attributes:
        task: the task.
        candidate: C(t), sorted int64 [M].
        leaves: per name, the gathered rows as leaves [M, ...] that require grad; emptied once
            :meth:`OdinRuntime.after_backward` has staged their gradients (the Shadow Graph frees them).
        generator: the task's random stream.
        read_mark: the last published step when it read.
        admitted: per unpublished earlier step, the rows whose write by it the read may miss (throughput's
            admitted stale rows, sorted int64 [S] each); empty otherwise.
    """

    task: Task
    candidate: Tensor
    leaves: dict[str, Tensor]
    generator: torch.Generator
    read_mark: int
    admitted: tuple[StepRows, ...] = ()

    @property
    def stale_rows(self) -> Tensor:
        """Rows read with an admitted stale value, sorted int64 [S]."""
        return union_sorted([a.rows for a in self.admitted], self.candidate.device)


@dataclass(frozen=True)
class Wait:
    """Why a task cannot read yet.

    Attributes:
        task: the task.
        reason: "raw" (conflicting rows), "ring" (its ring slot still holds step - K), "barrier" (barrier mode:
            the previous step).
        step: the step whose publication ends the wait.
        rows: the conflicting primitives, sorted int64 [M] (empty unless "raw").
    """

    task: Task
    reason: str
    step: int
    rows: Tensor


@dataclass
class StaleRead:
    """One admitted stale read (throughput): task, rows read stale, the largest staleness and the fraction.

    ``kept`` becomes True when the task's update is exchanged with this read (validation did not re-run the task
    on fresh state): the stale read then reached the model.
    """

    key: tuple[int, int, int]
    rows: int
    staleness: int
    fraction: float
    kept: bool = False


@dataclass
class RuntimeCounters:
    """What the runtime counted.

    Attributes:
        tasks: tasks run, re-runs included.
        waits: Wait answers per reason.
        validation_failures: failures per kind ("stale", "candidate", "escape").
        reruns: tasks re-run on fresh state after a validation failure.
        reordered: reads where dynamic ordering ran a later task of the worker's step first.
        stale_reads: every admitted stale read (throughput), also those of a read later re-run (``kept`` False).
        publications: steps published.
        bookkeeping_ns: wall time spent in the hooks (before_read, read_next, after_backward, progress,
            publish), the outermost call only, less the render and backward of the re-runs they execute and
            less their time in the transport (``comm_ns``).
        render_ns: wall time in ``render_fn``, re-runs included.
        backward_ns: wall time in ``loss.backward()``, re-runs included.
        comm_ns: wall time inside the transport's calls (``start_exchange``, a handle's ``done`` and ``wait``),
            from the hooks and from :meth:`OdinRuntime.await_publication`: communication and waiting for the
            other workers, not Odin's bookkeeping.
    """

    tasks: int = 0
    waits: dict[str, int] = field(default_factory=dict)
    validation_failures: dict[str, int] = field(default_factory=dict)
    reruns: int = 0
    reordered: int = 0
    stale_reads: list[StaleRead] = field(default_factory=list)
    publications: int = 0
    bookkeeping_ns: int = 0
    render_ns: int = 0
    backward_ns: int = 0
    comm_ns: int = 0

    @property
    def stale_reads_kept(self) -> int:
        """Admitted stale reads that reached the model (not superseded by a re-run of their task)."""
        return sum(1 for read in self.stale_reads if read.kept)


@dataclass(frozen=True)
class ReadRecord:
    """What a task read: its candidate set, the last published step then, and the stale writes it may miss."""

    candidate: Tensor
    read_mark: int
    admitted: tuple[StepRows, ...] = ()

    @property
    def stale_rows(self) -> Tensor:
        """Rows read with an admitted stale value, sorted int64 [S]."""
        return union_sorted([a.rows for a in self.admitted], self.candidate.device)


_Hook = TypeVar("_Hook", bound=Callable[..., Any])
_Result = TypeVar("_Result")


def _bookkeeping(hook: _Hook) -> _Hook:
    """Time a hook into ``counters.bookkeeping_ns``: Odin's own cost per step, which must stay small.

    Only the outermost hook call is timed (after_backward -> progress -> publish and read_next -> before_read
    count once), and the render and backward time of re-runs executed inside it is subtracted, as is its time in
    the transport (``comm_ns``: sending, and waiting for the other workers), so the counter holds the runtime's
    culling, conflict checks, gathers, staging, validation and publications, never the renderer's work nor
    communication. On CUDA the hook's kernels queued on the current stream are waited for before the clock stops
    (the hooks synchronize anyway: ``nonzero``, ``unique``), so they are not billed to the next render.
    """

    @functools.wraps(hook)
    def timed(self: OdinRuntime, *args: Any, **kwargs: Any) -> Any:
        if self._in_hook:
            return hook(self, *args, **kwargs)
        counters = self.counters
        self._in_hook = True
        others = _not_bookkeeping_ns(counters)
        start = Timeline.now()
        try:
            return hook(self, *args, **kwargs)
        finally:
            _synchronize(self.device)
            elapsed = Timeline.now() - start
            counters.bookkeeping_ns += elapsed - (_not_bookkeeping_ns(counters) - others)
            self._in_hook = False

    return timed  # type: ignore[return-value]


def _not_bookkeeping_ns(counters: RuntimeCounters) -> int:
    """The time counted elsewhere that a hook may contain: re-runs' render and backward, and transport calls."""
    return counters.render_ns + counters.backward_ns + counters.comm_ns


def _synchronize(device: torch.device) -> None:
    """Wait for the kernels queued on the device's current stream, so that spans time the work, not its launch.

    Only the current stream: an asynchronous exchange in flight on a communication stream (NCCL) is not waited
    for, so it still overlaps with the next task.
    """
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class OdinRuntime:
    """Runs training tasks of W workers against one replica with primitive-level synchronization.

    Args:
        config: the runtime's hyperparameters.
        params: per name, the model's parameter [N, ...] (``means`` [N, 3] and ``scales`` [N, 3] required);
            the dict is shared and may be edited by gsplat's ops behind :meth:`drain`.
        optimizers: per name, its :class:`SelectiveAdam` (gsplat's layout).
        transports: per worker, its end of the exchange.
        render_fn: renders a task from its gathered leaves and returns (loss, info); used by :meth:`run_next`
            and for re-runs.
        visibility_fn: optional; which parameter rows the rasterizer would see for a task (escape check), alone
            (every row is projected) or as an :class:`EscapeCheck` (only rows that could escape are).
        strategy_state: optional gsplat strategy state; the statistics of every task whose info holds
            ``means2d`` are accumulated into it at publication, those of every worker's tasks (the exchange
            carries them), in worker order then task order.
        start_step: the first step to run; a resumed run starts after its checkpoint's step (the state is then
            that step's synchronous state, so earlier steps count as published), and its rows keep the order
            they were saved in until the next structural change, so that it continues bit for bit.
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
    ) -> None:
        if len(transports) != config.num_workers:
            raise ValueError(f"{len(transports)} transports for {config.num_workers} workers")
        self.config = config
        self.params = params
        self.optimizers = optimizers
        self.transports = list(transports)
        self.render_fn = render_fn
        self.visibility_fn = visibility_fn
        self.strategy_state = strategy_state
        if config.spatial_order and start_step == 0:
            self._restore_spatial_order()
        self.tables = PrimitiveTables.create(self.num_primitives, device=self.device)
        self.shadow = ShadowGraph(config.ring_slots, device=self.device)
        self.timeline = Timeline()
        self.counters = RuntimeCounters()
        self.published_through = start_step - 1
        self.tasks: dict[tuple[int, int, int], Task] = {}
        self.reads: dict[tuple[int, int, int], ReadRecord] = {}
        self.final_reads: dict[tuple[int, int, int], ReadRecord] = {}
        self.published_rows: dict[int, Tensor] = {}
        self._recent_publications: dict[int, Tensor] = {}
        self._handles: dict[int, dict[int, tuple[ExchangeHandle, int]]] = {}
        self._wait_since: dict[int, tuple[int, Wait]] = {}
        self._step_plans: dict[int, tuple[int, ...]] = {}
        self._admissions: dict[tuple[int, int, int], StaleRead] = {}
        self._bounds: BoundingSpheres | None = None
        self._expected: dict[int, list[Task]] = {}
        self._expected_rows: dict[int, Tensor] = {}
        self._in_hook = False
        self._bounding_spheres()

    @property
    def device(self) -> torch.device:
        """The device of the model, its tables and every index tensor of the runtime."""
        return self.params["means"].device

    @property
    def num_primitives(self) -> int:
        """N, the rows of the model now."""
        return self.params["means"].shape[0]

    def _activated(self, scales: Tensor) -> Tensor:
        """World-space scales [M, 3] of parameter rows ``scales`` [M, 3] (exp of gsplat's log-scales)."""
        scales = scales.detach()
        return torch.exp(scales) if self.config.log_scales else scales

    def _bounding_spheres(self) -> BoundingSpheres:
        """The culling bounds of the current state and their block index: built with the runtime and after each
        structural change (``remap``), refreshed on the rows each publication writes."""
        if self._bounds is None or self._bounds.num_rows != self.num_primitives:
            self._bounds = BoundingSpheres.of(self.params["means"], self._activated(self.params["scales"]))
            if self.num_primitives:
                self._bounds.index()
        return self._bounds

    def _candidate_region(self, task: Task) -> CullRegion:
        """The region C(t) is culled against (the task's widened frustum)."""
        return CullRegion.candidates(task.camera, self.config.candidate_margin, self.config.near_plane)

    def _candidate_set(self, task: Task) -> Tensor:
        """C(t) on the current state, sorted int64 [M] (through the block index: O(|C(t)|), not O(N))."""
        return self._bounding_spheres().rows_in(self._candidate_region(task))

    def _unpublished_writes(self, before_step: int) -> list[StepRows]:
        """What unpublished steps < ``before_step`` may write: the local tasks' declared candidate sets and staged
        rows, and the candidate sets of the tasks other processes run in them (:meth:`expect`)."""
        local = [slot.writes() for slot in self.shadow.open_slots() if slot.step < before_step]
        return local + self._expected_writes(before_step)

    def expect(self, tasks: Sequence[Task]) -> None:
        """Tasks other processes run (a distributed run knows them from the shared schedule).

        Until their step is published, their candidate sets, culled on this replica when first needed, count as
        that step's pending writes, so a read that would miss one of them waits for the publication instead of
        reading early and being re-run after validation. A prediction only: validation still decides.
        """
        for task in tasks:
            self._expected.setdefault(task.step, []).append(task)

    def _expected_writes(self, before_step: int) -> list[StepRows]:
        """The candidate sets of the expected tasks of unpublished steps < ``before_step``, one union per step."""
        for step in [s for s in self._expected if s <= self.published_through]:
            del self._expected[step]
            self._expected_rows.pop(step, None)
        writes = []
        for step in sorted(s for s in self._expected if s < before_step):
            if step not in self._expected_rows:
                sets = [self._candidate_set(task) for task in self._expected[step]]
                self._expected_rows[step] = union_sorted(sets, self.device)
            writes.append(StepRows(step, self._expected_rows[step]))
        return writes

    def _count_wait(self, wait: Wait) -> Wait:
        self.counters.waits[wait.reason] = self.counters.waits.get(wait.reason, 0) + 1
        return wait

    @_bookkeeping
    def before_read(self, task: Task) -> Read | Wait:
        """Hook 1: compute C(t), check it against unpublished writes, and gather it or say what to wait for.

        Args:
            task: the task about to read.

        Returns:
            A :class:`Read` (C(t) declared as the task's possible writes and gathered into leaves), or a
            :class:`Wait` naming the conflicting primitives and the publication to wait for.
        """
        step = task.step
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        if self.published_through < step - self.config.ring_slots:
            return self._count_wait(Wait(task, "ring", step - self.config.ring_slots, empty))
        if self.config.mode == "barrier" and self.published_through < step - 1:
            return self._count_wait(Wait(task, "barrier", step - 1, empty))
        candidate = self._candidate_set(task)
        conflicts = raw(candidate, step, self._unpublished_writes(step))
        admitted: tuple[StepRows, ...] = ()
        if conflicts.any:
            admission = self._admit_stale(task, candidate, conflicts) if self.config.mode == "throughput" else None
            if admission is None:
                return self._count_wait(Wait(task, "raw", conflicts.wait_step, conflicts.rows))
            admitted = admission
        self.shadow.declare(task.key, candidate)
        self.tables.declare(candidate, step)
        self.tasks[task.key] = task
        self.reads[task.key] = ReadRecord(candidate, self.published_through, admitted)
        return Read(
            task=task,
            candidate=candidate,
            leaves=self.shadow.gather(self.params, candidate),
            generator=task_generator(self.config.seed, step, task.view),
            read_mark=self.published_through,
            admitted=admitted,
        )

    def _admit_stale(self, task: Task, candidate: Tensor, conflicts: Conflicts) -> tuple[StepRows, ...] | None:
        """Throughput-first admission of a stale read; an admitted read is counted with staleness and size.

        Admitted when |C n pending| / |C| <= stale_fraction, no row lags more than max_staleness steps, and
        on every pending step the conflicting rows are staged (not still being computed) with a gradient
        magnitude below stale_grad_ratio x the mean magnitude over that step's staged active rows.

        Returns:
            None if refused; else, per pending step, the rows whose write by that step the read may miss.
        """
        fraction = conflicts.rows.numel() / max(candidate.numel(), 1)
        staleness = int((task.step - conflicts.first_step).max())
        if fraction > self.config.stale_fraction or staleness > self.config.max_staleness:
            return None
        admitted = []
        for slot in self.shadow.open_slots():
            if slot.step >= task.step:
                break
            rows = conflicts.rows[isin_sorted(conflicts.rows, slot.writes().rows)]
            if rows.numel() == 0:
                continue
            producer = slot.staged_update(self.params)
            if not bool(isin_sorted(rows, producer.rows).all()):
                return None
            running = [c for key, c in slot.candidates.items() if key not in slot.staged]
            if running and bool(isin_sorted(rows, union_sorted(running, self.device)).any()):
                return None
            magnitude = producer.row_magnitude()
            ours = magnitude[torch.searchsorted(producer.rows, rows)]
            if not bool((ours < self.config.stale_grad_ratio * magnitude.mean()).all()):
                return None
            admitted.append(StepRows(slot.step, rows))
        stale = StaleRead(task.key, conflicts.rows.numel(), staleness, fraction)
        self.counters.stale_reads.append(stale)
        self._admissions[task.key] = stale
        return tuple(admitted)

    @_bookkeeping
    def after_backward(self, read: Read, info: dict[str, Any] | None = None) -> None:
        """Hook 2: stage A(t) and its gradients; when the worker's step is complete, validate and exchange it.

        Args:
            read: what :meth:`before_read` returned, after the loss was back-propagated into its leaves.
            info: the rasterizer's meta, optional. With ``radii`` ([C, M], or [nnz] with ``gaussian_ids`` when
                packed) A(t) is the rows with radii > 0, else the rows with a non-zero gradient; with
                ``means2d`` and a strategy state, the task's densification statistics are staged too.
        """
        self._stage(read, info)
        self.progress()

    def _stage(self, read: Read, info: dict[str, Any] | None) -> None:
        """Stage A(t), its gradients and its densification statistics; then free the task's leaves and grads."""
        active = self._active_rows(read, info)
        grads = {
            name: (leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)).detach().index_select(0, active)
            for name, leaf in read.leaves.items()
        }
        stats: tuple[TaskStats, ...] = ()
        if self.strategy_state is not None and info is not None and "means2d" in info:
            stats = (task_stats(info, read.candidate, self.config.packed, self.config.absgrad),)
        self.shadow.stage(read.task.key, SparseUpdate(read.candidate.index_select(0, active), grads, stats))
        self.shadow.release(read.leaves)

    def _active_rows(self, read: Read, info: dict[str, Any] | None) -> Tensor:
        """Positions in C(t) of the active set A(t), int64 [A] sorted."""
        size = read.candidate.numel()
        if info is not None and "radii" in info:
            if self.config.packed:
                visible = torch.zeros(size, dtype=torch.bool, device=self.device)
                visible[info["gaussian_ids"]] = True
            else:
                radii = info["radii"].reshape(-1, size)
                visible = radii[0] > 0 if radii.shape[0] == 1 else (radii > 0).any(dim=0)
            return torch.nonzero(visible).flatten()
        nonzero = torch.zeros(size, dtype=torch.bool, device=self.device)
        for leaf in read.leaves.values():
            if leaf.grad is not None:
                nonzero |= (leaf.grad.reshape(size, -1) != 0).any(dim=1)
        return torch.nonzero(nonzero).flatten()

    @_bookkeeping
    def progress(self) -> None:
        """Commit every worker step that can be validated (an empty part of the next step included) and publish
        every step whose exchange is complete."""
        changed = True
        while changed:
            changed = False
            self._open_empty_step()
            for slot in self.shadow.open_slots():
                if slot.step > self.published_through + 1:
                    break
                for worker in range(self.config.num_workers):
                    if self._ready_to_commit(slot.step, worker):
                        self._commit(slot.step, worker)
                        changed = True
            step = self.published_through + 1
            handles = self._handles.get(step, {})
            if len(handles) == self.config.num_workers and all(self._in_transport(h.done) for h, _ in handles.values()):
                self.publish(step)
                changed = True

    def await_publication(self, timeout: float) -> bool:
        """Block until the next step's exchange completes and publish it, if this runtime has sent its part.

        With an in-process transport every exchange completes as soon as the last local worker sends, so this
        only blocks for a remote transport (one runtime per rank), where the other ranks may still be computing.

        Returns:
            Whether a step was published (False if some local worker has not sent its update yet).
        """
        step = self.published_through + 1
        handles = self._handles.get(step, {})
        if len(handles) < self.config.num_workers:
            return False
        for handle, _ in handles.values():
            self._in_transport(handle.wait, timeout)
        self.progress()
        return True

    def plan_step(self, step: int, tasks_per_worker: Sequence[int]) -> None:
        """Declare how many tasks each worker runs in ``step`` when it is not B (a schedule's short last step).

        A worker with no task in the step sends an empty update once its step can commit (all earlier steps
        published), so every exchange still has W parts; when no local worker has a task (a rank left out of a
        short step), the runtime opens the step's slot itself and sends its empty part (see :meth:`progress`).
        """
        if len(tasks_per_worker) != self.config.num_workers or min(tasks_per_worker) < 0:
            raise ValueError(f"step {step}: a plan needs one task count (>= 0) per worker")
        self._step_plans[step] = tuple(int(n) for n in tasks_per_worker)

    def _in_transport(self, call: Callable[..., _Result], *args: Any) -> _Result:
        """``call(*args)``, a transport call, its wall time counted in ``counters.comm_ns``: sending and waiting
        for the other workers is communication, which the hooks' bookkeeping time leaves out."""
        start = Timeline.now()
        try:
            return call(*args)
        finally:
            self.counters.comm_ns += Timeline.now() - start

    def _open_empty_step(self) -> None:
        """Open the slot of the next step to publish if no local worker has a task in it: no read opens it, yet
        this runtime must still send its (empty) part of the step's exchange, after the previous step's."""
        step = self.published_through + 1
        plan = self._step_plans.get(step)
        if plan is not None and not any(plan) and self.shadow.slot(step) is None:
            self.shadow.open(step)

    def _tasks_of(self, step: int, worker: int) -> int:
        """How many tasks ``worker`` runs in ``step``."""
        plan = self._step_plans.get(step)
        return self.config.tasks_per_worker if plan is None else plan[worker]

    def _ready_to_commit(self, step: int, worker: int) -> bool:
        if worker in self._handles.get(step, {}) or self.published_through < step - 1:
            return False
        slot = self.shadow.slot(step)
        staged = sum(1 for key in slot.staged if key[1] == worker)
        return staged == self._tasks_of(step, worker)

    def _commit(self, step: int, worker: int) -> None:
        """Validate the worker's tasks of ``step`` on the synchronous state, re-run failures, start the exchange."""
        slot = self.shadow.slot(step)
        for key in sorted(k for k in slot.staged if k[1] == worker):
            failures, escaped = self._validate(self.tasks[key])
            stale = self._admissions.pop(key, None)
            if failures and (self.config.mode != "throughput" or "stale" in failures):
                self.counters.reruns += 1
                self._rerun(self.tasks[key], escaped)
            elif stale is not None:
                stale.kept = True
            if self.config.record_reads:
                self.final_reads[key] = self.reads[key]
        start = self.timeline.now()
        update = self.shadow.local_update(step, worker, self.params)
        handle = self._in_transport(self.transports[worker].start_exchange, step, update)
        self._handles.setdefault(step, {})[worker] = (handle, start)

    def _validate(self, task: Task) -> tuple[list[str], Tensor]:
        """Check a task's read against the synchronous state (all earlier steps published); count failures.

        Returns:
            The failure kinds ("stale", "candidate", "escape"; empty if valid), and the rows outside C(t) the
            rasterizer would see (int64 [E], empty without a visibility_fn), which a re-run adds to C(t).
        """
        record = self.reads[task.key]
        admitted = {a.step: a.rows for a in record.admitted}
        failures = []
        outside = []
        for step in range(record.read_mark + 1, task.step):
            published = self._recent_publications[step]
            read = isin_sorted(published, record.candidate)
            missed = published[read]
            allowed = admitted.get(step)
            if (
                missed.numel()
                and "stale" not in failures
                and (allowed is None or not bool(isin_sorted(missed, allowed).all()))
            ):
                failures.append("stale")
            outside.append(published[~read])
        moved = union_sorted(outside, self.device)
        if moved.numel() and bool(self._bounding_spheres().meets(self._candidate_region(task), moved).any()):
            failures.append("candidate")
        escaped = self._escaped(task, record.candidate)
        if escaped.numel():
            failures.append("escape")
        for kind in failures:
            self.counters.validation_failures[kind] = self.counters.validation_failures.get(kind, 0) + 1
        return failures, escaped

    def _escaped(self, task: Task, candidate: Tensor) -> Tensor:
        """Rows outside ``candidate`` the visibility function reports visible for ``task``, sorted int64 [E].

        With an :class:`EscapeCheck`, only the rows of its drawable region outside C(t) are gathered and asked
        about; with a plain VisibilityFn, every row is (views, no copy).
        """
        check = self.visibility_fn
        if check is None:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        if isinstance(check, EscapeCheck):
            rows = self._bounding_spheres().rows_in(check.drawable(task))
            rows = rows[~isin_sorted(rows, candidate)]
            if rows.numel() == 0:
                return rows
            gathered = {name: p.detach().index_select(0, rows) for name, p in self.params.items()}
            return rows[check.visible(task, gathered)]
        every_row = {name: p.detach() for name, p in self.params.items()}
        visible = torch.nonzero(check(task, every_row)).flatten()
        return visible[~isin_sorted(visible, candidate)]

    def _rerun(self, task: Task, extra_rows: Tensor) -> None:
        """Re-run a task on the synchronous state, its candidate set widened by ``extra_rows``."""
        candidate = union_sorted([self._candidate_set(task), extra_rows], self.device)
        self.shadow.declare(task.key, candidate)
        self.tables.declare(candidate, task.step)
        self.reads[task.key] = ReadRecord(candidate, self.published_through)
        read = Read(
            task=task,
            candidate=candidate,
            leaves=self.shadow.gather(self.params, candidate),
            generator=task_generator(self.config.seed, task.step, task.view),
            read_mark=self.published_through,
        )
        _, info = self._render_and_backward(read)
        self._stage(read, info)

    @_bookkeeping
    def publish(self, step: int) -> None:
        """Hook 3: apply selective Adam to the union of step ``step``'s active rows, accumulate every worker's
        task statistics (worker order, then task order) into the strategy state, and free its slot.

        Publications run in step order (which is what WAW requires); WAW and WAR are checked and raise if
        violated. Bias correction counts global steps: an empty union still advances the step count.

        Args:
            step: the step to publish; every worker's exchange for it must have started.
        """
        if step != self.published_through + 1:
            raise RuntimeError(f"publish({step}) out of order: last published step is {self.published_through}")
        start = self.timeline.now()
        handles = self._handles.pop(step)
        merged = self._in_transport(handles[0][0].wait, self.config.wait_timeout_s)
        for worker, (_, comm_start) in sorted(handles.items()):
            self.timeline.record("comm", worker, step, comm_start)
        if waw(merged.rows, step, self._unpublished_writes(step)).any:
            raise RuntimeError(f"publish({step}): an earlier step's write to the same rows is still staged (WAW)")
        running = [
            StepRows(key[0], record.candidate)
            for key, record in self.reads.items()
            if key[0] <= step and key not in self.shadow.slot(key[0]).staged
        ]
        if war(merged.rows, step, running).any:
            raise RuntimeError(f"publish({step}): a running task of step <= {step} read the rows (WAR)")
        updated = {name: opt.step_rows(merged.rows, [merged.grads[name]])[0] for name, opt in self.optimizers.items()}
        means, scales = (
            updated[name] if name in updated else self.params[name].detach().index_select(0, merged.rows)
            for name in ("means", "scales")
        )
        self._bounding_spheres().update(merged.rows, means, self._activated(scales))
        slot = self.shadow.free(step)
        self.tables.publish(merged.rows, slot.declared_sets(), step)
        if self.strategy_state is not None:
            for stats in merged.stats:
                accumulate(self.strategy_state, stats, self.num_primitives)
        for key in list(slot.candidates):
            self.reads.pop(key, None)
            self.tasks.pop(key, None)
        self._recent_publications[step] = merged.rows
        self._step_plans.pop(step, None)
        self._recent_publications.pop(step - self.config.ring_slots, None)
        if self.config.record_reads:
            self.published_rows[step] = merged.rows
        self.published_through = step
        self.counters.publications += 1
        self.timeline.record("publish", -1, step, start, {"rows": merged.rows.numel()})

    def _render_and_backward(self, read: Read) -> tuple[Tensor, dict[str, Any]]:
        task = read.task
        start = self.timeline.now()
        loss, info = self.render_fn(task, read.leaves, read.generator)
        if self.strategy_state is not None and "means2d" in info and info["means2d"].requires_grad:
            info["means2d"].retain_grad()
        _synchronize(self.device)
        render = self.timeline.record("render", task.worker, task.step, start, {"view": task.view})
        self.counters.render_ns += render.end_ns - render.start_ns
        start = self.timeline.now()
        loss.backward()
        _synchronize(self.device)
        backward = self.timeline.record("backward", task.worker, task.step, start, {"view": task.view})
        self.counters.backward_ns += backward.end_ns - backward.start_ns
        self.counters.tasks += 1
        return loss, info

    @_bookkeeping
    def read_next(self, tasks: Sequence[Task]) -> Read | Wait:
        """Admit, among one worker's remaining tasks of a step, the first whose read has no pending conflict.

        Dynamic ordering: the tasks are tried in task order and the first admitted one reads; its gradients
        are still summed in task order. A worker's wait is recorded on the timeline when it ends, with the
        reason and the primitives waited on.

        Args:
            tasks: the worker's remaining tasks of its current step, in task order.

        Returns:
            The admitted task's :class:`Read`, or the first task's :class:`Wait` if none may read.
        """
        worker = tasks[0].worker
        first_wait = None
        for position, task in enumerate(tasks):
            result = self.before_read(task)
            if isinstance(result, Wait):
                first_wait = first_wait or result
                continue
            if worker in self._wait_since:
                since, wait = self._wait_since.pop(worker)
                args = {
                    "reason": wait.reason,
                    "on_step": wait.step,
                    "primitives": wait.rows.numel(),
                    "primitive_ids": wait.rows[:_MAX_LOGGED_ROWS].tolist(),
                }
                self.timeline.record("wait", worker, task.step, since, args)
            if position > 0:
                self.counters.reordered += 1
            return result
        self._wait_since.setdefault(worker, (self.timeline.now(), first_wait))
        return first_wait

    def finish(self, read: Read) -> None:
        """Render an admitted task with ``render_fn``, back-propagate, and run :meth:`after_backward`."""
        _, info = self._render_and_backward(read)
        self.after_backward(read, info)

    def run_next(self, tasks: Sequence[Task]) -> Task | Wait:
        """:meth:`read_next` then :meth:`finish`: run one of a worker's remaining tasks, or say why none can."""
        result = self.read_next(tasks)
        if isinstance(result, Wait):
            return result
        self.finish(result)
        return result.task

    def drain(self) -> None:
        """The barrier before a structural change: every staged step published, nothing in flight.

        Raises if a task has read but not been staged, or a worker's step is incomplete.
        """
        self.progress()
        if self.shadow.open_slots() or self._handles:
            raise RuntimeError(
                f"drain: steps {[s.step for s in self.shadow.open_slots()]} are not published "
                "(every worker must finish its tasks of those steps first)"
            )

    def remap(self, index_map: Tensor) -> None:
        """Carry the per-primitive tables through a structural change, after :meth:`drain`.

        gsplat's ops have already edited the parameters, the optimizers' state and the strategy state; with
        ``spatial_order`` the rows are then put back in Z-order (gsplat appends new rows at the end). The history
        of recent publications (old row ids) is dropped: after the drain no read depends on it.

        Args:
            index_map: int64 [N_new], new row -> old row, -1 for a fresh row.
        """
        self.drain()
        if index_map.numel() != self.num_primitives:
            raise ValueError(f"index map has {index_map.numel()} rows, the model {self.num_primitives}")
        if self.config.spatial_order:
            index_map = index_map.index_select(0, self._restore_spatial_order())
        self.tables = self.tables.remap(index_map)
        self._expected_rows.clear()
        self._bounds = None
        self._bounding_spheres()
        self._recent_publications.clear()
        self.published_rows.clear()

    def _restore_spatial_order(self) -> Tensor:
        """Permute the model's rows (parameters, optimizer and strategy state) into the Z-order of their centres;
        returns the order applied, int64 [N] (new row -> old row)."""
        order = spatial_order(self.params["means"])
        permute_rows(self.params, self.optimizers, self.strategy_state, order)
        return order

    def memory_report(self) -> dict[str, int]:
        """Peak and current bytes of gathered plus staged tensors, the peak's make-up, and the model's bytes.

        ``peak_{kind}_bytes`` for kind in leaves, grads, staged, candidates: what each held at the peak (they
        sum to it).
        """
        meter = self.shadow.memory
        return {
            "peak_extra_bytes": meter.peak,
            "current_extra_bytes": meter.current,
            "model_bytes": model_bytes(self.params),
            **{f"peak_{kind}_bytes": meter.at_peak.get(kind, 0) for kind in MEMORY_KINDS},
        }
