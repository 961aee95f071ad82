"""Structural changes of a sharded run: each owner edits its own rows, then the rows are put back in the order the
replicated model's edit would give them, re-cut where the shards drifted apart, and moved with all their state.

Why the order matters: global ids are the replicated model's rows, which the runtime keeps in Z-order; for the
sharded barrier to equal the replicated one bit for bit after a densification (and for shards to stay compact
pieces of space), the ids after it must be the replicated model's rows after its edit and its Z-order pass
(``core/row_order.py``). Each owner runs gsplat's rules on its rows (``adapter/gsplat.edit_rows``: every rule per
row, split draws per global id), which also tells each new row where the whole model's edit would put it (its
order key). Then, collectively (every rank, the same exchanges in the same order):

1. every rank learns every row's order key (8 bytes a row), hence the pre-Z-order position of its own rows;
2. the rows at the replicated Z-order's sample positions send their centres: every rank computes the same frame;
3. every rank learns every row's Z-code (8 bytes a row): the new global ids, the replicated stable sort;
4. the new cuts: each shard keeps as many rows as its edit left it, unless max / min shard load (each row
   weighing 1 plus the epoch's views that see it over their mean, counted by its owner with the codes) then exceeds
   ``ownership.RECUT_LIMIT``: re-cut by load (:func:`~odin_nerfstudio.runtime.ownership.cut_by_load`);
5. rows whose new id falls in another shard move there with their Adam moments, versions and statistics.

The keys and codes are the only O(N) tensors a rank holds, 16 bytes a row against the few hundred of its shard's
parameters and moments per row.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import torch
from torch import Tensor

from odin_nerfstudio.adapter.gsplat import edit_rows
from odin_nerfstudio.core.row_order import codes_in, morton_frame, sample_stride
from odin_nerfstudio.core.tables import PrimitiveTables
from odin_nerfstudio.core.tasks import NO_STEP, Task
from odin_nerfstudio.runtime.culling_index import CullingIndex
from odin_nerfstudio.runtime.ownership import ShardCuts, cut_by_load, needs_recut, row_load, views_seeing
from odin_nerfstudio.runtime.shard_reader import Reader
from odin_nerfstudio.runtime.sharding import Owner, RowExchange, Rows


def restructure(
    owner: Owner,
    reader: Reader,
    exchange: RowExchange,
    strategy: Any,
    step: int,
    seed: int,
    timeout_s: float,
    views: Sequence[Task] = (),
) -> bool:
    """The structural change after ``step`` (every step through it published on every owner) by ``strategy``
    (gsplat's ``DefaultStrategy``): edit, re-order,
    re-cut and move (see the module); returns whether the shards were re-cut by load. ``views``: one task per
    training view (an epoch), whose candidate sets weigh the rows (``ownership.row_load``); none: every row 1."""
    if owner.pending:
        raise RuntimeError(f"restructure after step {step}: steps {sorted(owner.pending)} are not published")
    rank, num_shards = owner.rank, owner.cuts.num_shards
    ids = torch.arange(owner.lo, owner.lo + owner.params["means"].shape[0], device=owner.params["means"].device)
    index_map, keys = edit_rows(strategy, owner.params, owner.optimizers, owner.strategy_state, step, seed, ids)
    owner.tables = owner.tables.remap(index_map)

    def everyone(table: Rows, what: str) -> list[Rows]:
        return exchange.start([table] * num_shards, f"{what} after step {step}").wait(timeout_s)

    received = everyone({"ids": keys}, "order keys")
    counts = [part["ids"].numel() for part in received]
    all_keys = torch.cat([part["ids"] for part in received])
    start = sum(counts[:rank])
    mine = slice(start, start + counts[rank])
    before = torch.argsort(all_keys)  # the replicated edit's row order (keys are unique): position -> row
    position = torch.empty_like(before)
    position[before] = torch.arange(before.numel(), device=before.device)

    means = owner.params["means"].detach()
    sampled = position[mine] % sample_stride(before.numel()) == 0
    samples = everyone({"ids": position[mine][sampled], "centres": means[sampled]}, "Z-order sample")
    sample_at = torch.cat([part["ids"] for part in samples])
    centres = torch.cat([part["centres"] for part in samples])[torch.argsort(sample_at)]
    codes = codes_in(means.T, morton_frame(centres.T))
    index = CullingIndex(owner.params, owner.adapter, owner.index.margin, owner.index.near_plane, owner.index.drawable)  # the edited rows
    seen = views_seeing(index, views)
    coded = everyone({"ids": codes, "seen": seen}, "Z-order codes and loads")
    all_codes = torch.cat([part["ids"] for part in coded])
    order = before[torch.argsort(all_codes[before], stable=True)]  # new id -> row, as restore_spatial_order sorts
    new_ids = torch.empty_like(order)
    new_ids[order] = torch.arange(order.numel(), device=order.device)

    load = row_load(torch.cat([part["seen"] for part in coded])[order].cpu())
    cuts = ShardCuts(torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()]))
    recut = needs_recut(load, cuts)
    if recut:
        cuts = cut_by_load(load, num_shards)
    _move(owner, reader, exchange, new_ids[mine], cuts, f"rows moving after step {step}", timeout_s)
    return recut


def _move(
    owner: Owner, reader: Reader, exchange: RowExchange, new_ids: Tensor, cuts: ShardCuts, what: str, timeout_s: float
) -> None:
    """Send every row of ``owner`` (new global ids ``new_ids``) to its owner under ``cuts``, with its parameters,
    Adam moments, version and statistics; take in this rank's new range."""
    order = torch.argsort(new_ids)
    table: Rows = {"ids": new_ids[order], "seq": owner.tables.seq[order]}
    table["published_step"] = owner.tables.published_step[order]
    for name, param in owner.params.items():
        table[name] = param.detach()[order]
        state = owner.optimizers[name].state[param]
        for key in ("exp_avg", "exp_avg_sq"):
            table[f"{name}.{key}"] = state[key][order]
    per_row = _per_row_state(owner)
    for key in per_row:
        table[f"state.{key}"] = owner.strategy_state[key][order]
    received = exchange.start(cuts.split(table), what).wait(timeout_s)
    merged = {key: torch.cat([part[key] for part in received]) for key in table}
    order = torch.argsort(merged["ids"])
    merged = {key: value[order] for key, value in merged.items()}
    for name, old in list(owner.params.items()):
        new = torch.nn.Parameter(merged[name])
        optimizer = owner.optimizers[name]
        state = optimizer.state.pop(old)
        for key in ("exp_avg", "exp_avg_sq"):
            state[key] = merged[f"{name}.{key}"]
        optimizer.param_groups[0]["params"] = [new]
        optimizer.state[new] = state
        owner.params[name] = new
    for key in per_row:
        owner.strategy_state[key] = merged[f"state.{key}"]
    rows = merged["ids"].numel()
    owner.tables = PrimitiveTables(
        seq=merged["seq"],
        pending_step=torch.full((rows,), NO_STEP, dtype=torch.int64, device=merged["seq"].device),
        published_step=merged["published_step"],
    )
    owner.cuts, reader.cuts = cuts, cuts
    owner.lo = cuts.range(owner.rank)[0]
    owner.index = CullingIndex(owner.params, owner.adapter, owner.index.margin, owner.index.near_plane, owner.index.drawable)


def _per_row_state(owner: Owner) -> Sequence[str]:
    """The strategy state's per-row tensors (gsplat's ``grad2d``, ``count``, ``radii``)."""
    rows = owner.params["means"].shape[0]
    state = owner.strategy_state or {}
    return [key for key, value in state.items() if isinstance(value, Tensor) and value.dim() > 0 and len(value) == rows]
