"""One protocol, sharded: real sharded ranks and the simulator's sharded mode take the same decisions.

The same schedule runs through ``ShardedLoop`` twice on two ranks: on the toy scene's real shards (real culling,
renders and Adam, ranks as threads over ``VirtualRowExchange``) and through the simulator (the workload of that
scene's candidate sets, a modeled exchange on the virtual clock). Per mode, each rank's trace (every exchange it
started, with the rows or flags of each piece, and every task it rendered, in order) must be equal; a rule changed
on one side only changes one trace. And the simulated barrier's step is fetch + slowest render + return +
publication, computed by hand; with many workers the halves order lets every task run ahead where the regional
order makes every step wait for its rest.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np
import pytest
import torch

from odin_nerfstudio.adapter.gsplat import GsplatAdapter
from odin_nerfstudio.comm.inprocess import VirtualRowExchange
from odin_nerfstudio.core.row_order import restore_spatial_order
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.core.tasks import Task, view_tasks
from odin_nerfstudio.drivers.sharded_loop import ShardedLoop
from odin_nerfstudio.runtime.config import OdinRuntimeConfig
from odin_nerfstudio.runtime.metering import Decision, Meter
from odin_nerfstudio.runtime.placement import Placement, RankLoads, by_rank
from odin_nerfstudio.runtime.shard_reader import Reader
from odin_nerfstudio.runtime.sharding import Owner
from odin_nerfstudio.scenes import toy
from odin_nerfstudio.scenes.citygen import CityConfig, city_point_sets
from odin_nerfstudio.simulation.costs import CostModel, LinearFit
from odin_nerfstudio.simulation.interconnect import Interconnect
from odin_nerfstudio.simulation.sharded import VALUE_BYTES, ShardedSimulation, exchange_decision, render_decision
from odin_nerfstudio.simulation.simulator import SimulationConfig
from odin_nerfstudio.simulation.workload import Workload
from tests.simulation.test_decision_trace import PER_WORKER, STEPS, WORKERS, every_row_written, scene_workload

COSTS = CostModel(task=LinearFit(0.01, (0.0, 0.0), 1.0, 1), bookkeeping_s=0.0, publish=LinearFit(0.002, (1e-5,), 1, 1))
LINK = Interconnect("slow", latency_s=0.004, bandwidth_bytes_per_s=1e6)
MODES = ("barrier", "quality", "throughput")
FOCAL = 1.5
"""The toy ring's focal length in image widths: views that share some rows, so that some steps' tasks are all sure
of their C(t) (they run ahead) and others wait for the rest of their rows."""


def config(mode: str, **changes: float) -> OdinRuntimeConfig:
    """The mode; throughput-first's gradient rule (real gradients only) always passing; K = 2 unless
    ``ring_slots`` says (quality-first fetches K - 1 steps ahead, the most it may); placed by candidate rows unless
    ``placement_by_time`` says: the real ranks measure their wall time and the simulator its modeled time, so by time
    their placements could differ where locality ties."""
    slots = int(changes.get("ring_slots", 2))
    return OdinRuntimeConfig(mode=mode, stale_grad_ratio=1e9, stale_fraction=changes.get("stale_fraction", 0.2),
                             ring_slots=slots, fetch_ahead=max(1, slots - 1),
                             placement_by_time=bool(changes.get("placement_by_time", False)))


def simulated(mode: str, workload, **changes: float) -> ShardedSimulation:
    # The locality order: the toy ring's workload has no regional keys, and its focal length is chosen for it.
    run = SimulationConfig(
        config(mode, **changes), WORKERS, PER_WORKER, STEPS, record_decisions=True, sharded=True, schedule_order="rlg"
    )
    return ShardedSimulation(workload, COSTS, LINK, run)


class _Recording:
    """A rank's end of the real exchange that records what it starts (``sharded.exchange_decision``)."""

    def __init__(self, inner, rank: int, trace: list[Decision]) -> None:
        self.inner, self.rank, self.trace = inner, rank, trace

    def start(self, pieces, what: str):
        self.trace.append(exchange_decision(self.rank, what, pieces))
        return self.inner.start(pieces, what)


class _InlineLane:
    """A lane that renders at once on the loop's thread, where the simulator's virtual lane renders too (a thread's
    renders would interleave with the loop's exchanges in the trace by the machine's timing)."""

    def submit(self, fn, *args) -> Future:
        done = Future()
        done.set_result(fn(*args))
        return done

    def wait_any(self, running, timeout: float) -> bool:
        return True

    def shutdown(self) -> None:
        """Nothing to stop."""


def real_traces(
    mode: str, cameras: dict, simulation: ShardedSimulation, **changes: float
) -> tuple[list[list[Decision]], list]:
    """Each real rank's trace (toy shards culled by their own index; rates tiny, so C(t) stays the initial one), on
    the simulation's schedule and cuts; and the ranks' counters."""
    cuts = simulation.cuts()
    exchange = VirtualRowExchange(WORKERS)
    traces: list[list[Decision]] = [[] for _ in range(WORKERS)]
    params = toy.make_params(num_gaussians=200)
    restore_spatial_order(params, {}, None)  # the rows in the order the workload's runtime culled them

    def step_tasks(step: int) -> list[list[Task]]:
        tasks, _ = simulation._step_tasks(step)
        return [[Task(t.step, t.worker, t.index, t.view, cameras[t.view]) for t in rank] for rank in tasks]

    loops = []
    for rank in range(WORKERS):
        lo, hi = cuts.range(rank)
        shard = {name: torch.nn.Parameter(p.detach()[lo:hi].clone()) for name, p in params.items()}
        optimizers = selective_adams(shard, {name: lr * 1e-7 for name, lr in toy.LRS.items()})
        runtime = config(mode, **changes)
        owner = Owner(shard, optimizers, cuts, rank, GsplatAdapter(), runtime.candidate_margin, runtime.near_plane)

        def render(task, leaves, generator, trace=traces[rank]):
            trace.append(render_decision(task))
            return every_row_written(task, leaves, generator)

        reader = Reader(cuts, shard, render, GsplatAdapter(), Meter(torch.device("cpu")), 0, runtime.ring_slots)
        endpoint = _Recording(exchange.endpoint(rank), rank, traces[rank])
        loops.append(ShardedLoop(
            owner, reader, endpoint, rank, step_tasks, mode, STEPS - 1, 30.0, None, runtime.stale_fraction,
            runtime.stale_grad_ratio, runtime.max_staleness, executor=_InlineLane(), fetch_ahead=runtime.fetch_ahead,
            placement_by_time=runtime.placement_by_time,
        ))  # fmt: skip
    errors = []
    views = view_tasks(simulation.workload.num_views, cameras.__getitem__)

    def run(loop: ShardedLoop) -> None:
        try:
            loop.place(views)  # as a sharded run places its workers, and the simulator
            for step in range(STEPS):
                loop.iteration(step)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(loop,)) for loop in loops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return traces, [loop.counters for loop in loops]


@pytest.mark.parametrize("mode", MODES)
def test_real_sharded_ranks_and_the_simulator_take_the_same_decisions(mode: str) -> None:
    workload, cameras = scene_workload(FOCAL)
    simulation = simulated(mode, workload)
    predicted = [list(trace) for trace in simulation.run().decisions]
    actual, counters = real_traces(mode, cameras, simulation)
    whats = {d.detail[0].rsplit(" of step", 1)[0] for trace in actual for d in trace if d.kind == "exchange"}
    assert {"fetch", "return"} <= whats and sum(d.kind == "render" for d in actual[0]) == STEPS * PER_WORKER
    if mode != "barrier":  # tasks ran ahead of an unpublished step on both sides, and some waited for the rest
        assert "fetch of the rest" in whats  # the clean parts ride on the fetches and returns
        assert all(c.ran_ahead > 0 for c in counters)
        assert any(c.ran_ahead < STEPS * PER_WORKER - PER_WORKER for c in counters)
    if mode == "throughput":
        assert sum(c.stale_reads for c in counters) > 0
    assert predicted == actual


def test_three_steps_fetched_ahead_take_the_same_decisions_in_the_simulator() -> None:
    """Quality-first at K = 4: three clean parts in flight, each culled against every unpublished step, the later
    ones riding on the returns."""
    workload, cameras = scene_workload(FOCAL)
    simulation = simulated("quality", workload, ring_slots=4)
    predicted = [list(trace) for trace in simulation.run().decisions]
    actual, _ = real_traces("quality", cameras, simulation, ring_slots=4)
    whats = [d.detail[0] for d in actual[0] if d.kind == "exchange"]
    # After the placement's exchange, step 1's clean part rides on the fetch of step 0, steps 2 and 3's on its return.
    assert whats[:3] == ["rows seen per view", "fetch of step 0", "return of step 0"]
    assert predicted == actual


def test_a_rule_changed_on_one_side_only_changes_its_trace() -> None:
    """Not vacuous: the simulator admitting no stale read (one rule changed, on its side only) decides otherwise
    than the real ranks that admit them."""
    workload, cameras = scene_workload(FOCAL)
    actual, _ = real_traces("throughput", cameras, simulated("throughput", workload))
    changed = simulated("throughput", workload, stale_fraction=0.0)
    assert [list(trace) for trace in changed.run().decisions] != actual


def test_the_loop_publishes_beside_the_tasks_rendering_ahead_on_its_lane() -> None:
    """Quality-first renders tasks ahead on a lane while a step's return travels; when the return arrives the loop
    publishes (and goes on to the next exchange) at once, beside the lane's render, instead of after it: in virtual
    time a render takes 10 ms and the return 8 ms, so some publication starts inside a render of the next step."""
    workload, _ = scene_workload(FOCAL)
    simulation = simulated("quality", workload)
    simulation.run()
    beside = 0
    for loop in simulation.loops:
        events = loop.reader.meter.timeline.events
        published = {event.step: event for event in events if event.name == "publish"}
        for render in (e for e in events if e.name == "render" and e.step - 1 in published):
            beside += render.start_ns < published[render.step - 1].start_ns < render.end_ns
    assert sum(loop.counters.ran_ahead for loop in simulation.loops) > 0
    assert beside, "a publication started while a task rendered ahead"


def test_the_simulated_barrier_step_is_fetch_slowest_render_return_and_publication() -> None:
    """By hand: the placement's exchange (a count per view), then per step the fetch (two collectives' latencies and
    the largest piece, 24 + VALUE_BYTES a row), the slower rank's render, the return (8 + VALUE_BYTES a row, and the
    8 bytes of the rank's measured time) and the slower owner's publication, each worker on the rank the placement
    chose: by rows owned, then by the time the ranks measured in the steps K before."""
    workload, _ = scene_workload(FOCAL)
    simulation = simulated("barrier", workload, placement_by_time=True)
    simulation.measured = {(s, v): 0.01 + 0.02 * (v % 3) for s in range(STEPS) for v in range(workload.num_views)}
    simulation.config.record_decisions = False
    result = simulation.run()
    cuts = simulation.cuts()
    spent: dict[tuple[int, int], int] = {}  # (step, rank): the rank's render time of its tasks, as it measured it
    for rank, loop in enumerate(simulation.loops):
        for event in loop.reader.meter.timeline.events:
            if event.name in ("render", "backward"):
                spent[event.step, rank] = spent.get((event.step, rank), 0) + event.end_ns - event.start_ns
    loads = RankLoads(WORKERS, simulation.loops[0].ring_slots)
    placement = Placement(torch.as_tensor(simulation.loops[0].placement.rows_owned), loads)  # placed again, by hand
    counts = 8 * workload.num_views
    expected, published = [], LINK.all_to_all_s([[counts] * WORKERS] * WORKERS)
    for step in range(STEPS):
        workers = simulation._step_tasks(step)[0]
        tasks = by_rank(workers, placement.ranks_of(workers))
        loads.measured(step, np.array([spent.get((step, rank), 0) for rank in range(WORKERS)]))
        rows = [torch.unique(torch.cat([workload.candidates[t.view] for t in rank])) for rank in tasks]
        ranges = [cuts.range(owner) for owner in range(WORKERS)]
        owned = [[int(((r >= lo) & (r < hi)).sum()) for lo, hi in ranges] for r in rows]
        crossing = max(owned[r][o] for r in range(WORKERS) for o in range(WORKERS) if r != o)
        fetch = 2 * LINK.latency_s + crossing * (24 + VALUE_BYTES) / LINK.bandwidth_bytes_per_s
        back = 2 * LINK.latency_s + (crossing * (8 + VALUE_BYTES) + 8) / LINK.bandwidth_bytes_per_s
        render = max(sum(simulation.measured[(step, t.view)] for t in rank) for rank in tasks)
        union = torch.unique(torch.cat(rows))
        merged = [int(((union >= lo) & (union < hi)).sum()) for lo, hi in ranges]
        published += fetch + render + back + max(COSTS.publish_s(n) for n in merged)
        expected.append(published)
    ends = {}
    for rank in result.metrics.ranks:
        assert rank.views == STEPS * PER_WORKER and rank.exposed_wait_s > 0
    for loop in simulation.loops:
        for event in loop.reader.meter.timeline.events:
            if event.name == "publish":
                ends[event.step] = max(ends.get(event.step, 0.0), event.end_ns / 1e9)
    assert [ends[step] for step in range(STEPS)] == pytest.approx(expected, rel=1e-6)
    assert sum(loop.counters.placed for loop in simulation.loops) > 0, "some step ran a worker on another rank"
    assert loads.counted_through == STEPS - 1 - loads.lag, "the steps K before were placed by the measured time"


def test_with_many_workers_the_halves_order_lets_every_task_run_ahead_where_regions_wait() -> None:
    """A citygen city of 256 views at 16 workers (regions of 16 views, in sight of each other): in the regional
    order every step's tasks include one unsure of the step before, so every rank fetches the step's rest after
    its publication; in the halves order consecutive steps lie in opposite halves of the city, every task of the
    steps after the first runs ahead, and quality-first trains faster."""
    workload = Workload.from_point_sets("city", city_point_sets(CityConfig(num_views=256)).point_sets)
    costs = CostModel(LinearFit(0.1, (1e-4, 0.0), 1.0, 1), 0.0, LinearFit(0.002, (1e-6,), 1, 1),
                      residuals=(-0.03, 0.0, 0.05))  # fmt: skip
    link = Interconnect.preset("10gbe", "allgather", 0.002, workload.num_rows)
    workers, steps, runs = 16, 12, {}
    for order in ("regions", "halves"):
        run = SimulationConfig(OdinRuntimeConfig(mode="quality"), workers, 1, steps, sharded=True, schedule_order=order)
        simulation = ShardedSimulation(workload, costs, link, run)
        runs[order] = simulation.run(), [loop.counters for loop in simulation.loops]
    (regional, waited), (halves, ran) = runs["regions"], runs["halves"]
    assert sum(c.rest_fetches for c in waited) == workers * (steps - 1), "every step after the first fetched a rest"
    assert sum(c.rest_fetches for c in ran) == 0 and sum(c.ran_ahead for c in ran) == workers * (steps - 1)
    assert halves.views_per_s > 1.1 * regional.views_per_s


def test_a_slower_rank_gets_the_cheaper_views_when_placed_by_measured_time() -> None:
    """The same city at 16 workers in the halves order, rank 0 computing 1.5 times slower than the others: placed by
    candidate rows, its compute sets quality-first's pace; placed by the ranks' measured time (riding on the
    returns), the ties give it the cheaper workers, so its compute comes nearer the others' and the run is faster."""
    workload = Workload.from_point_sets("city", city_point_sets(CityConfig(num_views=256)).point_sets)
    costs = CostModel(LinearFit(0.01, (1e-3, 0.0), 1.0, 1), 0.0, LinearFit(0.002, (1e-6,), 1, 1))  # by |C(t)|
    link = Interconnect.preset("10gbe", "allgather", 0.002, workload.num_rows)
    runs = {}
    for by_time in (False, True):
        runtime = OdinRuntimeConfig(mode="quality", placement_by_time=by_time)
        run = SimulationConfig(runtime, 16, 1, 24, sharded=True, schedule_order="halves", straggler=1.5)
        simulation = ShardedSimulation(workload, costs, link, run)
        result = simulation.run()
        compute = [rank.compute_s for rank in result.metrics.ranks]
        runs[by_time] = result.views_per_s, compute[0] / np.mean(compute)
        assert (simulation.loops[0].placement.loads.lag is not None) == by_time
    (rows_speed, rows_slowest), (time_speed, time_slowest) = runs[False], runs[True]
    assert rows_slowest > 1.3 and time_slowest < rows_slowest - 0.05, runs
    assert time_speed > 1.03 * rows_speed, runs
