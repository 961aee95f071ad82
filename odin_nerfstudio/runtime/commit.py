"""Commit and publication order: when a worker's step is validated and sent, and when a step publishes, in parts.

The control plane's commit rules, one place for them (the runtime drives them with real tensors, the simulator with
modeled ones, ``simulation/simulator.py``). :meth:`Commits.progress` runs to a fixed point:

- a worker's part of a step is *committed* (validated, failures re-run on the synchronous state, exchange
  started) once every task of the worker is staged and, in a mode that validates, every earlier step is published
  (``ExchangeBook.ready``); exchanges start in step order on every worker;
- *early commit*: where the step before is published only in its first part, a part whose every read is surely
  valid whatever the rest holds (``Validator.surely_valid``) commits at once, two exchanges in flight; an unsure
  one waits for the whole publication;
- a step *publishes* once its exchange is complete, and its *first part* (the rows the next tasks asked for) as
  soon as that arrives (priority publication): each exchange asks for the candidate sets of the worker's upcoming
  tasks that have not read yet (:meth:`Commits.asked_rows`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from torch import Tensor

from odin_nerfstudio.comm.protocol import FirstPart
from odin_nerfstudio.core.conflicts import union_sorted
from odin_nerfstudio.core.sparse import densified
from odin_nerfstudio.core.tables import PrimitiveTables
from odin_nerfstudio.core.tasks import Task, TaskKey
from odin_nerfstudio.kernels import ops
from odin_nerfstudio.runtime.admission import AdmissionPolicy
from odin_nerfstudio.runtime.culling_index import CullingIndex
from odin_nerfstudio.runtime.exchange import ExchangeBook
from odin_nerfstudio.runtime.metering import Meter
from odin_nerfstudio.runtime.publication import Publisher
from odin_nerfstudio.runtime.shadow import ShadowGraph
from odin_nerfstudio.runtime.validation import ReadLog, Validator


class Commits:
    """The commit rules of one runtime (see the module).

    Args:
        policy: the mode's admission policy (whether it validates, commits early, publishes first, reads every row).
        priority: whether exchanges ask for rows first (``priority_publication``).
        shadow, exchange, validator, log, meter, publisher, index: the runtime's parts.
        params: the model's parameters (a staged part is read from the leaves; only the row count is read here).
        rerun: re-runs a task on the synchronous state with the escaped rows added to its candidate set.
        publish: publishes a complete step (the runtime's hook 3, which times it and calls :meth:`publish`).
        publish_first: publishes a step's first part (likewise, :meth:`publish_first`).
    """

    def __init__(
        self,
        policy: AdmissionPolicy,
        priority: bool,
        shadow: ShadowGraph,
        exchange: ExchangeBook,
        validator: Validator,
        log: ReadLog,
        meter: Meter,
        publisher: Publisher,
        index: CullingIndex,
        params: dict[str, Tensor],
        rerun: Callable[[Task, Tensor], None],
        publish: Callable[[int], None],
        publish_first: Callable[[int, FirstPart], None],
    ) -> None:
        self.policy = policy
        self.asks_first = priority and policy.publishes_first
        self.shadow, self.exchange, self.validator, self.log = shadow, exchange, validator, log
        self.meter, self.publisher, self.index, self.params = meter, publisher, index, params
        self._rerun, self._publish, self._publish_first = rerun, publish, publish_first
        self.upcoming: dict[int, list[Task]] = {}
        """Per step, this process's tasks of it whose candidate sets the step before's exchange asks for."""
        self.unsure: set[tuple[int, int]] = set()
        """(step, worker) parts whose early commit was refused: committed once the step before is published."""
        self.publishing = 0
        """Publications begun so far; odd while one writes (a lane's gather beside it counts as such)."""

    def progress(self) -> None:
        """Commit every worker step that can be validated (an empty part of the next step included) and publish
        every step whose exchange is complete (or its first part, once arrived)."""
        changed = True
        while changed:
            changed = False
            published = self.publisher.published_through
            if self.exchange.no_local_task(published + 1) and self.shadow.slot(published + 1) is None:
                self.shadow.open(published + 1)  # no read opens it, yet this runtime still sends its (empty) part
            for slot in self.shadow.open_slots():
                early = False
                if self.policy.validates and slot.step > published + 1:
                    if not self._may_commit_early(slot.step):
                        break
                    early = True
                for worker in range(self.exchange.num_workers):
                    after_published = self.policy.validates and not early
                    if not self.exchange.ready(slot, worker, published, after_published):
                        continue
                    if not early:
                        self._commit(slot.step, worker)
                        changed = True
                    elif (slot.step, worker) not in self.unsure:
                        changed = self._commit_early(slot.step, worker) or changed
            step = self.publisher.published_through + 1
            if self.exchange.complete(step):
                self._publish(step)
                changed = True
            elif self.exchange.asked(step) and step not in self.publisher.early:
                first = self.exchange.first(step)
                if first is not None:
                    self._publish_first(step, first)
                    changed = True

    def await_next(self, timeout: float) -> bool:
        """Block until the next step's first part (where it was asked for and is not published yet) or its whole
        exchange arrives, if every local worker has sent its part (only a remote transport blocks: the other ranks
        may still compute); returns whether it waited."""
        step = self.publisher.published_through + 1
        if not self.exchange.all_sent(step):
            return False
        if self.exchange.asked(step) and step not in self.publisher.early:
            self.exchange.wait_first(step, timeout)
        else:
            self.exchange.wait(step, timeout)
        return True

    def check_drained(self) -> None:
        """Raise unless every staged step is published and no exchange is in flight (a task that read but was not
        staged, or a worker's incomplete step, leaves its step open)."""
        if self.shadow.open_slots() or self.exchange.in_flight():
            steps = [slot.step for slot in self.shadow.open_slots()]
            raise RuntimeError(f"drain: steps {steps} are not published (every worker must finish its tasks first)")

    def publish(self, step: int, tables: PrimitiveTables, timeout: float) -> None:
        """Apply selective Adam to the union of ``step``'s active rows, accumulate every worker's task statistics
        (worker order, then task order), advance the rows' versions and free the slot. Publications run in step
        order; WAW and WAR hold by construction (``publication.py``)."""
        self.publisher.check_order(step)
        start = self.meter.timeline.now()
        merged = self.exchange.collect(step, timeout)
        with self._publication():
            rows, means, scales = self.publisher.apply(step, merged, tables.seq)
        self.index.update(rows, means, scales)
        slot = self.shadow.free(step)
        ops.settle_rows(tables, merged.rows, slot.declared_sets(), step)
        for key in slot.candidates:
            self.log.forget(key)
        self.validator.published(step, merged.rows)
        self.unsure = {part for part in self.unsure if part[0] > step + 1}
        self.publisher.done(step, merged.rows)
        self.meter.counters.publications += 1
        self.meter.decide("publish", step)
        self.meter.timeline.record("publish", -1, step, start, {"rows": merged.rows.numel()})

    def publish_first(self, step: int, first: FirstPart, tables: PrimitiveTables) -> None:
        """Apply selective Adam to the first part of the next step (the rows the workers' next tasks asked for)
        before the rest of its update has arrived; the step's other rows stay pending (exactly known now) until
        :meth:`publish`. A read then sees these rows' new values; validation knows it (``ReadRecord.early``)."""
        start = self.meter.timeline.now()
        with self._publication():
            rows, means, scales = self.publisher.apply_first(step, first, tables.seq)
        self.index.update(rows, means, scales)
        self.meter.counters.first_publications += 1
        self.meter.decide("publish_first", step)
        self.meter.timeline.record("publish", -1, step, start, {"rows": rows.numel(), "first": True})

    @contextlib.contextmanager
    def _publication(self) -> Iterator[None]:
        """Mark a publication writing the model (:attr:`publishing` odd meanwhile), for gathers beside it."""
        self.publishing += 1
        try:
            yield
        finally:
            self.publishing += 1

    def _keys(self, step: int, worker: int) -> list[TaskKey]:
        """The worker's staged tasks of ``step``, in task order."""
        return sorted(k for k in self.shadow.slot(step).staged if k[1] == worker)

    def _commit(self, step: int, worker: int) -> None:
        """Validate the worker's tasks of ``step`` on the synchronous state, re-run failures, start the exchange."""
        for key in self._keys(step, worker):
            if not self.policy.validates:
                self.log.final(key)
                continue
            task = self.log.tasks[key]
            failures, escaped = self.validator.validate(task, self.log.reads[key])
            self.meter.count_failures(failures)
            rerun = bool(failures) and self.policy.reruns(failures)
            if self.policy.settled(key, rerun):
                self.meter.counters.stale.kept += 1
            if rerun:
                self.meter.counters.reruns += 1
                self.meter.decide("rerun", step, worker, task.view)
                self._rerun(task, escaped)
            self.log.final(key)
        self.meter.decide("commit", step, worker, False)
        self._send(step, worker)

    def _send(self, step: int, worker: int) -> None:
        """Start the exchange of the worker's staged part of ``step`` (densified for a policy that reads every
        row), asking for the rows of its next tasks first."""
        update = self.shadow.local_update(step, worker, self.params)
        if self.policy.reads_every_row:
            update = densified(update, self.params["means"].shape[0])
        self.exchange.start(step, worker, update, self.asked_rows(step, worker))

    def _may_commit_early(self, step: int) -> bool:
        """Whether ``step`` may be committed before the step before it is wholly published: that step is the next
        to publish and its first part is published, in a mode that commits early."""
        before = self.publisher.published_through + 1
        return self.policy.commits_early and step == before + 1 and before in self.publisher.early

    def _commit_early(self, step: int, worker: int) -> bool:
        """Commit the worker's tasks of ``step`` while the rest of step - 1 is still on its way, if every read is
        surely valid whatever that rest holds (``Validator.surely_valid``); else leave it for :meth:`_commit` once
        step - 1 is published. Two exchanges are then in flight. Returns whether it committed."""
        early = self.publisher.early[step - 1]
        reach = self.index.reach(*self.publisher.rest_movement())
        keys = self._keys(step, worker)
        for key in keys:
            if not self.validator.surely_valid(self.log.tasks[key], self.log.reads[key], step - 1, early, reach):
                self.unsure.add((step, worker))
                return False
        for key in keys:
            self.log.final(key)
        self.meter.counters.early_commits += 1
        self.meter.decide("commit", step, worker, True)
        self._send(step, worker)
        return True

    def ask(self, tasks: Sequence[Task]) -> None:
        """This process's tasks of a coming step: the exchange of the step before theirs asks for their rows."""
        for task in tasks:
            self.upcoming.setdefault(task.step, []).append(task)

    def asked_rows(self, step: int, worker: int) -> Tensor | None:
        """The rows ``worker``'s exchange of ``step`` asks for first: the candidate sets, on the current state, of
        its upcoming tasks of step + 1 that have not read yet (None without priority publication, or without such a
        task: then only the other workers' asks make a first part)."""
        if not self.asks_first:
            return None
        for earlier in [s for s in self.upcoming if s <= step]:
            del self.upcoming[earlier]
        tasks = [t for t in self.upcoming.get(step + 1, []) if t.worker == worker and t.key not in self.log.tasks]
        if not tasks:
            return None
        device = self.params["means"].device
        # C(t) as the task's read will cull it, in the fused op (no write sets: nothing to check here)
        return union_sorted([self.index.candidates_and_conflicts(task, ())[0] for task in tasks], device)
