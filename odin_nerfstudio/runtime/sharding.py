"""The sharded (mixed-parallel) mode: the owner of a shard of the Gaussians, and what a step moves between ranks (the
reader's side, a rank's own tasks on the rows fetched for them, is ``runtime/shard_reader.py``).

Every rank owns a contiguous range of global ids (``ownership.py``) with their parameters, Adam moments, versions
and culling bounds, and renders its own views. A step moves rows twice, each time as one variable-size
all-to-all (``comm/all_to_all.py``):

1. **fetch**: the schedule is global, so each owner culls its range against every task of the step (no request
   message) and sends each rank the rows its tasks read, with their versions and, per row, a mask of the rank's
   tasks that read it. A rank keeps a step's rows for all its tasks: two of its tasks that share a row fetch it once.
   What travels is 3D rows (the pull model), not screen-space Gaussians (``docs/architecture.md`` gives the bytes).
2. **return**: after its tasks' backwards, a rank sends each owner the rows of its step's update in the owner's
   range: its tasks' gradients summed in task order (the Shadow Graph's staging op, as a replicated worker does).
   The owner sums the ranks' parts in the order of the schedule workers they ran (the loop puts them so) and
   applies selective Adam to the union (``publication.py``'s
   :class:`Publisher`), so each row gets the replicated barrier's bits: same sums in the same order, same Adam.

The owner checks reads against the pending writes to its rows, which it knows exactly (every write to a row
reaches its owner): a row that some task of an unpublished step may write (it is in that task's C(t)) is
*pending*. C(t) itself is culled on the synchronous state, as the barrier culls it. Before step s is published an
owner may already send step s + 1's rows that step s cannot write (the clean part): they hold their synchronous
values now, and they are in C(t) whatever step s does, since only step s's rows move. It also tells each task
whether a pending row may end up in its C(t): whether one meets its frustum widened by the most one publication can
move a row (``SelectiveAdam.movement_bound``). A task for which no owner says so reads exactly its synchronous C(t)
already, and may run ahead of the publication; the others get the rest of their rows (the pending rows in their
frustum, culled after the publication) once step s is published. That is how quality-first overlaps a step with
the one before and stays equal to the barrier bit for bit. Where those pending rows are the owner's own rank's to
write alone (no other rank's task of step s has them in its C(t)), the owner publishes them from its own rank's
part before the return arrives and serves its rank's waiting task their rest at once (:meth:`Owner.publish_early`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from odin_nerfstudio.comm.protocol import FirstPart
from odin_nerfstudio.core.conflicts import isin_sorted, union_sorted
from odin_nerfstudio.core.selective_adam import SelectiveAdam
from odin_nerfstudio.core.sparse import SparseUpdate, restricted, sum_in_order, tensor_bytes
from odin_nerfstudio.core.tables import PrimitiveTables
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.runtime.adapter import RenderAdapter
from odin_nerfstudio.runtime.culling_index import CullingIndex
from odin_nerfstudio.runtime.ownership import ShardCuts
from odin_nerfstudio.runtime.publication import Publisher
from odin_nerfstudio.runtime.reads import DrawableFn

LearningRates = Callable[[str, int], float]
"""(parameter name, k) -> the learning rate of the k-th publication from now (0: the next), before any batch gain."""

Rows = dict[str, Tensor]
"""Per-row tensors of one row count (``ids`` int64 [n] first), the unit a shard message carries."""

MASK_BITS = 63
"""The most tasks a rank may run in one step: a fetched row's mask holds one bit per task of the reading rank."""


class RowHandle(Protocol):
    """A row exchange in flight."""

    def wait(self, timeout: float) -> list[Rows]:
        """Per source rank, in rank order, the rows it sent this rank; raises ``TimeoutError`` naming the exchange."""


class RowExchange(Protocol):
    """Moves per-destination row tables between the ranks (an all-to-all with split sizes); every rank starts the
    same exchanges in the same order."""

    def start(self, pieces: Sequence[Rows], what: str) -> RowHandle:
        """Send ``pieces[r]`` to rank r (possibly no rows); ``what`` names the exchange in errors."""


@dataclass
class ShardCounters:
    """What the sharded mode counted on one rank.

    Attributes:
        rows_fetched: rows this rank received for its tasks (each once per step, whatever its tasks sharing it).
        rows_local: those of them this rank owns itself (no link crossed).
        task_rows: rows its tasks read (the sum of |C(t)|): what a fetch per task would have moved.
        rows_served: rows this rank's shard sent to readers.
        rows_returned: gradient rows this rank sent to owners.
        ran_ahead: tasks rendered before the previous step was published (on clean rows, or stale ones admitted).
        most_ahead: the most unpublished steps before a task that ran ahead (up to K - 1 in quality-first).
        placed: steps whose workers the placement ran on other ranks than their own numbers.
        rest_fetches: steps fetched ahead whose rest was fetched after the publication (the others skip that
            exchange: no owner held a row of them back).
        stale_reads: tasks that read rows of the unpublished step stale (throughput-first; a task admitted whose C(t)
            held none of them, only rows that might move into it, runs ahead without counting here).
        reruns: tasks read stale and re-run on the published state (the gradient rule failed).
        publications: steps this owner published.
        published_early: steps this owner published in two parts, the rows only its own rank's tasks write first
            (before the return arrived), so that its rank's tasks of the next step settled their doubt locally.
        settled_locally: this rank's tasks whose only doubt that early publication settled (no rest fetched).
        peak_fetched_bytes: the most bytes of fetched rows held at once (a step's, and the next one's clean part).
        restructures: structural changes (each re-orders the rows and moves those whose owner changed).
        recuts: structural changes after which the shards were re-cut by load.
        bytes_sent, bytes_received: what this rank's exchanges passed to the collectives (over torch.distributed).
    """

    rows_fetched: int = 0
    rows_local: int = 0
    task_rows: int = 0
    rows_served: int = 0
    rows_returned: int = 0
    ran_ahead: int = 0
    most_ahead: int = 0
    rest_fetches: int = 0
    placed: int = 0
    stale_reads: int = 0
    reruns: int = 0
    publications: int = 0
    published_early: int = 0
    settled_locally: int = 0
    peak_fetched_bytes: int = 0
    restructures: int = 0
    recuts: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


class Owner:
    """One rank's shard: its parameters, moments, versions and culling bounds, what it serves and publishes.

    Args:
        params: per name, the shard's parameter rows [n, ...] (global ids ``lo .. lo + n - 1``).
        optimizers: per name, the shard's :class:`SelectiveAdam`.
        cuts: every rank's range.
        rank: this owner's rank.
        adapter: the renderer's conventions (world scales for the culling bounds).
        margin, near_plane: the culling frustum's widening and near plane (as the replicated runtime culls).
        start_step: the first step (the steps before count as published).
        strategy_state: the shard's densification statistics (gsplat's strategy state over its rows), or None.
        index: the shard's culling index (default: a :class:`CullingIndex` of ``params``; the simulator passes one
            whose C(t) is a workload's set).
        drawable: per task, the drawable region of the camera it renders with (``CullingIndex``).
    """

    def __init__(
        self,
        params: dict[str, Tensor],
        optimizers: dict[str, SelectiveAdam],
        cuts: ShardCuts,
        rank: int,
        adapter: RenderAdapter,
        margin: float,
        near_plane: float,
        start_step: int = 0,
        strategy_state: dict[str, Any] | None = None,
        index: CullingIndex | None = None,
        drawable: DrawableFn | None = None,
    ) -> None:
        self.lo, hi = cuts.range(rank)
        if params["means"].shape[0] != hi - self.lo:
            raise ValueError(f"rank {rank} owns ids {self.lo}..{hi - 1} but holds {params['means'].shape[0]} rows")
        self.params, self.optimizers, self.cuts, self.rank = params, optimizers, cuts, rank
        self.adapter, self.strategy_state = adapter, strategy_state
        self.index = index if index is not None else CullingIndex(params, adapter, margin, near_plane, drawable)
        self.tables = PrimitiveTables.create(hi - self.lo, device=params["means"].device)
        self.publisher = Publisher(params, optimizers, adapter, None, start_step - 1, record_rows=False)
        self.pending: dict[int, Tensor] = {}
        """Per unpublished step, its possible writes among this shard's rows (local, sorted): its tasks' C(t)."""
        self._held: dict[int, Tensor] = {}
        """Per step fetched ahead, the pending rows its clean part held back (local, sorted)."""
        self._maybe: dict[int, Tensor] = {}
        """Per step fetched ahead, the held-back rows its unsure tasks' rest may take (local, sorted)."""
        self._stale: dict[int, list[list[Tensor]]] = {}
        """Per step fetched ahead, per rank and task, the rows read stale here (throughput-first; empty: none)."""
        self._others: dict[int, list[Tensor]] = {}
        """Per unpublished step, its possible writes among this shard's rows by other ranks' tasks, as declared
        (local rows; united only where an early publication needs them, :meth:`_others_of`): the rest of its
        pending rows only this rank's own tasks may write (:meth:`publish_early`)."""

    @property
    def published_through(self) -> int:
        """The last step this owner published."""
        return self.publisher.published_through

    def memory(self) -> dict[str, int]:
        """Bytes this shard holds: ``params``, Adam ``moments``, per-row ``tables`` (versions, pending marks) and the
        culling ``bounds`` (centres, radii and their block index)."""
        moments = sum(
            tensor_bytes(value)
            for name, param in self.params.items()
            for value in self.optimizers[name].state.get(param, {}).values()
            if isinstance(value, Tensor) and value.dim() > 0
        )
        bounds = self.index.bounds()
        blocks = bounds.index() if bounds.num_rows else None  # built as the next cull would build it
        index = [] if blocks is None else [blocks.rows, blocks.spheres, blocks.slot_of, blocks.bounds]
        return {
            "params": sum(tensor_bytes(p) for p in self.params.values()),
            "moments": moments,
            "tables": sum(tensor_bytes(t) for t in vars(self.tables).values()),
            "bounds": sum(tensor_bytes(t) for t in [bounds.centres, bounds.radii, *index]),
        }

    def rows_seen(self, views: Sequence[Task]) -> Tensor:
        """Per view, how many rows of this shard its candidate set holds, int64 [len(views)] (for the placement)."""
        counts = [self.index.candidates(view).numel() for view in views]
        return torch.tensor(counts, dtype=torch.int64, device=self.params["means"].device)

    def cull(self, step: int, tasks: Sequence[Sequence[Task]]) -> list[list[Tensor]]:
        """Per rank and task of ``step``, its C(t) in this shard on the current state (local rows, sorted): the whole
        read, every earlier step published. The rows are the step's pending writes until it is published."""
        culled = [[self.index.candidates(task) for task in rank_tasks] for rank_tasks in tasks]
        self._declare(step, culled)
        return culled

    def cull_clean(
        self,
        step: int,
        tasks: Sequence[Sequence[Task]],
        gains: Sequence[float | None] = (),
        rates: LearningRates | None = None,
    ) -> tuple[list[list[Tensor]], list[list[bool]], list[list[Tensor]], list[list[bool]]]:
        """Before the steps before ``step`` are published: per rank and task of ``step``, the rows of its C(t) that
        none of them can write (local, sorted), whether a row one of them may write may end up in its C(t) (in its
        frustum widened by the most their publications can move a row: the k-th at learning rates ``rates(name,
        k)``, default the current ones, and at batch gain ``gains[k]`` where its own is not set yet), the rows
        of its C(t) now that they may write (what a stale read would read), and whether this owner's doubt is
        local: the task is this rank's own, one step is unpublished, and only this rank's own tasks of it may
        write the rows that may end up in its C(t), so that :meth:`publish_early` settles it with no exchange."""
        pending = self._pending_before(step)
        unpublished = step - 1 - self.published_through
        gains = [*gains, *[None] * (unpublished - len(gains))]
        reach = self.index.reach(*(
            sum(
                self.optimizers[name].movement_bound(k + 1, gains[k], None if rates is None else rates(name, k))
                for k in range(unpublished)
            )
            for name in ("means", "scales")
        ))  # fmt: skip
        clean, unsure, stale, local = [], [], [], []
        others = self._others_of(step - 1) if unpublished == 1 else None
        maybe = pending[:0]
        for rank, rank_tasks in enumerate(tasks):
            rows = [self.index.candidates(task) for task in rank_tasks]
            held = [isin_sorted(r, pending) if pending.numel() else torch.zeros_like(r, dtype=torch.bool) for r in rows]
            clean.append([r[~h] for r, h in zip(rows, held, strict=True)])
            stale.append([r[h] for r, h in zip(rows, held, strict=True)])
            meeting = [self.index.meeting(task, pending, reach) if pending.numel() else pending[:0] for task in rank_tasks]
            unsure.append([bool(m.numel()) for m in meeting])
            own = rank == self.rank and others is not None
            local.append([own and bool(m.numel()) and not bool(isin_sorted(m, others).any()) for m in meeting])
            maybe = union_sorted([maybe, *meeting], pending.device)
        self._declare(step, clean)
        self._held[step] = pending
        self._maybe[step] = maybe
        return clean, unsure, stale, local

    def admit_stale(self, step: int, stale: Sequence[Sequence[Tensor]], admitted: Sequence[Sequence[bool]]) -> None:
        """Tasks of ``step`` admitted to read ``stale`` rows before step - 1 is published (throughput-first): those
        rows are their possible writes, and :meth:`judge` checks them once step - 1's gradients are here."""
        kept = [[rows if ok else rows[:0] for rows, ok in zip(r, a, strict=True)] for r, a in zip(stale, admitted)]
        self._declare(step, kept)
        self._stale[step] = kept

    def judge(self, step: int, merged: SparseUpdate, ratio: float) -> list[list[bool]]:
        """Throughput-first's gradient rule, once step - 1's gradients reached this owner (``merged``, local rows):
        per rank and task of ``step`` admitted stale, whether a row it read stale here has a gradient magnitude of
        at least ``ratio`` x the mean over step - 1's rows here (then the task is re-run on the published state)."""
        magnitude = merged.row_magnitude()
        bound = ratio * float(magnitude.mean()) if magnitude.numel() else 0.0
        failed = []
        for rank_rows in self._stale.pop(step, []):
            verdicts = []
            for rows in rank_rows:
                read = isin_sorted(merged.rows, rows) if rows.numel() else None
                verdicts.append(read is not None and bool((magnitude[read] >= bound).any()))
            failed.append(verdicts)
        return failed

    def cull_rest(
        self, step: int, tasks: Sequence[Sequence[Task]], unsure: Sequence[Sequence[bool]]
    ) -> list[list[Tensor]]:
        """Once step - 1 is published: per rank and task of ``step`` that :meth:`cull_clean` was unsure of, the rows
        it held back that are in the task's C(t) now (the rest of its read; empty for the others)."""
        held = self._held.pop(step)
        self._maybe.pop(step, None)
        rest = [
            [
                held[self.index.bounds().meets(self.index.region(task), held)] if doubt else held[:0]
                for task, doubt in zip(rank_tasks, rank_unsure, strict=True)
            ]
            for rank_tasks, rank_unsure in zip(tasks, unsure, strict=True)
        ]
        self._declare(step, rest)
        return rest

    def cull_local(self, step: int, tasks: Sequence[Sequence[Task]], settled: Sequence[int]) -> list[list[Tensor]]:
        """Once :meth:`publish_early` published step - 1's rows that only this rank's tasks write: per rank and task
        of ``step``, for this rank's tasks ``settled`` (their indices; :meth:`cull_clean` found their doubt local),
        the rows held back that are in their C(t) now (the rest of their read, at their synchronous values; empty
        for the other tasks)."""
        held = self._held[step]
        culled = [[held[:0] for _ in rank_tasks] for rank_tasks in tasks]
        for index in settled:
            task = tasks[self.rank][index]
            culled[self.rank][index] = held[self.index.bounds().meets(self.index.region(task), held)]
        self._declare(step, culled)
        return culled

    def _declare(self, step: int, culled: Sequence[Sequence[Tensor]]) -> None:
        """Add ``culled`` rows (per rank and task) to ``step``'s pending writes (and other ranks' to its others')."""
        sets = [rows for rank in culled for rows in rank]
        if step in self.pending:
            sets.append(self.pending[step])
        self.pending[step] = union_sorted(sets, self.params["means"].device)
        others = [rows for rank, rank_rows in enumerate(culled) if rank != self.rank for rows in rank_rows]
        self._others.setdefault(step, []).extend(rows for rows in others if rows.numel())

    def _others_of(self, step: int) -> Tensor:
        """The rows of this shard that other ranks' tasks of ``step`` may write (local, sorted)."""
        return union_sorted(self._others.get(step, []), self.params["means"].device)

    def _pending_before(self, step: int) -> Tensor:
        """The rows an unpublished step before ``step`` may write (local, sorted): its C(t) culled so far, and for
        a step fetched ahead whose rest is not culled yet, the held-back rows its rest may take (those that may
        reach an unsure task's frustum)."""
        sets = [rows for s, rows in self.pending.items() if self.published_through < s < step]
        sets += [rows for s, rows in self._maybe.items() if self.published_through < s < step]
        return union_sorted(sets, self.params["means"].device)

    def serve(self, culled: Sequence[Sequence[Tensor]]) -> list[Rows]:
        """Per rank, the rows its tasks read among ``culled`` (per task, local rows): global ids, task masks,
        versions and parameter values, each row once."""
        pieces = []
        for rank_rows in culled:
            local, masks = _rows_and_masks(rank_rows, self.params["means"].device)
            rows = {"ids": local + self.lo, "masks": masks, "versions": self.tables.versions.index_select(0, local)}
            rows.update({name: param.detach().index_select(0, local) for name, param in self.params.items()})
            pieces.append(rows)
        return pieces

    def publish(self, step: int, parts: Sequence[Rows], stats: Sequence[Rows] = ()) -> SparseUpdate:
        """Sum the ranks' gradient parts of ``step`` in the order given (the schedule workers' order, the barrier's:
        ``drivers/placed_steps.PlacedSteps.worker_order``), apply selective Adam to their union (the shard's rows
        only), advance the versions, refresh the culling bounds and accumulate the tasks' statistics (``stats``: per
        part, its tasks' entries in this shard, in task order); returns the merged update (local
        rows), whose rows' norms the adaptive batch rule gathers."""
        self.publisher.check_order(step)
        updates = [SparseUpdate(part["ids"] - self.lo, {name: part[name] for name in self.params}) for part in parts]
        merged = sum_in_order(updates, self.params)
        rows, means, scales = self.publisher.apply(step, merged, self.tables.seq)
        self.index.update(rows, means, scales)
        if self.strategy_state is not None:
            none = {"rows": rows[:0], "grad2d": means.new_zeros(0), "radii": means.new_zeros(0)}
            self.adapter.accumulate(self.strategy_state, none, self.params["means"].shape[0])  # the tables, once
            for entries in stats:  # worker order, then task order within a worker: the replicated publication's
                for task_entries in _by_task(entries):
                    task_entries["rows"] = task_entries["rows"] - self.lo
                    self.adapter.accumulate(self.strategy_state, task_entries, self.params["means"].shape[0])
        self.publisher.done(step, rows)
        self.pending.pop(step, None)
        self._others.pop(step, None)
        return merged

    def publish_early(self, step: int, part: Rows) -> int:
        """Publish now, before the other ranks' parts of ``step`` arrive, the rows of this rank's own part (``part``:
        its tasks' gradients in this shard, global ids) that no other rank's task of the step may write: their sum
        is this part alone, so selective Adam gives them the bits the whole publication would (``Publisher``'s
        first part, at the step's global step); :meth:`publish` then applies the rest. Returns the rows written."""
        update = SparseUpdate(part["ids"] - self.lo, {name: part[name] for name in self.params})
        others = self._others_of(step)
        own = restricted(update, ~isin_sorted(update.rows, others)) if others.numel() else update
        rows, means, scales = self.publisher.apply_first(step, FirstPart(own.rows, own, None), self.tables.seq)
        self.index.update(rows, means, scales)
        return int(rows.numel())


def _by_task(entries: Rows) -> list[Rows]:
    """A rank's statistics entries (a ``task`` column, in task order) as one table per task."""
    _, counts = torch.unique_consecutive(entries["task"], return_counts=True)
    pieces = [torch.split(entries[key], counts.tolist()) for key in ("rows", "grad2d", "radii")]
    return [{"rows": r, "grad2d": g, "radii": q} for r, g, q in zip(*pieces, strict=True)]


def _rows_and_masks(task_rows: Sequence[Tensor], device: torch.device) -> tuple[Tensor, Tensor]:
    """The union of a rank's tasks' rows (sorted) and, per row, the bit mask of the tasks that read it."""
    if len(task_rows) > MASK_BITS:
        raise ValueError(f"a rank runs {len(task_rows)} tasks in a step; the sharded mode allows {MASK_BITS}")
    ids = union_sorted(list(task_rows), device)
    mask = torch.zeros_like(ids)
    for bit, rows in enumerate(task_rows):
        mask[torch.searchsorted(ids, rows)] |= 1 << bit
    return ids, mask
