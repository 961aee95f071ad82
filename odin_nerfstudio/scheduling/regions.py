"""The regional order: each of the W workers trains the views of its own region of the scene, B of them per step,
so that in the sharded mode each rank reads mostly the rows its own shard holds.

Why: the locality schedule (``schedule.py``) puts strongly connected views in the same step (their gradients are
summed, so they never conflict) and keeps consecutive steps apart. In the sharded mode that is the worst case for
traffic: every task of a step reads the same part of the scene, which one owner holds, so the other W - 1 ranks fetch
all their rows and that owner serves the whole step. Here a step takes views from W different regions instead: far
apart (so the views of one step rarely share rows), each near the rows one shard holds (the sharded mode places each
worker on the rank owning most of its rows, ``runtime/placement.py``), and each region's views in a strided order,
so that the steps of one worker close in time look at parts of its region far apart (:func:`strided`).

Regions: the views sorted by the Z-order code of the centroid of their SfM points (the Z-order the shards are cut
in: the model starts from those points), cut into W runs of equal size (``numpy.array_split``). Only SfM data is
needed, as for the other orders, so the schedule is the same in every mode and the sharded mode's equality with the
replicated barrier holds under it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import math

import numpy as np
import torch

from odin_nerfstudio.core.row_order import codes_in, morton_frame

Order = Literal["rlg", "random", "regions"]
"""A schedule's order (``ScheduleConfig.order``): the locality schedule, the random control, or regions."""
OrderOption = Literal["auto", "rlg", "random", "regions"]
"""An order as the options name it (``--pipeline.datamanager.schedule-order``, ``odin-simulate --schedule-order``)."""


def resolved_order(order: OrderOption, sharded: bool) -> Order:
    """The order an ``auto`` option stands for: this regional order in the sharded mode (each rank reads mostly its
    own shard), the locality schedule otherwise; any other order as given."""
    if order == "auto":
        return "regions" if sharded else "rlg"
    return order


def view_keys(point_sets: Sequence[np.ndarray], point_ids: np.ndarray, points_xyz: np.ndarray) -> np.ndarray:
    """Per view, the Z-order code (in the frame of all the points) of the centroid of its points, int64 [V]; a view
    without points gets the code of the points' centroid. ``point_sets``: per view, point ids (as ``point_ids``,
    the id of each row of ``points_xyz`` [P, 3])."""
    order = np.argsort(point_ids, kind="stable")
    xyz = np.asarray(points_xyz, dtype=np.float64)
    middle = xyz.mean(axis=0) if len(xyz) else np.zeros(3)
    centroids = np.empty((len(point_sets), 3))
    for view, ids in enumerate(point_sets):
        rows = order[np.searchsorted(point_ids, ids, sorter=order)] if len(ids) else np.zeros(0, np.int64)
        centroids[view] = xyz[rows].mean(axis=0) if len(rows) else middle
    frame = morton_frame(torch.from_numpy(xyz.T.copy()) if len(xyz) else torch.zeros(3, 1, dtype=torch.float64))
    return codes_in(torch.from_numpy(centroids.T.copy()), frame).numpy()


def regions_of(keys: np.ndarray, num_regions: int) -> list[np.ndarray]:
    """The W regions of the views: runs of the views sorted by ``keys`` (ties by index), of sizes differing by at
    most one, each in key order."""
    order = np.argsort(keys, kind="stable").astype(np.int64)
    return list(np.array_split(order, num_regions))


def regional_steps(
    regions: list[np.ndarray], views_per_worker: int, rng: np.random.Generator
) -> list[list[np.ndarray]]:
    """An epoch's steps, each a list of per-worker views: worker w takes the next ``views_per_worker`` of region w's
    order (:func:`strided`; fewer, or none, once the region is spent)."""
    ordered = [strided(region, rng) for region in regions]
    longest = max((len(region) for region in regions), default=0)
    return [
        [region[start : start + views_per_worker] for region in ordered]
        for start in range(0, longest, views_per_worker)
    ]


def strided(region: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Every view of ``region`` (in key order) once, from a seeded start by a stride coprime with its size n, the
    nearest to n / phi (phi the golden ratio; n - stride, seeded, is as good): views 1, 2 and 3 steps apart lie
    about 0.38 n, 0.24 n and 0.15 n apart (the golden ratio's multiples spread furthest from whole numbers), so a
    worker's steps read ahead of unpublished ones rarely share points with them. A stride near n / 2 would put the
    views two steps apart side by side; a plain shuffle puts neighbours back to back now and then."""
    n = len(region)
    if n <= 2:
        return rng.permutation(region)
    golden = n * (math.sqrt(5.0) - 1.0) / 2.0
    stride = min((k for k in range(1, n) if math.gcd(k, n) == 1), key=lambda k: (abs(k - golden), k))
    stride = int(rng.choice([stride, n - stride]))
    return region[(int(rng.integers(n)) + stride * np.arange(n)) % n]
