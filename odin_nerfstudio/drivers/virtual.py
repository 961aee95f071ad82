"""Virtual workers: a deterministic single-process driver that runs W simulated workers through the runtime.

Each worker walks its own list of tasks step by step. A turn is the step loop's (``step_loop.turn``): one phase
of one task, finishing an admitted read or reading the next of the worker's remaining tasks (dynamic ordering);
short steps and deadlocks are handled by the step loop's pieces too. What this driver adds is the order of the
turns, the interleaving: a given sequence of worker ids (adversarial ones included, e.g. one worker taking many turns while
another holds a read in flight, so that it runs ahead by several steps), then round-robin until every step is
published. The same schedule and interleaving always give the same run.

Structural changes run at a step boundary behind the runtime's drain barrier: the driver holds every worker at
that step until all earlier steps are published, applies the change once and remaps the runtime's tables.

The same driver runs one rank of a distributed run (a runtime with one local worker and a remote transport):
when no local worker can proceed it blocks on the pending exchange, bounded by the runtime's wait timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from torch import Tensor

from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.drivers.step_loop import Worker, plan_short_step, turn, unblock
from odin_nerfstudio.runtime.runtime import OdinRuntime

Schedule = Sequence[Sequence[Sequence[Task]]]
"""step -> worker -> the worker's B tasks of the step, in task order."""
StructuralChange = Callable[[OdinRuntime], Tensor]
"""Applies a structural change (gsplat's ops on the runtime's params, optimizers, strategy state) and returns
its index map, int64 [N_new] (new row -> old row, -1 fresh)."""


@dataclass
class VirtualRunReport:
    """What the driver did: turns taken and turns in which a worker could not proceed."""

    turns: int = 0
    blocked_turns: int = 0


def _turn(
    runtime: OdinRuntime, schedule: Schedule, workers: list[Worker], me: Worker, changes: dict[int, StructuralChange]
) -> bool:
    """One turn of worker ``me`` (the step loop's :func:`turn`, moving it along the schedule); returns whether
    anything progressed."""
    if me.in_flight is not None:
        turn(runtime, me)
        if not me.remaining:
            me.step += 1
        return True
    if me.step >= len(schedule):
        return False
    if not me.remaining:
        if me.step in changes:
            if any(w.step < me.step or w.in_flight is not None for w in workers):
                return False
            runtime.progress()
            if runtime.published_through != me.step - 1:
                return False
            runtime.drain()
            runtime.remap(changes.pop(me.step)(runtime))
        me.remaining = list(schedule[me.step][me.worker])
        if not me.remaining:
            me.step += 1
            return True
    return turn(runtime, me)


def run_virtual(
    runtime: OdinRuntime,
    schedule: Schedule,
    interleaving: Iterable[int] = (),
    structural_changes: dict[int, StructuralChange] | None = None,
) -> VirtualRunReport:
    """Run every task of ``schedule`` on W virtual workers in the given interleaving, then round-robin.

    Args:
        runtime: the runtime (its topology's W and B match the schedule).
        schedule: step -> worker -> the worker's tasks of the step (B, fewer in a short step; the driver
            declares such steps with ``plan_step``).
        interleaving: worker ids, one per turn, taken before the round-robin that finishes the run.
        structural_changes: per step s, a change applied once steps < s are published, before s reads.

    Returns:
        Turn counts. Raises if no worker can proceed and no exchange is pending (a deadlock is a bug, never a
        hang); a pending exchange that does not complete raises the transport's TimeoutError.
    """
    num_workers = runtime.topology.num_workers
    for step, per_worker in enumerate(schedule):
        plan_short_step(runtime, step, per_worker)
    workers = [Worker(w) for w in range(num_workers)]
    changes = dict(structural_changes or {})
    report = VirtualRunReport()

    def take(worker: int) -> bool:
        progressed = _turn(runtime, schedule, workers, workers[worker], changes)
        runtime.progress()
        report.turns += 1
        report.blocked_turns += not progressed
        return progressed

    def stuck() -> str:
        waits = {w.worker: (w.step, w.last_wait.reason if w.last_wait else None) for w in workers}
        return f"virtual workers deadlocked at published step {runtime.published_through}: {waits}"

    for worker in interleaving:
        take(worker % num_workers)
    while runtime.published_through < len(schedule) - 1:
        published = runtime.published_through
        progressed = [take(w) for w in range(num_workers)]
        unblock(runtime, published, any(progressed), stuck)
    return report
