"""The sharded mode's training loop: one schedule step per iteration, the same exchanges in the same order on every
rank (``runtime/sharding.py`` says what each side does).

Per step s, every rank: (1) the rest of step s's rows, if step s was fetched ahead (quality), else the whole fetch;
(2) in quality-first, step s + 1's clean part and each of its tasks' "unsure" flag, fetched before step s is
published; (3) its tasks of step s rendered; (4) the return of step s started; (5) while it travels, the tasks of
step s + 1 that no owner is unsure of (running ahead of the publication, exact); (6) the owners' publication of step
s. Barrier fetches step s + 1 only after (6): Grendel's synchronization, the reference.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from odin_nerfstudio.core.batch_gain import AdaptiveGain, merged_squared_norms, row_squared_norms
from odin_nerfstudio.core.sparse import SparseUpdate
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.runtime.resharding import restructure
from odin_nerfstudio.runtime.sharding import FetchedStep, Owner, Reader, RowExchange, RowHandle, Rows, ShardCounters

SHARDED_MODES = ("barrier", "quality")
"""The modes the sharded loop runs."""


@dataclass
class ShardedLoop:
    """Runs schedule steps on one rank of a sharded run.

    Attributes:
        owner: this rank's shard.
        reader: this rank's side of its own tasks.
        exchange: the row all-to-all between the ranks.
        rank: this rank (its tasks are ``step_tasks(step)[rank]``).
        step_tasks: step -> every rank's tasks of the step, in task order (the global schedule).
        mode: "barrier" or "quality".
        last_step: the run's last step (nothing is fetched ahead of it).
        timeout_s: the longest any exchange is waited for.
        gain: the adaptive batch rule (``core/batch_gain.py``), or None: after each publication every rank gathers
            the merged gradient's row norms (global-id order) and the ranks' tasks' norms (rank order), so every
            owner sets the gain the replicated publication sets, bit for bit.
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

    def __post_init__(self) -> None:
        if self.mode not in SHARDED_MODES:
            raise ValueError(f"the sharded mode runs {' or '.join(SHARDED_MODES)}, not {self.mode!r}")
        self.counters = ShardCounters()
        self._ahead: dict[int, tuple[FetchedStep, list[list[bool]]]] = {}

    def iteration(self, step: int, may_run_ahead: bool = True) -> None:
        """Run step ``step`` on this rank (see the module); ``may_run_ahead``: nothing after it needs its
        synchronous state (a structural change does: the caller's to say, the same on every rank)."""
        tasks = self.step_tasks(step)
        fetched = self._fetch(step, tasks)
        ahead = None
        if self.mode == "quality" and may_run_ahead and step < self.last_step:
            ahead = self._fetch_clean(step + 1)
        held = fetched.nbytes + (0 if ahead is None else ahead.nbytes)
        self.counters.peak_fetched_bytes = max(self.counters.peak_fetched_bytes, held)
        for task in tasks[self.rank]:
            if task.index not in fetched.started:
                self._run(fetched, task)
        returns, stats, norms = self.reader.returns(step, self.rank)
        self.counters.rows_returned += sum(int(piece["ids"].numel()) for piece in returns)
        handle = self.exchange.start(returns, f"return of step {step}")
        stats_handle = self.exchange.start(stats, f"statistics of step {step}") if self.reader.keeps_stats else None
        if ahead is not None:
            for task in self.step_tasks(step + 1)[self.rank]:
                if not ahead.unsure[task.index]:
                    self._run(ahead, task)
                    self.counters.ran_ahead += 1
        received_stats = () if stats_handle is None else self._wait(stats_handle, step, "return")
        parts = self._wait(handle, step, "return")
        start = self.reader.meter.timeline.now()
        merged = self.owner.publish(step, parts, received_stats)
        self.reader.meter.timeline.record("publish", -1, step, start, {"rows": merged.rows.numel()})
        self.counters.publications += 1
        if self.gain is not None:
            self._observe_gain(step, merged, norms)

    def _observe_gain(self, step: int, merged: SparseUpdate, norms: Tensor | None) -> None:
        """The adaptive batch rule after ``step``'s publication, from every owner's rows and every rank's tasks."""
        row_norms = row_squared_norms(merged.grads)
        device = row_norms.device
        none = torch.zeros(1, row_norms.shape[1], dtype=torch.float64, device=device)
        measured = none if norms is None else norms[None]
        everyone = [{"rows": row_norms}] * self.owner.cuts.num_shards
        parts = self._wait(self.exchange.start(everyone, f"gradient norms of step {step}"), step, "return")
        tasks = [{"norms": measured, "any": torch.tensor([norms is not None], device=device)}] * len(everyone)
        views = self._wait(self.exchange.start(tasks, f"task norms of step {step}"), step, "return")
        if not any(bool(part["any"][0]) for part in views):
            return
        summed = merged_squared_norms(torch.cat([part["rows"] for part in parts]))
        total = torch.zeros_like(summed)
        for part in views:
            total.add_(part["norms"][0])
        names = list(merged.grads)
        self.gain.observe(self.owner.optimizers, dict(zip(names, zip(summed.tolist(), total.tolist()))))

    def restructure(self, strategy: Any, step: int, seed: int, views: Sequence[Task] = ()) -> None:
        """The structural change after ``step`` (densify, prune, reset; re-order, re-cut, move rows), on every rank
        once ``step`` is published and nothing of later steps was fetched (``runtime/resharding.py``); ``views``:
        one task per training view, whose candidate sets weigh the rows for the cut."""
        if self._ahead:
            raise RuntimeError(f"restructure after step {step}: steps {sorted(self._ahead)} were fetched ahead")
        recut = restructure(self.owner, self.reader, self.exchange, strategy, step, seed, self.timeout_s, views)
        self.counters.recuts += int(recut)
        self.counters.restructures += 1

    def _run(self, fetched: FetchedStep, task: Task) -> None:
        """Render, back-propagate and stage one of this rank's tasks."""
        self.counters.task_rows += int(((fetched.masks >> task.index) & 1).sum())
        self.reader.run(fetched, task)

    def _fetch(self, step: int, tasks: Sequence[Sequence[Task]]) -> FetchedStep:
        """Step ``step``'s rows for this rank's tasks, every earlier step published: the whole read, or the rest
        of a read fetched ahead."""
        if step not in self._ahead:
            pieces = self.owner.serve(self.owner.cull(step, tasks))
            received = self._exchange(pieces, f"fetch of step {step}", step)
            return FetchedStep.of(received, self.owner.params, [False] * len(tasks[self.rank]))
        fetched, unsure = self._ahead.pop(step)
        rest = self.owner.serve(self.owner.cull_rest(step, tasks, unsure))
        fetched.add(self._exchange(rest, f"fetch of the rest of step {step}", step), self.owner.params)
        return fetched

    def _fetch_clean(self, step: int) -> FetchedStep:
        """Step ``step``'s clean part, before step - 1 is published, and each of this rank's tasks' unsure flag
        (set where any owner may still send rows of it); kept for :meth:`_fetch`."""
        tasks = self.step_tasks(step)
        clean, unsure = self.owner.cull_clean(step, tasks)
        received = self._exchange(self.owner.serve(clean), f"fetch of the clean part of step {step}", step - 1)
        device = self.owner.params["means"].device
        flags = [{"ids": torch.tensor(doubt, dtype=torch.int64, device=device).reshape(-1)} for doubt in unsure]
        doubts = self._exchange(flags, f"unsure flags of step {step}", step - 1)
        mine = torch.stack([d["ids"] for d in doubts]).any(dim=0)
        fetched = FetchedStep.of(received, self.owner.params, [bool(flag) for flag in mine.reshape(-1).tolist()])
        self._ahead[step] = (fetched, unsure)
        return fetched

    def _exchange(self, pieces: Sequence[Rows], what: str, step: int) -> list[Rows]:
        """One all-to-all of row tables during ``step``, waited for; counts the rows served and fetched."""
        received = self._wait(self.exchange.start(pieces, what), step, "fetch")
        if pieces and "masks" in pieces[0]:
            self.counters.rows_served += sum(int(piece["ids"].numel()) for piece in pieces)
            self.counters.rows_fetched += sum(int(part["ids"].numel()) for part in received)
        return received

    def _wait(self, handle: RowHandle, step: int, reason: str) -> list[Rows]:
        """Wait for an exchange of ``step`` (bounded by ``timeout_s``): a "wait" span with its ``reason`` (fetch,
        return) on this rank's timeline; its bytes, where the exchange counts them, in the counters."""
        timeline = self.reader.meter.timeline
        start = timeline.now()
        received = handle.wait(self.timeout_s)
        timeline.record("wait", self.rank, step, start, {"reason": reason})
        spent = getattr(getattr(handle, "handle", None), "bytes", None)
        if spent is not None:
            self.counters.bytes_sent += spent.sent
            self.counters.bytes_received += spent.received
        return received
