"""The sharded mode's training loop: one schedule step per iteration, the same exchanges in the same order on every
rank (``runtime/sharding.py`` says what each side does).

Per step s, every rank: (1) the rest of step s's rows, if step s was fetched ahead (quality, throughput), else the
whole fetch, with the clean part of step s + 1 riding on it (each of its tasks with an "unsure" flag; on an
exchange of its own where step s fetches nothing); (2) in quality-first with ``fetch_ahead`` > 1, the clean parts
of the steps after s + 1 up to s + ``fetch_ahead`` (at most K - 1: a step is read once the step K before it is
published) culled before step s is published; (3) its tasks of step s rendered; (4) the return of step s started,
carrying the clean parts culled in (2), then the clean parts that came earlier taken; (5) quality-first's early
publication: where the only doubt about a task of step s + 1 is its own rank's owner's, about rows that only that
rank's tasks of step s write, the owner publishes those rows from its own part at once and the task takes the
rest of its rows from it, with no exchange (``Owner.publish_early``: the same bits); (6) while the return
travels, the tasks of the steps fetched ahead that no owner is unsure of start rendering on the lane (running
ahead of the publications, exact), only step s + 1's where its rest is to be fetched, so that the lane is free
for the tasks waiting for that rest; (7) as soon as the return arrives, the owners' publication of step s, and
then the next step's exchange, beside the lane's render: every rank waits for that exchange, and a rank that
waited for its render first would hold every rank back. Barrier fetches step s + 1 only after (7): Grendel's
synchronization, the reference. The unsure flags of every task go to every rank, so every rank knows when no owner
held anything back and all skip the fetch of the rest alike (the same exchanges in the same order on every rank,
whatever each one's tasks). Throughput-first looks one step ahead (K = 2's order).

A step's small tables ride on its row exchanges as side tables (``comm/all_to_all.py``), since every exchange pairs
all ranks and pays a message latency: the densification statistics and the adaptive batch rule's per-task norms on
the return, and the norms of the rows each owner published in step s - 1 on the first exchange of step s (its
fetch, or its return where it fetches nothing), so the gain of step s is set before its early publication
(``drivers/sharded_gain.py``). The barrier thus makes two exchanges a step. Where something after
step s needs its synchronous state (a structural change, a checkpoint, an evaluation, the last step), the gain of
step s is set at once, with an exchange of its own. Until the gain of step s is set, the owners bound the movement
of its publication with the largest gain the rule may set.

Throughput-first adds bounded stale reads: with step s + 1's clean part come the rows of the unsure tasks' C(t) that
step s may write, at their values before it, and each task's count of them; a task whose share of such rows is at
most ``stale_fraction`` (and ``max_staleness`` >= 1) runs ahead on them (every rank decides for every task, from
the same flags). When step s's gradients reach an owner, it applies the gradient rule to the rows read stale there
(``Owner.judge``: magnitude below ``stale_grad_ratio`` x the mean over the step's rows it holds); a task that fails
anywhere is re-run on the published state in the next iteration, with the rest of its rows.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from odin_nerfstudio.comm.all_to_all import main_of, side_of, with_side
from odin_nerfstudio.core.batch_gain import AdaptiveGain
from odin_nerfstudio.core.sparse import SparseUpdate
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.drivers.ahead_lane import AheadLane
from odin_nerfstudio.drivers.placed_steps import PlacedSteps
from odin_nerfstudio.drivers.fetched_ahead import (
    Ahead,
    Carrier,
    CleanPart,
    doubt_flags,
    flat,
    none_of,
    per_rank,
    settled_locally,
    unflat,
    waiting,
)
from odin_nerfstudio.drivers.sharded_gain import ShardedGain
from odin_nerfstudio.runtime.lanes import LaneExecutor, ThreadExecutor
from odin_nerfstudio.runtime.placement import Placement
from odin_nerfstudio.runtime.resharding import restructure
from odin_nerfstudio.runtime.shard_reader import FetchedStep, Reader
from odin_nerfstudio.runtime.sharding import (
    LearningRates,
    Owner,
    RowExchange,
    RowHandle,
    Rows,
    ShardCounters,
)

SHARDED_MODES = ("barrier", "quality", "throughput")
"""The modes the sharded loop runs."""


@dataclass
class ShardedLoop:
    """Runs schedule steps on one rank of a sharded run.

    Attributes:
        owner: this rank's shard.
        reader: this rank's side of its own tasks.
        exchange: the row all-to-all between the ranks.
        rank: this rank (without a placement, its tasks are ``step_tasks(step)[rank]``).
        step_tasks: step -> every schedule worker's tasks of the step, in task order (the global schedule).
        mode: one of :data:`SHARDED_MODES`.
        last_step: the run's last step (nothing is fetched ahead of it).
        timeout_s: the longest any exchange is waited for.
        gain: the adaptive batch rule (``core/batch_gain.py``), or None: after each publication every rank gathers
            the merged gradient's row norms (global-id order) and the ranks' tasks' norms (worker order), so every
            owner sets the gain the replicated publication sets, bit for bit.
        stale_fraction, stale_grad_ratio, max_staleness: throughput-first's bounds (``OdinRuntimeConfig``'s).
        rates: the learning rates of the publications to come (a scheduler's), which bound how far the rows of
            the steps fetched ahead of may move; default: the current ones.
        settles: step -> whether something after it needs its synchronous state (a structural change, a
            checkpoint, an evaluation: the caller's to say, the same on every rank); nothing is fetched ahead
            across such a step, and its gain is set at once.
        executor: where the tasks run ahead render (a thread beside the loop's, or a simulation's virtual lane), so
            that the loop publishes and starts the next exchange when the return arrives, not when a render ends.
        fetch_ahead: quality-first's steps fetched ahead (``OdinRuntimeConfig.fetch_ahead``), at most K - 1.
        placement_by_time: the placement evens out the ranks' measured time, each rank's riding on the returns
            (``OdinRuntimeConfig.placement_by_time``), else their candidate rows.
    """

    owner: Owner
    reader: Reader
    exchange: RowExchange
    rank: int
    step_tasks: Callable[[int], Sequence[Sequence[Task]]]
    mode: str
    last_step: int
    timeout_s: float
    gain: AdaptiveGain | None = None
    stale_fraction: float = 0.2
    stale_grad_ratio: float = 0.2
    max_staleness: int = 4
    settles: Callable[[int], bool] = lambda step: False
    rates: LearningRates | None = None
    executor: LaneExecutor = field(default_factory=lambda: ThreadExecutor(1))
    fetch_ahead: int = 1
    placement_by_time: bool = True

    def __post_init__(self) -> None:
        if self.mode not in SHARDED_MODES:
            raise ValueError(f"the sharded mode runs {', '.join(SHARDED_MODES)}, not {self.mode!r}")
        self.counters = ShardCounters()
        depth = {"barrier": 0, "throughput": 1, "quality": min(self.fetch_ahead, self.ring_slots - 1)}
        self.depth = depth[self.mode]
        """How many steps past the one being published are fetched ahead: quality-first's ``fetch_ahead``, at most
        K - 1 (a step is read once the step K before it is published, as in the replicated mode); throughput-first's
        stale reads are judged against the step just before, so it looks one step ahead."""
        self._gain = ShardedGain(self.gain, self.owner)
        self._inflight: dict[int, CleanPart] = {}
        """Per step whose clean part is on its way, the exchange carrying it."""
        self._ahead: dict[int, Ahead] = {}
        self._lane = AheadLane(self.executor, self.rank, self.timeout_s)
        self._placed = PlacedSteps(self.step_tasks, self.reader.meter.timeline, self.counters)

    def place(self, views: Sequence[Task]) -> None:
        """Place the workers by rows owned (``runtime/placement.py``): every owner counts its rows in each view's
        candidate set (``views``: one task per training view) and every rank gets every owner's counts; on every
        rank at once, after the shards are cut or re-cut (the ranks' loads carried on), with no step begun."""
        seen = self.owner.rows_seen(views)
        size = max((view.view for view in views), default=-1) + 1
        counts = torch.zeros(size, dtype=torch.int64, device=seen.device)
        counts[torch.tensor([view.view for view in views], dtype=torch.int64, device=seen.device)] = seen
        parts = self._everyone(counts, "rows seen per view", -1)
        lag = self.ring_slots if self.placement_by_time else None  # step s is placed once step s - K is published
        self._placed.place(torch.stack(parts, dim=1), lag)

    @property
    def placement(self) -> Placement | None:
        """Whether each step's workers run on the ranks that own most of their rows (``runtime/placement.py``; set
        by :meth:`place`), else worker w on rank w. The owners sum in worker order either way."""
        return self._placed.placement

    @property
    def ring_slots(self) -> int:
        """K, the steps the reader may hold staged at once."""
        return self.reader.shadow.ring_slots

    def iteration(self, step: int) -> None:
        """Run step ``step`` on this rank (see the module)."""
        tasks = self._placed.tasks(step)
        fetched, riding = self._fetch(step, tasks)  # later steps' clean parts culled, to ride on the return
        self._lane.join()
        for task in tasks[self.rank]:
            if task.index not in fetched.started:
                self._run(fetched, task)
        returns, stats, norms = self.reader.returns(step, self._placed.worker(step, self.rank))
        self.counters.rows_returned += sum(int(piece["ids"].numel()) for piece in returns)
        pieces = self._return_pieces(step, returns, stats, norms)
        for clean in riding:  # the clean parts of the steps after step + 1 ride on the return
            pieces = clean.pieces(pieces)
        carrier = self._start(pieces, f"return of step {step}")
        for clean in riding:
            clean.carrier = carrier
        for ahead_step in sorted(self._inflight):
            if self._inflight[ahead_step].carrier is not carrier:  # those on this return come with it
                self._finish_clean(self._inflight.pop(ahead_step))
        self._publish_early(step, returns[self.rank])
        held = fetched.nbytes + sum(ahead.fetched.nbytes for ahead in self._ahead.values())
        self.counters.peak_fetched_bytes = max(self.counters.peak_fetched_bytes, held)
        self._start_lane(step)
        by_rank = self._carried(carrier, step, "return")
        start = self.reader.meter.timeline.now()
        parts = self._placed.worker_order(step, by_rank)
        received_stats = [side_of(part, "stats") for part in parts] if self.reader.keeps_stats else ()
        merged = self.owner.publish(step, [main_of(part) for part in parts], received_stats)
        self.reader.meter.timeline.record("publish", -1, step, start, {"rows": merged.rows.numel()})
        ahead = self._ahead.get(step + 1)
        if ahead is not None and ahead.admitted is not None:
            ahead.failed = self.owner.judge(step + 1, merged, self.stale_grad_ratio)
        self.counters.publications += 1
        self._gain.published(step, merged, parts)
        if self.gain is not None and (self.settles(step) or step >= self.last_step):  # what follows needs its gain
            self._flush_gain()
        self._placed.arrived(step, by_rank)

    def _start_ahead(self, step: int, fetch: list[Rows] | None) -> tuple[list[CleanPart], CleanPart | None]:
        """Cull the clean parts of the steps after ``step`` up to ``depth`` ahead (not past the last step nor across
        a step that settles) that are not on their way yet. Step + 1's runs ahead in this iteration: it rides on
        ``fetch`` (step ``step``'s fetch, about to start: one exchange's latency saved) and is returned second, or
        where step ``step`` fetches nothing it starts now on an exchange of its own. The later ones are returned
        first, to ride on this step's return (they run ahead in a later iteration, and a return is on its way)."""
        riding, first = [], None
        for ahead_step in range(step + 1, min(step + self.depth, self.last_step) + 1):
            if self.settles(ahead_step - 1):
                break
            if ahead_step in self._inflight or ahead_step in self._ahead:
                continue
            if ahead_step == step + 1 and fetch is None:
                clean = self._cull_ahead(ahead_step, "")
                clean.carrier = self._start(clean.pieces(), f"fetch of the clean part of step {ahead_step}")
            else:
                clean = self._cull_ahead(ahead_step, f"ahead{ahead_step}")
                if ahead_step == step + 1:
                    first = clean
                else:
                    riding.append(clean)
            self._inflight[ahead_step] = clean
        return riding, first

    def _start(self, pieces: list[Rows], what: str) -> Carrier:
        """Start an exchange of ``pieces`` (``what`` names it); the row norms of a published step whose gain is not
        set ride on it where they have not left yet (``drivers/sharded_gain.py``)."""
        pieces, riding = self._gain.riding(pieces)
        carrier = Carrier(self.exchange.start(pieces, what))
        if riding:
            self._gain.started(carrier)
        return carrier

    def _carried(self, carrier: Carrier, step: int, reason: str) -> list[Rows]:
        """What ``carrier`` brought, waited for once (during ``step``, for ``reason``); a gain whose row norms rode
        on it is set."""
        if carrier.parts is None:
            carrier.parts = self._wait(carrier.handle, step, reason)
            self._gain.arrived(carrier)
        return carrier.parts

    def _start_lane(self, step: int) -> None:
        """Start rendering, on the lane, this rank's tasks of the steps fetched ahead that may run before the steps
        before them are published (those no owner is unsure of, and in throughput-first those admitted to read
        stale), while step ``step``'s return travels. The loop meanwhile publishes step ``step`` and starts the next
        exchange as soon as the return arrives: every rank waits for that exchange, so a rank must not hold it back
        by a render. Where step + 1's rest is to be fetched, only step + 1's tasks run ahead, so that the lane is
        free for the tasks waiting for that rest once it arrives."""
        following = self._ahead.get(step + 1)
        rest_next = following is not None and not none_of(following.rest_needed())
        work = []
        for ahead_step in sorted(self._ahead):
            if rest_next and ahead_step > step + 1:
                break
            ahead = self._ahead[ahead_step]
            for task in self._placed.tasks(ahead_step)[self.rank]:
                if task.index in ahead.fetched.started:
                    continue
                if ahead.fetched.unsure[task.index]:
                    if ahead.admitted is None or not ahead.admitted[self.rank][task.index]:
                        continue
                    work.append((ahead.stale, ahead.fetched, task))
                    self.counters.stale_reads += int(ahead.held[task.index] > 0)
                else:
                    work.append((ahead.fetched, None, task))
                self.counters.ran_ahead += 1
                self.counters.most_ahead = max(self.counters.most_ahead, ahead_step - 1 - self.owner.published_through)
        if work:
            self._lane.start(step, lambda: self._render_ahead(work))

    def _render_ahead(self, work: list[tuple[FetchedStep, FetchedStep | None, Task]]) -> None:
        """The lane's work: render each task on its rows (a stale read's are the clean part joined with the rows
        at their values before the step before; it counts as started in the step's fetch too)."""
        for rows, fetched, task in work:
            self._run(rows, task)
            if fetched is not None:
                fetched.started.add(task.index)

    def close(self) -> None:
        """Wait for the lane's renders and stop its thread (at the end of a run)."""
        self._lane.close()

    def _return_pieces(self, step: int, returns: list[Rows], stats: list[Rows], norms: Tensor | None) -> list[Rows]:
        """The return of ``step`` to every owner: its gradient rows, and as side tables the tasks' statistics in the
        owner's rows, the rank's time spent on its tasks (where placed: ``RankLoads``) and, for the adaptive rule,
        the tasks' squared norms."""
        if self.reader.keeps_stats:
            returns = [with_side(piece, "stats", entries) for piece, entries in zip(returns, stats, strict=True)]
        returns = self._placed.with_spent(step, returns, self.owner.params["means"].device)
        return self._gain.task_norms(returns, norms)

    def _flush_gain(self) -> None:
        """Set the pending step's gain now: every owner's row norms gathered by an exchange of their own."""
        pending = self._gain.pending
        self._gain.observe(
            self._everyone(pending.rows, f"gradient norms of step {pending.step}", pending.step, "return")
        )

    def _publish_early(self, step: int, own_part: Rows) -> None:
        """Where this rank's tasks of step + 1 wait only for rows of its own shard that only its own tasks of step
        ``step`` write (``Ahead.local``): the owner publishes those rows now, from ``own_part`` (this rank's
        gradients in its shard), and the tasks get the rest of their rows from it, with no exchange; they then run
        ahead on the lane while the return travels (``Owner.publish_early``)."""
        ahead = self._ahead.get(step + 1)
        if ahead is None or not ahead.local:
            return
        timeline = self.reader.meter.timeline
        start = timeline.now()
        rows = self.owner.publish_early(step, own_part)
        timeline.record("publish", -1, step, start, {"rows": rows, "first": True})
        culled = self.owner.cull_local(step + 1, self._placed.tasks(step + 1), ahead.local)
        served = self.owner.serve(culled)  # rows for this rank only: served and received here
        ahead.fetched.add([self._counted(served, served)[self.rank]], self.owner.params, ahead.local)
        self.counters.published_early += 1
        self.counters.settled_locally += len(ahead.local)

    def restructure(self, strategy: Any, step: int, seed: int, views: Sequence[Task] = ()) -> None:
        """The structural change after ``step`` (densify, prune, reset; re-order, re-cut, move rows), on every rank
        once ``step`` is published and nothing of later steps was fetched (``runtime/resharding.py``); ``views``:
        one task per training view, whose candidate sets weigh the rows for the cut."""
        self.settled(f"the restructure after step {step}")
        recut = restructure(self.owner, self.reader, self.exchange, strategy, step, seed, self.timeout_s, views)
        self.counters.recuts += int(recut)
        self.counters.restructures += 1
        if self.placement is not None:  # rows moved: count again where each view's rows live
            self.place(views)

    def settled(self, what: str) -> None:
        """Join the lane and check that no step after the last published one was begun (fetched ahead or placed),
        before ``what`` (a structural change, a re-balance of the schedule) changes what later steps read."""
        self._lane.join()
        begun = sorted({*self._ahead, *self._inflight, *self._placed.ranks_of})
        if begun:
            raise RuntimeError(f"{what}: steps {begun} were begun ahead of it")

    def _run(self, fetched: FetchedStep, task: Task) -> None:
        """Render, back-propagate and stage one of this rank's tasks."""
        self.counters.task_rows += int(((fetched.masks >> task.index) & 1).sum())
        self.reader.run(fetched, task)

    def _fetch(self, step: int, tasks: Sequence[Sequence[Task]]) -> tuple[FetchedStep, list[CleanPart]]:
        """Step ``step``'s rows for this rank's tasks, every earlier step published: the whole read, or the rest
        of a read fetched ahead (for the tasks that waited, and those read stale that must be re-run); and the
        clean parts of later steps that are to ride on its return (:meth:`_start_ahead`)."""
        if step not in self._ahead:
            pieces = self.owner.serve(self.owner.cull(step, tasks))
            received, riding = self._fetch_with_ahead(step, pieces, f"fetch of step {step}")
            return FetchedStep.of(received, self.owner.params, [False] * len(tasks[self.rank])), riding
        ahead = self._ahead.pop(step)
        need, anyone = ahead.unsure, ahead.anyone
        reruns: list[int] = []
        if ahead.admitted is not None:
            failed = [[False] * len(t) for t in tasks]
            if not none_of(ahead.admitted):  # no verdicts to gather where no task read stale
                local = ahead.failed if ahead.failed is not None else failed
                device = self.owner.params["means"].device
                verdicts = self._everyone(flat(local, device), f"stale-read verdicts of step {step}", step)
                failed = unflat(torch.stack(verdicts).any(dim=0), tasks)
            need, anyone = (waiting(flags, ahead.admitted, failed) for flags in (ahead.unsure, ahead.anyone))
            reruns = [index for index, rerun in enumerate(failed[self.rank]) if rerun]
        fetched = ahead.fetched

        def joined() -> None:  # the lane's tasks done: a failed stale read is to run again
            self._lane.join()
            for index in reruns:
                fetched.started.discard(index)
                self.counters.reruns += 1

        rest = self.owner.cull_rest(step, tasks, need)
        if none_of(anyone):  # every rank skips the exchange alike where no owner holds back a row
            riding, _ = self._start_ahead(step, None)
            joined()
            return fetched, riding

        def render_sure() -> None:  # while the rest travels, the tasks that need none of it
            joined()
            for task in tasks[self.rank]:
                if task.index not in fetched.started and not anyone[self.rank][task.index]:
                    self._run(fetched, task)

        what = f"fetch of the rest of step {step}"
        received, riding = self._fetch_with_ahead(step, self.owner.serve(rest), what, render_sure)
        fetched.add(received, self.owner.params)
        self.counters.rest_fetches += 1
        return fetched, riding

    def _fetch_with_ahead(
        self, step: int, pieces: list[Rows], what: str, meanwhile: Callable[[], None] = lambda: None
    ) -> tuple[list[Rows], list[CleanPart]]:
        """One fetch of ``step`` (``pieces`` served) with step + 1's clean part riding on it, ``meanwhile`` run
        while it travels, then waited for: the rows received, and the clean parts to ride on the return."""
        riding, first = self._start_ahead(step, pieces)
        carrier = self._start(pieces if first is None else first.pieces(pieces), what)
        if first is not None:
            first.carrier = carrier
        meanwhile()
        parts = self._carried(carrier, step, "fetch")
        return self._counted(pieces, [main_of(part) for part in parts]), riding

    def _cull_ahead(self, step: int, tag: str) -> CleanPart:
        """Cull step ``step``'s clean part, before step - 1 is published, with each of its tasks' unsure flags (set
        where any owner may still send rows of it), and in throughput-first the rows a stale read would read;
        ``tag``: how it travels (:class:`CleanPart`). :meth:`_finish_clean` takes it once it is here."""
        tasks = self._placed.tasks(step)
        # Per publication before ``step``, the gain to bound its movement with where it is not set yet: the first
        # one's waits for the row norms riding on the exchange about to start, the later ones' for steps not
        # published yet.
        unpublished = step - 1 - self.owner.published_through
        gains = [
            None if self.gain is None or (k == 0 and self._gain.is_set) else self.gain.largest
            for k in range(unpublished)
        ]
        clean, unsure, stale, local = self.owner.cull_clean(step, tasks, gains, self.rates)
        served = self.owner.serve(clean)
        flags = doubt_flags(unsure, local, stale, clean, self.owner.params["means"].device)
        stale_served = self.owner.serve(stale) if self.mode == "throughput" else []
        return CleanPart(step, served, unsure, stale, stale_served, flags, tag)

    def _finish_clean(self, pending: CleanPart) -> Ahead:
        """Take a clean part once it is here (counted as a fetch of the step before); in throughput-first, decide
        which unsure tasks read stale (every rank learns which). Kept for :meth:`_fetch`."""
        step = pending.step
        tables = [pending.tables(part) for part in self._carried(pending.carrier, step - 1, "fetch")]
        received = self._counted(pending.served, [rows for rows, _, _ in tables])
        doubts = [flags for _, flags, _ in tables]
        tasks = self._placed.tasks(step)
        # Early publication (quality-first, the step before the next to publish, its gain set): the same on
        # every rank, as are the flags, so every rank knows which tasks it settles.
        early = self.mode == "quality" and self.owner.published_through == step - 2 and self._gain.is_set
        anyone, settled = settled_locally(doubts, tasks, early)
        own = settled[self.rank]
        fetched = FetchedStep.of(received, self.owner.params, [a or s for a, s in zip(anyone[self.rank], own)])
        unsure = [[u and not s for u, s in zip(rank_unsure, rank_settled, strict=True)]
                  for rank_unsure, rank_settled in zip(pending.unsure, settled, strict=True)]
        ahead = Ahead(fetched, unsure, anyone, local=[index for index, s in enumerate(own) if s])
        if self.mode == "throughput":
            # Every rank decides every task's admission from the same sums: no exchange of the decisions.
            rows = self._counted(pending.stale_served, [stale for _, _, stale in tables])
            held = torch.stack([d["held"] for d in doubts]).sum(dim=0).double()
            total = torch.stack([d["total"] for d in doubts]).sum(dim=0).double().clamp(min=1.0)
            share = (held / total).tolist() if held.numel() else []
            doubt = [flag for rank in anyone for flag in rank]
            admitted = [
                flag and self.max_staleness >= 1 and fraction <= self.stale_fraction
                for flag, fraction in zip(doubt, share, strict=True)
            ]
            ahead.admitted = per_rank(admitted, tasks)
            ahead.held = [int(count) for count in per_rank(held.tolist(), tasks)[self.rank]]
            self.owner.admit_stale(step, pending.stale, ahead.admitted)
            ahead.stale = fetched.joined(rows, self.owner.params)
        self._ahead[step] = ahead
        return ahead

    def _everyone(self, values: Tensor, what: str, step: int, reason: str = "fetch") -> list[Tensor]:
        """``values`` (one tensor, [n, ...]) sent to every rank; every rank's, in rank order (its wait counted as a
        ``reason`` wait)."""
        parts = self._wait(self.exchange.start([{"ids": values}] * self.owner.cuts.num_shards, what), step, reason)
        return [part["ids"] for part in parts]

    def _counted(self, served: Sequence[Rows], received: list[Rows]) -> list[Rows]:
        """``received``, the rows a fetch that served ``served`` brought; counts both."""
        self.counters.rows_served += sum(int(piece["ids"].numel()) for piece in served)
        self.counters.rows_fetched += sum(int(part["ids"].numel()) for part in received)
        self.counters.rows_local += int(received[self.rank]["ids"].numel())
        return received

    def _wait(self, handle: RowHandle, step: int, reason: str) -> list[Rows]:
        """Wait for an exchange of ``step`` (bounded by ``timeout_s``): a "wait" span with its ``reason`` (fetch,
        return) on this rank's timeline; its bytes, where the exchange counts them, in the counters."""
        timeline = self.reader.meter.timeline
        start = timeline.now()
        received = handle.wait(self.timeout_s)
        timeline.record("wait", self.rank, step, start, {"reason": reason})
        spent = getattr(handle, "bytes", None)
        if spent is not None:
            self.counters.bytes_sent += spent.sent
            self.counters.bytes_received += spent.received
        return received
