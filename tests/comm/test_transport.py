"""Transports: the in-process exchange and torch.distributed over 2 gloo processes merge sparse updates (and list
their task statistics) in worker order, bit for bit as ``sum_in_order``; starting an exchange never blocks, and
every wait times out with a message naming what it waited for. Training over 2 gloo ranks (one runtime each) ends
bit-identical to the virtual barrier: with a rank left without a task in a short step, with densification
statistics driving a refinement, and with a fast rank rendering its next step while a slow rank still renders.
Time blocked on the transport is counted as communication, never as bookkeeping."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gsplat.strategy import DefaultStrategy

from odin_nerfstudio.adapter.gsplat import STATS_SCHEMA, apply_structural_change
from odin_nerfstudio.runtime.config import Topology
from odin_nerfstudio.runtime.runtime import OdinRuntime, OdinRuntimeConfig, RenderFn
from odin_nerfstudio.core.batch_gain import squared_norms
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.core.sparse import SparseUpdate, sum_in_order
from odin_nerfstudio.drivers.step_loop import run_step, settle
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.comm.distributed import DistributedHandle, DistributedTransport
from odin_nerfstudio.comm.waiting import Closed
from odin_nerfstudio.comm.inprocess import VirtualTransport
from odin_nerfstudio.comm.protocol import Transport
from odin_nerfstudio.drivers.virtual import run_virtual
from odin_nerfstudio.kernels import ops
from tests.runtime.test_runtime import epoch_schedule, run_first
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
)

N = 30
STEPS = 3


def template() -> dict[str, torch.Tensor]:
    return {"means": torch.zeros(N, 3), "opacities": torch.zeros(N), "features_rest": torch.zeros(N, 2, 3)}


def local_update(step: int, worker: int) -> SparseUpdate:
    """A deterministic sparse update of ``worker`` in ``step`` (possibly empty), with the statistics of 0 to 2
    tasks of 0 to 5 entries each."""
    generator = torch.Generator().manual_seed(100 * step + worker)
    rows = torch.nonzero(torch.rand(N, generator=generator) < 0.3 * worker).flatten()
    grads = {name: torch.randn(rows.numel(), *ref.shape[1:], generator=generator) for name, ref in template().items()}
    stats = []
    for _ in range((step + worker) % 3):
        entries = int(torch.randint(0, 6, (1,), generator=generator))
        stats.append(
            {
                "rows": torch.randint(0, N, (entries,), generator=generator),
                "grad2d": torch.rand(entries, generator=generator),
                "radii": torch.rand(entries, generator=generator),
            }
        )
    norms = None if (step + worker) % 4 == 3 else squared_norms(grads)  # now and then an update measures none
    return SparseUpdate(rows, grads, tuple(stats), norms)


def assert_same(a: SparseUpdate, b: SparseUpdate) -> None:
    """The same rows, gradients, statistics and squared norms bit for bit (None and zeros alike: a distributed
    exchange sends zeros for an update without any)."""
    assert torch.equal(a.rows, b.rows)
    norms = [n for n in (a.sq_norms, b.sq_norms) if n is not None]
    assert torch.equal(norms[0], norms[-1]) if len(norms) == 2 else not any(bool(n.any()) for n in norms)
    for name in a.grads:
        assert torch.equal(a.grads[name], b.grads[name]), name
    assert len(a.stats) == len(b.stats)
    for ours, theirs in zip(a.stats, b.stats, strict=True):
        assert ours.keys() == theirs.keys() == STATS_SCHEMA.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in STATS_SCHEMA)


def test_virtual_transport_merges_in_worker_order_and_times_out_by_name() -> None:
    transport = VirtualTransport(3, template())
    handles = [transport.endpoint(w).start_exchange(0, local_update(0, w)) for w in (2, 0)]
    assert not handles[0].done()
    try:
        handles[0].wait(timeout=0.01)
    except TimeoutError as error:
        assert "step 0" in str(error) and "[1]" in str(error)
    else:
        raise AssertionError("wait returned before every worker contributed")
    handles.append(transport.endpoint(1).start_exchange(0, local_update(0, 1)))
    expected = sum_in_order([local_update(0, w) for w in range(3)], template())
    for handle in handles:
        assert handle.done()
        assert_same(handle.wait(timeout=0.01), expected)


def test_virtual_transport_merges_with_the_compiled_scatter_bit_for_bit_as_sum_in_order() -> None:
    """The trainers hand the transports ``ops.scatter_in_order`` (the C++ op where built): same bits as the
    reference sum, and the transport calls it once per step."""
    calls = []

    def merge(updates, template):
        calls.append(len(updates))
        return ops.scatter_in_order(updates, template)

    transport = VirtualTransport(3, template(), merge)
    for step in range(STEPS):
        handles = [transport.endpoint(w).start_exchange(step, local_update(step, w)) for w in range(3)]
        expected = sum_in_order([local_update(step, w) for w in range(3)], template())
        for handle in handles:
            assert_same(handle.wait(timeout=0.01), expected)
    assert calls == [3] * STEPS


def _rank_main(rank: int, init_file: str, out_dir: str) -> None:
    """One gloo rank: exchange STEPS updates, then rank 0 starts an exchange rank 1 never joins and waits 1 s."""
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        transport = DistributedTransport(template(), 30.0, stats_schema=STATS_SCHEMA, merge=ops.scatter_in_order)
        handles = [transport.start_exchange(step, local_update(step, rank)) for step in range(STEPS)]
        merged = [handle.wait(timeout=30.0) for handle in handles]
        saved = [(m.rows, m.grads, list(m.stats), m.sq_norms) for m in merged]
        torch.save(saved, Path(out_dir) / f"merged{rank}.pt")
        if rank == 0:
            handle = transport.start_exchange(STEPS, local_update(STEPS, 0))
            started = time.monotonic()
            try:
                handle.wait(timeout=1.0)
                message = "no timeout"
            except TimeoutError as error:
                message = str(error)
            waited = time.monotonic() - started
            (Path(out_dir) / "timeout.txt").write_text(f"{handle.done()} {waited}\n{message}")
        else:
            time.sleep(3.0)
    except BaseException:
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


class _LateWork:
    """A collective's work that completes ``delay_s`` after it is made (its future set by a timer), counting how
    often its completion is polled."""

    def __init__(self, delay_s: float) -> None:
        self.future: torch.futures.Future = torch.futures.Future()
        self.polls = 0
        self.completed_at: float | None = None
        threading.Timer(delay_s, self._complete).start()

    def _complete(self) -> None:
        self.completed_at = time.monotonic()
        self.future.set_result(None)

    def get_future(self) -> torch.futures.Future:
        return self.future

    def is_completed(self) -> bool:
        self.polls += 1
        return self.future.done()

    def wait(self) -> bool:
        return True


def _bare_gloo_transport(timeout: float) -> DistributedTransport:
    """A CPU transport's waiting state only (no process group): what ``_wait`` reads."""
    transport = object.__new__(DistributedTransport)
    transport.template, transport.timeout, transport.world_size = template(), timeout, 2
    transport._closed = threading.Event()
    return transport


def test_the_gloo_progress_thread_sleeps_on_a_collective_until_it_completes_or_the_transport_closes() -> None:
    """On gloo the progress thread waits on the collective's future: it wakes when the collective completes (a
    late peer: 0.3 s), not every 0.5 ms to poll it (which took CPU from the renders beside it), and still notices a
    close of the transport and its own timeout, naming the part."""
    transport = _bare_gloo_transport(timeout=5.0)
    handle = DistributedHandle(transport, 3, local_update(3, 0))
    work = _LateWork(0.3)
    transport._wait(work, handle, "gradient rows")
    assert work.completed_at is not None and time.monotonic() - work.completed_at < 0.1
    assert work.polls <= 3, f"polled {work.polls} times in 0.3 s: the thread must sleep on the future"

    threading.Timer(0.1, transport._closed.set).start()
    start = time.monotonic()
    with pytest.raises(Closed):
        transport._wait(_LateWork(30.0), handle, "gradient rows")
    assert time.monotonic() - start < 1.0

    transport = _bare_gloo_transport(timeout=0.2)
    with pytest.raises(TimeoutError, match="exchange of step 3: the gradient rows"):
        transport._wait(_LateWork(30.0), DistributedHandle(transport, 3, local_update(3, 0)), "gradient rows")


def test_gloo_transport_merges_like_sum_in_order_and_names_its_timeouts(tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    errors = [p.read_text() for p in tmp_path.glob("error*.txt")]
    assert not errors, errors
    for rank in range(2):
        merged = torch.load(tmp_path / f"merged{rank}.pt")
        for step, (rows, grads, stats, norms) in enumerate(merged):
            expected = sum_in_order([local_update(step, w) for w in range(2)], template())
            assert_same(SparseUpdate(rows, grads, tuple(stats), norms), expected)
    status, message = (tmp_path / "timeout.txt").read_text().split("\n", 1)
    done, waited = status.split()
    assert done == "False" and float(waited) < 10.0, "the wait is bounded by its own timeout, not the transport's"
    assert f"step {STEPS}" in message and "row counts" in message and "ranks 0..1" in message


DENSIFY = DefaultStrategy(
    refine_start_iter=0,
    refine_every=3,
    reset_every=1000,
    pause_refine_after_reset=0,
    refine_scale2d_stop_iter=10,
    grow_grad2d=5e-3,
    grow_scale2d=0.4,
    prune_opa=0.1,
)
"""Refines after step 3 of the toy scene: about half of its Gaussians have a mean grad2d above the threshold
(those with exp(scale) <= 0.1 duplicated, the others split), the least opaque pruned; radii tracked."""
REFINE_AFTER = 3


@dataclasses.dataclass(frozen=True)
class Run:
    """A training run, made the same way per rank (one runtime each, gloo) and on virtual workers.

    Attributes:
        schedule: the W = 2 schedule (step -> worker -> tasks).
        per_worker: B.
        lr_scale: the learning rates are LRS x lr_scale.
        densify: render with gsplat's rasterizer, keep a strategy state and refine after step REFINE_AFTER.
    """

    schedule: Callable[[], list]
    per_worker: int
    lr_scale: float = 1.0
    densify: bool = False


RUNS = {
    "sparse": Run(lambda: make_schedule(6, 2, 2, 12, focal_scale=2.0), per_worker=2, lr_scale=8.0),
    "short_step": Run(lambda: epoch_schedule(3, 2, 1, 5), per_worker=1),
    "densify": Run(lambda: epoch_schedule(3, 2, 2, 7), per_worker=2, densify=True),
}


def train(name: str, mode: str, rank: int | None) -> tuple[dict[str, torch.Tensor], int]:
    """Train run ``name`` as rank ``rank`` of 2 over gloo (worker ``rank``'s tasks), or on 2 virtual workers if None.

    Returns:
        The model's snapshot and, with a strategy, its state (``strategy.*``) at the end and just before the
        refinement (``refined.*``); and the reads that met an unpublished step (waited on one's writes, read before
        it was published, or were re-run).
    """
    run = RUNS[name]
    params = make_params(60 if run.densify else 120)
    if rank is None:
        workers, virtual = 2, VirtualTransport(2, params)
        transports: list[Transport] = [virtual.endpoint(w) for w in range(2)]
        schedule = run.schedule()
    else:
        workers, transports = 1, [DistributedTransport(params, timeout=60.0, stats_schema=STATS_SCHEMA)]
        schedule = [[[dataclasses.replace(task, worker=0) for task in step[rank]]] for step in run.schedule()]
    state = DENSIFY.initialize_state(scene_scale=10.0) if run.densify else None
    runtime = OdinRuntime(
        OdinRuntimeConfig(mode=mode, wait_timeout_s=60.0),
        params,
        selective_adams(params, {name: lr * run.lr_scale for name, lr in LRS.items()}),
        transports,
        render_gsplat if run.densify else render,
        strategy_state=state,
        topology=Topology(workers, run.per_worker),
    )
    out = {}

    def refine(rt: OdinRuntime) -> torch.Tensor:
        out.update(tensors_of(rt.strategy_state, "refined"))
        return apply_structural_change(DENSIFY, rt.params, rt.optimizers, rt.strategy_state, REFINE_AFTER, seed=0)

    run_virtual(runtime, schedule, structural_changes={REFINE_AFTER + 1: refine} if run.densify else None)
    counters = runtime.counters
    met = counters.waits.get("raw", 0) + counters.overlapped_reads + counters.reruns
    return {**out, **snapshot(runtime), **tensors_of(state or {}, "strategy")}, met


def tensors_of(state: dict, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of a strategy state, cloned, keyed ``prefix.key``."""
    return {f"{prefix}.{key}": value.clone() for key, value in state.items() if isinstance(value, torch.Tensor)}


def _train_rank_main(rank: int, init_file: str, out_dir: str, name: str) -> None:
    """One rank of a distributed quality-first run: its own runtime, replica and worker, gloo in between."""
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        result, met = train(name, "quality", rank)
        torch.save(result, Path(out_dir) / f"result{rank}.pt")
        (Path(out_dir) / f"met{rank}.txt").write_text(str(met))
    except BaseException:
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def assert_ranks_equal_the_virtual_barrier(tmp_path: Path, name: str) -> dict[str, torch.Tensor]:
    """Train ``name`` on 2 gloo ranks; both ranks' results equal the virtual barrier's, which is returned, and some
    of their reads met an unpublished step (6 to 17 a rank on the development machine)."""
    mp.spawn(_train_rank_main, args=(str(tmp_path / "init"), str(tmp_path), name), nprocs=2, join=True)
    errors = [p.read_text() for p in tmp_path.glob("error*.txt")]
    assert not errors, errors
    barrier, _ = train(name, "barrier", None)
    for rank in range(2):
        assert_identical(torch.load(tmp_path / f"result{rank}.pt"), barrier)
    met = [int((tmp_path / f"met{rank}.txt").read_text()) for rank in range(2)]
    assert sum(met) > 0, "no read met an unpublished step: the equality says nothing of quality-first's reads"
    return barrier


def test_two_gloo_ranks_train_bit_identical_to_the_virtual_barrier(tmp_path: Path) -> None:
    """One runtime per rank (quality-first, sparse updates over gloo): both replicas end bit-identical to each
    other and to the virtual barrier run of the same schedule."""
    assert_ranks_equal_the_virtual_barrier(tmp_path, "sparse")


def test_a_rank_without_a_task_in_a_short_step_still_takes_part_in_its_exchange(tmp_path: Path) -> None:
    """5 views on 2 ranks, B = 1: the last step of every epoch has one view, rank 1 none. Rank 1 sends an empty
    update for it in step order and both replicas end bit-identical to the virtual barrier."""
    assert [[len(tasks) for tasks in step] for step in RUNS["short_step"].schedule()][2::3] == [[1, 0]] * 3
    assert_ranks_equal_the_virtual_barrier(tmp_path, "short_step")


def test_two_gloo_ranks_share_densification_statistics_and_refine_identically(tmp_path: Path) -> None:
    """gsplat's rasterizer, a DefaultStrategy state and a refinement after step 3 driven by the statistics: every
    rank accumulates every rank's task statistics, so the states before the refinement, the refined replicas and
    the states after it are bit-identical on both ranks and to the virtual barrier with W = 2."""
    barrier = assert_ranks_equal_the_virtual_barrier(tmp_path, "densify")
    counts = barrier["refined.count"]
    assert counts.max() > counts.min() > 0, "every Gaussian should be seen, some by both ranks' tasks"
    grads = barrier["refined.grad2d"] / counts
    assert (grads > DENSIFY.grow_grad2d).any() and (grads <= DENSIFY.grow_grad2d).any()
    assert barrier["means"].shape[0] != 60 and barrier["strategy.radii"].any()


SLOW_S = 2.0
"""How long the slow rank keeps rendering once the fast rank has shown what it did meanwhile."""
SIGNAL_S = 30.0
"""The longest a rank waits for the other's signal file (a blocking exchange never sends it: the test fails)."""


def overlap_schedule() -> list:
    """Two steps of one task per worker (W = 2) in the sparse ring of 12 views: worker 0 renders views 0 then 6,
    worker 1 views 3 then 9; a worker's two views face opposite ways, so its step-1 read has no RAW on its step 0."""
    views = ((0, 3), (6, 9))
    return [
        [[Task(step, worker, 0, view, camera(view, 12, focal_scale=2.0))] for worker, view in enumerate(step_views)]
        for step, step_views in enumerate(views)
    ]


def rank_runtime(rank: int, render_fn: RenderFn) -> tuple[OdinRuntime, list]:
    """A quality-first runtime for ``rank`` of 2 over gloo (one worker), and the rank's part of the schedule."""
    params = make_params()
    runtime = OdinRuntime(
        OdinRuntimeConfig(mode="quality", wait_timeout_s=60.0),
        params,
        selective_adams(params, LRS),
        [DistributedTransport(params, timeout=60.0)],
        render_fn,
    )
    schedule = [[[dataclasses.replace(task, worker=0) for task in step[rank]]] for step in overlap_schedule()]
    return runtime, schedule


def appears(path: Path, timeout: float = SIGNAL_S) -> bool:
    """Whether ``path`` exists within ``timeout`` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def counters_of(runtime: OdinRuntime) -> dict:
    """The counters the tests look at."""
    counters = runtime.counters
    return {"waits": counters.waits, "comm_ns": counters.comm_ns, "bookkeeping_ns": counters.bookkeeping_ns}


def _overlap_rank_main(rank: int, init_file: str, out_dir: str) -> None:
    """Rank 0 runs its steps 0 and 1 with the step driver, then settles; rank 1 does the same, but its render of
    step 0 first waits for rank 0's step-1 render (noting whether it came) and then sleeps SLOW_S."""
    torch.set_num_threads(1)
    out = Path(out_dir)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)

        def render_fn(task: Task, leaves: dict, generator: torch.Generator):
            if rank == 1 and task.step == 0:
                (out / "overlap.txt").write_text(str(appears(out / "rank0_rendered_step1")))
                time.sleep(SLOW_S)
            result = render(task, leaves, generator)
            if rank == 0 and task.step == 1:
                (out / "rank0_rendered_step1").touch()
            return result

        runtime, schedule = rank_runtime(rank, render_fn)
        for step, step_tasks in enumerate(schedule):
            run_step(runtime, step, step_tasks)
        settle(runtime)
        torch.save({"snapshot": snapshot(runtime), **counters_of(runtime)}, out / f"overlap{rank}.pt")
    except BaseException:
        (out / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def test_a_fast_rank_renders_its_next_step_while_a_slow_rank_still_renders(tmp_path: Path) -> None:
    """Rank 1 renders step 0 until rank 0 has started the exchange of step 0 and read and rendered its step-1 task,
    which a blocking start of the exchange (waiting for every rank's row counts) would never let it do. Rank 0 then
    waits for rank 1 in ``settle``: that wait is communication (comm_ns), not bookkeeping. Both replicas end
    bit-identical to the virtual barrier of the same schedule."""
    mp.spawn(_overlap_rank_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    errors = [p.read_text() for p in tmp_path.glob("error*.txt")]
    assert not errors, errors
    assert (tmp_path / "overlap.txt").read_text() == "True", "rank 0 did not render step 1 before rank 1 committed"
    results = [torch.load(tmp_path / f"overlap{rank}.pt") for rank in range(2)]
    fast = results[0]
    assert fast["waits"] == {}, "rank 0's step-1 read should never wait"
    assert fast["comm_ns"] >= 0.5 * SLOW_S * 1e9 > fast["bookkeeping_ns"]
    barrier = make_runtime(OdinRuntimeConfig(mode="barrier"), make_params(), topology=Topology(2))
    run_virtual(barrier, overlap_schedule())
    for result in results:
        assert_identical(result["snapshot"], snapshot(barrier))


def _comm_rank_main(rank: int, init_file: str, out_dir: str) -> None:
    """Rank 0 runs its step-0 task (starting the exchange), signals, and publishes step 0 at once: a hook that
    blocks on the transport until rank 1, which sleeps SLOW_S after the signal, has sent its part."""
    torch.set_num_threads(1)
    out = Path(out_dir)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        runtime, schedule = rank_runtime(rank, render)
        ((tasks,), _) = schedule
        if rank == 0:
            assert run_first(runtime, tasks) == tasks[0]
            (out / "rank0_started_step0").touch()
            runtime.publish(0)
        else:
            if not appears(out / "rank0_started_step0"):
                raise TimeoutError("rank 0 never started the exchange of step 0")
            time.sleep(SLOW_S)
            assert run_first(runtime, tasks) == tasks[0]
            settle(runtime)
        torch.save(counters_of(runtime), out / f"comm{rank}.pt")
    except BaseException:
        (out / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def test_time_blocked_on_the_transport_inside_a_hook_is_comm_not_bookkeeping(tmp_path: Path) -> None:
    """Rank 0's publish hook waits about SLOW_S for rank 1's update: that time lands in comm_ns and is left out of
    bookkeeping_ns, which holds only the runtime's own work (far below the wait)."""
    mp.spawn(_comm_rank_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    errors = [p.read_text() for p in tmp_path.glob("error*.txt")]
    assert not errors, errors
    waiting = torch.load(tmp_path / "comm0.pt")
    assert waiting["comm_ns"] >= 0.5 * SLOW_S * 1e9 > waiting["bookkeeping_ns"]
    assert torch.load(tmp_path / "comm1.pt")["comm_ns"] > 0
