"""Ownership in the sharded (mixed-parallel) mode: every Gaussian has a global id and one owner.

Global ids are the rows of the replicated model, which the runtime keeps in Z-order (``core/row_order.py``), so a
shard is a contiguous range of ids, a compact piece of space: a view reads few shards, and an owner culls its
range against a view as fast as the replicated model's block index culls the whole. Ranges are cut so that the
ranks carry equal load, a row weighing 1 (its memory and Adam) plus the scheduled views that see it over their mean
(its render and return traffic), and re-cut when the largest shard's load exceeds the smallest's by more than
:data:`RECUT_LIMIT` (Grendel's trigger). See ``docs/architecture.md`` ("Sharded Gaussians").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.runtime.culling_index import CullingIndex

RECUT_LIMIT = 1.1
"""Re-cut the shards when max / min shard load exceeds this."""


@dataclass(frozen=True)
class ShardCuts:
    """Contiguous ranges of global ids, one per rank: rank r owns ids ``bounds[r] <= id < bounds[r + 1]``.

    Attributes:
        bounds: int64 [W + 1], non-decreasing, from 0 to N.
    """

    bounds: Tensor

    def __post_init__(self) -> None:
        bounds = self.bounds
        if bounds.dim() != 1 or bounds.numel() < 2 or int(bounds[0]) != 0 or bool((bounds.diff() < 0).any()):
            raise ValueError(f"shard bounds must rise from 0 to N, got {bounds.tolist()}")

    @classmethod
    def even(cls, num_rows: int, num_shards: int) -> ShardCuts:
        """Ranges of equal size (within one row)."""
        return cls(torch.div(torch.arange(num_shards + 1) * num_rows, num_shards, rounding_mode="floor"))

    @property
    def num_shards(self) -> int:
        """W, the owners."""
        return self.bounds.numel() - 1

    @property
    def num_rows(self) -> int:
        """N, the model's rows."""
        return int(self.bounds[-1])

    @property
    def sizes(self) -> list[int]:
        """Rows per shard."""
        return self.bounds.diff().tolist()

    def range(self, rank: int) -> tuple[int, int]:
        """The ids ``rank`` owns, [lo, hi)."""
        return int(self.bounds[rank]), int(self.bounds[rank + 1])

    def owner_of(self, ids: Tensor) -> Tensor:
        """The owner of each global id, int64 [M]."""
        return torch.searchsorted(self.bounds[1:-1].to(ids.device), ids, right=True)

    def counts(self, sorted_ids: Tensor) -> list[int]:
        """How many of ``sorted_ids`` (sorted int64 [M]) each shard owns: the split sizes of a message of them."""
        edges = torch.searchsorted(sorted_ids, self.bounds.to(sorted_ids.device))
        return edges.diff().tolist()

    def split(self, table: Mapping[str, Tensor], ids: str = "ids") -> list[dict[str, Tensor]]:
        """A table of per-row tensors whose ``ids`` column is sorted, cut into one piece per owner (views, no copy)."""
        counts = self.counts(table[ids])
        return [dict(zip(table, parts)) for parts in zip(*(value.split(counts) for value in table.values()))]


BOUNDS_ROW_BYTES = 48
"""A row's culling bounds on the worker that culls it: centre and radius (16 B) and its block index (about 32 B)."""


def row_bytes(params: Mapping[str, Tensor]) -> int:
    """The bytes one Gaussian costs the worker that holds it: its parameter row, its two Adam moments, its per-row
    tables (three int64: ``core/tables.py``) and its culling bounds (:data:`BOUNDS_ROW_BYTES`)."""
    values = sum(math.prod(p.shape[1:]) * p.element_size() for p in params.values())
    return 3 * values + 3 * 8 + BOUNDS_ROW_BYTES


def views_seeing(index: CullingIndex, views: Iterable[Task]) -> Tensor:
    """Per row of ``index``'s model, how many of ``views`` hold it in their candidate set, int64 [N]: the counts a
    row's load is made of (every training view once: an epoch)."""
    bounds = index.bounds()
    seen = torch.zeros(bounds.num_rows, dtype=torch.int64, device=bounds.radii.device)
    for view in views:
        seen[index.candidates(view)] += 1
    return seen


def row_load(views_seeing: Tensor) -> Tensor:
    """Each row's load, float64 [N]: 1 plus the scheduled views that see it over their mean (1 where none does)."""
    counts = views_seeing.double()
    mean = counts.mean() if counts.numel() else counts.new_zeros(())
    return 1.0 + (counts / mean if float(mean) > 0 else torch.zeros_like(counts))


def cut_by_load(load: Tensor, num_shards: int) -> ShardCuts:
    """Contiguous ranges of ``load`` (float [N], rows in global-id order) with equal sums as far as rows allow:
    shard r ends at the first row where the running load reaches (r + 1) / W of the total. Deterministic, so every
    rank cuts the same ranges from the same loads."""
    if num_shards < 1:
        raise ValueError(f"shards need at least one owner, got {num_shards}")
    total = torch.cumsum(load.double(), 0)
    whole = float(total[-1]) if total.numel() else 0.0
    targets = torch.arange(1, num_shards, dtype=torch.float64) * (whole / num_shards)
    inner = torch.searchsorted(total, targets, right=False) + 1 if total.numel() else torch.zeros(num_shards - 1)
    bounds = torch.cat([torch.zeros(1), inner.double(), torch.tensor([float(load.numel())])]).long()
    return ShardCuts(torch.cummax(bounds.clamp(max=load.numel()), 0).values)


def shard_loads(load: Tensor, cuts: ShardCuts) -> Tensor:
    """Each shard's summed load, float64 [W]."""
    total = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(load.double(), 0)])
    return total[cuts.bounds[1:]] - total[cuts.bounds[:-1]]


def imbalance(load: Tensor, cuts: ShardCuts) -> float:
    """max / min shard load (infinite when a shard carries none and another does)."""
    loads = shard_loads(load, cuts)
    low, high = float(loads.min()), float(loads.max())
    return high / low if low > 0 else (1.0 if high == 0 else float("inf"))


def needs_recut(load: Tensor, cuts: ShardCuts) -> bool:
    """Whether the shards' imbalance exceeds :data:`RECUT_LIMIT`."""
    return imbalance(load, cuts) > RECUT_LIMIT
