"""Who may read: hook 1's rules, C(t) against the unpublished writes, and dynamic ordering.

The control plane's read rules, one place for them (the runtime drives them on real tensors, the simulator on a
workload's sets): the mode's gates (ring, barrier), the pending writes a read is checked against (the local
tasks' candidate sets or active sets, other processes' predicted writes, the rest of a step whose first part is
published), RAW, the admission of bounded stale reads (throughput-first), and dynamic ordering (a worker's first
task that may read goes first). Acting on a decision (declaring the rows, gathering them) is the runtime's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from odin_nerfstudio.core.conflicts import Conflicts, StepRows, raw
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.runtime.admission import AdmissionPolicy
from odin_nerfstudio.runtime.culling_index import CullingIndex, RemoteTasks
from odin_nerfstudio.runtime.metering import Meter
from odin_nerfstudio.runtime.publication import Publisher
from odin_nerfstudio.runtime.reads import Read, Wait
from odin_nerfstudio.runtime.shadow import ShadowGraph

Admitted = tuple[Tensor, tuple[StepRows, ...]]
"""A read decided: C(t) (sorted int64 [M]) and the stale rows admitted past their pending writes, per step."""


class ReadGate:
    """Decides whether a task may read now (see the module).

    Args:
        policy: the mode's admission policy.
        ring_slots: K.
        publisher, remote, shadow, index, meter: the runtime's parts (what is published, the predicted writes of
            tasks not read here, the staged steps, the candidate sets, the counters).
        params: the model's parameters (the stale-read rule compares gradient sizes; the row count).
    """

    def __init__(
        self,
        policy: AdmissionPolicy,
        ring_slots: int,
        publisher: Publisher,
        remote: RemoteTasks,
        shadow: ShadowGraph,
        index: CullingIndex,
        meter: Meter,
        params: dict[str, Tensor],
    ) -> None:
        self.policy, self.ring_slots = policy, ring_slots
        self.publisher, self.remote, self.shadow, self.index, self.meter = publisher, remote, shadow, index, meter
        self.params = params

    def decide(self, task: Task) -> Admitted | Wait:
        """C(t) and its admitted stale rows if ``task`` may read now, else a :class:`Wait` (counted).

        Unpublished writes: per open step before t's, the local tasks' candidate sets (the active sets once
        staged), and the predicted writes of the tasks other processes run (``RemoteTasks``); for a step whose
        first part is published, the rest of its rows instead of both.
        """
        step, published = task.step, self.publisher.published_through
        gate = self.policy.gate(task, published, self.ring_slots)
        if gate is not None:
            empty = torch.empty(0, dtype=torch.int64, device=self.params["means"].device)
            return self.meter.count_wait(Wait(task, gate[0], gate[1], empty))
        # Once a step's first part is published, its pending writes are exactly the rest of its rows (the first
        # part tells every row it writes), whoever writes them: they replace the local sets and the predictions.
        early = self.publisher.early
        predicted = [w for w in self.remote.writes(step, published) if w.step not in early]
        predicted += [StepRows(s, rows.pending) for s, rows in early.items() if s < step]
        writes = [slot.writes() for slot in self.shadow.open_slots() if slot.step < step and slot.step not in early]
        writes += predicted
        candidate, conflicts = self._candidates_and_conflicts(task, writes)
        if not conflicts.any:
            return candidate, ()
        slots = self.shadow.open_slots()
        admission = self.policy.admit_stale(task, candidate, conflicts, slots, self.params, predicted)
        if admission is None:
            return self.meter.count_wait(Wait(task, "raw", conflicts.wait_step, conflicts.rows))
        admitted, stale = admission
        self.meter.counters.count_stale(stale)
        return candidate, admitted

    def _candidates_and_conflicts(self, task: Task, writes: list[StepRows]) -> tuple[Tensor, Conflicts]:
        """C(t) and its rows with a write in ``writes`` (RAW): culled and checked in one op (the index's
        ``cull_conflicts``), or every row and the check apart for a policy that reads every row."""
        if not self.policy.reads_every_row:
            return self.index.candidates_and_conflicts(task, writes)
        candidate = self.candidates(task)
        return candidate, raw(candidate, task.step, writes)

    def candidates(self, task: Task) -> Tensor:
        """C(t) on the current state: culled by the index, or every row for a policy that reads every row."""
        if self.policy.reads_every_row:
            means = self.params["means"]
            return torch.arange(means.shape[0], dtype=torch.int64, device=means.device)
        return self.index.candidates(task)

    def first_read(self, tasks: Sequence[Task], try_read: Callable[[Task], Read | Wait]) -> Read | Wait:
        """Dynamic ordering: ``try_read`` (hook 1) of one worker's remaining tasks of a step, in task order; the
        first admitted one reads (its gradients are still summed in task order), else the first task's Wait."""
        first_wait = None
        for position, task in enumerate(tasks):
            result = try_read(task)
            if isinstance(result, Wait):
                first_wait = first_wait or result
                continue
            overlapped = task.step - 1 > self.publisher.published_through
            self.meter.read(task, reordered=position > 0, overlapped=overlapped)
            return result
        self.meter.waiting(tasks[0].worker, first_wait)
        return first_wait
