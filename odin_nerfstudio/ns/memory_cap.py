"""``--memory-cap-gib``: a per-process budget for the Gaussians, checked before training and after every
densification, so that a scene too large for one worker is refused with the way to train it (``--sharded``)
instead of running out of memory hours in.

What counts is what grows with the Gaussians a process holds (``runtime/ownership.row_bytes``): each row's
parameters, its two Adam moments, its per-row tables and culling bounds. A replicated process holds every row; a
sharded one its shard. Images, the rasterizer's buffers and fetched rows come on top and are not counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from torch import Tensor

from odin_nerfstudio.runtime.ownership import row_bytes

GIB = float(1 << 30)


class MemoryCapError(RuntimeError):
    """The Gaussians a process would hold exceed ``--memory-cap-gib``; the message says how to train them."""


def check_memory_cap(
    cap_gib: float, params: Mapping[str, Tensor], held_rows: int, total_rows: int, sharded: bool, when: str
) -> None:
    """Raise :class:`MemoryCapError` if ``held_rows`` Gaussians of ``params``' layout exceed ``cap_gib`` (0: no cap).

    Args:
        cap_gib: the budget per process, GiB.
        params: the model's parameters (their row layout).
        held_rows: the rows this process holds (all of them replicated, its shard's sharded).
        total_rows: the model's rows.
        sharded: whether the run is sharded (the advice differs).
        when: when the check runs, for the message ("before training", "after the densification of step 500").
    """
    if cap_gib <= 0:
        return
    per_row = row_bytes(params)
    need = held_rows * per_row / GIB
    if need <= cap_gib:
        return
    processes = math.ceil(1.1 * total_rows * per_row / GIB / cap_gib)  # shards balanced by load: 10% of slack
    held = f"{held_rows:,} Gaussians ({per_row} B each: parameters, Adam moments, tables) need {need:.3g} GiB"
    if not sharded:
        raise MemoryCapError(
            f"odin-splat {when}: {held} in every process, over --memory-cap-gib {cap_gib:g}. Train the scene "
            f"sharded, each process holding a part: --sharded True under torchrun --nproc-per-node {processes} "
            "(odin-train), or raise the cap"
        )
    raise MemoryCapError(
        f"odin-splat {when}: the largest shard's {held}, over --memory-cap-gib {cap_gib:g}. Use more processes "
        f"(torchrun --nproc-per-node {processes}), or raise the cap"
    )
