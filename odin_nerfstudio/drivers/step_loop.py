"""A trainer's driver of the runtime: run one schedule step's local tasks, and settle every started step.

A trainer iteration is one step of the schedule. A process runs the tasks of its local workers (every worker of
the schedule when W virtual workers share the process, or its own worker when each rank is one worker). Workers
take turns; a worker whose next read must wait (a conflicting publication, the ring, the barrier) yields its
turn, and when no local worker can proceed the driver blocks on the next publication, which in a distributed run
needs the other ranks' updates, for at most the runtime's ``wait_timeout_s``. The iteration returns once its
tasks are staged and their exchange started, not published: the next step may read while it is in flight.

:func:`settle` is the barrier a trainer puts before what needs the synchronous state: checkpoints, evaluation,
structural changes and the end of training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.runtime.runtime import OdinRuntime, Read, Wait


@dataclass
class Worker:
    """One local worker's place: its step, the tasks of that step still to run, and its admitted read in flight."""

    worker: int
    step: int = 0
    remaining: list[Task] = field(default_factory=list)
    in_flight: Read | None = None
    last_wait: Wait | None = None


def turn(runtime: OdinRuntime, me: Worker) -> bool:
    """One phase of one task of worker ``me``: finish its read in flight (render, backward, ``after_backward``), or
    read the first of its remaining tasks that may read (dynamic ordering); returns whether it progressed."""
    if me.in_flight is not None:
        runtime.finish(me.in_flight)
        me.in_flight = None
        return True
    if not me.remaining:
        return False
    result = runtime.read_next(me.remaining)
    if isinstance(result, Wait):
        me.last_wait = result
        return False
    me.remaining.remove(result.task)
    me.in_flight = result
    return True


def plan_short_step(runtime: OdinRuntime, step: int, step_tasks: Sequence[Sequence[Task]]) -> None:
    """Declare ``step``'s task counts to the runtime when some worker runs other than B tasks in it."""
    counts = [len(tasks) for tasks in step_tasks]
    if counts != [runtime.topology.views_per_worker] * runtime.topology.num_workers:
        runtime.plan_step(step, counts)


def unblock(runtime: OdinRuntime, published: int, progressed: bool, stuck: Callable[[], str]) -> None:
    """Deadlock detection after a round of turns: if no worker progressed and nothing was published since
    ``published``, block on the next publication (bounded by ``wait_timeout_s``, a remote rank may still compute);
    if this process has not sent its part of it either, raise ``RuntimeError(stuck())`` (a bug, never a hang)."""
    if progressed or runtime.published_through != published:
        return
    if not runtime.await_publication(runtime.config.wait_timeout_s):
        raise RuntimeError(stuck())


def run_step(runtime: OdinRuntime, step: int, step_tasks: Sequence[Sequence[Task]], read_after: int = -1) -> None:
    """Run the local workers' tasks of ``step`` (``step_tasks[w]``: worker w's tasks, possibly none).

    Workers take turns in worker order, each reading and at once finishing one task per turn (:func:`turn`);
    :func:`unblock` detects a round in which none could read.

    ``read_after``: the last step that must be published before any task of this step reads. A schedule's overlap
    window names the earlier steps a step may run beside; reading beside an older one is optimistic and, when that
    step writes what the read needs, ends in a re-run, so a trainer passes ``step - len(window) - 1``.

    Raises:
        ValueError: if the tasks do not belong to ``step`` or their worker ids are not the list positions.
        RuntimeError: if no local worker can proceed and no publication is awaited (a bug, never a hang).
        TimeoutError: from the transport, naming the step and ranks, when a publication takes longer than
            ``wait_timeout_s``.
    """
    num_workers = runtime.topology.num_workers
    if len(step_tasks) != num_workers:
        raise ValueError(f"step {step}: tasks for {len(step_tasks)} workers, the runtime has {num_workers}")
    for worker, tasks in enumerate(step_tasks):
        if any(task.step != step or task.worker != worker for task in tasks):
            raise ValueError(f"step {step}: worker {worker}'s tasks must have step {step} and worker {worker}")
    plan_short_step(runtime, step, step_tasks)
    await_published(runtime, read_after)
    workers = [Worker(w, step, list(tasks)) for w, tasks in enumerate(step_tasks) if tasks]

    def stuck() -> str:
        waits = {me.worker: (me.last_wait.reason, me.last_wait.step) for me in workers if me.remaining}
        return f"step {step}: no local worker can read and no publication is pending: {waits}"

    while any(me.remaining for me in workers):
        published, progressed = runtime.published_through, False
        for me in workers:
            if me.remaining and turn(runtime, me):
                turn(runtime, me)
                progressed = True
        runtime.progress()
        unblock(runtime, published, progressed, stuck)
    runtime.progress()


def await_published(runtime: OdinRuntime, step: int) -> None:
    """Block until ``step`` is published (each wait bounded by ``wait_timeout_s``).

    Raises:
        RuntimeError: if this process has not yet sent its part of a step up to ``step`` (it would wait forever).
    """
    runtime.progress()
    start = runtime.timeline.now()
    blocked = runtime.published_through < step
    while runtime.published_through < step:
        if not runtime.await_publication(runtime.config.wait_timeout_s):
            raise RuntimeError(
                f"waiting for step {step} to be published, but this process has not sent its part of step "
                f"{runtime.published_through + 1} yet"
            )
    if blocked:
        _record_block(runtime, "window", step, start)


def settle(runtime: OdinRuntime) -> None:
    """Block until every step whose exchange this process started is published (each wait bounded by
    ``wait_timeout_s``), then check that nothing is left in flight (:meth:`OdinRuntime.drain`)."""
    runtime.progress()
    start, first = runtime.timeline.now(), runtime.published_through
    while runtime.await_publication(runtime.config.wait_timeout_s):
        pass
    if runtime.published_through != first:
        _record_block(runtime, "settle", runtime.published_through, start)
    runtime.drain()


def _record_block(runtime: OdinRuntime, reason: str, step: int, start_ns: int) -> None:
    """Put a block of the driver on the timeline as a wait of the process (track -1), so the timeline's exposed
    wait holds it too: ``window`` (a step's overlap-window gate) or ``settle`` (before a checkpoint, evaluation,
    structural change or the end)."""
    runtime.timeline.record("wait", -1, step, start_ns, {"reason": reason, "on_step": step})
