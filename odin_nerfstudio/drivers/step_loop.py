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

from collections.abc import Sequence

from odin_nerfstudio.runtime.runtime import OdinRuntime, Wait
from odin_nerfstudio.core.tasks import Task


def run_step(runtime: OdinRuntime, step: int, step_tasks: Sequence[Sequence[Task]], read_after: int = -1) -> None:
    """Run the local workers' tasks of ``step`` (``step_tasks[w]``: worker w's tasks, possibly none).

    ``read_after``: the last step that must be published before any task of this step reads. A schedule's overlap
    window names the earlier steps a step may run beside; reading beside an older one is optimistic and, when that
    step writes what the read needs, ends in a re-run, so a trainer passes ``step - len(window) - 1``.

    Raises:
        ValueError: if the tasks do not belong to ``step`` or their worker ids are not the list positions.
        RuntimeError: if no local worker can proceed and no publication is awaited (a bug, never a hang).
        TimeoutError: from the transport, naming the step and ranks, when a publication takes longer than
            ``wait_timeout_s``.
    """
    config = runtime.config
    if len(step_tasks) != config.num_workers:
        raise ValueError(f"step {step}: tasks for {len(step_tasks)} workers, the runtime has {config.num_workers}")
    for worker, tasks in enumerate(step_tasks):
        if any(task.step != step or task.worker != worker for task in tasks):
            raise ValueError(f"step {step}: worker {worker}'s tasks must have step {step} and worker {worker}")
    counts = [len(tasks) for tasks in step_tasks]
    if counts != [config.tasks_per_worker] * config.num_workers:
        runtime.plan_step(step, counts)
    await_published(runtime, read_after)
    remaining = {worker: list(tasks) for worker, tasks in enumerate(step_tasks) if tasks}
    while remaining:
        published = runtime.published_through
        waits: dict[int, Wait] = {}
        for worker in list(remaining):
            result = runtime.read_next(remaining[worker])
            if isinstance(result, Wait):
                waits[worker] = result
                continue
            remaining[worker].remove(result.task)
            runtime.finish(result)
            if not remaining[worker]:
                del remaining[worker]
        runtime.progress()
        stuck = remaining and len(waits) == len(remaining) and runtime.published_through == published
        if stuck and not runtime.await_publication(config.wait_timeout_s):
            reasons = {worker: (wait.reason, wait.step) for worker, wait in waits.items()}
            raise RuntimeError(f"step {step}: no local worker can read and no publication is pending: {reasons}")
    runtime.progress()


def await_published(runtime: OdinRuntime, step: int) -> None:
    """Block until ``step`` is published (each wait bounded by ``wait_timeout_s``).

    Raises:
        RuntimeError: if this process has not yet sent its part of a step up to ``step`` (it would wait forever).
    """
    runtime.progress()
    while runtime.published_through < step:
        if not runtime.await_publication(runtime.config.wait_timeout_s):
            raise RuntimeError(
                f"waiting for step {step} to be published, but this process has not sent its part of step "
                f"{runtime.published_through + 1} yet"
            )


def settle(runtime: OdinRuntime) -> None:
    """Block until every step whose exchange this process started is published (each wait bounded by
    ``wait_timeout_s``), then check that nothing is left in flight (:meth:`OdinRuntime.drain`)."""
    runtime.progress()
    while runtime.await_publication(runtime.config.wait_timeout_s):
        pass
    runtime.drain()
