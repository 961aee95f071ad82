"""How a schedule is generated (:class:`ScheduleConfig`): with the RLG and the view costs it fixes every step of
``schedule.Schedule``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odin_nerfstudio.scheduling.balance import BALANCE_TOLERANCE, MIN_BAND_GROUPS
from odin_nerfstudio.scheduling.regions import REGIONAL, Order


@dataclass(frozen=True)
class ScheduleConfig:
    """How a schedule is generated; together with the RLG and the view costs it fixes every step.

    Attributes:
        num_workers: W, workers (ranks) training concurrently.
        views_per_worker: B, views each worker renders per step (their gradients are summed).
        seed: seeds the per-epoch shuffle; epoch e uses an RNG made from (seed, e).
        ring_size: K, the farthest back (in steps) an overlap window reaches; the paper's staleness bound K = 4.
        overlap_threshold: largest conflict mass per view of a step with an earlier step for the two to overlap.
        cost_per_point: predicted cost of one observed SfM point of a view (Gaussians it touches).
        cost_per_pixel: predicted cost of one pixel of a view (rasterization); 1000 pixels weigh one point.
        order: "rlg", the locality schedule (``schedule.py``); "random", the control without locality (the paper's
            "overlap without locality"): each epoch's seeded random order within the cost bands, chunked into steps
            of S, LPT-assigned; "regions", each worker the views of its own region, and "halves", regions in two
            halves of the scene that the steps alternate between (``regions.py``: the sharded mode's orders).
        balance_tolerance: largest relative cost spread of the views grouped into one step with B = 1 (cost
            bands); with B views per worker the bands span B times as much, because LPT evens out sums of B views
            (on a 200-view street at W = 4, B = 2: balance 1.009 with bands of 10%, while bands of 5% halve the
            mean overlap window); None groups by locality alone (balance about 1.3 on a city, where sideways
            cameras see half the points).
        band_floor: the regions order's fewest steps' worth of views in a cost band (``regions.cost_banded``):
            ``MIN_BAND_GROUPS`` keeps a worker's consecutive views apart, which quality-first reads ahead by; 1
            lets a barrier's steps pair views of the nearest cost (with a tolerance of 0, its evenest steps:
            ``benchmarks/bench_band_replay.py``).
    """

    num_workers: int = 1
    views_per_worker: int = 1
    seed: int = 0
    ring_size: int = 4
    overlap_threshold: float = 0.1
    cost_per_point: float = 1.0
    cost_per_pixel: float = 1e-3
    order: Order = "rlg"
    balance_tolerance: float | None = BALANCE_TOLERANCE
    band_floor: int = MIN_BAND_GROUPS

    def __post_init__(self) -> None:
        for name in ("num_workers", "views_per_worker", "ring_size", "band_floor"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"ScheduleConfig.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"ScheduleConfig.seed must be a non-negative integer, got {self.seed!r}")
        for name in ("overlap_threshold", "cost_per_point", "cost_per_pixel"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"ScheduleConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.balance_tolerance is not None and not self.balance_tolerance >= 0:
            raise ValueError(f"ScheduleConfig.balance_tolerance must be >= 0 or None, got {self.balance_tolerance!r}")
        if self.order not in ("rlg", "random", *REGIONAL):
            raise ValueError(f"ScheduleConfig.order must be one of rlg, random, {', '.join(REGIONAL)}: {self.order!r}")

    @property
    def band_tolerance(self) -> float | None:
        """Relative cost spread of a cost band: balance_tolerance * B (None: no bands)."""
        return None if self.balance_tolerance is None else self.balance_tolerance * self.views_per_worker

    @property
    def step_size(self) -> int:
        """S = W * B, the views of a full step."""
        return self.num_workers * self.views_per_worker
