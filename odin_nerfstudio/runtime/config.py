"""The runtime's hyperparameters (nerfstudio-style config dataclass); see ``docs/architecture.md``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from odin_nerfstudio.runtime.admission import POLICIES

if TYPE_CHECKING:
    from odin_nerfstudio.scheduling.schedule import ScheduleConfig

Mode = Literal["quality", "throughput", "barrier", "ddp", "hogwild"]


@dataclass
class OdinRuntimeConfig:
    """Hyperparameters of the runtime.

    Attributes:
        mode: the admission policy (``admission.py``): "quality" (exact, waits on conflicting
            rows), "throughput" (admits bounded stale reads) or "barrier" (global wait per step, the reference); the
            paper's controls "ddp" (barrier, every row read, dense update and Adam, as DistributedDataParallel)
            and "hogwild" (reads never wait, nothing validated).
        ring_slots: K, steps that may be staged at once (step s may read once step s - K is published).
        fetch_ahead: sharded quality-first: how many steps past the one being published are fetched ahead (1 to
            K - 1; more is taken as K - 1). 1 by the simulator's measure (``docs/architecture.md``, "Why
            quality-first stays exact"): a task culled further ahead must be clear of more unpublished steps'
            writes, and one task that is not makes every rank fetch its step's rest.
        placement_by_time: sharded: among the placements of a step's workers that read as many rows locally, even out
            the ranks' render + backward time as measured (every rank's figure rides on each step's return), else
            their candidate rows (the same placement in every run); ``runtime/placement.py``.
        stale_fraction: t, the largest admitted |C n pending| / |C| (throughput).
        stale_grad_ratio: the admitted producer gradient magnitude, as a fraction of its active-set mean.
        max_staleness: the most steps a stale row may lag behind (throughput).
        candidate_margin: widening of the drawable region C(t) is culled against (fraction of the image size; its
            near plane moves by 1 + it times each radius), see ``CullRegion.widened``.
        near_plane: the near plane C(t) is culled with: the rasterizer's (odin-splat's model renders with 0.01).
        wait_timeout_s: timeout of every blocking wait on the transport.
        record_reads: keep, per task, its final read and, per step, its published rows (for tests and audits).
        priority_publication: ask, with each step's exchange, for the rows the next step's local tasks would read (their
            candidate sets), and publish those first, as soon as they arrive (the design's priority publication; quality
            and throughput only). The exchange then sends the rows before the gradients.
        spatial_order: keep the model's rows in the Z-order of their centres (``row_order.py``): permuted when the
            runtime is built and after every structural change, so that a view's rows are a few runs of consecutive
            rows (cache-friendly gathers, scatters and Adam). The runtime then owns the row order.
        tasks_in_flight: B_gpu, the tasks a process renders at once (``lanes.py``): the driver's thread and
            ``tasks_in_flight - 1`` lane threads (each a CUDA stream on a GPU) gather, render and back-propagate; the
            driver's thread alone stages, validates and publishes, under the kernels' row locks. 1: one task at a
            time, on the driver's thread.
        keep_freed_memory: on the CPU, keep freed blocks in the process heap for the next task rather than give them
            back to the kernel per task (``core/heap.py``: glibc's malloc thresholds, set once per process; the CUDA
            caching allocator does this on a GPU).
    """

    mode: Mode = "quality"
    ring_slots: int = 4
    fetch_ahead: int = 1
    placement_by_time: bool = True
    stale_fraction: float = 0.2
    stale_grad_ratio: float = 0.2
    max_staleness: int = 4
    candidate_margin: float = 0.1
    near_plane: float = 0.01
    wait_timeout_s: float = 60.0
    record_reads: bool = False
    priority_publication: bool = True
    spatial_order: bool = True
    tasks_in_flight: int = 1
    keep_freed_memory: bool = True

    def __post_init__(self) -> None:
        if self.mode not in POLICIES:
            raise ValueError(f"unknown mode {self.mode!r}")
        if self.ring_slots < 1:
            raise ValueError(f"ring_slots must be >= 1, got {self.ring_slots}")
        if self.fetch_ahead < 1:
            raise ValueError(f"fetch_ahead must be >= 1, got {self.fetch_ahead} (--runtime.fetch-ahead)")
        if self.tasks_in_flight < 1:
            raise ValueError(f"tasks_in_flight must be >= 1, got {self.tasks_in_flight} (--runtime.tasks-in-flight)")


@dataclass(frozen=True)
class Topology:
    """W and B of the workers one runtime holds, named once and derived from the schedule (:meth:`of`).

    K, the steps that may be staged at once, is the user's ``OdinRuntimeConfig.ring_slots``.

    Attributes:
        num_workers: W, the workers sharing this runtime (every schedule worker when they share one process, one
            per rank in a distributed run).
        views_per_worker: B, a worker's views (tasks) per step; a short step declares fewer (``plan_step``).
    """

    num_workers: int = 1
    views_per_worker: int = 1

    def __post_init__(self) -> None:
        if self.num_workers < 1 or self.views_per_worker < 1:
            raise ValueError(f"a topology needs W >= 1 and B >= 1, got W={self.num_workers}, B={self.views_per_worker}")

    @classmethod
    def of(cls, schedule: ScheduleConfig, local_workers: int | None = None) -> Topology:
        """The topology of a runtime holding ``local_workers`` (default: every one) of a schedule's workers."""
        workers = schedule.num_workers if local_workers is None else local_workers
        return cls(num_workers=workers, views_per_worker=schedule.views_per_worker)
