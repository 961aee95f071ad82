"""The culling index the runtime keeps over the model: bounding spheres, their block index and candidate sets.

Built with the runtime and after each structural change (rebuilt in O(N log N) only once its blocks have grown
by a quarter), refreshed on the rows each publication writes; C(t) is culled through it in O(|C(t)|), not O(N),
and checked against the unpublished writes in the same pass (the kernel op ``cull_conflicts``). See :class:`~odin_nerfstudio.culling.candidates.BoundingSpheres` and ``docs/architecture.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.core.conflicts import Conflicts, StepRows
from odin_nerfstudio.core.tables import remap_row_sets
from odin_nerfstudio.core.tasks import Task, TaskKey
from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion
from odin_nerfstudio.kernels import ops
from odin_nerfstudio.runtime.adapter import RenderAdapter
from odin_nerfstudio.runtime.metering import Meter
from odin_nerfstudio.runtime.reads import DrawableFn


REGIONS_KEPT = 1024
"""How many tasks' cull regions the index keeps (a few steps' worth; more are made again)."""


@dataclass(frozen=True)
class Reach:
    """How far a publication can move a bounding sphere: its radius grows at most ``grow``-fold, its centre moves
    at most ``shift`` (world units)."""

    grow: float
    shift: float


class CullingIndex:
    """Bounding spheres of the model's rows and the candidate sets culled against them.

    Args:
        params: the model's parameters (``means`` [N, 3] and ``scales`` [N, 3] read), shared with the runtime.
        adapter: turns ``scales`` rows into world-space scales.
        margin: widening of the drawable region C(t) is culled against, a fraction of the image size
            (``candidate_margin``).
        near_plane: the rasterizer's near plane.
        drawable: per task, the drawable region of the camera it renders with (the renderer's, which knows the
            resolution schedule); None: ``CullRegion.drawable`` of the task's camera.
    """

    def __init__(
        self,
        params: dict[str, Tensor],
        adapter: RenderAdapter,
        margin: float,
        near_plane: float,
        drawable: DrawableFn | None = None,
    ) -> None:
        self.params = params
        self.adapter = adapter
        self.margin = margin
        self.near_plane = near_plane
        self.drawable = drawable if drawable is not None else self._task_camera_drawable
        self._bounds: BoundingSpheres | None = None
        self._regions: dict[TaskKey, tuple[Camera, CullRegion]] = {}
        self.bounds()

    def bounds(self) -> BoundingSpheres:
        """The culling bounds of the current state and their block index, rebuilt when the row count changed."""
        num_rows = self.params["means"].shape[0]
        if self._bounds is None or self._bounds.num_rows != num_rows:
            self._bounds = BoundingSpheres.of(self.params["means"], self.adapter.world_scales(self.params["scales"]))
            if num_rows:
                self._bounds.index()
        return self._bounds

    def _task_camera_drawable(self, task: Task) -> CullRegion:
        """The drawable region of the task's own camera (a renderer that renders at that resolution)."""
        return CullRegion.drawable(task.camera, near_plane=self.near_plane)

    def region(self, task: Task) -> CullRegion:
        """The region C(t) is culled against (the drawable region of the camera it renders with, widened by the
        margin), made once per task: its read, its validation and a re-run share its pose, planes and kernel
        vector (the last ``REGIONS_KEPT`` tasks')."""
        camera, region = self._regions.get(task.key, (None, None))
        if region is None or camera is not task.camera:
            if len(self._regions) >= REGIONS_KEPT:
                self._regions.clear()
            region = self.drawable(task).widened(self.margin)
            self._regions[task.key] = (task.camera, region)
        return region

    def candidates(self, task: Task) -> Tensor:
        """C(t) on the current state, sorted int64 [M]."""
        return self.bounds().rows_in(self.region(task))

    def candidates_and_conflicts(self, task: Task, writes: Sequence[StepRows]) -> tuple[Tensor, Conflicts]:
        """C(t) on the current state, sorted int64 [M], and its rows with a write of an earlier unpublished step in
        ``writes`` (RAW; steps >= the task's are ignored), culled and checked in one op."""
        return ops.cull_conflicts(self.bounds(), self.region(task), task.step, writes)

    def any_meets(self, task: Task, rows: Tensor, reach: Reach | None = None, region: CullRegion | None = None) -> bool:
        """Whether any of ``rows`` (sorted int64 [R]) now lies in ``region`` (default: the region of ``task``'s
        candidate set), or, with ``reach``, may lie there once each has moved as far as a publication can move it."""
        grow, shift = (1.0, 0.0) if reach is None else (reach.grow, reach.shift)
        region = self.region(task) if region is None else region
        # a host synchronization on CUDA, needed: validation decides on it (re-run or not) on the host
        return bool(self.bounds().meets(region, rows, grow, shift).any())

    def meeting(self, task: Task, rows: Tensor, reach: Reach) -> Tensor:
        """Those of ``rows`` (sorted int64 [R]) that may lie in the region of ``task``'s candidate set once each has
        moved as far as ``reach`` allows (sorted)."""
        return rows[self.bounds().meets(self.region(task), rows, reach.grow, reach.shift)]

    def validate_read(
        self, task: Task, candidate: Tensor, written: Sequence[tuple[int, Tensor]], admitted: dict[int, Tensor]
    ) -> tuple[bool, bool]:
        """A read's stale and candidate checks (``ops.validate_read``) in ``task``'s region on the current state:
        (a written row of C(t) not admitted, a written row outside C(t) that now meets the region)."""
        return ops.validate_read(candidate, written, admitted, self.bounds(), self.region(task))

    def reach(self, mean_step: float, scale_step: float) -> Reach:
        """How far a publication can move a row's bounding sphere when it moves each element of ``means`` by at
        most ``mean_step`` and of ``scales`` by at most ``scale_step`` (the adapter's scale parametrization)."""
        return Reach(grow=self.adapter.scale_growth(scale_step), shift=3.0**0.5 * mean_step)

    def update(self, rows: Tensor, means: Tensor, scales: Tensor) -> None:
        """Refresh the bounds of ``rows`` [R] from their new ``means`` [R, 3] and parameter ``scales`` [R, 3]."""
        ops.refresh_bounds(self.bounds(), rows, means, self.adapter.world_scales(scales))

    def rebuild(self) -> None:
        """Rebuild the bounds and index from the parameters (after a structural change)."""
        self._bounds = None
        self.bounds()


class RemoteTasks:
    """Predicted writes of tasks not read here yet: those other processes run (a distributed run knows them from the
    shared schedule), and this process's own that a read runs ahead of.

    Until their step is published, their predicted writes count as that step's pending writes, so a read that would
    miss one of them waits for the publication instead of reading early and being re-run after validation. A
    view's prediction is the rows it last wrote here (A(t) of this process's latest render of it, :meth:`saw`),
    else the rows the rasterizer would draw for it on the current state when a ``predict`` function is given
    (tight: A(t) is what a render draws and moves; computed once per view), else its candidate set C(t) (a
    superset: the margin, the bounding spheres). A structural change renames the rows: every view's rows are carried
    through it (a split row's children replace it, a pruned row leaves), so a view is projected once per run, not
    once per densification interval. A prediction only: validation decides, so a view's rows from an epoch ago
    serve as well as a fresh projection of every row in its frustum, at the cost of a dictionary look-up.
    """

    def __init__(self, index: CullingIndex, meter: Meter, predict: Callable[[Task], Tensor] | None = None) -> None:
        self.index = index
        self.meter = meter
        self.predict = predict if predict is not None else index.candidates
        self._tasks: dict[int, list[Task]] = {}
        self._rows: dict[int, Tensor] = {}
        self._by_view: dict[int, Tensor] = {}

    def expect(self, tasks: Sequence[Task]) -> None:
        """Add tasks not read yet: other processes' tasks, or this process's own that a later step's read runs
        ahead of (``drivers/step_loop.py``); a step's predicted union is culled again when next needed."""
        for task in tasks:
            self._tasks.setdefault(task.step, []).append(task)
            self._rows.pop(task.step, None)

    def saw(self, view: int, rows: Tensor) -> None:
        """A render of ``view`` here wrote ``rows`` (its A(t), sorted int64): the view's next prediction."""
        self._by_view[view] = rows

    def writes(self, before_step: int, published_through: int) -> list[StepRows]:
        """The predicted writes of the expected tasks of unpublished steps < ``before_step``, one union per step."""
        for step in [s for s in self._tasks if s <= published_through]:
            del self._tasks[step]
            self._rows.pop(step, None)
        writes = []
        for step in sorted(s for s in self._tasks if s < before_step):
            if step not in self._rows:
                sets = [self._predicted(task) for task in self._tasks[step]]
                self._rows[step] = ops.union_rows(sets, self.index.params["means"].device)
            writes.append(StepRows(step, self._rows[step]))
        return writes

    def _predicted(self, task: Task) -> Tensor:
        """The view's known rows, else its projection (kept for the view's next task), counted with its CPU time
        (``RuntimeCounters.projections``, ``projection_cpu_ns``)."""
        if task.view not in self._by_view:
            start = time.thread_time_ns()
            self._by_view[task.view] = self.predict(task)
            self.meter.add(projections=1, projection_cpu_ns=time.thread_time_ns() - start)
        return self._by_view[task.view]

    def remap(self, index_map: Tensor) -> None:
        """Carry every view's rows through a structural change (``index_map``: new row -> old row, -1 fresh;
        ``core/tables.remap_row_sets``); the steps' predicted unions are culled again when next needed."""
        self._rows.clear()
        views = list(self._by_view)
        carried = remap_row_sets([self._by_view[view] for view in views], index_map)
        self._by_view = dict(zip(views, carried))
