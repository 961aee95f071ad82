"""The sharded mode simulated: the sharded loop's own code on a workload, a rank per worker, in virtual time.

As ``simulator.py`` runs the runtime's own code, this runs ``drivers/sharded_loop.ShardedLoop`` with
``runtime/sharding``'s :class:`~odin_nerfstudio.runtime.sharding.Owner` and
:class:`~odin_nerfstudio.runtime.shard_reader.Reader` (one protocol): which rows an owner serves, which tasks run ahead
of an unpublished step (the clean part, the unsure flags), throughput-first's stale reads and their admission, the
return and the publication in schedule-worker order are their rules, none written again here. What is modeled is the
data plane:

- :class:`ShardSetIndex`, an owner's culling index: C(t) in a shard is the workload's set of t's view within the
  shard's range; rows do not move, so a pending row may enter a task's C(t) only if it is in it; a publication
  spends its modeled time (``CostModel.publish_s``);
- the render is ``modeled.ModeledRender`` (the task's modeled time, a gradient exactly on the view's A(t));
- :class:`ModeledRowExchange`, the row all-to-all: the real in-process exchange (``comm/inprocess``'s
  ``VirtualRowExchange``), delivered when the interconnect says (``Interconnect.all_to_all_s``) from each piece's
  bytes: a fetched row at 24 B (ids, masks, versions) plus :data:`VALUE_BYTES`, a returned gradient row at 8 B plus
  :data:`VALUE_BYTES` (``docs/architecture.md``, "Bytes: 3D rows"), other messages at their tensors' bytes. A rank's
  exchanges run one after another, as ``comm/all_to_all.RowAllToAll``'s progress thread runs them.

The tables are real and tiny: ``means`` and ``scales`` [n, 3] per shard, with their Adam moments. Shards are cut by
load as ``odin-train --sharded`` cuts them (``ownership.cut_by_load`` of each row's views, counted on the sets), and
each rank places the workers before the first step as it does (``ShardedLoop.place``: one exchange of each owner's
rows per view).
Left out, as in the replicated simulator: structural changes (no re-cut, no row moves), the adaptive batch rule's
gathers, evaluation and checkpoints, contention between ranks, a GPU's overlap of compute and communication; an
owner's culling and serving take no time of their own (a fitted run's trainer time per step,
``CostModel.step_overhead_s``, holds them at the fitted W).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from odin_nerfstudio.adapter.gsplat import GsplatAdapter
from odin_nerfstudio.comm.all_to_all import tables_of
from odin_nerfstudio.comm.inprocess import VirtualRowExchange, VirtualRowHandle
from odin_nerfstudio.core.conflicts import isin_sorted
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.core.sparse import tensor_bytes
from odin_nerfstudio.core.tasks import Task, view_tasks
from odin_nerfstudio.core.timeline_metrics import RunMetrics, rank_metrics
from odin_nerfstudio.drivers.sharded_loop import ShardedLoop
from odin_nerfstudio.runtime.culling_index import Reach
from odin_nerfstudio.runtime.metering import Decision, Meter
from odin_nerfstudio.runtime.ownership import ShardCuts, cut_by_load, row_load
from odin_nerfstudio.runtime.shard_reader import Reader
from odin_nerfstudio.runtime.sharding import Owner, Rows
from odin_nerfstudio.simulation.clock import VirtualClock
from odin_nerfstudio.simulation.interconnect import Interconnect
from odin_nerfstudio.simulation.modeled import ModeledRender, VirtualLanes
from odin_nerfstudio.simulation.costs import CostModel
from odin_nerfstudio.simulation.simulator import LEARNING_RATE, Simulation, SimulationConfig, SimulationResult
from odin_nerfstudio.simulation.workload import Workload

VALUE_BYTES = 236
"""A row's parameter floats on the wire: splatfacto's 59 float32 at SH degree 3 (``docs/architecture.md``)."""
PARAMS = ("means", "scales")
"""The modeled shard's tables (what the owner's culling bounds and Adam act on)."""
TIMEOUT_S = 1e9
"""The loop's bound on a wait: a modeled exchange is delivered or the clock reports the run stuck."""


class ShardSetIndex:
    """An owner's culling index over a workload (see the module): local rows of ``[lo, hi)``.

    Args:
        workload: the views' candidate sets (global rows, sorted).
        lo, hi: the shard's range of global ids.
        clock: the virtual clock publications spend their time on.
        publish_s: a publication's modeled time from the rows it writes.
    """

    def __init__(
        self, workload: Workload, lo: int, hi: int, clock: VirtualClock, publish_s: Callable[[int], float]
    ) -> None:
        self.workload, self.lo, self.hi, self.clock, self.publish_s = workload, lo, hi, clock, publish_s
        self._local: dict[int, Tensor] = {}

    def candidates(self, task: Task) -> Tensor:
        """C(t) within the shard, local rows, sorted."""
        if task.view not in self._local:
            rows = self.workload.candidates[task.view]
            ends = torch.searchsorted(rows, torch.tensor([self.lo, self.hi]))
            self._local[task.view] = rows[int(ends[0]) : int(ends[1])] - self.lo
        return self._local[task.view]

    def reach(self, mean_step: float, scale_step: float) -> Reach:
        """Sets do not move: no reach."""
        return Reach(grow=1.0, shift=0.0)

    def any_meets(self, task: Task, rows: Tensor, reach: Reach | None = None, region: Task | None = None) -> bool:
        """Whether any of ``rows`` (local) is in the task's C(t)."""
        return bool(self.meets(task, rows).any())

    def meeting(self, task: Task, rows: Tensor, reach: Reach) -> Tensor:
        """Those of ``rows`` (local, sorted) in the task's C(t): sets do not move."""
        return rows[self.meets(task, rows)]

    def bounds(self) -> ShardSetIndex:
        """The bounds whose :meth:`meets` the owner asks: the sets themselves."""
        return self

    def region(self, task: Task) -> Task:
        """A task's region: the task (its view's set)."""
        return task

    def meets(self, region: Task, rows: Tensor) -> Tensor:
        """Which of ``rows`` (local, sorted) are in the region's C(t), bool."""
        return isin_sorted(rows, self.candidates(region))

    def update(self, rows: Tensor, means: Tensor, scales: Tensor) -> None:
        """A publication wrote ``rows``: spend its modeled time."""
        self.clock.spend(self.publish_s(rows.numel()))


def exchange_decision(rank: int, what: str, pieces: Sequence[Rows]) -> Decision:
    """One exchange a rank started, as a trace entry: what it is and, per destination, the ``ids`` it carries (rows,
    or the flags a message of flags carries)."""
    return Decision("exchange", -1, rank, (what, tuple(tuple(piece["ids"].tolist()) for piece in pieces)))


def render_decision(task: Task) -> Decision:
    """One task a rank rendered, as a trace entry."""
    return Decision("render", task.step, task.worker, task.view)


class ModeledRowExchange:
    """Every rank's row all-to-all: exchanged in process, delivered in virtual time (see the module).

    Args:
        num_ranks: W.
        clock: the virtual clock.
        interconnect: how long an all-to-all of given pieces takes.
        traces: per rank, a list the rank's exchanges are recorded in (:func:`exchange_decision`), or None.
    """

    def __init__(
        self,
        num_ranks: int,
        clock: VirtualClock,
        interconnect: Interconnect,
        traces: list[list[Decision]] | None = None,
    ) -> None:
        self.inner = VirtualRowExchange(num_ranks)
        self.num_ranks, self.clock, self.interconnect, self.traces = num_ranks, clock, interconnect, traces
        self.delivery: dict[int, float] = {}
        self._sends: dict[int, dict[int, tuple[float, list[int]]]] = {}
        self._started = [0] * num_ranks

    def endpoint(self, rank: int) -> _RowEndpoint:
        """The exchange as rank ``rank`` sees it."""
        return _RowEndpoint(self, rank)

    def start(self, rank: int, pieces: Sequence[Rows], what: str) -> _RowHandle:
        """Rank ``rank``'s next exchange, sent now; with the last rank's, its delivery is known: once every rank
        sent it and the exchange before it was delivered, after :meth:`Interconnect.all_to_all_s`."""
        number = self._started[rank]
        self._started[rank] += 1
        inner = self.inner.start(rank, pieces, what)
        if self.traces is not None:
            self.traces[rank].append(exchange_decision(rank, what, pieces))
        sends = self._sends.setdefault(number, {})
        sends[rank] = (self.clock.now_s, [piece_bytes(piece) for piece in pieces])
        if len(sends) == self.num_ranks:
            del self._sends[number]
            start = max(max(time for time, _ in sends.values()), self.delivery.get(number - 1, 0.0))
            sizes = [sends[source][1] for source in range(self.num_ranks)]
            self.delivery[number] = start + self.interconnect.all_to_all_s(sizes)
        return _RowHandle(self, inner, number, what)


def piece_bytes(piece: Rows) -> int:
    """A piece's bytes on the wire, over its tables (side tables included): their int64 columns and the rest as
    they are, and :data:`VALUE_BYTES` a row for a table's parameter (or gradient) columns, which the simulator's
    tables hold only a few floats of."""
    total = 0
    for table in tables_of(piece).values():
        rows = int(next(iter(table.values())).shape[0])
        values = any(name in table for name in PARAMS)
        total += sum(tensor_bytes(t) for name, t in table.items() if name not in PARAMS)
        total += VALUE_BYTES * rows if values else 0
    return total


class _RowEndpoint:
    """One rank's end of a :class:`ModeledRowExchange` (``runtime/sharding.RowExchange``)."""

    def __init__(self, exchange: ModeledRowExchange, rank: int) -> None:
        self.exchange, self.rank = exchange, rank

    def start(self, pieces: Sequence[Rows], what: str) -> _RowHandle:
        return self.exchange.start(self.rank, pieces, what)


class _RowHandle:
    """A modeled exchange in flight: the real pieces, at the modeled time."""

    def __init__(self, exchange: ModeledRowExchange, inner: VirtualRowHandle, number: int, what: str) -> None:
        self.exchange, self.inner, self.number, self.what = exchange, inner, number, what

    def wait(self, timeout: float) -> list[Rows]:
        self.exchange.clock.wait(lambda: self.exchange.delivery.get(self.number), self.what)
        return self.inner.wait(timeout)


class ShardedSimulation(Simulation):
    """Runs a sharded :class:`~odin_nerfstudio.simulation.simulator.SimulationConfig` (``sharded=True``): W ranks,
    each an owner and a reader driven by the real :class:`ShardedLoop` (see the module); with ``record_decisions``,
    each rank's trace of exchanges and renders in the order it took them. After :meth:`run`, ``loops`` holds the
    ranks' loops (their timelines and counters)."""

    def cuts(self) -> ShardCuts:
        """The shards, cut by load on the workload's sets (each row's views, as ``odin-train --sharded`` counts)."""
        seen = torch.bincount(torch.cat(list(self.workload.candidates)), minlength=self.workload.num_rows)
        return cut_by_load(row_load(seen), self.config.num_workers)

    def _every_rank(self, step: int) -> list[list[Task]]:
        """Every rank's tasks of ``step`` (built once, shared by the ranks)."""
        if step not in self._steps:
            self._steps[step] = self._step_tasks(step)[0]
        return self._steps[step]

    def run(self) -> SimulationResult:
        """Simulate every rank to the end of its last step's publication."""
        config = self.config
        if not config.sharded:
            raise ValueError("ShardedSimulation runs configurations with sharded=True; use Simulation otherwise")
        traces = [[] for _ in range(config.num_workers)] if config.record_decisions else None
        self._steps: dict[int, list[list[Task]]] = {}
        exchange = ModeledRowExchange(config.num_workers, self.clock, self.interconnect, traces)
        cuts = self.cuts()
        self.loops = loops = [self._rank(rank, cuts, exchange, traces) for rank in range(config.num_workers)]
        views = view_tasks(self.workload.num_views, self._cameras.__getitem__)

        def work(loop: ShardedLoop) -> None:
            loop.place(views)  # each worker on the rank owning most of its rows, as a sharded run places them
            for step in range(config.steps):
                self.clock.spend(self.costs.step_overhead_s)
                loop.iteration(step)

        self.clock.run([(f"rank {r}", lambda loop=loop: work(loop)) for r, loop in enumerate(loops)])
        ranks = tuple(
            rank_metrics(r, list(loop.reader.meter.timeline.events), loop.counters) for r, loop in enumerate(loops)
        )
        return SimulationResult(config, RunMetrics(ranks), tuple(map(tuple, traces or ())))

    def _rank(
        self, rank: int, cuts: ShardCuts, exchange: ModeledRowExchange, traces: list[list[Decision]] | None
    ) -> ShardedLoop:
        """One rank: its shard (an owner over a :class:`ShardSetIndex`), a reader rendering the modeled render,
        and the sharded loop over the modeled exchange."""
        config, runtime = self.config, self.config.runtime
        lo, hi = cuts.range(rank)
        params = {name: torch.nn.Parameter(torch.zeros(hi - lo, 3)) for name in PARAMS}
        optimizers = selective_adams(params, {name: LEARNING_RATE for name in params})
        index = ShardSetIndex(self.workload, lo, hi, self.clock, self.costs.publish_s)
        adapter = GsplatAdapter()
        owner = Owner(
            params, optimizers, cuts, rank, adapter, runtime.candidate_margin, runtime.near_plane, index=index
        )  # type: ignore[arg-type]
        slower = config.straggler if rank == 0 else 1.0
        modeled = ModeledRender(self.workload, self.clock, lambda task: slower * self.task_s(task), config.seed)

        def render(task: Task, leaves: dict[str, Tensor], generator: torch.Generator) -> tuple[Tensor, None]:
            if traces is not None:
                traces[rank].append(render_decision(task))
            return modeled(task, leaves, generator)

        meter = Meter(torch.device("cpu"), clock=self.clock.now_ns)
        reader = Reader(cuts, params, render, adapter, meter, config.seed, runtime.ring_slots)
        return ShardedLoop(
            owner, reader, exchange.endpoint(rank), rank, self._every_rank, runtime.mode, config.steps - 1, TIMEOUT_S,
            None, runtime.stale_fraction, runtime.stale_grad_ratio, runtime.max_staleness,
            executor=VirtualLanes(self.clock), fetch_ahead=runtime.fetch_ahead,
            placement_by_time=runtime.placement_by_time,
        )  # fmt: skip


def predict(
    workload: Workload,
    costs: CostModel,
    interconnect: Interconnect,
    config: SimulationConfig,
    measured: dict[tuple[int, int], float] | None = None,
) -> SimulationResult:
    """Simulate one run, sharded (:class:`ShardedSimulation`) or replicated (``Simulation``) as ``config`` says."""
    kind = ShardedSimulation if config.sharded else Simulation
    return kind(workload, costs, interconnect, config, measured).run()
