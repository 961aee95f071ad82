"""The sharded loop's steps read ahead (``drivers/sharded_loop.py``): a clean part culled ahead and the exchange
carrying it, a step fetched ahead and what its tasks may read, and the per-rank, per-task flags every rank
exchanges."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from odin_nerfstudio.comm.all_to_all import main_of, side_of, with_side
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.runtime.shard_reader import FetchedStep
from odin_nerfstudio.runtime.sharding import RowHandle, Rows


@dataclass
class Ahead:
    """A step fetched ahead, before the step before it is published.

    Attributes:
        fetched: its clean part (the rest follows once the step before is published).
        unsure: per rank and task, whether this owner held back rows of it (it serves their rest).
        anyone: per rank and task, whether any owner did (every rank knows: the flags go to every rank).
        stale: throughput-first: the clean part with the rows a stale read reads, else None.
        admitted: throughput-first: per rank and task, whether it read stale (every rank's decision), else None.
        failed: throughput-first: per rank and task, whether the gradient rule failed on this owner's rows.
        held: throughput-first: per task of this rank, how many rows of its C(t) the step before may write.
        local: quality-first: this rank's tasks (indices) whose only doubt is its own owner's, settled once that
            owner publishes early the rows only this rank's tasks of the step before write.
    """

    fetched: FetchedStep
    unsure: list[list[bool]]
    anyone: list[list[bool]]
    stale: FetchedStep | None = None
    admitted: list[list[bool]] | None = None
    failed: list[list[bool]] | None = None
    held: list[int] | None = None
    local: list[int] = field(default_factory=list)

    def rest_needed(self) -> list[list[bool]]:
        """Per rank and task, whether it waits for the rest of its rows (as far as known before the stale reads'
        verdicts): any owner held rows of it back, and it does not read them stale."""
        return self.anyone if self.admitted is None else waiting(self.anyone, self.admitted)


@dataclass
class Carrier:
    """An exchange in flight that carries clean parts (its own, or a return's), waited for once."""

    handle: RowHandle
    parts: list[Rows] | None = None


@dataclass
class CleanPart:
    """A clean part culled ahead (``ShardedLoop._cull_ahead``) and the exchange carrying it.

    Attributes:
        step: the step fetched ahead.
        served: the clean rows served (``Owner.serve`` of ``Owner.cull_clean``'s clean rows).
        unsure, stale: ``Owner.cull_clean``'s unsure flags and stale-read rows (per rank and task).
        stale_served: throughput-first: the stale-read rows served, else empty.
        flags: every rank's tasks' unsure flags, held-back and total row counts (the same table to every rank).
        tag: "" where the clean part is its exchange's main table, else the prefix of its side tables on a return.
        carrier: the exchange carrying it, once started.
    """

    step: int
    served: list[Rows]
    unsure: list[list[bool]]
    stale: list[list[Tensor]]
    stale_served: list[Rows]
    flags: Rows
    tag: str = ""
    carrier: Carrier | None = None

    def pieces(self, pieces: Sequence[Rows] | None = None) -> list[Rows]:
        """Per destination, its clean rows with the flags and stale rows as side tables; on ``pieces`` (a return's)
        as side tables under :attr:`tag`, else as a message of their own."""
        out = []
        for rank, rows in enumerate(self.served):
            tables = {self.tag: rows, f"{self.tag}flags": self.flags}
            if self.stale_served:
                tables[f"{self.tag}stale"] = self.stale_served[rank]
            piece = dict(rows) if pieces is None else dict(pieces[rank])
            for name, table in tables.items():
                if name:
                    piece = with_side(piece, name, table)
            out.append(piece)
        return out

    def tables(self, part: Rows) -> tuple[Rows, Rows, Rows]:
        """A received piece's clean rows, flags and stale rows (empty: none)."""
        rows = main_of(part) if not self.tag else side_of(part, self.tag)
        return rows, side_of(part, f"{self.tag}flags"), side_of(part, f"{self.tag}stale")


def doubt_flags(
    unsure: Sequence[Sequence[bool]],
    local: Sequence[Sequence[bool]],
    stale: Sequence[Sequence[Tensor]],
    clean: Sequence[Sequence[Tensor]],
    device: torch.device,
) -> Rows:
    """One owner's flags of a step's tasks (``Owner.cull_clean``'s), as the table it sends every rank, so that each
    learns every task's doubts: per task, unsure (``ids``), whether that doubt is local, and its held-back and
    total row counts here (throughput-first's stale share)."""

    def column(values: list) -> Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device).reshape(-1)

    return {
        "ids": column([d for rank in unsure for d in rank]),
        "local": column([d for rank in local for d in rank]),
        "held": column([r.numel() for rank in stale for r in rank]),
        "total": column([r.numel() + c.numel() for h, k in zip(stale, clean) for r, c in zip(h, k)]),
    }


def settled_locally(
    doubts: Sequence[Rows], tasks: Sequence[Sequence[Task]], early: bool
) -> tuple[list[list[bool]], list[list[bool]]]:
    """From every owner's flags (``doubts``, in owner order): per rank and task, whether any owner still holds rows
    of it back, and whether the early publication settles it (``early``: one is made): its only doubt is its own
    rank's owner's, and local there (``Owner.cull_clean``)."""
    doubt = torch.stack([d["ids"].bool() for d in doubts])
    local = torch.stack([d["local"].bool() for d in doubts])
    settled = local.any(dim=0) & ~(doubt & ~local).any(dim=0) & early
    return unflat(doubt.any(dim=0) & ~settled, tasks), unflat(settled, tasks)


def flat(flags: Sequence[Sequence[bool]], device: torch.device) -> Tensor:
    """Per rank and task flags as one bool tensor on ``device``, ranks in order."""
    return torch.tensor([bool(f) for rank in flags for f in rank], dtype=torch.bool, device=device)


def unflat(flags: Tensor, tasks: Sequence[Sequence[Task]]) -> list[list[bool]]:
    """:func:`flat`'s inverse, given every rank's tasks."""
    return [[bool(v) for v in rank] for rank in per_rank(flags.tolist(), tasks)]


def per_rank(values: list, tasks: Sequence[Sequence[Task]]) -> list[list]:
    """Per-task values of every rank, in rank order, split by rank."""
    out, start = [], 0
    for rank_tasks in tasks:
        out.append(values[start : start + len(rank_tasks)])
        start += len(rank_tasks)
    return out


def waiting(
    flags: Sequence[Sequence[bool]],
    admitted: Sequence[Sequence[bool]],
    failed: Sequence[Sequence[bool]] | None = None,
) -> list[list[bool]]:
    """Per rank and task, whether a task flagged (some owner held rows of it back) waits for the rest of its rows:
    it was not admitted to read them stale, or its stale read failed the gradient rule (``failed``; None: no
    verdict yet)."""
    if failed is None:
        failed = [[False] * len(rank) for rank in flags]
    return [
        [doubt and (not admit or rerun) for doubt, admit, rerun in zip(d, a, f, strict=True)]
        for d, a, f in zip(flags, admitted, failed, strict=True)
    ]


def none_of(flags: Sequence[Sequence[bool]]) -> bool:
    """Whether no flag of any rank is set."""
    return not any(any(rank) for rank in flags)
