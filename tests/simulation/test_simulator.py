"""The simulator against what can be computed by hand: the barrier's step times, and quality-first's bounds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.drivers.training_loop import LoopConfig
from odin_nerfstudio.runtime.config import OdinRuntimeConfig
from odin_nerfstudio.scheduling.balance import steps_balance
from odin_nerfstudio.simulation.costs import CostModel, LinearFit
from odin_nerfstudio.simulation.interconnect import Interconnect
from odin_nerfstudio.simulation.modeled import ViewCamera
from odin_nerfstudio.simulation.simulator import Simulation, SimulationConfig
from odin_nerfstudio.simulation.workload import ROW_BYTES, Workload

PUBLISH_S = 0.003
COSTS = CostModel(
    task=LinearFit(0.01, (1e-4, 0.0), 1.0, 1), bookkeeping_s=0.0, publish=LinearFit(PUBLISH_S, (0.0,), 1.0, 1)
)
"""10 ms + 0.1 ms x |C(t)| per task, 3 ms per publication, nothing else."""


def disjoint_views(views: int = 24, seed: int = 0) -> Workload:
    """Views that share no row, of uneven sizes (so workers finish a step at different times)."""
    sizes = np.random.default_rng(seed).integers(5, 200, size=views)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return Workload.from_point_sets("disjoint", [np.arange(s, s + n) for s, n in zip(starts, sizes)])


def shared_views(views: int = 24, seed: int = 0) -> Workload:
    """Views that all read and write the same rows; sizes still differ through the cost sizes."""
    workload = Workload.from_point_sets("shared", [np.arange(100)] * views)
    sizes = np.random.default_rng(seed).integers(5, 200, size=views)
    return workload.with_sizes({view: float(size) for view, size in enumerate(sizes)})


def run(
    workload: Workload,
    mode: str,
    workers: int = 3,
    views_per_worker: int = 2,
    steps: int = 12,
    interconnect: Interconnect = Interconnect(),
    **kwargs,
):
    loop = LoopConfig(follow_overlap_window=kwargs.pop("follow_overlap_window", False))
    config = SimulationConfig(OdinRuntimeConfig(mode=mode), workers, views_per_worker, steps, loop=loop, **kwargs)
    simulation = Simulation(workload, COSTS, interconnect, config)
    return simulation, simulation.run()


def test_barrier_with_free_exchange_is_the_sum_of_the_slowest_worker_per_step() -> None:
    workload = disjoint_views()
    simulation, result = run(workload, "barrier")
    expected = 0.0
    for step in range(simulation.config.steps):
        worker_s = [sum(COSTS.task_s(workload.size(v), 12288) for v in simulation.tasks(step, w)) for w in range(3)]
        expected += max(worker_s) + PUBLISH_S
    assert result.span_s == pytest.approx(expected, rel=1e-9)
    assert result.views == 3 * 2 * 12
    assert sum(p.exposed_wait_s for p in result.processes) > 0  # the faster workers waited at the barrier


@pytest.mark.parametrize(
    "mode, rerun", [("barrier", True), ("quality", True), ("throughput", False), ("ddp", False), ("hogwild", False)]
)
def test_escape_reruns_are_added_only_where_validation_reruns_them(mode: str, rerun: bool) -> None:
    """The fitted share of escape re-runs lengthens a task only in the modes that validate and re-run an escape
    (throughput-first counts it, ddp and HOGWILD validate nothing)."""
    costs = dataclasses.replace(COSTS, rerun_share=0.5)
    config = SimulationConfig(OdinRuntimeConfig(mode=mode), 3, 2, 2)
    simulation = Simulation(disjoint_views(), costs, Interconnect(), config)
    task = Task(0, 0, 0, 5, ViewCamera(12288))
    plain = COSTS.task_s(simulation.workload.size(5), 12288)
    assert simulation.task_s(task) == pytest.approx(plain * (1.5 if rerun else 1.0), rel=1e-12)


def test_a_rebalanced_schedule_evens_the_modeled_costs_and_speeds_the_barrier() -> None:
    """Sizes that the views' point counts (the predicted costs) do not tell: cut by the modeled costs, every step's
    workers are evener by them and the barrier waits less."""
    sizes = np.random.default_rng(1).integers(5, 400, size=24)
    workload = disjoint_views().with_sizes({view: float(size) for view, size in enumerate(sizes)})
    modeled = np.array([COSTS.task_s(workload.size(view), int(workload.pixels[view])) for view in range(24)])
    predicted, predicted_result = run(workload, "barrier")
    rebalanced, rebalanced_result = run(workload, "barrier", rebalanced=True)
    for epoch in range(3):
        plans = [simulation.schedule.epoch(epoch).steps for simulation in (predicted, rebalanced)]
        assert steps_balance(plans[1], modeled) < steps_balance(plans[0], modeled)
    assert rebalanced_result.views_per_s > predicted_result.views_per_s


def test_quality_is_faster_than_barrier_without_conflicts() -> None:
    """One epoch of views that share no row (a later epoch renders the same views again, which conflicts)."""
    workload = disjoint_views()
    _, barrier = run(workload, "barrier", steps=4)
    _, quality = run(workload, "quality", steps=4)
    assert quality.conflicts == 0
    assert quality.views == barrier.views
    assert quality.views_per_s > barrier.views_per_s
    assert quality.hidden_wait(barrier) > 0


@pytest.mark.parametrize("workers_per_process", [1, 3])
def test_quality_equals_barrier_when_every_task_conflicts(workers_per_process: int) -> None:
    workload = shared_views()
    # Without the overlap-window gate (which alone would hold every step back), RAW must do it; the link's
    # latency keeps the previous step unpublished when the next one could read.
    link = Interconnect("slow", latency_s=0.05)
    options = {"workers_per_process": workers_per_process, "follow_overlap_window": False, "interconnect": link}
    _, barrier = run(workload, "barrier", **options)
    _, quality = run(workload, "quality", **options)
    assert quality.conflicts > 0  # tasks of later steps met the previous step's writes and waited
    assert quality.span_s == pytest.approx(barrier.span_s, rel=1e-9)


def test_virtual_workers_share_one_thread() -> None:
    workload = disjoint_views()
    simulation, result = run(workload, "quality", workers_per_process=3)
    (process,) = result.processes
    views = [v for s in range(12) for w in range(3) for v in simulation.tasks(s, w)]
    work = sum(COSTS.task_s(workload.size(v), 12288) for v in views)
    assert process.compute_s == pytest.approx(work + 12 * PUBLISH_S)
    assert result.span_s >= process.compute_s


def test_a_link_delays_the_barrier_by_its_latency_per_step() -> None:
    workload = disjoint_views()
    _, free = run(workload, "barrier")
    link = Interconnect("slow", latency_s=0.05, bandwidth_bytes_per_s=1e12)
    config = SimulationConfig(OdinRuntimeConfig(mode="barrier"), 3, 2, 12)
    slow = Simulation(workload, COSTS, link, config).run()
    assert slow.span_s == pytest.approx(free.span_s + 12 * 0.05, rel=1e-6)


def test_interconnect_formulas() -> None:
    link = Interconnect("l", latency_s=1.0, bandwidth_bytes_per_s=10.0, collective="allgather")
    assert link.delivery_s([0.0, 2.0, 1.0, 0.0], [10, 20, 30, 40]) == pytest.approx(2.0 + 3 * 1.0 + 3 * 40 / 10)
    tree = Interconnect("l", latency_s=1.0, bandwidth_bytes_per_s=10.0, collective="allgather", hops="tree")
    assert tree.delivery_s([0.0] * 4, [10] * 4) == pytest.approx(2 * 1.0 + 3 * 10 / 10)
    emulated = Interconnect("l", latency_s=1.0, bandwidth_bytes_per_s=10.0)
    assert emulated.delivery_s([0.0, 2.0], [100, 10]) == pytest.approx(max(0 + 1 + 10, 2 + 1 + 1))
    dense = Interconnect("l", 1.0, 10.0, "ring-allreduce", dense_bytes=1000)
    assert dense.delivery_s([0.0] * 4, [0] * 4) == pytest.approx(6 * 1.0 + 1.5 * 1000 / 10)


def test_the_chosen_exchange_is_the_one_of_least_predicted_time() -> None:
    """As the transport chooses: sparse for small parts, union-then-reduce when the parts overlap (W = 4), dense
    when the parts together reach the model's size; a longer latency makes union's extra latencies lose."""
    link = Interconnect("l", 0.1, 100.0, collective="chosen", dense_bytes=4000, row_bytes=10)
    costs = link.costs(4, longest=100, union_rows=40)  # 10 rows each, none shared
    assert costs["sparse"][0] == 3 * 100 and costs["union"][0] == 3 * 8 * 10 + 1.5 * 40 * 2
    assert link.delivery_s([0.0] * 4, [100] * 4, union_rows=40) == pytest.approx(3 * 0.1 + 300 / 100)
    overlapping = link.costs(4, longest=1000, union_rows=100)  # 100 rows each, all the same rows
    assert overlapping["union"][0] < overlapping["sparse"][0]
    union_s = 9 * 0.1 + overlapping["union"][0] / 100
    assert link.delivery_s([0.0] * 4, [1000] * 4, union_rows=100) == pytest.approx(union_s)
    slow = Interconnect("l", 1.0, 100.0, collective="chosen", dense_bytes=4000, row_bytes=10)
    sparse_s = 3 * 1.0 + overlapping["sparse"][0] / 100  # 300 bytes saved do not pay 6 latencies of 100 bytes
    assert slow.delivery_s([0.0] * 4, [1000] * 4, union_rows=100) == pytest.approx(sparse_s)
    large = link.costs(4, longest=5000, union_rows=2000)
    assert large["dense"][0] < min(large["sparse"][0], large["union"][0])
    assert link.delivery_s([0.0] * 4, [5000] * 4, union_rows=2000) == pytest.approx(6 * 0.1 + 1.5 * 4000 / 100)


def test_a_preset_sizes_the_dense_exchange_by_the_model() -> None:
    link = Interconnect.preset("10gbe", "chosen", num_rows=1000)
    assert link.dense_bytes == 1000 * ROW_BYTES and link.row_bytes == ROW_BYTES
