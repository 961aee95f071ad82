"""Steps whose workers finish together: cost bands for the schedule's groups, and per-view costs measured in a run.

A barrier step lasts as long as its slowest worker. With B = 1 view per worker, a step's balance (max / mean worker
cost) is fixed by which views share the step, not by how they are assigned: a group grown along RLG edges alone
mixes a street's forward cameras (both facades, about twice the points) with its sideways ones (one facade), a
balance of about 1.3 (BENCHMARKS.md, bench_compile). So the schedule grows its groups inside cost bands: views sorted
by cost and cut into runs whose costs lie within a factor 1 + tolerance (:func:`cost_bands`); each step then holds
views of nearly equal cost, and locality is sought among them. Band sizes are multiples of the step size S, so that
no step straddles two bands, and hold at least ``MIN_BAND_GROUPS`` steps' worth of views: a band of a few steps
leaves its groups no neighbours to grow along (on fern, 20 views at W = 2, over 20 epochs: bands of one or two steps
gave 0.78 of the random order's conflict mass, bands of four 0.70, locality alone 0.70), so where the cost
distribution is sparse (its tails, a small scene) a band spans more than the tolerance. A band is narrower, down to
one step, only where the floor costs the balance: where ``MIN_BAND_GROUPS`` steps would hold a worker costlier than
the mean one by more than ``FLOOR_SPREAD`` balance tolerances (B = 1: a view that much above their mean view), and
only in the tails of a larger epoch's costs (narrower bands hold at most ``TAIL_SHARE`` of the views). On the
4,000-view street at W = 64, with measured-like costs, that took the balance from 1.082 to 1.046 and the conflict
ratio from 0.073 to 0.087 (BENCHMARKS.md, bench_compile).

Costs may come from measurement (:class:`ViewTimes`, :func:`measured_view_cost`): a view's render + backward seconds
in the previous epoch, as Grendel balances by measured time (a run's ``--pipeline.datamanager.rebalance-every``); the
counted SfM points and pixels only predict it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from odin_nerfstudio.core.timeline import Event

BALANCE_TOLERANCE = 0.05
"""The default largest relative cost spread of a step's views (``ScheduleConfig.balance_tolerance``): steps within
1.05 max / mean worker cost, a barrier's workers finishing within 5% of each other."""

MIN_BAND_GROUPS = 4
"""Fewest steps' worth of views (groups of S) in a cost band, unless ``FLOOR_SPREAD`` rules it out."""

FLOOR_SPREAD = 2.0
"""A band is narrower than ``MIN_BAND_GROUPS`` steps only where theirs would give a worker over 1 + FLOOR_SPREAD x
the balance tolerance times the mean worker cost (B = 1: a view over that times their mean view): that worker sets
one step's balance, the others are evener. Chosen on the 4,000-view street at W = 64 (measured-like costs, one
epoch): 1, 1.5, 2 gave balances 1.038, 1.042, 1.046 and conflict ratios 0.118, 0.108, 0.087 (the 4-step floor
everywhere: 1.082, 0.073); on fern at W = 2, 1 narrowed bands (conflict ratio 0.746 for 0.703) that 1.5 and 2 left
alone."""

TAIL_SHARE = 0.25
"""Most views that narrower bands may hold; beyond it (a small scene, its costs sparse throughout: a 24-view street
at W = 2, B = 2 lost its locality, conflict ratio 0.087 -> 0.583) every band keeps ``MIN_BAND_GROUPS`` steps. The
short-epoch street at W = 64 narrows 4% of its views, the 50k city at most 1%; small scenes 33% to all."""


def cost_bands(
    order: np.ndarray, cost: np.ndarray, size: int, tolerance: float | None, per_worker: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Arrange the views of ``order`` band by band (keeping their order within a band) and cut the bands.

    Bands are consecutive runs of the views sorted by cost (ties by view index), each a multiple of ``size`` views
    (the last one takes the V mod S rest). A band is the widest of: the views within a factor ``1 + tolerance`` of
    its cheapest (where the cost distribution is dense), and the most steps up to ``MIN_BAND_GROUPS`` whose
    costliest worker would stay within ``1 + FLOOR_SPREAD x tolerance / per_worker`` of the mean (one step where none
    is; that worker holds the costliest view and, LPT's last picks, ``per_worker - 1`` of the cheapest); the rest
    joins the last band when it is less than a step, or less than ``MIN_BAND_GROUPS`` steps that keep that bound.
    Where bands narrower than ``MIN_BAND_GROUPS`` steps would hold over ``TAIL_SHARE`` of the views, every band
    holds ``MIN_BAND_GROUPS`` steps or more (the rest joins the last band when it is less than that).

    Args:
        order: a permutation of the views [V] (the epoch's shuffle).
        cost: per-view cost [V] (predicted or measured), >= 0.
        size: S, views per step.
        tolerance: largest relative cost spread within a band; None: one band (locality alone).
        per_worker: B, views per worker in a step (a band's tolerance is B times the steps' balance tolerance).

    Returns:
        the views band by band [V] and the bands' bounds in it [bands + 1] (0 first, V last).
    """
    num_views = len(order)
    if tolerance is None or num_views == 0:
        return order, np.array([0, num_views], dtype=np.int64)
    by_cost = np.argsort(cost, kind="stable")
    sorted_cost = cost[by_cost]
    bounds = _cut(sorted_cost, size, tolerance, per_worker)
    lengths = np.diff(bounds)
    if len(lengths) > 1 and lengths[lengths < MIN_BAND_GROUPS * size].sum() > TAIL_SHARE * num_views:
        bounds = _cut(sorted_cost, size, tolerance, None)
    band_of = np.empty(num_views, dtype=np.int64)
    band_of[by_cost] = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    return order[np.argsort(band_of[order], kind="stable")], bounds


def _cut(sorted_cost: np.ndarray, size: int, tolerance: float, per_worker: int | None) -> np.ndarray:
    """Bounds of the cost bands of views sorted by cost [bands + 1] (see :func:`cost_bands`), narrower than
    ``MIN_BAND_GROUPS`` steps where those would hold a costlier worker than the bound (per_worker None: never)."""
    num_views = len(sorted_cost)
    prefix = np.concatenate(([0.0], np.cumsum(sorted_cost)))

    def even(low: int, ends: np.ndarray) -> np.ndarray:
        """Whether views low..end - 1 keep their costliest worker within the bound of their mean worker [ends]."""
        if per_worker is None:
            return np.ones(ends.shape, dtype=bool)
        worst = sorted_cost[ends - 1] + (per_worker - 1) * sorted_cost[low]
        mean = per_worker * (prefix[ends] - prefix[low]) / (ends - low)
        return worst <= (1.0 + FLOOR_SPREAD * tolerance / per_worker) * mean

    bounds = [0]
    while bounds[-1] < num_views:
        low = bounds[-1]
        within = int(np.searchsorted(sorted_cost, sorted_cost[low] * (1.0 + tolerance), side="right")) - low
        ends = low + size * np.arange(1, MIN_BAND_GROUPS + 1)
        ends = ends[ends <= num_views]
        high = low + max(size, within - within % size, int(ends[even(low, ends)].max(initial=low)) - low)
        rest = num_views - high
        evens_out = bool(even(low, np.array([num_views]))[0])
        bounds.append(num_views if rest < size or (rest < MIN_BAND_GROUPS * size and evens_out) else high)
    return np.array(bounds, dtype=np.int64)


def checked_view_cost(view_cost: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``view_cost`` as float64 of ``shape`` ([V]), or a ValueError saying what is wrong with it."""
    cost = np.asarray(view_cost, dtype=np.float64)
    if cost.shape != shape:
        raise ValueError(f"view_cost must hold one cost per view, shape {shape}, got {cost.shape}")
    if not np.all(np.isfinite(cost)) or np.any(cost < 0):
        raise ValueError("view_cost must be finite and >= 0 for every view (measured seconds, for instance)")
    return cost


class ViewTimes:
    """Render + backward seconds measured per view, summed, and the number of measurements: what a run's ranks add
    up (element-wise) before re-balancing by them, each having measured only its own tasks."""

    def __init__(self, num_views: int) -> None:
        self.seconds = np.zeros(num_views)
        self.count = np.zeros(num_views)

    def add(self, views: np.ndarray, seconds: np.ndarray, count: bool = True) -> None:
        """Add ``seconds[i]`` to view ``views[i]``, each a measurement of its own (a re-run is another one) or, not
        ``count``, more of one already counted (a task's backward after its render)."""
        views, seconds = np.asarray(views, dtype=np.int64), np.asarray(seconds, dtype=np.float64)
        size = self.seconds.size
        if views.shape != seconds.shape or (views.size and (views.min() < 0 or views.max() >= size)):
            raise ValueError(
                f"measured costs need one view index in [0, {size}) per time; got {views.shape} views for "
                f"{seconds.shape} times (views in {views.min(initial=0)}..{views.max(initial=0)})"
            )
        if not np.all(np.isfinite(seconds)) or np.any(seconds < 0):
            raise ValueError("measured task times must be finite and >= 0 seconds")
        self.seconds += np.bincount(views, weights=seconds, minlength=size)
        if count:
            self.count += np.bincount(views, minlength=size)

    def add_spans(self, spans: Sequence[Event]) -> None:
        """Add a timeline's task-cost spans (``core/timeline.TASK_COST_EVENTS``, each with its ``view``): a render
        is a measurement of its own (a re-run is another one), a backward more of the one its render counted."""
        for name, count in (("render", True), ("backward", False)):
            mine = [event for event in spans if event.name == name]
            views = np.array([int(event.args["view"]) for event in mine], dtype=np.int64)
            self.add(views, np.array([(event.end_ns - event.start_ns) / 1e9 for event in mine]), count)

    def view_cost(self, fallback: np.ndarray) -> np.ndarray:
        """Per-view cost [V] for a schedule (``Schedule.with_view_cost``): the mean of a view's measured times; a
        view without any keeps its ``fallback`` cost (predicted, or measured earlier) scaled by the median measured /
        fallback ratio of the measured views, so that all are in the measured views' seconds."""
        fallback = np.asarray(fallback, dtype=np.float64)
        measured = self.count > 0
        cost = np.zeros(fallback.size)
        cost[measured] = self.seconds[measured] / self.count[measured]
        usable = measured & (fallback > 0)
        scale = float(np.median(cost[usable] / fallback[usable])) if usable.any() else 1.0
        cost[~measured] = scale * fallback[~measured]
        return cost


def measured_view_cost(views: np.ndarray, seconds: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Per-view cost [V] from measured task times, for the next epoch's schedule (``Schedule.with_view_cost``), as
    :meth:`ViewTimes.view_cost` gives it.

    Args:
        views: the view of every measured task [N] (the timeline's render spans carry it as ``view``).
        seconds: render + backward seconds of every measured task [N].
        predicted: the schedule's predicted per-view cost [V] (``Schedule.view_cost``).
    """
    times = ViewTimes(np.asarray(predicted).size)
    times.add(views, seconds)
    return times.view_cost(predicted)


def mean_balance(loads: np.ndarray) -> float:
    """Per step of ``loads`` [S, W] (each worker's cost), max over mean worker cost (1.0 is perfect; idle workers
    count as 0), averaged over the steps; 1.0 with no step. One array op, for schedules of many steps."""
    if loads.shape[0] == 0:
        return 1.0
    mean = loads.mean(axis=1)
    return float(np.where(mean > 0, loads.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0).mean())


def steps_balance(steps: Sequence[Any], cost: np.ndarray | None = None) -> float:
    """:func:`mean_balance` of the full steps of ``steps`` (the schedule's ``Step``s; all of them when
    none is full), each worker's cost its ``worker_cost`` or, given ``cost`` [V], the sum over its views: a
    schedule's balance by the costs it was cut by, or by others (measured ones)."""
    size = max(sum(map(len, step.tasks)) for step in steps)
    full = [step for step in steps if sum(map(len, step.tasks)) == size]
    if cost is None:
        return mean_balance(np.array([step.worker_cost for step in full], dtype=np.float64))
    loads = [[cost[list(views)].sum() for views in step.tasks] for step in full]
    return mean_balance(np.array(loads, dtype=np.float64))


def predicted_view_cost(
    num_points: np.ndarray, pixels: np.ndarray | None, cost_per_point: float, cost_per_pixel: float
) -> np.ndarray:
    """cost_per_point * num_points + cost_per_pixel * pixels per view, [V] float64 (pixels None: no pixel term):
    the schedule's cost of a view when none was measured."""
    cost = cost_per_point * np.asarray(num_points, dtype=np.float64)
    if pixels is None:
        return cost
    pixels = np.asarray(pixels, dtype=np.float64)
    if pixels.shape != cost.shape:
        raise ValueError(f"pixels must hold one count per view, shape {cost.shape}, got {pixels.shape}")
    return cost + cost_per_pixel * pixels
