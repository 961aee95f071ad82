"""A trainer's driver of the runtime: run one schedule step's local tasks, and settle every started step.

A trainer iteration is one step of the schedule. A process runs the tasks of its local workers (every worker of
the schedule when W virtual workers share the process, or its own worker when each rank is one worker). Workers
take turns; a worker whose next read must wait (a conflicting publication, the ring, the barrier) yields its
turn, and when no local worker can proceed the driver blocks on the next publication, which in a distributed run
needs the other ranks' updates, for at most the runtime's ``wait_timeout_s``. With ``tasks_in_flight`` lanes the
workers read while a lane is free and the round's reads start together (the last on the driver's thread, the
others on lane threads), so up to that many tasks render at once beside the driver's publications. The
iteration returns once its tasks are staged and their exchange started, not published: the next step may read
while it is in flight.

Running ahead (:class:`Ahead`): dynamic ordering, which runs a worker's B tasks of a step in any order, reaches one
step further. When no local worker can read any task of step s + 1 (each conflicts with the unpublished step s), a
worker may read its task of step s + 2 first, if that task conflicts with nothing unpublished: step s's writes and
the predicted writes of step s + 1's tasks not read yet, this process's included (``OdinRuntime.expect``). Its
gradients are staged in step s + 2's slot and exchanged after step s + 1's, once step s + 1 is published and the
read validated (re-run if a prediction missed a write), so quality-first still equals the barrier; the wait the
conflict would have exposed is spent rendering instead.

Reading behind (:class:`ConflictStreak`): where every read conflicts with the step before (a dense scene), trying
to read before that step is published only costs a cull and check per attempt, the running ahead's and the ask for
rows first, and then waits anyway. After a streak of steps whose first reads met a conflict, a step's
reads wait for the step before to be published first, as the barrier's do; each such read still tells whether it
would have conflicted (a row of its C(t) written by that publication), and one that would not ends the streak.
Waiting is always exact, so quality-first still equals the barrier.

:func:`settle` is the barrier a trainer puts before what needs the synchronous state: checkpoints, evaluation,
structural changes and the end of training.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from odin_nerfstudio.core.tasks import Task, TaskKey
from odin_nerfstudio.runtime.runtime import OdinRuntime, Read, Wait


@dataclass
class Worker:
    """One local worker's place: its step, the tasks of that step still to run, its admitted read in flight, its
    latest Wait and its first read of the step."""

    worker: int
    step: int = 0
    remaining: list[Task] = field(default_factory=list)
    in_flight: Read | None = None
    last_wait: Wait | None = None
    first_read: Read | None = None


@dataclass
class ConflictStreak:
    """When a process's reads wait for the step before without trying first (reading behind).

    Attributes:
        after: steps in a row whose first reads met a conflict before the next steps read behind; 0: never.
        streak: such steps so far, the last one included.
    """

    after: int = 4
    streak: int = 0

    def reads_behind(self) -> bool:
        """Whether the next step's reads wait for the step before to be published first."""
        return 0 < self.after <= self.streak

    def saw(self, conflicted: bool) -> None:
        """A step's first reads met a conflict (a RAW wait, or, read behind, a row the step before wrote), or not."""
        self.streak = self.streak + 1 if conflicted else 0


@dataclass
class Ahead:
    """The next step's local tasks, which a worker may run while its tasks of the current step wait.

    Attributes:
        step: the next step.
        tasks: per local worker, its tasks of ``step`` (as ``run_step`` takes them).
        started: keys of the tasks already run ahead; the call that runs ``step`` skips them.
    """

    step: int
    tasks: Sequence[Sequence[Task]]
    started: set[TaskKey] = field(default_factory=set)
    _expected: set[TaskKey] = field(default_factory=set)


def turn(runtime: OdinRuntime, me: Worker) -> bool:
    """One phase of one task of worker ``me``: finish its read in flight (render, backward, ``after_backward``), or
    read the first of its remaining tasks that may read (dynamic ordering); returns whether it progressed."""
    if me.in_flight is not None:
        runtime.finish(me.in_flight)
        me.in_flight = None
        return True
    if not me.remaining:
        return False
    me.in_flight = _read(runtime, me)
    return me.in_flight is not None


def start_next(runtime: OdinRuntime, me: Worker) -> bool:
    """Read the first of worker ``me``'s remaining tasks that may read (dynamic ordering) and put it in flight on a
    lane (``OdinRuntime.start``: gather, render, backward); returns whether it read."""
    read = _read(runtime, me, gather=False)
    if read is not None:
        runtime.start(read)
    return read is not None


def _read(runtime: OdinRuntime, me: Worker, gather: bool = True) -> Read | None:
    """The read of the first of ``me``'s remaining tasks that may read, taken off its list (None: ``me.last_wait``
    says why none may); ``gather`` False leaves the gather to the lane."""
    result = runtime.read_next(me.remaining, gather)
    if isinstance(result, Wait):
        me.last_wait = result
        return None
    me.remaining.remove(result.task)
    me.first_read = me.first_read or result
    return result


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


def run_step(
    runtime: OdinRuntime,
    step: int,
    step_tasks: Sequence[Sequence[Task]],
    read_after: int = -1,
    ahead: Ahead | None = None,
    started: Collection[TaskKey] = (),
    streak: ConflictStreak | None = None,
) -> None:
    """Run the local workers' tasks of ``step`` (``step_tasks[w]``: worker w's tasks, possibly none).

    Workers take turns in worker order, each reading tasks in its turn while a lane is free and putting them in
    flight (:func:`start_next`); with one lane (the default) a worker's turn reads, renders and stages one task,
    with several the round's reads start together and what finished is staged after the round. In a round in
    which none could read, the driver waits for a lane in flight; with none, a worker may run one task of
    ``ahead`` (:func:`run_ahead`), else :func:`unblock` blocks on the next publication. Every task of the step is staged when it returns.

    ``ahead``: step + 1's local tasks, or None where the caller forbids running ahead (a structural change,
    evaluation, checkpoint or replica check follows this step, or it is the last). ``started``: keys of this step's
    tasks that the previous call ran ahead (its ``ahead.started``); they are not run again. ``streak``: the
    process's :class:`ConflictStreak` (None: never read behind); this step's first reads are added to it.

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
    if ahead is not None:
        if ahead.step != step + 1 or len(ahead.tasks) != num_workers:
            raise ValueError(f"step {step}: ahead must hold step {step + 1}'s tasks for {num_workers} workers")
        plan_short_step(runtime, ahead.step, ahead.tasks)
    workers = [Worker(w, step, [t for t in tasks if t.key not in started]) for w, tasks in enumerate(step_tasks)]
    workers = [me for me in workers if me.remaining]
    first_round = streak is not None and bool(workers)  # this step's first reads are added to the streak
    behind = first_round and streak.reads_behind()
    if behind:
        runtime.count(read_behind=1)
        await_published(runtime, max(read_after, step - 1), "behind", [me.worker for me in workers])
    else:
        await_published(runtime, read_after)

    def stuck() -> str:
        waits = {me.worker: (me.last_wait.reason, me.last_wait.step) for me in workers if me.remaining}
        return f"step {step}: no local worker can read and no publication is pending: {waits}"

    while any(me.remaining for me in workers):
        published, progressed = runtime.published_through, False
        for me in workers:
            while me.remaining and runtime.lane_free and start_next(runtime, me):
                progressed = True
            if runtime.config.tasks_in_flight == 1:  # it rendered in its turn: staged before the next worker reads
                runtime.collect()
        # Several lanes: the round's reads start together (the last on this thread), then what finished is staged.
        progressed = runtime.collect() or progressed
        if first_round:
            first_round = False
            streak.saw(_conflicted(runtime, workers, behind))
        runtime.progress()
        stalled = not progressed and runtime.published_through == published
        if stalled and runtime.in_flight:
            progressed = runtime.collect(block=True)  # its staging may publish what the waiting reads need
        elif stalled and ahead is not None:
            progressed = run_ahead(runtime, workers, ahead)
        unblock(runtime, published, progressed, stuck)
    runtime.join()
    runtime.progress()


def _conflicted(runtime: OdinRuntime, workers: Sequence[Worker], behind: bool) -> bool:
    """Whether a step's first round of reads met a conflict: a worker waited on a RAW conflict, or, read behind,
    a worker's first read holds a row the step before wrote (read earlier, it would have waited; counted in
    ``behind_conflicts``, as a RAW wait would have been)."""
    if behind:
        met = [me.first_read is not None and runtime.conflicted_with_step_before(me.first_read) for me in workers]
        runtime.count(behind_conflicts=sum(met))
        return any(met)
    return any(me.last_wait is not None and me.last_wait.reason == "raw" for me in workers)


def run_ahead(runtime: OdinRuntime, workers: Sequence[Worker], ahead: Ahead) -> bool:
    """Run one task of ``ahead`` for the first waiting worker that has one that may read; returns whether one ran.

    Before the first such read, the current step's tasks not read yet are expected (``OdinRuntime.expect``): their
    predicted writes count as pending writes of their step, as another process's would.
    """
    unread = [task for me in workers for task in me.remaining if task.key not in ahead._expected]
    runtime.expect(unread)
    ahead._expected.update(task.key for task in unread)
    for me in workers:
        if not me.remaining:
            continue
        tasks = [task for task in ahead.tasks[me.worker] if task.key not in ahead.started]
        if not tasks:
            continue
        result = runtime.read_next(tasks)
        if isinstance(result, Wait):
            continue
        ahead.started.add(result.task.key)
        runtime.count(ran_ahead=1)
        runtime.finish(result)
        return True
    return False


def await_published(
    runtime: OdinRuntime, step: int, reason: str = "window", workers: Sequence[int] = (-1,)
) -> None:
    """Block until ``step`` is published (each wait bounded by ``wait_timeout_s``), a block recorded as a wait of
    ``workers`` (default: the process) for ``reason``: ``window`` (the overlap-window gate) or ``behind``.

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
        for worker in workers:
            _record_block(runtime, reason, step, start, worker)


def settle(runtime: OdinRuntime) -> None:
    """Block until every task in flight is staged and every step whose exchange this process started is published
    (each wait bounded by ``wait_timeout_s``), then check that nothing is left in flight
    (:meth:`OdinRuntime.drain`)."""
    runtime.join()
    runtime.progress()
    start, first = runtime.timeline.now(), runtime.published_through
    while runtime.await_publication(runtime.config.wait_timeout_s):
        pass
    if runtime.published_through != first:
        _record_block(runtime, "settle", runtime.published_through, start)
    runtime.drain()


def _record_block(runtime: OdinRuntime, reason: str, step: int, start_ns: int, worker: int = -1) -> None:
    """Put a block of the driver on the timeline as a wait of ``worker`` (default: the process, track -1), so the
    timeline's exposed wait holds it too: ``window`` (a step's overlap-window gate), ``behind`` (reading behind)
    or ``settle`` (before a checkpoint, evaluation, structural change or the end)."""
    runtime.timeline.record("wait", worker, step, start_ns, {"reason": reason, "on_step": step})
