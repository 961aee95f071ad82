"""The training loop's side of the protocol: one schedule step per iteration, as a trainer (or the simulator) runs it.

A trainer iteration is one step of the schedule (``drivers/step_loop.run_step`` runs its local tasks). Around it
this loop decides what the runtime is told before the step reads: the overlap-window gate (``read_after``), the
other processes' tasks of the step (their predicted writes, ``OdinRuntime.expect``), the next step's local tasks
(asked for first, ``OdinRuntime.upcoming``, unless reads go behind), whether a worker may run the next step's tasks
ahead (:class:`~odin_nerfstudio.drivers.step_loop.Ahead`) and the process's conflict streak (reading behind).
nerfstudio's trainer (``ns/trainer.py``) and the simulator (``simulation/simulator.py``) both drive the runtime
through this class, so a prediction runs the same rules as a training run. Each step's tasks are built once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.drivers.step_loop import Ahead, ConflictStreak, run_step, settle
from odin_nerfstudio.runtime.runtime import OdinRuntime

StepTasks = Callable[[int], tuple[Sequence[Sequence[Task]], int]]
"""step -> (every schedule worker's tasks of the step, in task order; the step's overlap window's length)."""


@dataclass(frozen=True)
class LoopConfig:
    """How the loop feeds the runtime (the trainer's options of the same names).

    Attributes:
        follow_overlap_window: a step reads only once the steps before its overlap window are published.
        run_ahead: a worker may read its task of the next step while its current one waits.
        expect_remote_writes: other processes' tasks' predicted writes count as pending writes.
        read_behind_after: steps in a row whose first reads met a conflict before reads go behind (0: never).
    """

    follow_overlap_window: bool = False
    run_ahead: bool = True
    expect_remote_writes: bool = True
    read_behind_after: int = 4


class TrainingLoop:
    """Runs schedule steps through a runtime for this process's workers (see the module).

    Args:
        runtime: the process's runtime.
        step_tasks: the tasks of a step (:data:`StepTasks`).
        local_workers: the schedule workers this process runs, in the runtime's worker order.
        last_step: the last step of the run (no step after it is run ahead or asked for).
        config: the loop's options.
    """

    def __init__(
        self,
        runtime: OdinRuntime,
        step_tasks: StepTasks,
        local_workers: Sequence[int],
        last_step: int,
        config: LoopConfig,
    ) -> None:
        self.runtime = runtime
        self.step_tasks = step_tasks
        self.local_workers = list(local_workers)
        self.last_step = last_step
        self.config = config
        self.streak = ConflictStreak(config.read_behind_after)
        self.ahead: Ahead | None = None
        self._built: dict[int, tuple[Sequence[Sequence[Task]], int]] = {}

    def _tasks(self, step: int) -> tuple[Sequence[Sequence[Task]], int]:
        """Every worker's tasks of ``step`` and its window's length, built once (kept for the step after)."""
        if step not in self._built:
            self._built = {s: built for s, built in self._built.items() if s >= step - 1}
            self._built[step] = self.step_tasks(step)
        return self._built[step]

    def forget_from(self, step: int) -> None:
        """Drop the tasks built for ``step`` and later: the schedule changed from there (a re-balance)."""
        self._built = {s: built for s, built in self._built.items() if s < step}

    def local(self, step: int) -> list[list[Task]]:
        """This process's workers' tasks of ``step``, their worker ids the runtime's local ones."""
        tasks, _ = self._tasks(step)
        return [[_as_worker(task, local) for task in tasks[worker]] for local, worker in enumerate(self.local_workers)]

    def offers_ahead(self, step: int, may_run_ahead: bool) -> bool:
        """Whether ``step``'s workers may run step + 1's tasks: ``--run-ahead`` on, reads not following the overlap
        windows, not the last step, and nothing after ``step`` needing its synchronous state (``may_run_ahead``)."""
        config = self.config
        return may_run_ahead and config.run_ahead and not config.follow_overlap_window and step < self.last_step

    def iteration(self, step: int, may_run_ahead: bool) -> None:
        """Run ``step``'s local tasks (``run_step``), having told the runtime what it needs to know first;
        ``may_run_ahead``: nothing that needs this step's synchronous state follows it (the caller's to say)."""
        runtime, config = self.runtime, self.config
        tasks, window = self._tasks(step)
        read_after = step - window - 1 if config.follow_overlap_window else -1
        if config.expect_remote_writes:
            remote = [w for w in range(len(tasks)) if w not in self.local_workers]
            runtime.expect([_as_worker(task, i) for i, w in enumerate(remote) for task in tasks[w]])
        started = self.ahead.started if self.ahead is not None and self.ahead.step == step else set()
        self.ahead = None
        if step < self.last_step:
            upcoming = self.local(step + 1)
            if not self.streak.reads_behind():  # a step read behind has no use for rows first
                runtime.upcoming([task for worker in upcoming for task in worker])
            if self.offers_ahead(step, may_run_ahead):
                self.ahead = Ahead(step + 1, upcoming)
        run_step(runtime, step, self.local(step), read_after, self.ahead, started, self.streak)

    def finish(self) -> int | None:
        """Finish a step whose tasks ran ahead (a run stopped early), then settle; returns that step, if any."""
        finished = None
        if self.ahead is not None and self.ahead.started:
            ahead, self.ahead = self.ahead, None
            run_step(self.runtime, ahead.step, self.local(ahead.step), started=ahead.started)
            finished = ahead.step
        settle(self.runtime)
        return finished


def _as_worker(task: Task, worker: int) -> Task:
    """``task`` with ``worker`` as its worker id (the runtime numbers its workers)."""
    return task if task.worker == worker else Task(task.step, worker, task.index, task.view, task.camera)
