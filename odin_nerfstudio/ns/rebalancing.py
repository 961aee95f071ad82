"""Re-balancing by measured costs: the schedule's later epochs cut by the views' measured render + backward seconds.

The schedule is compiled before training from predicted costs (SfM points and pixels per view), which miss what a
view really costs; a barrier step then waits for its slowest worker. Grendel balances by measured time; so does
odin-splat with ``--pipeline.datamanager.rebalance-every N``: at the first step of every Nth epoch every rank
settles its runtime (every started step published, so no task of the new epoch has read yet; in the sharded mode its
loop, nothing of the epoch fetched ahead: ``ShardedLoop.settled``), adds the render +
backward seconds its tasks measured since the last re-balance to every other rank's (one all-reduce), and the
datamanager trains the epochs from there on by those costs (``OdinDatamanager.rebalance``): the same schedule on
every rank, since every rank holds the same sums. The step before it runs nothing ahead. The costs go into every
checkpoint (:data:`REBALANCE_KEY`), so a resumed run trains the schedule the run it resumes would have.

Each re-balance is written to ``odin_rebalance.json`` (``odin_rebalance_rank<r>.json`` per rank): its epoch, the
tasks measured, a digest of the costs (equal on every rank), how many of the epoch's steps changed, and the epoch's
balance (max / mean worker cost per full step, by the measured costs) as the predicted schedule would have cut it and
as the re-balanced one does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from nerfstudio.utils.rich_utils import CONSOLE

from odin_nerfstudio.comm.distributed import DistributedTransport, require_no_exchange_in_flight
from odin_nerfstudio.core.timeline import Event, SpanCursor, Timeline
from odin_nerfstudio.drivers.step_loop import settle
from odin_nerfstudio.runtime.runtime import OdinRuntime
from odin_nerfstudio.scheduling.balance import ViewTimes, steps_balance

REBALANCE_FILENAME = "odin_rebalance.json"
"""Each re-balance's record, in the run folder (per rank in a distributed run)."""
REBALANCE_KEY = "odin_rebalance"
"""The checkpoint entry holding the last re-balance: ``{"epoch": e, "view_cost": [V] float64}`` (None: none yet)."""


class MeasuredBalance:
    """One process's side of re-balancing: the render + backward seconds its tasks measured since the last
    re-balance, taken from the runtime's timeline, and the re-balance itself (see the module).

    Args:
        datamanager: the run's ``OdinDatamanager`` (its schedule and ``rebalance``).
        record: the JSON file each re-balance is appended to.
        device: where the all-reduce's tensor lives (the model's device: NCCL reduces CUDA tensors).
    """

    def __init__(self, datamanager: Any, record: Path, device: torch.device) -> None:
        self.datamanager = datamanager
        self.every = int(datamanager.config.rebalance_every)
        self.record = record
        self.device = device
        self.times = ViewTimes(datamanager.schedule.num_views)
        self.spans = SpanCursor()
        """This process's place in its timeline: the spans after it are not yet measured."""
        self.history: list[dict[str, Any]] = []
        if self.every and datamanager.rank == 0:  # rank 0 speaks for the job
            steps = self.every * datamanager.schedule.steps_per_epoch
            CONSOLE.print(
                f"odin: the schedule is re-balanced by measured costs every {self.every} epoch(s), every {steps} "
                "step(s); each re-balance first publishes every started step, as a checkpoint does"
            )

    def due(self, step: int) -> bool:
        """Whether the schedule is re-balanced before step ``step`` reads (the first step of every Nth epoch)."""
        epochs, within = divmod(step, self.datamanager.schedule.steps_per_epoch)
        return self.every > 0 and step > 0 and within == 0 and epochs % self.every == 0

    def consume(self, events: Sequence[Event], recorded: int) -> None:
        """Add the render and backward spans of ``events`` not yet consumed (a timeline's window, ``recorded``
        events in all; spans dropped from the window before they were consumed are not measured)."""
        self.times.add_spans(self.spans.take(events, recorded))

    def rebalance(self, step: int, runtime: OdinRuntime, transports: Iterable[DistributedTransport] = ()) -> None:
        """Settle ``runtime`` (the replicated mode's), then :meth:`rebalance_by` its timeline."""
        settle(runtime)
        require_no_exchange_in_flight(f"the re-balance before step {step}", transports)
        self.rebalance_by(step, runtime.timeline)

    def rebalance_by(self, step: int, timeline: Timeline) -> None:
        """Re-balance the epochs from ``step``'s on by every rank's measurements, this rank's from ``timeline`` (a
        collective in a distributed run: every rank calls it at the same step, every step before published and
        nothing of ``step`` or later begun: :meth:`rebalance`, or the sharded loop's ``settled``)."""
        self.consume(timeline.events, timeline.recorded)
        sums = torch.from_numpy(np.stack([self.times.seconds, self.times.count])).to(self.device)
        if dist.is_available() and dist.is_initialized():
            try:
                dist.all_reduce(sums)  # the process group's timeout bounds it (odin-train: ns/launch.py)
            except RuntimeError as error:
                raise RuntimeError(
                    f"rank {dist.get_rank()} did not get every rank's measured costs for the re-balance before step "
                    f"{step} (an all-reduce: a rank stopped, or took longer than the process group's timeout): {error}"
                ) from error
        totals = ViewTimes(self.times.seconds.size)
        totals.seconds, totals.count = sums.cpu().numpy()  # row 0 the seconds, row 1 the counts
        datamanager = self.datamanager
        epoch = step // datamanager.schedule.steps_per_epoch
        # A view no task measured since the last re-balance keeps its cost so far (at the measured scale), so a run
        # resumed right at a re-balance, which has measured nothing yet, keeps the costs it resumed with.
        cost = totals.view_cost(datamanager.schedule.view_cost)
        predicted = datamanager.predicted_schedule.epoch(epoch).steps
        datamanager.rebalance(epoch, cost)
        steps = datamanager.schedule.epoch(epoch).steps
        self.history.append(
            {
                "step": step,
                "epoch": epoch,
                "tasks_measured": int(totals.count.sum()),
                "views_measured": int((totals.count > 0).sum()),
                "views": int(cost.size),
                "cost_digest": hashlib.sha256(cost.tobytes()).hexdigest()[:16],
                "steps_changed": sum(old.tasks != new.tasks for old, new in zip(predicted, steps)),
                "balance_predicted_schedule": steps_balance(predicted, cost),
                "balance_rebalanced": steps_balance(steps, cost),
            }
        )
        self.record.write_text(json.dumps(self.history, indent=1))
        self.times = ViewTimes(cost.size)


def saved_rebalance(datamanager: Any) -> dict[str, Any] | None:
    """The checkpoint's :data:`REBALANCE_KEY` entry: the last re-balance's epoch and costs (None: none yet)."""
    if datamanager.rebalanced is None:
        return None
    epoch, cost = datamanager.rebalanced
    return {"epoch": epoch, "view_cost": cost.tolist()}


def restore_rebalance(datamanager: Any, saved: dict[str, Any] | None) -> None:
    """Train a resumed run by the checkpoint's re-balanced costs (``saved``: its :data:`REBALANCE_KEY` entry)."""
    if saved is not None:
        datamanager.rebalance(int(saved["epoch"]), np.asarray(saved["view_cost"], dtype=np.float64))
