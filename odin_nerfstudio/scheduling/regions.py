"""The regional order: each of the W workers trains the views of its own region of the scene, B of them per step,
so that in the sharded mode each rank reads mostly the rows its own shard holds.

Why: the locality schedule (``schedule.py``) puts strongly connected views in the same step (their gradients are
summed, so they never conflict) and keeps consecutive steps apart. In the sharded mode that is the worst case for
traffic: every task of a step reads the same part of the scene, which one owner holds, so the other W - 1 ranks fetch
all their rows and that owner serves the whole step. Here a step takes views from W different regions instead: far
apart (so the views of one step rarely share rows), each near the rows one shard holds (the sharded mode places each
worker on the rank owning most of its rows, ``runtime/placement.py``), and each region's views in a strided order,
so that the steps of one worker close in time look at parts of its region far apart (:func:`strided`), in cost bands
where the views' costs would leave the steps uneven (:func:`cost_banded`).

Regions: the views sorted by the Z-order code of the centroid of their SfM points (the Z-order the shards are cut
in: the model starts from those points), cut into W runs of equal size (``numpy.array_split``). Only SfM data is
needed, as for the other orders, so the schedule is the same in every mode and the sharded mode's equality with the
replicated barrier holds under it.

The halves order ("halves"): with many workers a region holds few views, all in sight of each other, so nearly every
task reads rows its own worker's previous step writes and must wait for that step's publication, as under a barrier
(a 1,024-view city at 64 workers: 29 to 57 of a step's 64 tasks). There the scene is cut into 2W regions, and the
steps alternate between its two halves: at even global steps every worker trains a view of its region in the first
half, at odd ones of its region in the second (:func:`halves_steps`). Consecutive steps then share rows only across
the one border between the halves (the same city: none of 39 steps holds a task that reads the step before's rows).
What it costs: each half lies in half of the shards, so at each step half the owners serve two workers each, and one
of the two reads from the other's shard (``docs/architecture.md``, "Sharded Gaussians"). Each half's regions take
their views from cost bands in turn where the sweep alone leaves the steps uneven, as the regional order's do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import math

import numpy as np
import torch

from odin_nerfstudio.core.row_order import codes_in, morton_frame
from odin_nerfstudio.scheduling.balance import MIN_BAND_GROUPS, mean_balance

Order = Literal["rlg", "random", "regions", "halves"]
"""A schedule's order (``ScheduleConfig.order``): the locality schedule, the random control, regions, or regions in
two halves."""
REGIONAL: tuple[Order, ...] = ("regions", "halves")
"""The orders that need each view's regional key (:func:`view_keys`)."""
OrderOption = Literal["auto", "rlg", "random", "regions", "halves"]
"""An order as the options name it (``--pipeline.datamanager.schedule-order``, ``odin-simulate --schedule-order``)."""


HALVES_FROM = 16
"""The fewest workers for which ``auto`` picks the halves order in the sharded mode. Simulated on a 1,024-view city
and street (BENCHMARKS.md, bench_simulate_sharded, both orders in cost bands): at 4 workers sharded quality-first is
as fast in either order and the halves order's barrier slower (half the workers read another shard); at 8 the halves
order's quality-first is 8-10% faster and its barrier 0-6% slower, a gain within the simulator's validated error
(15%), and 2 real ranks lost by it; at 16 and 64 the regional order's regions are too small to keep a worker's
consecutive views apart and the halves order's quality-first is 1.2x to 1.4x faster."""


def resolved_order(order: OrderOption, sharded: bool, num_workers: int) -> Order:
    """The order an ``auto`` option stands for: in the sharded mode (each rank reads mostly its own shard) the
    regional order, or with :data:`HALVES_FROM` workers or more the halves order; the locality schedule otherwise;
    any other order as given."""
    if order == "auto":
        return ("halves" if num_workers >= HALVES_FROM else "regions") if sharded else "rlg"
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


def order_regions(keys: np.ndarray | None, order: Order, num_workers: int) -> list[np.ndarray]:
    """The regions ``order`` cuts the views into (:func:`regions_of`): W for "regions", 2W for "halves", none for
    the orders without regions."""
    if order not in REGIONAL:
        return []
    return regions_of(keys, num_workers if order == "regions" else 2 * num_workers)


def epoch_steps(
    order: Order,
    regions: list[np.ndarray],
    views_per_worker: int,
    rng: np.random.Generator,
    first_step: int,
    cost: np.ndarray | None = None,
    tolerance: float | None = None,
    band_floor: int = MIN_BAND_GROUPS,
) -> list[list[np.ndarray]]:
    """An epoch's steps in a regional order, each a list of per-worker views (``first_step``: the epoch's first
    global step, which the halves order alternates by; ``cost``, ``tolerance`` and ``band_floor``: the views' costs,
    the cost bands' spread and the regions order's fewest steps a band, :func:`cost_banded`)."""
    if order == "halves":
        return halves_steps(regions, views_per_worker, rng, first_step, cost, tolerance)
    return regional_steps(regions, views_per_worker, rng, cost, tolerance, band_floor)


def regional_steps(
    regions: list[np.ndarray],
    views_per_worker: int,
    rng: np.random.Generator,
    cost: np.ndarray | None = None,
    tolerance: float | None = None,
    band_floor: int = MIN_BAND_GROUPS,
) -> list[list[np.ndarray]]:
    """An epoch's steps, each a list of per-worker views: worker w takes the next ``views_per_worker`` of region w's
    order (:func:`strided`, arranged in cost bands of at least ``band_floor`` steps where ``cost`` and ``tolerance``
    are given: :func:`cost_banded`; fewer, or none, once the region is spent)."""
    ordered = [strided(region, rng) for region in regions]
    if cost is not None and tolerance is not None:
        ordered = cost_banded(ordered, cost, tolerance, views_per_worker, band_floor)
    longest = max((len(region) for region in regions), default=0)
    return [
        [region[start : start + views_per_worker] for region in ordered]
        for start in range(0, longest, views_per_worker)
    ]


BANDS_ONE_BY_ONE = 32
"""Band counts :func:`cost_banded` tries one by one, from 2; above, a count 1.25 times the last (so a region of
62,500 views, a 500,000-view city at W = 8, tries 59 counts, not 15,624)."""


def cost_banded(
    orders: list[np.ndarray], cost: np.ndarray, tolerance: float, per_worker: int, min_groups: int = MIN_BAND_GROUPS
) -> list[np.ndarray]:
    """The regions' views (``orders``: each region's order, strided or swept) taken from cost bands in turn where
    that evens out the steps: a barrier's step waits for its costliest worker, and a region's views taken in space
    order alone may pair a view looking down a long street with one facing a wall (odin-synth's city at W = 2:
    max / mean predicted worker cost 1.45 a step).

    Every region is cut at the same cost quantiles into the same number of bands, each in the region's own
    order, and its steps take ``per_worker`` views from each band in turn (cheapest band first), so the k-th views
    of every region come from the same band (band edges at the same fraction of each region: off by at most one
    view where regions differ by one), and a worker's consecutive views come from different bands, apart in cost
    and, where cost follows place, in space. ``orders`` stay as they are where their steps' balance (max / mean
    worker cost) is already within ``1 + tolerance``; else the fewest bands that bring it within, or the most even
    of at most enough bands to leave each ``min_groups`` steps' worth of views in the smallest region (counts
    above :data:`BANDS_ONE_BY_ONE` on a geometric ladder)."""
    sizes = [len(order) for order in orders if len(order)]
    most = max(1, min(sizes, default=0) // (min_groups * per_worker))
    # Each view's cost rank within its region, once: a band count only cuts the ranks differently.
    ranks = [np.argsort(np.argsort(cost[order], kind="stable"), kind="stable") for order in orders]
    best, best_balance = orders, aligned_balance(orders, cost, per_worker)
    for bands in _band_counts(most):
        if best_balance <= 1.0 + tolerance:
            break
        banded = [_in_turn(order, rank * bands // len(order), per_worker) for order, rank in zip(orders, ranks)]
        balance = aligned_balance(banded, cost, per_worker)
        if balance < best_balance:
            best, best_balance = banded, balance
    return best


def _band_counts(most: int) -> list[int]:
    """The band counts :func:`cost_banded` tries, 2 to ``most``: each up to :data:`BANDS_ONE_BY_ONE`, then each
    1.25 times the last."""
    counts = list(range(2, min(most, BANDS_ONE_BY_ONE) + 1))
    while counts and counts[-1] < most:
        counts.append(min(most, math.ceil(counts[-1] * 1.25)))
    return counts


def _in_turn(order: np.ndarray, band_of: np.ndarray, per_worker: int) -> np.ndarray:
    """``order``'s views taken ``per_worker`` at a time from each band in turn (``band_of``: each view's band,
    cheapest 0), each band's in ``order``'s order, until every band is spent."""
    if len(order) == 0:
        return order
    by_band = np.argsort(band_of, kind="stable")
    starts = np.searchsorted(band_of[by_band], band_of[by_band])  # where each view's band begins in by_band
    within = np.empty(len(order), dtype=np.int64)
    within[by_band] = np.arange(len(order)) - starts  # each view's place within its band
    # Round by round (per_worker views of each band a round), bands in order, places in order.
    return order[np.lexsort((within % per_worker, band_of, within // per_worker))].astype(np.int64)


def aligned_balance(orders: list[np.ndarray], cost: np.ndarray, per_worker: int) -> float:
    """The mean balance (``balance.mean_balance``) of the steps that take ``per_worker`` views from every one of
    ``orders`` (regions) at the same positions; 1.0 where no step takes from all."""
    steps = min((len(order) for order in orders), default=0) // per_worker
    loads = [cost[order[: steps * per_worker]].reshape(steps, per_worker).sum(axis=1) for order in orders]
    return mean_balance(np.stack(loads, axis=1) if loads else np.zeros((0, 0)))


def halves_steps(
    regions: list[np.ndarray],
    views_per_worker: int,
    rng: np.random.Generator,
    first_step: int,
    cost: np.ndarray | None = None,
    tolerance: float | None = None,
) -> list[list[np.ndarray]]:
    """An epoch's steps in the halves order (see the module): ``regions``, 2W of them in key order; worker w trains
    region w (first half) at even global steps and region 2W - 1 - w (second half) at odd ones, ``views_per_worker`` a
    step; ``first_step``, the epoch's first global step, sets the parity. Each region is swept in key order (the
    direction seeded per epoch): a region is visited every other step, so its own views need no spreading, and the sweep
    keeps the two regions at the border, both worker W - 1's, a region's length apart at consecutive steps (one sweeps
    towards the border while the other sweeps away from it). Where its region of a step's half is spent (or holds fewer
    views than a step takes), a worker takes the other half's, so every worker trains all its views in ceil(views /
    ``views_per_worker``) steps: pairing region w with region 2W - 1 - w gives no worker more than ceil(V / W) views
    (``numpy.array_split`` makes the first regions the larger), so an epoch keeps ceil(V / (W x B)) steps. Where
    ``cost`` and ``tolerance`` are given, each half's regions, which share the steps, take their views from cost bands
    in turn (:func:`cost_banded`), each band swept in key order: the sweep's rule holds band by band. A band may be a
    single step's views: a worker's consecutive steps lie in opposite halves, so its views need no spreading by the
    bands (the regional order's ``MIN_BAND_GROUPS``). On citygen's 1,024-view city at 64 workers, whose regions hold
    8 views, that took the simulated sharded barrier from 188.6 to 209.0 views/s and quality-first from 289.7 to
    306.5 (BENCHMARKS.md, bench_simulate_sharded's pooled costs)."""
    if len(regions) % 2:
        raise ValueError(f"the halves order needs an even number of regions, got {len(regions)}")
    workers = len(regions) // 2
    direction = 1 if rng.integers(2) else -1
    first, second = regions[:workers], regions[workers:][::-1]  # worker w's: regions w and 2W - 1 - w
    halves = [[region[::direction] for region in half] for half in (first, second)]
    if cost is not None and tolerance is not None:
        halves = [cost_banded(half, cost, tolerance, views_per_worker, min_groups=1) for half in halves]
    pairs = list(zip(*halves))
    taken = [[0, 0] for _ in range(workers)]  # per worker, the views taken so far from each half
    longest = max((len(a) + len(b) for a, b in pairs), default=0)
    steps = []
    for step in range(-(-longest // views_per_worker)):
        half = (first_step + step) % 2
        views = []
        for pair, counts in zip(pairs, taken):
            mine = pair[half][counts[half] : counts[half] + views_per_worker]
            other = pair[1 - half][counts[1 - half] : counts[1 - half] + views_per_worker - len(mine)]
            counts[half] += len(mine)
            counts[1 - half] += len(other)
            views.append(np.concatenate([mine, other]).astype(np.int64))
        steps.append(views)
    return steps


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
