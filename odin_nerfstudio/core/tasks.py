"""Tasks (one training view rendered on one worker in one step) and their deterministic random streams.

Every random draw a task makes (a random background colour, say) comes from :func:`task_generator`, seeded from
(seed, step, view) alone, so the draw does not depend on which worker runs the task, in which order, or whether
it is re-run after a validation failure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from odin_nerfstudio.core.camera import Camera

_MASK64 = (1 << 64) - 1

NO_STEP = -1
"""The step of no step: a row never written or with nothing pending, a conflict check with nothing to wait for."""

TaskKey = tuple[int, int, int]
"""(step, worker, index) of a task: unique per task, and its place in the step's gradient sum."""


@dataclass(frozen=True)
class Task:
    """One training view of one step on one worker.

    Attributes:
        step: the step s the task belongs to.
        worker: the runtime's local worker that runs it (its place in the worker-order sum); 0 on every rank
            of a distributed run, where the transport orders the ranks.
        index: its position among the worker's B tasks of the step (the task order of the gradient sum).
        view: the training view's id.
        camera: the view's camera.
    """

    step: int
    worker: int
    index: int
    view: int
    camera: Camera

    @property
    def key(self) -> TaskKey:
        """(step, worker, index): unique per task, and its order in the step's gradient sum."""
        return (self.step, self.worker, self.index)


def step_tasks(
    step: int, views: Sequence[Sequence[int]], camera_of: Callable[[int], Camera], workers: Sequence[int] | None = None
) -> list[list[Task]]:
    """The tasks of one schedule step: the one place a schedule's views become runtime tasks.

    Args:
        step: the step s.
        views: per schedule worker, its views of the step in task order.
        camera_of: the camera of a view.
        workers: the schedule workers to make tasks for (default: every one); a task's worker id is the worker's
            position in this list (the runtime's local worker).

    Returns:
        Per worker of ``workers``, its tasks in task order.
    """
    chosen = range(len(views)) if workers is None else workers
    return [
        [Task(step, local, index, view, camera_of(view)) for index, view in enumerate(views[worker])]
        for local, worker in enumerate(chosen)
    ]


def view_tasks(num_views: int, camera_of: Callable[[int], Camera]) -> list[Task]:
    """One task per view (step 0, worker 0, index 0), for what the sharded mode weighs by view outside any step: the
    rows' load for the cuts, each owner's rows per view for the placement (``ShardedLoop.place``)."""
    return [Task(0, 0, 0, view, camera_of(view)) for view in range(num_views)]


def _splitmix64(value: int) -> int:
    """One round of SplitMix64, a bijective 64-bit mixer (Steele et al., 2014)."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def task_seed(seed: int, step: int, view: int) -> int:
    """A 63-bit seed that depends only on (seed, step, view)."""
    mixed = _splitmix64(seed & _MASK64)
    mixed = _splitmix64(mixed ^ (step & _MASK64))
    mixed = _splitmix64(mixed ^ (view & _MASK64))
    return mixed >> 1


def task_generator(seed: int, step: int, view: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` for every random draw of the task rendering ``view`` in ``step`` of run ``seed``."""
    generator = torch.Generator(device=device)
    generator.manual_seed(task_seed(seed, step, view))
    return generator
