"""One protocol: the runtime on real tensors and the simulator on a workload take the same decisions.

The same schedule runs through the training loop twice, on two ranks sharing a virtual clock, a modeled link,
virtual lanes and the same task costs (so the interleaving is fixed): on the toy scene's real runtimes (real
culling, renders and Adam) and through the simulator (the workload of that scene's candidate sets). Per mode, with
priority publication, early commits, running ahead, dynamic ordering and (in two cases) two lanes on, the two
decision traces (read, wait and on which step, re-run, commit and whether early, publish first part, publish) must
be equal; quality-first's traces hold first parts and early commits, throughput-first's first parts. No read goes
stale here (the rates are tiny), so no re-run is compared (the replicated equivalence tests re-run). A rule changed
on one side only changes one trace.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from odin_nerfstudio.drivers.training_loop import LoopConfig, TrainingLoop
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology
from odin_nerfstudio.runtime.metering import Decision
from odin_nerfstudio.runtime.runtime import OdinRuntime
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.scenes import toy
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.simulation.costs import CostModel, LinearFit
from odin_nerfstudio.simulation.interconnect import Interconnect
from odin_nerfstudio.simulation.modeled import ModeledTransport, VirtualLanes
from odin_nerfstudio.simulation.clock import VirtualClock
from odin_nerfstudio.simulation.workload import ROW_BYTES
from odin_nerfstudio.simulation.simulator import Simulation, SimulationConfig
from odin_nerfstudio.simulation.workload import Workload
from odin_nerfstudio.core.tasks import Task

WORKERS, PER_WORKER, STEPS = 2, 2, 8
VIEWS = WORKERS * PER_WORKER * STEPS  # one epoch: a view's candidate set is its task's
COSTS = CostModel(task=LinearFit(0.01, (0.0, 0.0), 1.0, 1), bookkeeping_s=0.0, publish=LinearFit(0.0, (0.0,), 1.0, 1))
MODES = ("barrier", "quality", "throughput", "ddp", "hogwild")
LINK = Interconnect("slow", latency_s=0.015, bandwidth_bytes_per_s=1e6)
"""A link slower than a task: a step's publication arrives while the next step's tasks could read, its first part
(fewer bytes) before the rest, so priority publication and early commits take place."""


def every_row_written(task, leaves, generator):
    """The toy render with every gathered row given a gradient, so A(t) = C(t) as in the workload."""
    loss, _ = toy.render(task, leaves, generator)
    return loss + 1e-9 * sum(leaf.sum() for leaf in leaves.values()), None


def scene_workload(focal_scale: float = 0.75) -> tuple[Workload, dict]:
    """The toy scene's views (``toy.camera``'s ``focal_scale``) as a workload: C(v) culled by the runtime's own
    index on the initial model."""
    params = toy.make_params(num_gaussians=200)
    index = toy.make_runtime(OdinRuntimeConfig(), params).index
    cameras = {v: toy.camera(v, VIEWS, focal_scale=focal_scale) for v in range(VIEWS)}
    sets = [index.candidates(Task(0, 0, 0, v, cameras[v])) for v in range(VIEWS)]
    rlg = RelativeLocalityGraph.from_point_sets([s.numpy() for s in sets])
    pixels = np.full(VIEWS, toy.IMAGE * toy.IMAGE, dtype=np.int64)
    workload = Workload("toy ring", sets, sets, pixels, rlg, params["means"].shape[0])
    return workload, cameras


def runtime_traces(
    mode: str, workload: Workload, cameras: dict, simulation: Simulation, lanes: int = 1
) -> list[list[Decision]]:
    """The decisions of real runtimes (toy renders, culling and Adam; rates tiny, so C(t) stays the initial one),
    one per process as the simulation has them, on the simulation's schedule, clock costs and link."""
    clock = VirtualClock()
    template = toy.make_params(num_gaussians=200)
    transport = ModeledTransport(WORKERS, template, clock, LINK, ROW_BYTES)
    views, runtimes, loops = {}, [], []

    def step_tasks(step: int):
        tasks, window = simulation._step_tasks(step)
        views.update({t.key: t.view for worker in tasks for t in worker})
        return [[Task(t.step, t.worker, t.index, t.view, cameras[t.view]) for t in worker] for worker in tasks], window

    def render(task, leaves, generator):
        clock.spend(simulation.task_s(task))
        return every_row_written(task, leaves, generator)

    for worker in range(WORKERS):
        params = toy.make_params(num_gaussians=200)
        runtime = OdinRuntime(
            config(mode, lanes), params, selective_adams(params, {n: lr * 1e-7 for n, lr in toy.LRS.items()}),
            [transport.endpoint(worker)], render, topology=Topology(1, PER_WORKER), clock=clock.now_ns,
            record_decisions=True, lane_executor=VirtualLanes(clock),
        )
        runtimes.append(runtime)
        loops.append(TrainingLoop(runtime, step_tasks, [worker], STEPS - 1, LoopConfig()))

    def work(loop: TrainingLoop) -> None:
        for step in range(STEPS):
            loop.iteration(step, may_run_ahead=True)
        loop.finish()

    clock.run([(f"rank {w}", lambda loop=loop: work(loop)) for w, loop in enumerate(loops)])
    assert max(runtime.counters.most_in_flight for runtime in runtimes) == lanes  # the lanes ran side by side
    every_row = torch.arange(workload.num_rows)
    for rank, runtime in enumerate(runtimes):
        for key, read in runtime.final_reads.items():  # the workload is exactly what the runtime read (ddp: all)
            expected = every_row if mode == "ddp" else workload.candidates[views[(key[0], rank, key[2])]]
            assert torch.equal(read.candidate, expected)
    return [runtime.meter.decisions for runtime in runtimes]


def config(mode: str, lanes: int = 1) -> OdinRuntimeConfig:
    """The mode with ``lanes`` tasks in flight, recording reads; the stale-read rule's gradient test (real
    gradients only) always passing."""
    return OdinRuntimeConfig(mode=mode, stale_grad_ratio=1e9, record_reads=True, tasks_in_flight=lanes)


def simulated(mode: str, workload: Workload, lanes: int = 1) -> Simulation:
    run = SimulationConfig(
        config(mode, lanes), WORKERS, PER_WORKER, STEPS, remote_writes="candidates", record_decisions=True
    )
    return Simulation(workload, COSTS, LINK, run)


@pytest.mark.parametrize(("mode", "lanes"), [(mode, 1) for mode in MODES] + [("quality", 2), ("throughput", 2)])
def test_the_runtime_and_the_simulator_take_the_same_decisions(mode: str, lanes: int) -> None:
    workload, cameras = scene_workload()
    simulation = simulated(mode, workload, lanes)
    predicted = [list(trace) for trace in simulation.run().decisions]
    actual = runtime_traces(mode, workload, cameras, simulation, lanes)
    kinds = {decision.kind for trace in actual for decision in trace}
    assert {"read", "commit", "publish"} <= kinds
    if mode in ("quality", "throughput"):  # reads ran ahead of unpublished steps, some waited, first parts went first
        assert "wait" in kinds and any(d.kind == "read" and d.detail[1] for trace in actual for d in trace)
        assert "publish_first" in kinds
    if mode == "quality":
        assert any(d.kind == "commit" and d.detail for trace in actual for d in trace), "no early commit"
    assert predicted == actual


def test_a_rule_changed_on_one_side_only_changes_its_trace() -> None:
    """Not vacuous: the simulator without the other rank's predicted writes (one rule changed, on its side only)
    decides otherwise than the runtime with them."""
    workload, cameras = scene_workload()
    simulation = simulated("quality", workload)
    actual = runtime_traces("quality", workload, cameras, simulation)
    simulation.config.loop = LoopConfig(expect_remote_writes=False)
    assert [list(trace) for trace in simulation.run().decisions] != actual
