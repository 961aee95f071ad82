"""Per-primitive tables of the runtime (sequence words and versions, pending writes, last publication), their remap.

Rows are stable between structural changes; a structural change (densify, prune, opacity reset) produces an
index map ``new row -> old row`` (-1 for a fresh row) and :func:`remap` carries every per-primitive table
through it at once, the way gsplat's ``ops`` carry parameters, optimizer state and strategy state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from odin_nerfstudio.core.tasks import NO_STEP


@dataclass
class PrimitiveTables:
    """Bookkeeping per primitive; every field is an int64 tensor [N].

    Attributes:
        seq: the row's sequence word, twice its version (how many publications have written it), odd while a
            publication writes the row: the seqlock word the kernels' gather and publish share
            (``kernels/ops.py``). :attr:`versions` reads it as ``seq >> 1``.
        pending_step: the latest step that declared (candidate set read) or staged (active set) a write to the
            row that is not published yet, ``NO_STEP`` if none. A superset filter: the exact per-step write
            sets live in the staging ring.
        published_step: the step whose publication last wrote the row, ``NO_STEP`` if none since start or
            since the row was created.
    """

    seq: Tensor
    pending_step: Tensor
    published_step: Tensor

    @classmethod
    def create(cls, num_primitives: int, device: torch.device | str = "cpu") -> PrimitiveTables:
        """Fresh tables for ``num_primitives`` rows: version 0, nothing pending, nothing published."""
        return cls(
            seq=torch.zeros(num_primitives, dtype=torch.int64, device=device),
            pending_step=torch.full((num_primitives,), NO_STEP, dtype=torch.int64, device=device),
            published_step=torch.full((num_primitives,), NO_STEP, dtype=torch.int64, device=device),
        )

    @property
    def versions(self) -> Tensor:
        """How many publications have written each row, int64 [N] (``seq >> 1``; a fresh tensor)."""
        return self.seq >> 1

    @versions.setter
    def versions(self, versions: Tensor) -> None:
        self.seq = versions.to(torch.int64) * 2

    @property
    def num_primitives(self) -> int:
        """Number of rows N."""
        return self.seq.numel()

    def declare(self, rows: Tensor, step: int) -> None:
        """Record that ``step`` may write ``rows`` (int64 [M]) before its publication."""
        pending = self.pending_step.index_select(0, rows)
        self.pending_step.index_copy_(0, rows, torch.clamp(pending, min=step))

    def publish(self, rows: Tensor, declared: Tensor | Sequence[Tensor], step: int) -> None:
        """Record the publication of ``step``: ``rows`` (int64 [M]) written (their versions advanced), ``declared``
        rows no longer pending (:meth:`settle`)."""
        self.seq.index_add_(0, rows, torch.full_like(rows, 2))
        self.settle(rows, declared, step)

    def settle(self, rows: Tensor, declared: Tensor | Sequence[Tensor], step: int) -> None:
        """The marks of ``step``'s publication, once its ``rows`` (int64 [M]) are written and their sequence words
        advanced (the runtime's publication advances them with the rows, ``kernels.ops.publish_adam``).

        Publications run in step order, so every pending mark at or before ``step`` on the declared rows is
        cleared; marks of later steps stay. ``declared`` may be one row tensor or the candidate sets as the tasks
        declared them: clearing is idempotent, so they are cleared one by one, without forming their union.
        """
        self.published_step.index_fill_(0, rows, step)
        for part in [declared] if isinstance(declared, Tensor) else declared:
            pending = self.pending_step.index_select(0, part)
            self.pending_step.index_copy_(0, part, torch.where(pending <= step, NO_STEP, pending))

    def remap(self, index_map: Tensor) -> PrimitiveTables:
        """The tables after a structural change; see :func:`remap`."""
        return remap(self, index_map)


_FRESH_VALUE = {"seq": 0, "pending_step": NO_STEP, "published_step": NO_STEP}


def remap_rows(table: Tensor, index_map: Tensor, fresh_value: int | float) -> Tensor:
    """Gather a per-primitive table [N_old, ...] through ``index_map`` [N_new] (new row -> old row, -1 fresh)."""
    fresh = index_map < 0
    out = table[index_map.clamp(min=0)].clone()
    out[fresh] = fresh_value
    return out


def remap_row_sets(sets: Sequence[Tensor], index_map: Tensor) -> list[Tensor]:
    """Sorted row sets (old ids, int64) carried through a structural change: each becomes the new rows whose parent
    is in it (the row kept, or the children of a duplicated or split row), sorted; a removed row leaves every set and
    a fresh row (-1) joins none. O(|set| log N) per set after one sort of the index map."""
    kept = torch.nonzero(index_map >= 0).flatten()
    parents, order = torch.sort(index_map[kept], stable=True)
    children = kept[order]
    carried = []
    for rows in sets:
        first = torch.searchsorted(parents, rows)
        counts = torch.searchsorted(parents, rows, right=True) - first
        # the children of rows[i] are children[first[i] : first[i] + counts[i]]: one flat gather of those runs
        offsets = torch.cumsum(counts, 0) - counts
        runs = torch.repeat_interleave(first - offsets, counts)
        positions = runs + torch.arange(runs.numel(), dtype=torch.int64, device=runs.device)
        carried.append(torch.sort(children[positions]).values)
    return carried


def remap(tables: PrimitiveTables, index_map: Tensor) -> PrimitiveTables:
    """Carry every per-primitive table through a structural change.

    A row kept, duplicated or split inherits its parent's entries (a child starts where its parent was); a
    fresh row (-1) starts at version 0 (an even sequence word) with nothing pending or published. Structural changes run behind a
    drain barrier, so a pending write on any parent is a bug and raises.

    Args:
        tables: the tables before the change, [N_old] each.
        index_map: int64 [N_new], new row -> old row, or -1 for a fresh row.

    Returns:
        New tables, [N_new] each.
    """
    used = index_map[index_map >= 0]
    if bool((tables.pending_step[used] != NO_STEP).any()):
        raise RuntimeError("remap with unpublished writes: structural changes must run behind a drain barrier")
    return PrimitiveTables(
        **{f.name: remap_rows(getattr(tables, f.name), index_map, _FRESH_VALUE[f.name]) for f in fields(tables)}
    )


def index_map_from_uid(uid: Tensor) -> Tensor:
    """The index map of a structural change made by gsplat's ops, from a row-id column they carried.

    gsplat 1.4.0's ``duplicate``, ``split`` and ``remove`` remap every tensor of the strategy state like the
    parameters, so storing ``state["uid"] = torch.arange(N)`` before the change leaves, after it, each new
    row's parent row: that column is the index map (new row -> old row). Ops that append zero-initialised
    state rows (``sample_add``) would label fresh rows as row 0, so they are not supported by this helper.

    Args:
        uid: the carried column, int64 [N_new].
    """
    return uid.to(torch.int64).clone()
