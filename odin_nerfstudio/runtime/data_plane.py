"""The data plane of one runtime: what acting on the protocol's decisions does to tensors.

The control plane (``reading.py``, ``commit.py``) decides who reads, waits, commits and publishes; this part
acts: it declares an admitted read's rows as pending writes, gathers them into the task's leaves (the Shadow
Graph), and stages the task's active rows, gradients and statistics after its backward. The per-primitive tables
(versions, pending marks) live here and are carried through structural changes (:meth:`DataPlane.remap`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from odin_nerfstudio.core.conflicts import StepRows, isin_sorted
from odin_nerfstudio.core.tables import PrimitiveTables
from odin_nerfstudio.core.tasks import Task, task_generator
from odin_nerfstudio.kernels import ops
from odin_nerfstudio.runtime.adapter import RenderAdapter
from odin_nerfstudio.runtime.culling_index import RemoteTasks
from odin_nerfstudio.runtime.metering import Meter
from odin_nerfstudio.runtime.publication import Publisher
from odin_nerfstudio.runtime.reads import Read, ReadRecord
from odin_nerfstudio.runtime.shadow import ShadowGraph
from odin_nerfstudio.runtime.validation import ReadLog


class DataPlane:
    """Declares, gathers and stages reads (see the module).

    Args:
        params: the model's parameters.
        shadow, log, remote, publisher, meter: the runtime's parts.
        adapter: the renderer's conventions (A(t) and statistics from a render's info).
        seed: the run's seed (a task's random draws).
        keeps_stats: whether a strategy's statistics are staged.
        wait_timeout_s: the longest a gather waits for a row a publication holds.
    """

    def __init__(
        self,
        params: dict[str, Tensor],
        shadow: ShadowGraph,
        log: ReadLog,
        remote: RemoteTasks,
        publisher: Publisher,
        meter: Meter,
        adapter: RenderAdapter,
        seed: int,
        keeps_stats: bool,
        wait_timeout_s: float,
    ) -> None:
        self.params, self.shadow, self.log, self.remote = params, shadow, log, remote
        self.publisher, self.meter, self.adapter = publisher, meter, adapter
        self.seed, self.keeps_stats, self.wait_timeout_s = seed, keeps_stats, wait_timeout_s
        self.tables = PrimitiveTables.create(params["means"].shape[0], device=params["means"].device)

    def admit(self, task: Task, candidate: Tensor, admitted: tuple[StepRows, ...] = ()) -> Read:
        """Let ``task`` read ``candidate`` (a first read, or a re-run on the synchronous state): declare it as the
        task's possible writes and log the read (what it saw of a first part published before it)."""
        self.shadow.declare(task.key, candidate)
        ops.declare_rows(self.tables, candidate, task.step)
        published = self.publisher.published_through
        early = self.publisher.early.get(published + 1)
        record = ReadRecord(candidate, published, admitted, None if early is None else early.published)
        if early is not None and bool(isin_sorted(early.published, candidate).any()):
            self.meter.counters.early_reads += 1
        self.log.add(task, record)
        return Read(task, record, {}, task_generator(self.seed, task.step, task.view))

    def gather(self, read: Read, concurrent: bool, publishing: Callable[[], int]) -> None:
        """Gather a read's C(t) into its leaves (once). ``concurrent``: a publication may run beside it (lanes);
        ``publishing()`` counts publications begun (odd while one writes): a row a publication holds is read again
        once released, and the gather is counted as beside a publication."""
        if read.leaves:
            return
        begun = publishing()
        seq, timeout = self.tables.seq, self.wait_timeout_s
        leaves, rereads = self.shadow.gather(self.params, read.candidate, seq, concurrent, timeout)
        read.leaves.update(leaves)
        if concurrent:
            beside = begun % 2 == 1 or publishing() != begun
            self.meter.add(locked_rereads=rereads, gathers_beside_publication=int(beside))

    def stage(self, read: Read, info: dict[str, Any] | None) -> None:
        """Stage A(t) (the adapter reads it from the render's ``info``, else the rows with a gradient), its
        gradients and its statistics (A(t) is also the view's next predicted writes); frees the leaves."""
        stats = None
        if self.keeps_stats and info is not None:
            stats = self.adapter.task_stats(info, read.candidate)
        active = None if info is None else self.adapter.active_mask(info, read.candidate.numel())
        task_stats = () if stats is None else (stats,)
        staged = self.shadow.stage_task(read.task.key, read.candidate, read.leaves, active, task_stats)
        self.remote.saw(read.task.view, staged)

    def conflicted_with_step_before(self, read: Read) -> bool:
        """Whether ``read``'s C(t) holds a row the publication of the step before its task's wrote."""
        written = self.tables.published_step.index_select(0, read.candidate)
        # a host synchronization on CUDA, needed: the driver decides on it how the next step reads
        return bool((written == read.task.step - 1).any())

    def remap(self, index_map: Tensor) -> None:
        """Carry the tables through a structural change (``index_map`` int64 [N_new]: new row -> old row)."""
        self.tables = self.tables.remap(index_map)
