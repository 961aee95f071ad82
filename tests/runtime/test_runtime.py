"""The runtime on virtual workers: barrier equals the reference semantics, quality-first equals barrier bit for bit
under any interleaving (adversarial and hypothesis-generated), throughput-first stays within its bounds, and
structural changes behind the drain barrier keep the equivalence."""

from __future__ import annotations

import dataclasses

import functools
import json
import time

import pytest
import torch
from gsplat.strategy import DefaultStrategy
from gsplat.strategy.ops import duplicate, remove
from hypothesis import given, settings, target
from hypothesis import strategies as st

from odin_nerfstudio.core.batch_gain import AdaptiveGain
from odin_nerfstudio.culling.candidates import candidate_set
from odin_nerfstudio.rendering.rasterize import rasterization
from odin_nerfstudio.core.row_order import permute_rows, spatial_order
from odin_nerfstudio.runtime.config import Topology
from odin_nerfstudio.runtime.culling_index import Reach
from odin_nerfstudio.runtime.publication import EarlyRows, Publisher
from odin_nerfstudio.runtime.reads import ReadRecord
from odin_nerfstudio.runtime.runtime import OdinRuntime, OdinRuntimeConfig, Read, Wait
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.runtime.shadow import MEMORY_KINDS, ShadowGraph
from odin_nerfstudio.runtime.validation import Validator
from odin_nerfstudio.core.sparse import SparseUpdate, sum_in_order
from odin_nerfstudio.core.tables import index_map_from_uid
from odin_nerfstudio.core.tasks import Task, TaskKey, task_generator
from odin_nerfstudio.comm.inprocess import VirtualTransport
from odin_nerfstudio.drivers.virtual import run_virtual
from odin_nerfstudio.scenes.toy import (
    LRS,
    assert_identical,
    camera,
    make_params,
    make_runtime,
    make_schedule,
    render,
    render_gsplat,
    snapshot,
    visibility,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 8
DENSE = {"num_views": 6, "focal_scale": 0.75, "lr_scale": 1.0}
SPARSE = {"num_views": 12, "focal_scale": 2.0, "lr_scale": 8.0}
SCENES = {"dense": DENSE, "sparse": SPARSE}


def run_first(runtime: OdinRuntime, tasks: list[Task]) -> Task | Wait:
    """Read the first of a worker's tasks that may read and finish it (render, backward, stage), or its Wait."""
    result = runtime.read_next(tasks)
    if isinstance(result, Wait):
        return result
    runtime.finish(result)
    return result.task


def schedule_of(scene: dict, workers: int, per_worker: int, steps: int = STEPS) -> list:
    return make_schedule(steps, workers, per_worker, scene["num_views"], focal_scale=scene["focal_scale"])


def epoch_schedule(epochs: int, workers: int, per_worker: int, num_views: int, focal_scale: float = 0.75) -> list:
    """step -> worker -> tasks: every view once per epoch (seeded shuffles), W x B views per step; the epoch's last
    step holds the V mod (W x B) views left, ceil(r / W) per worker as ``schedule.py`` assigns them, so the last
    workers may have none."""
    generator = torch.Generator().manual_seed(0)
    size = workers * per_worker
    schedule: list = []
    for _ in range(epochs):
        views = torch.randperm(num_views, generator=generator).tolist()
        for start in range(0, num_views, size):
            chunk = views[start : start + size]
            quota = -(-len(chunk) // workers)
            step = len(schedule)
            schedule.append(
                [
                    [
                        Task(step, w, b, view, camera(view, num_views, focal_scale=focal_scale))
                        for b, view in enumerate(chunk[w * quota : (w + 1) * quota])
                    ]
                    for w in range(workers)
                ]
            )
    return schedule


def run(mode: str, scene: dict, workers: int, per_worker: int, interleaving=(), steps: int = STEPS, **config):
    """A fresh model trained on virtual workers; returns the runtime (``visibility_fn`` and ``batch_gain`` go to
    the runtime)."""
    visibility_fn, batch_gain = config.pop("visibility_fn", None), config.pop("batch_gain", None)
    runtime = make_runtime(
        OdinRuntimeConfig(mode=mode, **config),
        make_params(),
        lr_scale=scene["lr_scale"],
        visibility_fn=visibility_fn,
        topology=Topology(workers, per_worker),
        batch_gain=batch_gain,
    )
    run_virtual(runtime, schedule_of(scene, workers, per_worker, steps), interleaving)
    return runtime


@functools.lru_cache(maxsize=None)
def barrier_snapshot(scene_name: str, workers: int, per_worker: int) -> dict[str, torch.Tensor]:
    return snapshot(run("barrier", SCENES[scene_name], workers, per_worker))


def adversarial(workers: int) -> dict[str, list[int]]:
    """Interleavings that stress the runtime: a worker running ahead by several steps, one holding a read."""
    return {
        "round_robin": [],
        "last_runs_ahead": [workers - 1] * 40,
        "first_runs_ahead": [0] * 40,
        "first_holds_a_read": [0] + [w for w in range(1, workers) for _ in range(40)],
        "bursts": [w for w in range(workers) for _ in range(5)] * 6,
    }


def reference_run(scene: dict, workers: int, per_worker: int, steps: int = STEPS) -> dict[str, torch.Tensor]:
    """The reference semantics written out: per step, each task renders its candidate rows of theta_s, each
    worker sums its tasks' gradients in task order, the workers' sums are added in worker order, and selective
    Adam updates the union of the active sets. Rows in the Z-order the runtime puts them in."""
    params = make_params()
    permute_rows(params, {}, None, spatial_order(params["means"]))
    optimizers = selective_adams(params, {name: lr * scene["lr_scale"] for name, lr in LRS.items()})
    for step_tasks in schedule_of(scene, workers, per_worker, steps):
        worker_sums = []
        for tasks in step_tasks:
            contributions = []
            for task in tasks:
                scales = torch.exp(params["scales"].detach())
                rows = candidate_set(params["means"].detach(), scales, task.camera, margin=0.1)
                leaves = {name: p.detach()[rows].requires_grad_(True) for name, p in params.items()}
                loss, info = render(task, leaves, task_generator(0, task.step, task.view))
                loss.backward()
                active = torch.nonzero(info["radii"][0] > 0).flatten()
                grads = {n: torch.zeros_like(leaf) if leaf.grad is None else leaf.grad for n, leaf in leaves.items()}
                contributions.append(SparseUpdate(rows[active], {n: grad[active] for n, grad in grads.items()}))
            worker_sums.append(sum_in_order(contributions, params))
        merged = sum_in_order(worker_sums, params)
        for name, optimizer in optimizers.items():
            optimizer.step_rows(merged.rows, [merged.grads[name]])
    out = {}
    for name, param in params.items():
        out[name] = param.detach().clone()
        for key in ("exp_avg", "exp_avg_sq", "step"):
            out[f"{name}.{key}"] = optimizers[name].state[param][key].clone()
    return out


@pytest.mark.parametrize("scene_name", ["dense", "sparse"])
def test_barrier_equals_reference_semantics(scene_name: str) -> None:
    runtime = run("barrier", SCENES[scene_name], 2, 2, record_reads=True)
    assert_identical(snapshot(runtime), reference_run(SCENES[scene_name], 2, 2))
    assert all(record.read_mark == key[0] - 1 for key, record in runtime.final_reads.items())


@pytest.mark.parametrize("workers,per_worker", [(2, 2), (4, 1)])
@pytest.mark.parametrize("scene_name", ["dense", "sparse"])
@pytest.mark.parametrize("interleaving", list(adversarial(4)))
def test_quality_equals_barrier_under_adversarial_interleavings(
    workers: int, per_worker: int, scene_name: str, interleaving: str
) -> None:
    """Every interleaving but round-robin (the barrier's own order, the control: no read meets an unpublished step)
    makes reads reach an unpublished step's writes and wait, and the model is still the barrier's bit for bit."""
    runtime = run("quality", SCENES[scene_name], workers, per_worker, adversarial(workers)[interleaving])
    assert_identical(snapshot(runtime), barrier_snapshot(scene_name, workers, per_worker))
    met = runtime.counters.waits.get("raw", 0) + runtime.counters.overlapped_reads
    assert (met == 0) if interleaving == "round_robin" else (met > 0), dict(runtime.counters.waits)


def test_adversarial_runs_exercise_waits_reruns_and_reordering() -> None:
    """The equivalence above is not vacuous: the sparse scene makes workers read ahead optimistically, fail
    validation (stale values, a row that moved into the frustum) and re-run, and reorder their tasks."""
    ahead = run("quality", SPARSE, 2, 2, [1] * 40)
    assert ahead.counters.waits["raw"] > 0
    assert ahead.counters.validation_failures.get("stale", 0) > 0
    assert ahead.counters.validation_failures.get("candidate", 0) > 0
    assert ahead.counters.reruns > 0
    assert ahead.counters.reordered > 0
    assert_identical(snapshot(ahead), barrier_snapshot("sparse", 2, 2))
    assert (ahead.tables.pending_step == -1).all(), "a re-run's superseded candidate set stayed pending"
    assert ahead.shadow.open_slots() == [] and ahead.memory_report()["current_extra_bytes"] == 0


@pytest.mark.parametrize("interleaving", list(adversarial(2)))
def test_quality_equals_barrier_with_the_adaptive_batch_gain(interleaving: str) -> None:
    """The adaptive batch rule's gain comes from published steps only, so it is the same in every mode: under the
    adversarial interleavings quality-first still ends at the barrier's model bit for bit, and the gain moved."""
    barrier = run("barrier", SPARSE, 2, 2, batch_gain=AdaptiveGain(4))
    quality = run("quality", SPARSE, 2, 2, adversarial(2)[interleaving], batch_gain=AdaptiveGain(4))
    assert_identical(snapshot(quality), snapshot(barrier))
    if interleaving != "round_robin":  # the barrier's own order reads nothing ahead
        assert quality.counters.waits.get("raw", 0) + quality.counters.overlapped_reads > 0
    gains = [optimizer.param_groups[0]["lr_gain"] for optimizer in quality.optimizers.values()]
    assert gains == [optimizer.param_groups[0]["lr_gain"] for optimizer in barrier.optimizers.values()]
    assert any(gain != 1.0 for gain in gains), gains


@pytest.mark.parametrize("interleaving", list(adversarial(2)))
def test_short_last_steps_quality_equals_barrier(interleaving: str) -> None:
    """5 views on W = 2, B = 1: the last step of every epoch has one view and worker 1 none; worker 1 sends an
    empty update for it and quality still equals barrier."""
    schedule = epoch_schedule(3, 2, 1, 5)
    assert [len(tasks) for tasks in schedule[2]] == [1, 0]
    results = {}
    for mode, turns in (("barrier", []), ("quality", adversarial(2)[interleaving])):
        runtime = make_runtime(OdinRuntimeConfig(mode=mode), make_params(), topology=Topology(2))
        run_virtual(runtime, schedule, turns)
        results[mode] = snapshot(runtime)
    assert_identical(results["quality"], results["barrier"])


class RecordingEndpoint:
    """A transport endpoint that records the step and row count of every update it sends."""

    def __init__(self, endpoint, sent: list[tuple[int, int]]) -> None:
        self.endpoint = endpoint
        self.sent = sent

    def start_exchange(self, step: int, update: SparseUpdate, first=None):
        self.sent.append((step, update.rows.numel()))
        return self.endpoint.start_exchange(step, update, first)


@pytest.mark.parametrize("mode", ["barrier", "quality"])
def test_a_runtime_without_a_task_in_a_step_sends_an_empty_update_in_step_order(mode: str) -> None:
    """A runtime whose only worker has no task in a step (rank 1 of a short step) still sends its part of that
    step's exchange, after the previous step's and before the next, and publishes it like any other step."""
    schedule = [[tasks[1]] for tasks in epoch_schedule(2, 2, 1, 5)]
    schedule = [[[Task(t.step, 0, t.index, t.view, t.camera) for t in tasks] for tasks in step] for step in schedule]
    empty = [step for step, (tasks,) in enumerate(schedule) if not tasks]
    assert empty == [2, 5]
    sent: list[tuple[int, int]] = []
    params = make_params()
    runtime = OdinRuntime(
        OdinRuntimeConfig(mode=mode),
        params,
        selective_adams(params, LRS),
        [RecordingEndpoint(VirtualTransport(1, params).endpoint(0), sent)],
        render,
    )
    run_virtual(runtime, schedule, [0] * 20)
    assert [step for step, _ in sent] == list(range(len(schedule)))
    assert all((rows == 0) == (step in empty) for step, rows in sent)
    assert runtime.published_through == len(schedule) - 1 and runtime.shadow.open_slots() == []
    assert int(runtime.optimizers["means"].state[runtime.params["means"]]["step"]) == len(schedule)


def test_plan_step_needs_one_count_per_worker() -> None:
    runtime = make_runtime(OdinRuntimeConfig(mode="quality"), make_params(), topology=Topology(2))
    runtime.plan_step(0, [0, 0])
    for counts in ([1], [1, -1]):
        with pytest.raises(ValueError, match="one task count"):
            runtime.plan_step(1, counts)


def test_without_validation_an_adversarial_run_diverges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sensitivity: skipping the validation re-runs breaks bit-equality, so the equality tests would notice."""
    monkeypatch.setattr(Validator, "validate", lambda self, task, record: ([], torch.empty(0, dtype=torch.int64)))
    runtime = run("quality", SPARSE, 2, 2, [1] * 40)
    reference = barrier_snapshot("sparse", 2, 2)
    assert any(not torch.equal(value, reference[key]) for key, value in snapshot(runtime).items())


def changed_rows_since_read(runtime: OdinRuntime, key: TaskKey) -> dict[int, int]:
    """Rows of a final read's candidate set published by a step between its read and its own step: row ->
    earliest such step (the first write the read missed)."""
    record = runtime.final_reads[key]
    missed: dict[int, int] = {}
    for step in range(key[0] - 1, record.read_mark, -1):
        hit = record.candidate[torch.isin(record.candidate, runtime.published_rows[step])]
        missed.update({int(row): step for row in hit})
    return missed


@settings(max_examples=25, deadline=None)
@given(
    workers=st.sampled_from([2, 4]),
    per_worker=st.sampled_from([1, 2]),
    scene_name=st.sampled_from(["dense", "sparse"]),
    data=st.data(),
)
def test_quality_equals_barrier_and_never_reads_stale_values(workers, per_worker, scene_name, data) -> None:
    interleaving = data.draw(st.lists(st.integers(0, workers - 1), max_size=80), label="interleaving")
    runtime = run("quality", SCENES[scene_name], workers, per_worker, interleaving, record_reads=True)
    target(float(runtime.counters.overlapped_reads), label="reads before the step before was published")
    assert_identical(snapshot(runtime), barrier_snapshot(scene_name, workers, per_worker))
    assert len(runtime.final_reads) == STEPS * workers * per_worker
    for key in runtime.final_reads:
        assert changed_rows_since_read(runtime, key) == {}, f"task {key} used a value older than step {key[0]}"


def test_the_stale_value_checks_meet_reads_ahead() -> None:
    """The two properties around this test check every final read against the rows published since it read; here,
    on fixed interleavings, there are such reads: quality-first keeps reads made before the step before was
    published (none used an older value), and throughput-first keeps admitted stale reads within its bounds."""
    quality = run("quality", SPARSE, 2, 2, adversarial(2)["bursts"], record_reads=True)
    ahead = [key for key, record in quality.final_reads.items() if record.read_mark < key[0] - 1]
    assert ahead and all(changed_rows_since_read(quality, key) == {} for key in quality.final_reads)
    throughput = run(
        "throughput", DENSE, 2, 1, adversarial(2)["last_runs_ahead"], stale_fraction=0.5, stale_grad_ratio=5.0,
        max_staleness=2, record_reads=True,
    )
    kept = [stale for stale in throughput.counters.stale_reads if stale.kept]
    assert kept, "no stale read was kept"
    for stale in kept:
        missed = changed_rows_since_read(throughput, stale.key)
        assert missed and set(missed) <= set(throughput.final_reads[stale.key].stale_rows.tolist())


@settings(max_examples=20, deadline=None)
@given(
    stale_fraction=st.sampled_from([0.2, 0.5, 0.9]),
    max_staleness=st.integers(1, 3),
    workers=st.sampled_from([2, 4]),
    data=st.data(),
)
def test_throughput_never_exceeds_its_bounds(stale_fraction, max_staleness, workers, data) -> None:
    interleaving = data.draw(st.lists(st.integers(0, workers - 1), max_size=80), label="interleaving")
    runtime = run(
        "throughput",
        DENSE,
        workers,
        1,
        interleaving,
        stale_fraction=stale_fraction,
        stale_grad_ratio=5.0,
        max_staleness=max_staleness,
        record_reads=True,
    )
    target(float(len(runtime.counters.stale_reads)), label="stale reads admitted")
    for stale in runtime.counters.stale_reads:
        assert stale.fraction <= stale_fraction and stale.staleness <= max_staleness
        assert stale.kept == bool(runtime.final_reads[stale.key].admitted)
    for key, record in runtime.final_reads.items():
        missed = changed_rows_since_read(runtime, key)
        assert set(missed) <= set(record.stale_rows.tolist()), f"task {key} read unadmitted stale rows"
        assert record.stale_rows.numel() <= stale_fraction * record.candidate.numel()
        assert all(key[0] - first <= max_staleness for first in missed.values())


def test_throughput_admits_stale_reads_and_counts_them() -> None:
    runtime = run("throughput", DENSE, 2, 1, [1] * 40, stale_fraction=0.9, stale_grad_ratio=5.0, max_staleness=3)
    stale = runtime.counters.stale_reads
    assert stale and all(s.rows > 0 and 1 <= s.staleness <= 3 for s in stale)
    assert runtime.counters.waits.get("raw", 0) < run("quality", DENSE, 2, 1, [1] * 40).counters.waits["raw"]


def test_throughput_counts_the_stale_reads_that_reach_the_model() -> None:
    """A stale read whose task validation re-runs on fresh state (a write unknown at admission) is superseded;
    the others reach the model: ``kept`` marks exactly the tasks whose final read holds its admitted rows."""
    runtime = run(
        "throughput",
        DENSE,
        2,
        1,
        adversarial(2)["last_runs_ahead"],
        stale_fraction=0.9,
        stale_grad_ratio=5.0,
        max_staleness=3,
        record_reads=True,
    )
    stale = runtime.counters.stale_reads
    assert any(read.kept for read in stale) and not all(read.kept for read in stale)
    assert all(read.kept == bool(runtime.final_reads[read.key].admitted) for read in stale)
    assert runtime.counters.stale_reads_kept == sum(read.kept for read in stale)


def test_throughput_with_zero_gradient_ratio_admits_nothing() -> None:
    runtime = run("throughput", DENSE, 2, 1, [1] * 40, stale_fraction=1.0, stale_grad_ratio=0.0)
    assert runtime.counters.waits.get("raw", 0) > 0, "no conflicting read reached the admission rule"
    assert runtime.counters.stale_reads == []
    assert_identical(snapshot(runtime), barrier_snapshot("dense", 2, 1))


def test_escape_from_candidate_set_is_detected_and_rerun() -> None:
    """A frustum narrower than the renderer's view (negative margin) lets active rows escape C(t): the
    visibility check catches it, the re-run adds the rows, and quality still equals barrier."""
    kwargs = {"candidate_margin": -0.8, "visibility_fn": visibility}
    barrier = run("barrier", DENSE, 2, 1, **kwargs)
    quality = run("quality", DENSE, 2, 1, [1] * 40, **kwargs)
    assert barrier.counters.validation_failures["escape"] > 0
    assert quality.counters.validation_failures["escape"] > 0
    assert_identical(snapshot(quality), snapshot(barrier))
    assert barrier.counters.reruns == barrier.counters.validation_failures["escape"]
    assert quality.counters.reruns >= quality.counters.validation_failures["escape"]


def structural_change(runtime: OdinRuntime) -> torch.Tensor:
    """Duplicate every 5th Gaussian and prune every 7th with gsplat's ops; the uid column gives the index map."""
    n = runtime.num_primitives
    state = {"uid": torch.arange(n)}
    duplicate(runtime.params, runtime.optimizers, state, torch.arange(n) % 5 == 0)
    n_grown = runtime.num_primitives
    remove(runtime.params, runtime.optimizers, state, torch.arange(n_grown) % 7 == 3)
    return index_map_from_uid(state["uid"])


@pytest.mark.parametrize("interleaving", [[], [1] * 40, [0] + [1] * 40])
def test_structural_change_behind_drain_keeps_equivalence(interleaving: list[int]) -> None:
    """A densification after step 4 runs on a drained runtime (nothing staged, nothing pending) in either mode, and
    quality-first, whose reads met unpublished steps where the interleaving runs a worker ahead, still ends at the
    barrier's model."""
    results, runtimes = {}, {}
    for mode, turns in (("barrier", []), ("quality", interleaving)):
        runtime = make_runtime(
            OdinRuntimeConfig(mode=mode), make_params(), lr_scale=8.0, topology=Topology(2, 2)
        )
        schedule = schedule_of(SPARSE, 2, 2)
        drained = []

        def change(rt: OdinRuntime) -> torch.Tensor:
            drained.append(rt.shadow.open_slots() == [] and bool((rt.tables.pending_step == -1).all()))
            return structural_change(rt)

        run_virtual(runtime, schedule, turns, structural_changes={4: change})
        assert drained == [True], f"{mode}: the structural change did not run behind a drain"
        results[mode], runtimes[mode] = snapshot(runtime), runtime
        assert runtime.num_primitives == 144 - len(range(3, 144, 7))
        assert runtime.tables.num_primitives == runtime.num_primitives
    assert_identical(results["quality"], results["barrier"])
    if interleaving:  # [] is the barrier's own order: nothing read ahead
        counters = runtimes["quality"].counters
        assert counters.waits.get("raw", 0) + counters.overlapped_reads > 0


def test_remap_carries_tables_through_gsplat_ops() -> None:
    runtime = run("quality", SPARSE, 2, 1, steps=3)
    versions = runtime.tables.versions.clone()
    index_map = structural_change(runtime)
    order = spatial_order(runtime.params["means"])
    assert not torch.equal(order, torch.arange(order.numel())), "gsplat's appended rows should break the Z-order"
    runtime.remap(index_map)
    assert torch.equal(runtime.tables.versions, versions[index_map][order])
    assert torch.equal(spatial_order(runtime.params["means"]), torch.arange(order.numel()))
    assert (runtime.tables.pending_step == -1).all()


def test_drain_refuses_unpublished_work() -> None:
    runtime = make_runtime(OdinRuntimeConfig(mode="quality"), make_params(), topology=Topology(2))
    task = schedule_of(DENSE, 2, 1)[0][0][0]
    runtime.finish(runtime.read_next([task]))
    with pytest.raises(RuntimeError, match="not published"):
        runtime.drain()


def test_throughput_waits_for_rows_another_rank_is_predicted_to_write() -> None:
    """Throughput-first's gradient bound needs the producer's gradient, which another rank's task has not sent: a
    read conflicting with such a predicted write waits (as quality-first does) even within generous bounds."""
    first = schedule_of(DENSE, 2, 1)[0][0][0]
    remote, ours = dataclasses.replace(first, worker=1), dataclasses.replace(first, step=1)
    bounds = {"stale_fraction": 1.0, "stale_grad_ratio": 100.0, "max_staleness": 3}
    runtime = make_runtime(OdinRuntimeConfig(mode="throughput", **bounds), make_params(), topology=Topology(1))
    runtime.expect([remote])
    wait = runtime.before_read(ours)
    assert isinstance(wait, Wait) and wait.reason == "raw" and wait.step == 0
    assert runtime.counters.stale.admitted == 0


def test_before_read_waits_on_exactly_the_conflicting_rows() -> None:
    runtime = make_runtime(OdinRuntimeConfig(mode="quality"), make_params(), topology=Topology(2))
    first = schedule_of(DENSE, 2, 1)[0][0][0]
    later = type(first)(1, 0, 0, first.view, first.camera)
    read = runtime.before_read(first)
    assert isinstance(read, Read)
    wait = runtime.before_read(later)
    assert isinstance(wait, Wait) and wait.reason == "raw" and wait.step == 0
    assert torch.equal(wait.rows, read.candidate)
    barrier = make_runtime(OdinRuntimeConfig(mode="barrier"), make_params(), topology=Topology(2))
    assert barrier.before_read(later).reason == "barrier"
    ring = make_runtime(OdinRuntimeConfig(mode="quality", ring_slots=1), make_params(), topology=Topology(2))
    assert ring.before_read(later).reason == "ring"


def test_timeline_exports_a_chrome_trace(tmp_path) -> None:
    runtime = run("quality", DENSE, 2, 1, [1] * 20, steps=3)
    trace = json.loads(runtime.timeline.export_chrome_trace(tmp_path / "trace.json").read_text())
    names = {event["name"] for event in trace["traceEvents"]}
    assert names == {"render", "backward", "wait", "comm", "publish"}
    waits = [e for e in trace["traceEvents"] if e["name"] == "wait"]
    assert all(e["ph"] == "X" and e["dur"] >= 0 and e["args"]["primitives"] > 0 for e in waits)
    assert all(e["args"]["primitive_ids"] for e in waits)
    assert runtime.timeline.total_ns("render") > 0
    # Render and backward spans carry what the simulator's cost model is fitted on: |C(t)| and the pixels.
    tasks = [e for e in trace["traceEvents"] if e["name"] in ("render", "backward")]
    assert all(e["args"]["candidates"] > 0 and e["args"]["pixels"] > 0 for e in tasks)


def test_bookkeeping_time_excludes_the_render_and_backward_of_reruns() -> None:
    """A render that takes 10 s on the runtime's clock (advanced, not slept, so the bound does not hang on the
    machine's load): those seconds land in render_ns, also those of the re-runs that validation runs inside
    progress(), and the hooks' own time stays far below one of them per re-run."""
    nap_ns = 10_000_000_000
    advanced = [0]

    def clock() -> int:
        return time.perf_counter_ns() + advanced[0]

    def slow_render(task, leaves, generator):
        advanced[0] += nap_ns
        return render(task, leaves, generator)

    config = OdinRuntimeConfig(mode="quality")
    runtime = make_runtime(
        config, make_params(), render_fn=slow_render, lr_scale=SPARSE["lr_scale"], topology=Topology(2, 2),
        clock=clock,
    )  # fmt: skip
    start = clock()
    run_virtual(runtime, schedule_of(SPARSE, 2, 2, steps=4), [1] * 40)
    wall_ns = clock() - start
    counters = runtime.counters
    assert counters.reruns > 0
    assert counters.render_ns >= counters.tasks * nap_ns
    assert 0 < counters.bookkeeping_ns < counters.reruns * nap_ns
    assert counters.bookkeeping_ns + counters.render_ns + counters.backward_ns <= wall_ns


def test_bookkeeping_counts_nested_hooks_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker: every publish runs inside progress inside after_backward (and before_read inside read_next);
    a publication slowed by a known sleep adds that sleep once, not once per nesting level."""
    nap_ns = 20_000_000
    slept = []
    apply = Publisher.apply

    def slow_apply(self, step, merged, seq):
        time.sleep(nap_ns / 1e9)
        slept.append(nap_ns)
        return apply(self, step, merged, seq)

    monkeypatch.setattr(Publisher, "apply", slow_apply)
    runtime = make_runtime(OdinRuntimeConfig(mode="quality"), make_params())
    for (tasks,) in schedule_of(DENSE, 1, 1, steps=4):
        assert run_first(runtime, tasks) == tasks[0]
    assert runtime.counters.publications == 4
    assert sum(slept) <= runtime.counters.bookkeeping_ns < 1.5 * sum(slept)


def _spin(cpu_ns: int) -> None:
    """Busy this thread for ``cpu_ns`` of its own CPU time."""
    end = time.thread_time_ns() + cpu_ns
    while time.thread_time_ns() < end:
        pass


def test_bookkeeping_cpu_time_is_the_hooks_own_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bookkeeping_cpu_ns``: a publication that spins adds its spin, one that sleeps adds its sleep to the wall
    time only, and the spinning renders of the re-runs run inside progress() add to neither."""
    spin_ns, nap_ns, render_ns = 5_000_000, 20_000_000, 50_000_000
    spun, slept = [], []
    apply = Publisher.apply

    def slow_apply(self, step, merged, seq):
        _spin(spin_ns)
        spun.append(spin_ns)
        time.sleep(nap_ns / 1e9)
        slept.append(nap_ns)
        return apply(self, step, merged, seq)

    def spinning_render(task, leaves, generator):
        _spin(render_ns)
        return render(task, leaves, generator)

    monkeypatch.setattr(Publisher, "apply", slow_apply)
    config = OdinRuntimeConfig(mode="quality")
    runtime = make_runtime(
        config, make_params(), render_fn=spinning_render, lr_scale=SPARSE["lr_scale"], topology=Topology(2, 2)
    )
    run_virtual(runtime, schedule_of(SPARSE, 2, 2, steps=4), [1] * 40)
    counters = runtime.counters
    assert counters.reruns > 0 and counters.publications == 4
    assert sum(spun) <= counters.bookkeeping_cpu_ns < sum(spun) + counters.reruns * render_ns
    assert counters.bookkeeping_cpu_ns + 0.9 * sum(slept) <= counters.bookkeeping_ns


def test_shadow_graph_memory_stays_below_a_model_copy() -> None:
    """Sparse views (24 narrow views): the peak of gathered, staged and declared bytes stays below one copy of the
    model (about half of this toy: 56-byte rows, a tenth of them per view, one worker 4 steps ahead), its make-up
    sums to it, and nothing is left once every step is published."""
    scene = {"num_views": 24, "focal_scale": 3.0, "lr_scale": 1.0}
    runtime = make_runtime(OdinRuntimeConfig(mode="quality"), make_params(600), lr_scale=1.0, topology=Topology(2))
    run_virtual(runtime, schedule_of(scene, 2, 1, steps=4), [1] * 20)
    memory = runtime.memory_report()
    assert 0 < memory["peak_extra_bytes"] < memory["model_bytes"]
    assert all(memory[f"peak_{kind}_bytes"] > 0 for kind in MEMORY_KINDS)
    assert sum(memory[f"peak_{kind}_bytes"] for kind in MEMORY_KINDS) == memory["peak_extra_bytes"]
    assert memory["current_extra_bytes"] == 0


def test_staged_tasks_carry_squared_norms_only_for_the_adaptive_batch_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The norms feed only the adaptive gain: without one the hot path skips them; with one every staged task has
    them (a step's r is measured from them)."""
    staged: list[SparseUpdate] = []
    stage = ShadowGraph.stage
    monkeypatch.setattr(
        ShadowGraph, "stage", lambda self, key, update: (staged.append(update), stage(self, key, update))
    )
    run("quality", SPARSE, 2, 2, steps=2)
    assert staged and all(update.sq_norms is None for update in staged)
    staged.clear()
    run("quality", SPARSE, 2, 2, steps=2, batch_gain=AdaptiveGain(4))
    assert staged and all(update.sq_norms is not None for update in staged)


def test_shadow_ring_stages_in_task_order_and_keeps_superseded_candidates() -> None:
    params = {"means": torch.zeros(10, 3), "opacities": torch.zeros(10)}
    shadow = ShadowGraph(ring_slots=2)
    leaves, _ = shadow.gather(params, torch.tensor([1, 2, 4]), torch.zeros(10, dtype=torch.int64))
    assert shadow.memory.current == 3 * 3 * 4 + 3 * 4
    shadow.release(leaves)
    assert leaves == {} and shadow.memory.current == 0
    shadow.declare((0, 0, 1), torch.tensor([1, 2]))
    shadow.declare((0, 0, 1), torch.tensor([2, 3]))
    shadow.declare((0, 0, 0), torch.tensor([5]))
    assert shadow.memory.parts["candidates"] == 5 * 8
    assert shadow.slot(0).declared().tolist() == [1, 2, 3, 5]
    first = SparseUpdate(torch.tensor([2]), {"means": torch.full((1, 3), 1e8), "opacities": torch.ones(1)})
    second = SparseUpdate(torch.tensor([2, 5]), {"means": torch.ones(2, 3), "opacities": torch.ones(2)})
    shadow.stage((0, 0, 1), first)
    shadow.stage((0, 0, 0), second)
    assert shadow.slot(0).writes().rows.tolist() == [2, 5]
    assert_same_update(shadow.local_update(0, 0, params), sum_in_order([second, first], params))
    assert not shadow.is_free_for(2) and shadow.is_free_for(1)
    with pytest.raises(RuntimeError, match="still holds step 0"):
        shadow.open(2)
    shadow.free(0)
    assert shadow.memory.current == 0 and shadow.memory.peak > 0


def assert_same_update(a: SparseUpdate, b: SparseUpdate) -> None:
    assert torch.equal(a.rows, b.rows)
    assert all(torch.equal(a.grads[name], b.grads[name]) for name in a.grads)


def test_task_generator_depends_only_on_seed_step_view() -> None:
    def draw(seed: int, step: int, view: int) -> torch.Tensor:
        return torch.rand(4, generator=task_generator(seed, step, view))

    assert torch.equal(draw(0, 3, 5), draw(0, 3, 5))
    assert not torch.equal(draw(0, 3, 5), draw(0, 5, 3))
    assert not torch.equal(draw(0, 3, 5), draw(1, 3, 5))


def test_candidate_set_covers_what_the_rasterizer_sees() -> None:
    """Default margin: every Gaussian with radii > 0 in the CPU rasterizer is a candidate."""
    for seed in range(6):
        generator = torch.Generator().manual_seed(seed)
        means = (torch.rand(400, 3, generator=generator) - 0.5) * 8
        scales = torch.exp(torch.randn(400, 3, generator=generator) * 0.7 - 2.5)
        quats = torch.randn(400, 4, generator=generator)
        for view in range(4):
            cam = camera(view, 4, size=16)
            _, _, info = rasterization(
                means,
                quats,
                scales,
                torch.rand(400),
                torch.rand(400, 3),
                cam.viewmat[None],
                cam.K[None],
                16,
                16,
                packed=False,
            )
            visible = torch.nonzero(info["radii"][0] > 0).flatten()
            assert torch.isin(visible, candidate_set(means, scales, cam, margin=0.1)).all()


def test_rasterizer_tasks_quality_equals_barrier_and_stats_match_full_renders() -> None:
    """With the project's rasterizer (gsplat's call): quality equals barrier, params and densification
    statistics; and the statistics scattered from gathered renders match gsplat's own accumulation over
    full-model renders of the same states."""
    schedule = make_schedule(3, 2, 1, 6)
    results = {}
    for mode, turns in (("barrier", []), ("quality", [1] * 10)):
        state = {"grad2d": None, "count": None, "radii": None}
        runtime = make_runtime(
            OdinRuntimeConfig(mode=mode),
            make_params(60),
            topology=Topology(2),
            render_fn=render_gsplat,
            strategy_state=state,
        )
        run_virtual(runtime, schedule, turns)
        results[mode] = (snapshot(runtime), state)
    assert_identical(results["quality"][0], results["barrier"][0])
    for key in ("grad2d", "count", "radii"):
        assert torch.equal(results["quality"][1][key], results["barrier"][1][key])

    params = make_params(60)
    permute_rows(params, {}, None, spatial_order(params["means"]))
    optimizers = selective_adams(params, LRS)
    strategy = DefaultStrategy(refine_scale2d_stop_iter=1)
    state = strategy.initialize_state()
    for step_tasks in schedule:
        updates = []
        for (task,) in step_tasks:
            leaves = {name: p.detach().clone().requires_grad_(True) for name, p in params.items()}
            loss, info = render_gsplat(task, leaves, task_generator(0, task.step, task.view))
            info["means2d"].retain_grad()
            loss.backward()
            strategy._update_state(leaves, state, info, packed=False)
            active = torch.nonzero(info["radii"][0] > 0).flatten()
            updates.append(SparseUpdate(active, {n: leaf.grad[active] for n, leaf in leaves.items()}))
        merged = sum_in_order(updates, params)
        for name, optimizer in optimizers.items():
            optimizer.step_rows(merged.rows, [merged.grads[name]])
    barrier_state = results["barrier"][1]
    assert torch.equal(barrier_state["count"], state["count"])
    torch.testing.assert_close(barrier_state["grad2d"], state["grad2d"], rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(barrier_state["radii"], state["radii"])
    torch.testing.assert_close(results["barrier"][0]["means"], params["means"].detach(), rtol=1e-5, atol=1e-7)


def test_a_read_before_the_step_before_is_not_sure_of_that_steps_first_part() -> None:
    """The early commit's check (``Validator.surely_valid``) counts a read as having seen a step's first part only
    if it read after it: a read made two steps back, even after an earlier step's first part, missed it."""
    runtime = make_runtime(OdinRuntimeConfig(mode="quality"), make_params(), topology=Topology(1))
    task = dataclasses.replace(schedule_of(DENSE, 1, 1)[0][0][0], step=3)
    candidate = runtime.index.candidates(task)
    validator = Validator(4, runtime.index, None)
    validator.published(1, candidate[:0])
    first_part = EarlyRows(published=candidate[:1], pending=candidate[:0])
    reach = Reach(grow=1.0, shift=0.0)
    two_back = ReadRecord(candidate, read_mark=0, early=candidate[:0])  # read with step 1 published in part
    assert not validator.surely_valid(task, two_back, 2, first_part, reach), "step 2's first part was missed"
    after = ReadRecord(candidate, read_mark=1, early=candidate[:1])  # read after step 2's first part
    assert validator.surely_valid(task, after, 2, first_part, reach)
