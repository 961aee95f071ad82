"""Training schedule: which views each worker renders at every step, ordered so consecutive steps rarely conflict.

Odin (arXiv 2607.19893) compiles the schedule ahead of time from the Relative Locality Graph (RLG): every view
once per epoch in a seeded shuffle (SGD needs one), the W x B views of a step balanced across the W workers by
predicted cost, and consecutive steps loosely connected in the RLG so that step s+1 can run while step s is
still publishing its updates.

What it optimizes. The conflict mass between two steps is the sum of RLG weights over the view pairs they
span; the schedule lowers the conflict mass between each step and its predecessor (and, as a tie-break, the
ring_size - 1 steps before that). Within a step the views may be strongly connected: their gradients are
summed into one update, so they never conflict with each other.

How, per epoch e (RNG seeded from (seed, e), so epoch e never needs epochs < e):
1. Group: shuffle the views; cut them into cost bands (views of nearly equal cost, within a factor
   1 + balance_tolerance x B, each band a multiple of S views: :mod:`odin_nerfstudio.scheduling.balance`), so that
   every step's workers cost about the same and a barrier's workers rarely wait for a slower one. In each band,
   take the first unassigned view of the shuffle as the seed of a group and grow it along the strongest RLG edge
   from any member (single linkage, edges within the band) until it holds S = W * B views, jumping to the next
   unassigned view of the band's shuffle when the group has no free neighbour (isolated views, exhausted
   components). Internally connected groups leave little weight between groups. The V mod S views left at the
   end form the short last step.
2. Order: collapse the RLG onto the groups (G x G cross weights, a sparse triple product) and chain them
   greedily: the next step is the first group, in a seeded random priority, with no edge to the last
   ring_size steps; when every remaining group has one, the group with the least weight to the previous step
   (then to the earlier steps, then priority). The short group stays last.
   Untangle: the greedy chain spends the loosely connected groups first (they are free most often) and leaves
   the tightly connected ones for the end of the epoch, where every remaining group conflicts with its
   predecessor (on fern, W = 2: half again as much conflict mass per step in the last third as in the first two).
   2-opt then reverses any run of the chain whose reversal lowers the conflict mass between consecutive steps
   (:func:`untangle`), which moves loosely connected groups in between the tightly connected ones all over the
   epoch and lowers the total. The short group stays last.
   Fallback: when the chained groups conflict more with their predecessors than the epoch's seeded random
   order of the same bands (random within each band, chunked into steps of S; possible on small, dense scenes,
   where greedy grouping leaves its worst pairs for the end), the epoch takes that random order instead.
3. Assign: longest-processing-time-first (LPT) within each step: views by decreasing cost, each to the worker
   with the least cost in this step that holds fewer than its quota of views (B in a full step), the step's
   balance first (a barrier waits on each step's slowest worker); among workers of equal step cost (all of
   them for each step's first W views) the one with the least cost so far in the epoch, then workers in index
   order from epoch mod W. The epoch's loads break the ties because a worker that gets the costlier view of
   every step (W = 2, B = 1: always worker 0) would fall behind the others over the epoch, an imbalance the
   overlapping modes cannot hide. Cost of a view: measured (``view_cost``, e.g. its render + backward seconds
   in the previous epoch: ``balance.measured_view_cost``) or predicted, cost_per_point * (observed SfM points)
   + cost_per_pixel * (image pixels); the point term stands for the Gaussians it touches, the pixel term for
   rasterization.

Complexity per epoch, with E RLG edges, mean degree d, G = V / S groups: O(V S d) for grouping (numpy work on
each group's frontier, one Python iteration per view), O(E) for the group graph and the statistics, about
O(G (ring_size d + 1)) for ordering when free groups abound (sparse scenes; a dense scene costs O(G^2) but has
few views), O(G^2) per 2-opt pass only when the chain has conflict mass left and G <= UNTANGLE_MAX_GROUPS (a
chain without conflict mass, the sparse scenes' case, is left as it is), O(V log W) for LPT. Memory O(V + E),
plus a dense G x G matrix of group weights while untangling.

Short last step: when V is not a multiple of S, the last step of every epoch holds the r = V mod S remaining
views with a quota of ceil(r / W) per worker, so min(r, W) workers get tasks and the rest idle. When S > V, an
epoch is that single short step (every view, some workers idle), and it overlaps nothing: the overlap window
never crosses an epoch boundary, since that would need the previous epoch.

Per step it records the conflict mass against its predecessor and the overlap window: the earlier steps
s-k..s-1 it may run beside, k the largest value <= ring_size (and <= its index within the epoch) such that each
of those steps has a conflict mass with s of at most overlap_threshold per view of s. The same conflict mass
for a seeded random order of the same views (chunked into steps of S) is the number to beat.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from odin_nerfstudio.scheduling.balance import checked_view_cost, cost_bands, predicted_view_cost, steps_balance
from odin_nerfstudio.scheduling.config import ScheduleConfig
from odin_nerfstudio.scheduling.ordering import (
    assign_lpt,
    conflict_by_lag,
    group_of_views,
    grow_groups,
    order_groups,
    untangle,
)
from odin_nerfstudio.scheduling.regions import REGIONAL, epoch_steps, order_regions
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph

FORMAT = "odin-schedule"
VERSION = 5
_CACHED_EPOCHS = 2


@dataclass(frozen=True)
class Step:
    """The tasks of one global step and its predicted conflicts.

    Attributes:
        index: global step number (epoch * steps_per_epoch + step within the epoch).
        epoch: the epoch it belongs to.
        tasks: per worker, the view indices it renders, [W] tuples of length <= B (empty for an idle worker).
        worker_cost: cost per worker (predicted or measured, as the schedule's ``view_cost``), [W].
        conflict_mass: summed RLG weight between this step's views and the previous step's (0 for an epoch's
            first step).
        overlap_window: global indices of the earlier steps it may run beside, consecutive and ending at
            index - 1; empty when it should wait for the previous step's publication.
    """

    index: int
    epoch: int
    tasks: tuple[tuple[int, ...], ...]
    worker_cost: tuple[float, ...]
    conflict_mass: float
    overlap_window: tuple[int, ...]

    @property
    def views(self) -> tuple[int, ...]:
        """All view indices of the step, worker by worker."""
        return tuple(view for worker in self.tasks for view in worker)

    @property
    def balance(self) -> float:
        """Max over mean worker cost (1.0 is perfect; idle workers count as 0: ``balance.mean_balance``)."""
        return steps_balance([self])


@dataclass(frozen=True)
class EpochPlan:
    """All steps of one epoch, with the conflict mass of a random order of the same views for comparison.

    Attributes:
        epoch: epoch number.
        steps: its steps in order.
        random_conflict_mass: total conflict mass between consecutive steps of a seeded random order.
    """

    epoch: int
    steps: tuple[Step, ...]
    random_conflict_mass: float

    @property
    def conflict_mass(self) -> float:
        """Total conflict mass between consecutive steps of this epoch."""
        return float(sum(step.conflict_mass for step in self.steps))


class Schedule:
    """Lazily generated, reproducible schedule over an RLG: ``at(step)`` for any global step, epochs cached."""

    def __init__(
        self,
        rlg: RelativeLocalityGraph,
        config: ScheduleConfig | None = None,
        pixels: np.ndarray | None = None,
        view_cost: np.ndarray | None = None,
        view_keys: np.ndarray | None = None,
    ) -> None:
        """Prepare the schedule of ``rlg``'s V views.

        Args:
            rlg: the views' Relative Locality Graph.
            config: generation settings (defaults: one worker, one view per step).
            pixels: pixels of each view [V]; None drops the pixel term of the predicted cost.
            view_cost: measured cost of each view [V] (any unit, >= 0; ``balance.measured_view_cost`` makes it from
                a run's task times), used instead of the predicted cost to band and assign the views.
            view_keys: the regional order's keys [V] (``regions.view_keys``); needed by it only.
        """
        self.config = config or ScheduleConfig()
        self.rlg, self.view_keys = rlg, view_keys
        if self.config.order in REGIONAL and (view_keys is None or len(view_keys) != rlg.num_views):
            raise ValueError("the regional order needs a key per view (scheduling/regions.view_keys of its SfM points)")
        config = self.config
        self.view_cost = predicted_view_cost(rlg.num_points, pixels, config.cost_per_point, config.cost_per_pixel)
        if view_cost is not None:
            self.view_cost = checked_view_cost(view_cost, self.view_cost.shape)
        upper = sp.triu(rlg.weights, k=1).tocoo()
        self._edges = (upper.row.astype(np.int64), upper.col.astype(np.int64), upper.data)
        self._epochs: OrderedDict[int, EpochPlan] = OrderedDict()
        self._regions = order_regions(view_keys, self.config.order, self.config.num_workers)

    def with_view_cost(self, view_cost: np.ndarray) -> Schedule:
        """The same schedule (RLG, config, seed) balanced by ``view_cost`` [V], e.g. the views' measured render +
        backward times in the previous epoch (``balance.measured_view_cost``).

        Epoch e of the result is generated from (seed, e) and these costs alone, so a run that re-balances at an
        epoch boundary switches to the result's epochs from there on (global step numbers do not move: the
        number of steps per epoch is the same), and a resumed run regenerates them from the saved costs.
        """
        schedule = copy.copy(self)
        schedule.view_cost = checked_view_cost(view_cost, self.view_cost.shape)
        schedule._epochs = OrderedDict()
        return schedule

    @property
    def num_views(self) -> int:
        """V."""
        return self.rlg.num_views

    @property
    def steps_per_epoch(self) -> int:
        """ceil(V / S): full steps plus the short last one when S does not divide V."""
        return -(-self.num_views // self.config.step_size)

    def at(self, global_step: int) -> Step:
        """The step with global index ``global_step`` (epoch = global_step // steps_per_epoch)."""
        if global_step < 0:
            raise ValueError(f"global_step must be >= 0, got {global_step}")
        epoch, within = divmod(int(global_step), self.steps_per_epoch)
        return self.epoch(epoch).steps[within]

    def epoch(self, epoch: int) -> EpochPlan:
        """The plan of epoch ``epoch``, generated from (seed, epoch) alone and cached."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch not in self._epochs:
            self._epochs[epoch] = self._plan(epoch)
            if len(self._epochs) > _CACHED_EPOCHS:
                self._epochs.popitem(last=False)
        self._epochs.move_to_end(epoch)
        return self._epochs[epoch]

    def summary(self, epochs: int = 1) -> dict[str, float]:
        """Conflict mass, random-order conflict mass, their ratio, balance and mean overlap over ``epochs`` epochs.

        ``balance`` is max/mean predicted worker cost averaged over the full steps (over all steps when there
        is no full step); ``ratio`` is conflict_mass / random_conflict_mass (1.0 when both are 0).
        """
        plans = [self.epoch(e) for e in range(epochs)]
        steps = [step for plan in plans for step in plan.steps]
        total = sum(plan.conflict_mass for plan in plans)
        random = sum(plan.random_conflict_mass for plan in plans)
        return {
            "epochs": epochs,
            "steps": len(steps),
            "conflict_mass": total,
            "random_conflict_mass": random,
            "ratio": total / random if random > 0 else (1.0 if total == 0 else float("inf")),
            "balance": steps_balance(steps),
            "mean_overlap_window": float(np.mean([len(s.overlap_window) for s in steps])),
        }

    def to_json(self, epochs: int = 1) -> str:
        """JSON of the config, the fingerprints of the RLG and costs, and the first ``epochs`` epochs for reading."""
        return json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "config": asdict(self.config),
                "num_views": self.num_views,
                "steps_per_epoch": self.steps_per_epoch,
                "rlg_fingerprint": self.rlg.fingerprint(),
                "view_cost_sha256": _array_digest(self.view_cost),
                "epochs": [_epoch_to_dict(self.epoch(e)) for e in range(epochs)],
            }
        )

    @classmethod
    def from_json(
        cls,
        text: str,
        rlg: RelativeLocalityGraph,
        pixels: np.ndarray | None = None,
        view_cost: np.ndarray | None = None,
        view_keys: np.ndarray | None = None,
    ) -> Schedule:
        """Rebuild a schedule saved by :meth:`to_json`; ``rlg``, ``pixels``, ``view_cost`` and ``view_keys`` must be
        those it was
        made from.

        Raises:
            ValueError: not a schedule, another RLG or costs, or the stored epochs no longer regenerate
                identically (e.g. a numpy RNG change), each with what to do.
        """
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError(f"not an {FORMAT} file (format={data.get('format')!r}); pass a file written by Schedule.save")
        if data.get("version") != VERSION:
            raise ValueError(
                f"an {FORMAT} v{data.get('version')!r} file, this odin-nerfstudio writes v{VERSION} (its steps are "
                "assigned differently); resume with the version that wrote it, or start a new run"
            )
        schedule = cls(rlg, ScheduleConfig(**data["config"]), pixels, view_cost, view_keys)
        if data["rlg_fingerprint"] != rlg.fingerprint() or data["num_views"] != schedule.num_views:
            raise ValueError(
                "the schedule was compiled for a different RLG (other views, view order, tracks or RLG points); "
                "rebuild the RLG from the run's COLMAP model, train split and --pipeline.datamanager.rlg-points, "
                "or compile a new schedule"
            )
        if data["view_cost_sha256"] != _array_digest(schedule.view_cost):
            raise ValueError(
                "the schedule was compiled with other view costs; pass the same pixels per view (and the same "
                "measured view_cost, if it was balanced by one)"
            )
        for stored in data["epochs"]:
            if _epoch_to_dict(schedule.epoch(stored["epoch"])) != stored:
                raise ValueError(
                    f"epoch {stored['epoch']} no longer regenerates identically from the saved seed "
                    "(numpy or scipy changed?); resume with the library versions of the original run"
                )
        return schedule

    def save(self, path: Path, epochs: int = 1) -> None:
        """Write :meth:`to_json` to ``path``."""
        Path(path).write_text(self.to_json(epochs))

    @classmethod
    def load(
        cls,
        path: Path,
        rlg: RelativeLocalityGraph,
        pixels: np.ndarray | None = None,
        view_cost: np.ndarray | None = None,
        view_keys: np.ndarray | None = None,
    ) -> Schedule:
        """Read a schedule written by :meth:`save`; see :meth:`from_json`."""
        return cls.from_json(Path(path).read_text(), rlg, pixels, view_cost, view_keys)

    def _plan(self, epoch: int) -> EpochPlan:
        """Generate epoch ``epoch``: group, order, assign, then measure conflicts."""
        config, weights = self.config, self.rlg.weights
        random_mass = float(self.random_conflict_profile(epoch).sum())
        banded_random = self.random_groups(epoch, banded=True)
        if config.order == "random":
            return self._assemble(epoch, banded_random, random_mass)
        if config.order in REGIONAL:
            rng = np.random.default_rng([config.seed, epoch, 2])
            first = epoch * self.steps_per_epoch
            steps = epoch_steps(
                config.order, self._regions, config.views_per_worker, rng, first, self.view_cost, config.band_tolerance,
                config.band_floor,
            )
            groups = [np.concatenate(step) for step in steps]
            return self._assemble(epoch, groups, random_mass, fixed=steps)
        rng = np.random.default_rng([config.seed, epoch, 0])
        shuffle, bounds = cost_bands(
            rng.permutation(self.num_views), self.view_cost, config.step_size, config.band_tolerance,
            config.views_per_worker,
        )
        groups = grow_groups(weights, shuffle, config.step_size, bounds)
        order = order_groups(weights, groups, config.step_size, config.ring_size, rng)
        groups = [groups[i] for i in untangle(weights, groups, order, config.step_size)]
        lag_mass = conflict_by_lag(self._edges, group_of_views(groups, self.num_views), len(groups), config.ring_size)
        fallback = conflict_by_lag(self._edges, group_of_views(banded_random, self.num_views), len(banded_random), 1)
        if lag_mass[:, 0].sum() > fallback.sum():
            return self._assemble(epoch, banded_random, random_mass)
        return self._assemble(epoch, groups, random_mass, lag_mass)

    def _assemble(
        self,
        epoch: int,
        groups: list[np.ndarray],
        random_mass: float,
        lag_mass: np.ndarray | None = None,
        fixed: list[list[np.ndarray]] | None = None,
    ) -> EpochPlan:
        """Epoch ``epoch`` from its ordered groups of views (and their conflict mass by lag, if already measured):
        LPT tasks (or, ``fixed``, each step's views per worker as given), conflict masses and overlap windows."""
        ring = self.config.ring_size
        if lag_mass is None:
            lag_mass = conflict_by_lag(self._edges, group_of_views(groups, self.num_views), len(groups), ring)
        first = epoch * self.steps_per_epoch
        steps, carried = [], [0.0] * self.config.num_workers
        for s, views in enumerate(groups):
            given = None if fixed is None else fixed[s]
            steps.append(self._step(first + s, epoch, views, lag_mass[s], min(s, ring), carried, given))
            carried = [load + cost for load, cost in zip(carried, steps[-1].worker_cost)]
        return EpochPlan(epoch=epoch, steps=tuple(steps), random_conflict_mass=random_mass)

    def step_views(self, epoch: int) -> list[np.ndarray]:
        """The views of each step of epoch ``epoch``, in step order."""
        return [np.asarray(step.views, dtype=np.int64) for step in self.epoch(epoch).steps]

    def random_groups(self, epoch: int, banded: bool = False) -> list[np.ndarray]:
        """Epoch ``epoch``'s random baseline: a permutation drawn from (seed, epoch, 1) chunked into steps of S;
        ``banded``: the same permutation arranged band by band (the cost bands of ``balance_tolerance``) first."""
        config, size = self.config, self.config.step_size
        order = np.random.default_rng([config.seed, epoch, 1]).permutation(self.num_views)
        if banded:
            order, bounds = cost_bands(order, self.view_cost, size, config.band_tolerance, config.views_per_worker)
            return [order[i : min(i + size, b)] for a, b in zip(bounds[:-1], bounds[1:]) for i in range(a, b, size)]
        return [order[i : i + size] for i in range(0, self.num_views, size)]

    def random_conflict_profile(self, epoch: int) -> np.ndarray:
        """Conflict mass of each step with its predecessor in epoch ``epoch``'s random baseline, [steps_per_epoch];
        its sum is the epoch's ``random_conflict_mass``."""
        groups = self.random_groups(epoch)
        return conflict_by_lag(self._edges, group_of_views(groups, self.num_views), len(groups), 1)[:, 0]

    def _step(
        self,
        index: int,
        epoch: int,
        views: np.ndarray,
        lag_mass: np.ndarray,
        max_lag: int,
        carried: list[float],
        given: list[np.ndarray] | None = None,
    ) -> Step:
        """Assemble one step: LPT tasks (on top of each worker's ``carried`` cost in the epoch so far, ties from
        worker ``epoch mod W`` on) or the ``given`` views per worker, conflict mass with the previous step and
        overlap window."""
        quota = min(self.config.views_per_worker, -(-len(views) // self.config.num_workers))
        num_workers = self.config.num_workers
        if given is None:
            tasks, loads = assign_lpt(views, self.view_cost, num_workers, quota, carried, first=epoch % num_workers)
        else:
            tasks = tuple(tuple(int(v) for v in worker) for worker in given)
            loads = tuple(float(self.view_cost[worker].sum()) for worker in given)
        limit, depth = self.config.overlap_threshold * len(views), 0
        while depth < max_lag and lag_mass[depth] <= limit:
            depth += 1
        return Step(
            index=index,
            epoch=epoch,
            tasks=tasks,
            worker_cost=loads,
            conflict_mass=float(lag_mass[0]),
            overlap_window=tuple(range(index - depth, index)),
        )


def _epoch_to_dict(plan: EpochPlan) -> dict:
    """JSON-ready dict of an epoch's steps."""
    return {
        "epoch": plan.epoch,
        "random_conflict_mass": plan.random_conflict_mass,
        "steps": [
            {
                "index": s.index,
                "tasks": [list(t) for t in s.tasks],
                "worker_cost": list(s.worker_cost),
                "conflict_mass": s.conflict_mass,
                "overlap_window": list(s.overlap_window),
            }
            for s in plan.steps
        ],
    }


def _array_digest(array: np.ndarray) -> str:
    """SHA-256 of a float64 array's bytes."""
    return hashlib.sha256(np.ascontiguousarray(array, dtype=np.float64).tobytes()).hexdigest()
