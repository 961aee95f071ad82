"""The sharded mode's reader side (``runtime/sharding.py`` describes a step): the rows one rank's tasks of a step
read, gathered from every owner, and the rank's side of its own tasks (render on fetched rows, stage, return the
gradients to their owners)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from odin_nerfstudio.core.sparse import tensor_bytes
from odin_nerfstudio.core.tasks import Task, task_generator
from odin_nerfstudio.runtime.adapter import RenderAdapter
from odin_nerfstudio.runtime.metering import Meter
from odin_nerfstudio.runtime.ownership import ShardCuts
from odin_nerfstudio.runtime.reads import Read, ReadRecord, RenderFn
from odin_nerfstudio.runtime.shadow import ShadowGraph
from odin_nerfstudio.runtime.sharding import Rows


@dataclass
class FetchedStep:
    """The rows one rank's tasks of a step read, gathered from every owner.

    Attributes:
        ids: global ids, sorted int64 [R].
        masks: per row, the bit of each of the rank's tasks that reads it, int64 [R].
        versions: the version each row was read at, int64 [R].
        values: per name, the rows' parameter values [R, ...].
        unsure: per task of the rank, whether some owner may still send rows of it (after a publication).
        started: the rank's tasks of the step rendered so far.
    """

    ids: Tensor
    masks: Tensor
    versions: Tensor
    values: dict[str, Tensor]
    unsure: list[bool]
    started: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, received: Sequence[Rows], template: dict[str, Tensor], unsure: Sequence[bool]) -> FetchedStep:
        """The rows received from each owner (owners hold increasing ranges: their parts concatenate in order)."""
        rows = _concat(received, template)
        values = {name: rows[name] for name in template}
        return cls(rows["ids"], rows["masks"], rows["versions"], values, list(unsure))

    def joined(self, received: Sequence[Rows], template: dict[str, Tensor]) -> FetchedStep:
        """A copy with ``received`` rows (none of them held here) merged in: the clean part and the stale rows a
        throughput-first read admits."""
        copy = FetchedStep(self.ids, self.masks, self.versions, dict(self.values), list(self.unsure))
        copy.add(received, template)
        return copy

    def add(self, received: Sequence[Rows], template: dict[str, Tensor], tasks: Sequence[int] | None = None) -> None:
        """The rest of the rows, sent after a publication: merged in id order; every task (or the rank's ``tasks``)
        then has all its rows. No task's row was sent before, though a row may already be here for another task
        (an owner's early publication settled that one locally): each task still reads each of its rows once."""
        rest = _concat(received, template)
        ids = torch.cat([self.ids, rest["ids"]])
        order = torch.argsort(ids)
        self.ids = ids[order]
        self.masks = torch.cat([self.masks, rest["masks"]])[order]
        self.versions = torch.cat([self.versions, rest["versions"]])[order]
        self.values = {name: torch.cat([self.values[name], rest[name]])[order] for name in template}
        for index in range(len(self.unsure)) if tasks is None else tasks:
            self.unsure[index] = False

    @property
    def nbytes(self) -> int:
        """Bytes of the fetched rows (ids, masks, versions, values)."""
        tables = [self.ids, self.masks, self.versions, *self.values.values()]
        return sum(tensor_bytes(t) for t in tables)

    def rows_of(self, index: int) -> Tensor:
        """The positions (into :attr:`ids`) of the rows the rank's task ``index`` reads, sorted int64."""
        return torch.nonzero((self.masks >> index) & 1).flatten()


def _concat(parts: Sequence[Rows], template: dict[str, Tensor]) -> Rows:
    """Row tables of the owners, in owner order, as one (no row appears twice)."""
    return {key: torch.cat([part[key] for part in parts]) for key in ["ids", "masks", "versions", *template]}


class Reader:
    """One rank's side of its own tasks: leaves from fetched rows, render, stage, and the return to the owners.

    Args:
        cuts: every rank's range (where a gradient row returns).
        template: per name, a tensor giving the gradient rows' trailing shape and dtype (the shard's parameters).
        render_fn: (task, leaves, generator) -> (loss, info).
        adapter: the renderer's conventions (A(t) from the render's info).
        meter: the rank's counters and timeline.
        seed: the run's seed (each task's random stream).
        ring_slots: K, the steps that may be staged at once.
        keeps_stats: whether the tasks' densification statistics return to the owners.
        measure_norms: whether each task's squared gradient norms are measured (the adaptive batch rule).
    """

    def __init__(
        self,
        cuts: ShardCuts,
        template: dict[str, Tensor],
        render_fn: RenderFn,
        adapter: RenderAdapter,
        meter: Meter,
        seed: int,
        ring_slots: int,
        keeps_stats: bool = False,
        measure_norms: bool = False,
    ) -> None:
        self.keeps_stats = keeps_stats
        self.cuts, self.template, self.render_fn, self.adapter = cuts, template, render_fn, adapter
        self.meter, self.seed = meter, seed
        self.shadow = ShadowGraph(ring_slots, device=next(iter(template.values())).device, measure_norms=measure_norms)

    def run(self, fetched: FetchedStep, task: Task) -> None:
        """Render and back-propagate ``task`` (the rank's task number ``task.index``) on its fetched rows and stage
        its active rows' gradients in its step's slot (global ids)."""
        positions = fetched.rows_of(task.index)
        candidate = fetched.ids.index_select(0, positions)
        if self.shadow.slot(task.step) is None:
            self.shadow.open(task.step)
        self.shadow.declare(task.key, candidate)
        leaves = {
            name: values.index_select(0, positions).requires_grad_(True) for name, values in fetched.values.items()
        }
        record = ReadRecord(candidate, task.step - 1, (), None)
        read = Read(task, record, leaves, task_generator(self.seed, task.step, task.view))
        keep = self.adapter.before_backward if self.keeps_stats else None
        info = self.meter.render_and_backward(self.render_fn, read, keep)
        stats = self.adapter.task_stats(info, candidate) if self.keeps_stats else None
        active = None if info is None else self.adapter.active_mask(info, candidate.numel())
        self.shadow.stage_task(task.key, candidate, leaves, active, () if stats is None else (stats,))
        fetched.started.add(task.index)

    def returns(self, step: int, worker: int) -> tuple[list[Rows], list[Rows], Tensor | None]:
        """The rank's update of ``step`` (its tasks' gradients summed in task order) split by owner, its tasks'
        statistics split by owner (a ``task`` column keeps their order) and their squared gradient norms summed in
        task order (None unless measured); frees the slot."""
        if self.shadow.slot(step) is None:
            self.shadow.open(step)
        update = self.shadow.local_update(step, worker, self.template)
        self.shadow.free(step)
        pieces = self.cuts.split({"ids": update.rows, **update.grads})
        return pieces, self._stats_by_owner(update.stats), update.sq_norms

    def _stats_by_owner(self, stats: Sequence[dict[str, Tensor]]) -> list[Rows]:
        """Each task's statistics entries (global rows) split by the owner of their rows, task by task."""
        device = next(iter(self.template.values())).device
        entries = {
            "task": torch.cat([torch.full_like(s["rows"], i) for i, s in enumerate(stats)])
            if stats else torch.empty(0, dtype=torch.int64, device=device),
            **{key: torch.cat([s[key] for s in stats]) if stats else torch.empty(0, device=device)
               for key in ("rows", "grad2d", "radii")},
        }
        entries["rows"] = entries["rows"].to(torch.int64)
        owners = self.cuts.owner_of(entries["rows"])
        return [{key: value[owners == rank] for key, value in entries.items()} for rank in range(self.cuts.num_shards)]
