"""Virtual workers: a deterministic single-process driver that runs W simulated workers through the runtime.

Each worker walks its own list of tasks step by step. A turn of a worker does one phase of one task: if it holds
an admitted read, it finishes it (render, backward, after_backward); otherwise it tries to read the next of its
remaining tasks of the step (dynamic ordering), and a wait leaves it where it was. The order of turns is the
interleaving: a given sequence of worker ids (adversarial ones included, e.g. one worker taking many turns while
another holds a read in flight, so that it runs ahead by several steps), then round-robin until every step is
published. The same schedule and interleaving always give the same run.

Structural changes run at a step boundary behind the runtime's drain barrier: the driver holds every worker at
that step until all earlier steps are published, applies the change once and remaps the runtime's tables.

The same driver runs one rank of a distributed run (a runtime with one local worker and a remote transport):
when no local worker can proceed it blocks on the pending exchange, bounded by the runtime's wait timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from torch import Tensor

from odin_nerfstudio.runtime.runtime import OdinRuntime, Read, Wait
from odin_nerfstudio.core.tasks import Task

Schedule = Sequence[Sequence[Sequence[Task]]]
"""step -> worker -> the worker's B tasks of the step, in task order."""
StructuralChange = Callable[[OdinRuntime], Tensor]
"""Applies a structural change (gsplat's ops on the runtime's params, optimizers, strategy state) and returns
its index map, int64 [N_new] (new row -> old row, -1 fresh)."""


@dataclass
class VirtualWorker:
    """One simulated worker's position: its next step, the tasks of it still to run, and its read in flight."""

    worker: int
    step: int = 0
    remaining: list[Task] = field(default_factory=list)
    in_flight: Read | None = None
    last_wait: Wait | None = None


@dataclass
class VirtualRunReport:
    """What the driver did: turns taken and turns in which a worker could not proceed."""

    turns: int = 0
    blocked_turns: int = 0


def _turn(
    runtime: OdinRuntime,
    schedule: Schedule,
    workers: list[VirtualWorker],
    me: VirtualWorker,
    changes: dict[int, StructuralChange],
) -> bool:
    """One turn of worker ``me``; returns whether anything progressed."""
    if me.in_flight is not None:
        runtime.finish(me.in_flight)
        me.in_flight = None
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
    result = runtime.read_next(me.remaining)
    if isinstance(result, Wait):
        me.last_wait = result
        return False
    me.remaining.remove(result.task)
    me.in_flight = result
    return True


def run_virtual(
    runtime: OdinRuntime,
    schedule: Schedule,
    interleaving: Iterable[int] = (),
    structural_changes: dict[int, StructuralChange] | None = None,
) -> VirtualRunReport:
    """Run every task of ``schedule`` on W virtual workers in the given interleaving, then round-robin.

    Args:
        runtime: the runtime (its config's num_workers and tasks_per_worker match the schedule).
        schedule: step -> worker -> the worker's tasks of the step (B, fewer in a short step; the driver
            declares such steps with ``plan_step``).
        interleaving: worker ids, one per turn, taken before the round-robin that finishes the run.
        structural_changes: per step s, a change applied once steps < s are published, before s reads.

    Returns:
        Turn counts. Raises if no worker can proceed and no exchange is pending (a deadlock is a bug, never a
        hang); a pending exchange that does not complete raises the transport's TimeoutError.
    """
    num_workers = runtime.config.num_workers
    for step, per_worker in enumerate(schedule):
        counts = [len(tasks) for tasks in per_worker]
        if counts != [runtime.config.tasks_per_worker] * num_workers:
            runtime.plan_step(step, counts)
    workers = [VirtualWorker(w) for w in range(num_workers)]
    changes = dict(structural_changes or {})
    report = VirtualRunReport()

    def take(worker: int) -> bool:
        progressed = _turn(runtime, schedule, workers, workers[worker], changes)
        runtime.progress()
        report.turns += 1
        report.blocked_turns += not progressed
        return progressed

    for worker in interleaving:
        take(worker % num_workers)
    while runtime.published_through < len(schedule) - 1:
        published = runtime.published_through
        progressed = [take(w) for w in range(num_workers)]
        stuck = not any(progressed) and runtime.published_through == published
        if stuck and not runtime.await_publication(runtime.config.wait_timeout_s):
            waits = {w.worker: (w.step, w.last_wait.reason if w.last_wait else None) for w in workers}
            raise RuntimeError(f"virtual workers deadlocked at published step {runtime.published_through}: {waits}")
    return report
