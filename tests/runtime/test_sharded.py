"""The sharded mode against the replicated barrier: W ranks (threads of one process, and gloo processes below;
odin-train under torchrun in ``tests/ns/test_sharded_training.py``) each own a shard, fetch rows, return gradients;
the model gathered in global-id order equals the replicated barrier's bit for bit, and quality-first's reads run
ahead of unpublished steps."""

from __future__ import annotations

import os
import threading
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from odin_nerfstudio.adapter.gsplat import GsplatAdapter
from odin_nerfstudio.comm.all_to_all import RowAllToAll, TableAllToAll
from odin_nerfstudio.comm.inprocess import VirtualRowExchange
from odin_nerfstudio.core.batch_gain import AVERAGES_KEY, AdaptiveGain
from odin_nerfstudio.core.row_order import restore_spatial_order
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.drivers.sharded_loop import ShardedLoop
from odin_nerfstudio.drivers.virtual import run_virtual
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology
from odin_nerfstudio.runtime.metering import Meter
from odin_nerfstudio.runtime.ownership import ShardCuts
from odin_nerfstudio.runtime.shard_reader import Reader
from odin_nerfstudio.runtime.sharding import Owner
from odin_nerfstudio.adapter.gsplat import apply_structural_change
from odin_nerfstudio.scenes.toy import (
    LRS,
    assert_identical,
    make_params,
    make_runtime,
    make_schedule,
    render,
    render_gsplat,
    snapshot,
)
from tests.comm.test_transport import DENSIFY, REFINE_AFTER

STEPS, VIEWS, LR_SCALE = 6, 12, 8.0
PARAMS = ("means", "scales", "quats", "opacities", "features_dc")


def replicated_barrier(schedule: list, workers: int, per_worker: int) -> dict[str, torch.Tensor]:
    """The reference: the replicated barrier on W virtual workers."""
    runtime = make_runtime(
        OdinRuntimeConfig(mode="barrier"), make_params(), lr_scale=LR_SCALE, topology=Topology(workers, per_worker)
    )
    run_virtual(runtime, schedule)
    return {"versions": runtime.tables.versions, **snapshot(runtime)}


def make_loop(
    rank: int,
    schedule: list,
    cuts: ShardCuts,
    mode: str,
    lr_scale: float,
    exchange,
    densify: bool = False,
    gain: AdaptiveGain | None = None,
    stale: tuple[float, float] = (0.2, 0.2),
    refine_after: int | None = None,
    ring_slots: int = 4,
    fetch_ahead: int | None = None,
) -> ShardedLoop:
    """Rank ``rank``'s shard of the toy model (its Z-order range) and its loop over ``exchange``; ``densify``: 60
    Gaussians rendered by the project's rasterizer, with a strategy state (``DENSIFY``'s); ``ring_slots``: K;
    ``fetch_ahead``: how far quality-first fetches ahead (default K - 1, the most it may)."""
    params = make_params(60 if densify else 120)
    restore_spatial_order(params, {}, None)
    config = OdinRuntimeConfig(mode=mode, ring_slots=ring_slots)
    lo, hi = cuts.range(rank)
    shard = {name: torch.nn.Parameter(p.detach()[lo:hi].clone()) for name, p in params.items()}
    optimizers = selective_adams(shard, {name: lr * lr_scale for name, lr in LRS.items()})
    state = DENSIFY.initialize_state(scene_scale=10.0) if densify else None
    adapter = GsplatAdapter()
    owner = Owner(shard, optimizers, cuts, rank, adapter, config.candidate_margin, config.near_plane,
                  strategy_state=state)
    render_fn = render_gsplat if densify else render
    meter = Meter(torch.device("cpu"))
    reader = Reader(cuts, shard, render_fn, adapter, meter, 0, config.ring_slots, densify, gain is not None)
    last = len(schedule) - 1
    return ShardedLoop(owner, reader, exchange, rank, lambda s: schedule[s], mode, last, 30.0, gain, *stale,
                       settles=lambda step: step == refine_after,
                       fetch_ahead=ring_slots - 1 if fetch_ahead is None else fetch_ahead)


def run_loop(loop: ShardedLoop, steps: int, refine_after: int | None = None) -> None:
    """Every step on one rank, the structural change after ``refine_after`` (if given) before the step after it."""
    for step in range(steps):
        if refine_after is not None and step == refine_after + 1:
            loop.restructure(DENSIFY, refine_after, seed=0)
        loop.iteration(step)


def shard_snapshot(loop: ShardedLoop) -> dict[str, torch.Tensor]:
    """A shard's parameters, Adam state, versions and strategy state, keyed as ``toy.snapshot`` (and ``strategy.*``,
    ``versions``)."""
    owner = loop.owner
    out = {"versions": owner.tables.versions}
    for name, param in owner.params.items():
        out[name] = param.detach().clone()
        state = owner.optimizers[name].state[param]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            out[f"{name}.{key}"] = state[key].clone()
    for key, value in (owner.strategy_state or {}).items():
        if isinstance(value, torch.Tensor):
            out[f"strategy.{key}"] = value.clone()
    return out


def gathered(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The shards' snapshots in global-id order (the step counts are every shard's, the same)."""
    return {key: shards[0][key] if key.endswith(".step") else torch.cat([s[key] for s in shards]) for key in shards[0]}


class Logged:
    """A rank's end of the row exchange that logs what each exchange it starts is for."""

    def __init__(self, inner, log: list[str]) -> None:
        self.inner, self.log = inner, log

    def start(self, pieces, what: str):
        self.log.append(what)
        return self.inner.start(pieces, what)


def sharded(
    schedule: list,
    cuts: ShardCuts,
    mode: str,
    lr_scale: float = LR_SCALE,
    refine_after: int | None = None,
    gain: AdaptiveGain | None = None,
    stale: tuple[float, float] = (0.2, 0.2),
    place: bool = False,
    logs: list[list[str]] | None = None,
    ring_slots: int = 4,
    fetch_ahead: int | None = None,
) -> tuple[dict[str, torch.Tensor], list[ShardedLoop]]:
    """The schedule on ``cuts.num_shards`` sharded ranks (threads); the model gathered in global-id order;
    ``place``: workers placed on the ranks owning most of their rows (one task per view of the schedule); ``logs``:
    per rank, a list its exchanges are logged in."""
    exchange = VirtualRowExchange(cuts.num_shards)
    densify = refine_after is not None
    ends = [exchange.endpoint(rank) if logs is None else Logged(exchange.endpoint(rank), logs[rank])
            for rank in range(cuts.num_shards)]
    loops = [
        make_loop(rank, schedule, cuts, mode, lr_scale, ends[rank], densify, gain, stale, refine_after, ring_slots,
                  fetch_ahead)
        for rank in range(cuts.num_shards)
    ]
    errors = []

    views = list({task.view: task for step in schedule for tasks in step for task in tasks}.values())

    def run(loop: ShardedLoop) -> None:
        try:
            if place:
                loop.place(views)
            run_loop(loop, len(schedule), refine_after)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
            traceback.print_exc()

    threads = [threading.Thread(target=run, args=(loop,)) for loop in loops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return gathered([shard_snapshot(loop) for loop in loops]), loops


def replicated_densified(schedule: list, workers: int, gain: AdaptiveGain | None = None) -> dict[str, torch.Tensor]:
    """The replicated barrier with ``DENSIFY``'s refinement after ``REFINE_AFTER`` (the rows put back in Z-order),
    and the adaptive batch rule ``gain`` if given."""
    params = make_params(60)
    state = DENSIFY.initialize_state(scene_scale=10.0)
    runtime = make_runtime(OdinRuntimeConfig(mode="barrier"), params, render_gsplat, strategy_state=state,
                           lr_scale=LR_SCALE, topology=Topology(workers, 2), batch_gain=gain)

    def refine(rt) -> torch.Tensor:
        return apply_structural_change(DENSIFY, rt.params, rt.optimizers, rt.strategy_state, REFINE_AFTER, seed=0)

    run_virtual(runtime, schedule, structural_changes={REFINE_AFTER + 1: refine})
    out = {"versions": runtime.tables.versions, **snapshot(runtime)}
    out.update({f"strategy.{k}": v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)})
    return out


def test_the_adaptive_batch_rule_sets_the_same_gains_on_every_owner_as_on_the_replica() -> None:
    """Owners gather the merged gradient's row norms in global-id order and the ranks' task norms in worker order:
    the gains, hence every Adam step, equal the replicated barrier's with the same rule."""
    workers, per_worker = 3, 2
    schedule = make_schedule(STEPS, workers, per_worker, VIEWS, focal_scale=2.0)
    gain = AdaptiveGain(workers * per_worker)
    runtime = make_runtime(OdinRuntimeConfig(mode="barrier"), make_params(), lr_scale=LR_SCALE,
                           topology=Topology(workers, per_worker), batch_gain=gain)
    run_virtual(runtime, schedule)
    model, loops = sharded(schedule, ShardCuts(torch.tensor([0, 30, 71, 120])), "quality", gain=gain)
    assert_identical(model, {"versions": runtime.tables.versions, **snapshot(runtime)})
    gains = {loop.owner.optimizers["means"].param_groups[0]["lr_gain"] for loop in loops}
    assert len(gains) == 1 and gains != {1.0}


def test_a_barrier_step_makes_two_exchanges_with_the_statistics_and_the_adaptive_rule_riding_on_them() -> None:
    """Densification statistics and per-task norms travel as side tables of the return, the row norms of the step
    before on the fetch: a step is one fetch and one return on every rank, and a step's gain is set by an exchange
    of its own only where something needs it at once (the refinement after ``REFINE_AFTER``, the last step). The
    model, the statistics and the gains equal the replicated barrier's with the same rule."""
    workers = 3
    schedule = make_schedule(STEPS, workers, 2, VIEWS, focal_scale=2.0)
    gain = AdaptiveGain(workers * 2)
    reference = replicated_densified(schedule, workers, gain)
    logs: list[list[str]] = [[] for _ in range(workers)]
    model, loops = sharded(schedule, ShardCuts(torch.tensor([0, 20, 41, 60])), "barrier", refine_after=REFINE_AFTER,
                           gain=gain, logs=logs)
    assert_identical(model, reference)
    assert len({loop.owner.optimizers["means"].param_groups[0]["lr_gain"] for loop in loops}) == 1
    expected = []
    for step in range(STEPS):
        expected += [f"fetch of step {step}", f"return of step {step}"]
        if step in (REFINE_AFTER, STEPS - 1):
            expected.append(f"gradient norms of step {step}")
    for log in logs:
        steps = [what for what in log if not what.endswith(f"after step {REFINE_AFTER}")]  # the refinement's own
        assert steps == expected
        assert len(steps) < len(log), "the refinement ran"


@pytest.mark.parametrize("workers", [2, 3])
def test_sharded_densification_equals_the_replicated_barrier(workers: int) -> None:
    """Owners densify and prune their own rows; the rows are re-ordered as the replicated model's, moved between
    shards (and re-cut where the shards' sizes drift apart) with moments, versions and statistics: bit for bit."""
    schedule = make_schedule(STEPS, workers, 2, VIEWS)
    reference = replicated_densified(schedule, workers)
    assert reference["means"].shape[0] != 60, "the refinement should change the rows"
    for mode in ("barrier", "quality"):
        model, loops = sharded(schedule, ShardCuts.even(60, workers), mode, refine_after=REFINE_AFTER)
        assert_identical(model, reference)
        assert all(loop.counters.restructures == 1 for loop in loops)


def _gloo_rank_main(rank: int, workers: int, init_file: str, out_dir: str, densify: bool) -> None:
    """One gloo rank of a sharded barrier run of :func:`gloo_run`'s schedule (with the refinement if ``densify``)."""
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=workers)
        schedule, cuts = gloo_run(workers, densify)
        exchange = TableAllToAll(RowAllToAll(timeout=60.0))
        loop = make_loop(rank, schedule, cuts, "barrier", LR_SCALE, exchange, densify,
                         refine_after=REFINE_AFTER if densify else None)
        run_loop(loop, len(schedule), REFINE_AFTER if densify else None)
        exchange.close()
        torch.save({"model": shard_snapshot(loop), "counters": vars(loop.counters)}, Path(out_dir) / f"rank{rank}.pt")
    except BaseException:
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def gloo_run(workers: int, densify: bool) -> tuple[list, ShardCuts]:
    """The schedule and uneven shards of the gloo runs."""
    rows = 60 if densify else 120
    bounds = [0, rows // 3, rows] if workers == 2 else [0, rows // 4, rows // 2 + 1, rows]
    focal_scale = 0.75 if densify else 2.0
    return make_schedule(STEPS, workers, 2, VIEWS, focal_scale=focal_scale), ShardCuts(torch.tensor(bounds))


@pytest.mark.parametrize(("workers", "densify"), [(2, False), (3, False), (3, True)])
def test_gloo_ranks_shard_the_model_and_equal_the_replicated_barrier(
    tmp_path: Path, workers: int, densify: bool
) -> None:
    """W processes over gloo (the variable all-to-all of ``comm/all_to_all.py``), each holding only its shard; with
    ``densify`` across a refinement that re-orders, re-cuts and moves rows."""
    args = (workers, str(tmp_path / "init"), str(tmp_path), densify)
    mp.spawn(_gloo_rank_main, args=args, nprocs=workers)
    errors = [p.read_text() for p in tmp_path.glob("error*.txt")]
    assert not errors, errors
    results = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(workers)]
    schedule, cuts = gloo_run(workers, densify)
    reference = replicated_densified(schedule, workers) if densify else replicated_barrier(schedule, workers, 2)
    assert_identical(gathered([r["model"] for r in results]), reference)
    if densify:
        assert all(r["counters"]["recuts"] == 1 for r in results)
    else:
        assert [r["model"]["means"].shape[0] for r in results] == cuts.sizes
    assert all(r["counters"]["rows_fetched"] > 0 and r["counters"]["rows_returned"] > 0 for r in results)
    assert all(r["counters"]["bytes_sent"] > 0 and r["counters"]["bytes_received"] > 0 for r in results)


@pytest.mark.parametrize("workers", [2, 3])
def test_sharded_barrier_equals_the_replicated_barrier_bit_for_bit(workers: int) -> None:
    """Uneven shards (W = 3 does not divide 120 rows by load) and a sparse schedule of 2 views per rank."""
    schedule = make_schedule(STEPS, workers, 2, VIEWS, focal_scale=2.0)
    cuts = ShardCuts(torch.tensor([0, 37, 120]) if workers == 2 else torch.tensor([0, 30, 71, 120]))
    reference = replicated_barrier(schedule, workers, 2)
    gathered, loops = sharded(schedule, cuts, "barrier")
    assert_identical(gathered, reference)
    assert sum(loop.counters.ran_ahead for loop in loops) == 0
    fetched = sum(loop.counters.rows_fetched for loop in loops)
    assert 0 < fetched < sum(loop.counters.task_rows for loop in loops)  # tasks of a rank share fetched rows


@pytest.mark.parametrize("workers", [2, 3])
def test_placed_workers_read_more_rows_where_they_live_and_still_equal_the_barrier(workers: int) -> None:
    """Each step's workers on the ranks owning most of their rows: the owners sum in worker order, so the model is
    the replicated barrier's bit for bit; workers did move off their own ranks, and fewer rows crossed ranks. Every
    rank's measured time came with the returns, the same on every rank, and the placements counted it. Placed
    quality-first whose reads run ahead equals the placed barrier too."""
    schedule = make_schedule(STEPS, workers, 2, VIEWS, focal_scale=2.0)
    cuts = ShardCuts.even(120, workers)
    reference = replicated_barrier(schedule, workers, 2)
    for mode in ("barrier", "quality"):
        placed, loops = sharded(schedule, cuts, mode, place=True)
        assert_identical(placed, reference)
        assert sum(loop.counters.placed for loop in loops) > 0, "the placement moved some step's workers"
        counted = [loop.placement.loads for loop in loops]
        assert all(loads.counted_through == STEPS - 1 - 4 for loads in counted), "placed by the measurements K before"
        alike = [(loads.measured_ns == counted[0].measured_ns).all() for loads in counted]
        assert all(alike) and counted[0].measured_ns.min() > 0, "every rank counted the same measured times"
    _, fixed = sharded(schedule, cuts, "barrier")
    _, moved = sharded(schedule, cuts, "barrier", place=True)
    remote = [sum(c.counters.rows_fetched - c.counters.rows_local for c in run) for run in (fixed, moved)]
    assert remote[1] < remote[0], remote
    # Placed quality-first where reads run ahead (as in the read-ahead test below: K = 2, a real run's rates, a
    # narrow field of view): still the placed barrier's model, with tasks run ahead and workers moved.
    schedule = make_schedule(STEPS, workers, 2, VIEWS, focal_scale=6.0)
    barrier, _ = sharded(schedule, cuts, "barrier", lr_scale=0.02, place=True)
    quality, loops = sharded(schedule, cuts, "quality", lr_scale=0.02, ring_slots=2, place=True)
    assert_identical(quality, barrier)
    assert sum(loop.counters.ran_ahead for loop in loops) > 0 and sum(loop.counters.placed for loop in loops) > 0


@pytest.mark.parametrize("workers", [2, 3])
def test_sharded_quality_equals_the_sharded_barrier_and_reads_ran_ahead(
    workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K = 2 (one step fetched ahead). Learning rates of a real run's size (the toy's x 0.02), so that one
    publication moves a row a little: tasks far from the previous step's rows are sure of their C(t) before it is
    published (a narrow field of view: on 8 px images the drawable region's pixel pad is half the image). Tasks run
    ahead on the lane, also those of steps whose rest is fetched (the loop does not wait for the lane to publish and
    start that exchange: ``tests/simulation/test_sharded_trace.py`` times it)."""
    schedule = make_schedule(STEPS, workers, 1, 32, focal_scale=6.0)
    cuts = ShardCuts.even(120, workers)
    barrier, _ = sharded(schedule, cuts, "barrier", lr_scale=0.02)
    on_lane: set[int] = set()
    render_ahead = ShardedLoop._render_ahead

    def recorded(loop: ShardedLoop, work: list) -> None:
        on_lane.update(task.step for _, _, task in work)
        render_ahead(loop, work)

    monkeypatch.setattr(ShardedLoop, "_render_ahead", recorded)
    logs: list[list[str]] = [[] for _ in range(workers)]
    quality, loops = sharded(schedule, cuts, "quality", lr_scale=0.02, ring_slots=2, logs=logs)
    assert_identical(quality, barrier)
    assert sum(loop.counters.ran_ahead for loop in loops) > 0
    rested = {int(what.rsplit(" ", 1)[1]) for what in logs[0] if what.startswith("fetch of the rest of step")}
    assert rested, "some step's tasks waited for the rest of their rows"
    assert on_lane & rested, "some step whose rest was fetched ran a task ahead"
    # With the adaptive rule, a step's gain is set only once the next return is in: the clean parts culled before
    # then bound the publication's movement with the largest gain, and the reads still run ahead exactly.
    gain = AdaptiveGain(workers * 2)
    barrier, _ = sharded(schedule, cuts, "barrier", lr_scale=0.02, gain=gain)
    quality, loops = sharded(schedule, cuts, "quality", lr_scale=0.02, gain=gain, ring_slots=2)
    assert_identical(quality, barrier)
    assert sum(loop.counters.ran_ahead for loop in loops) > 0
    averages = {loop.owner.optimizers["means"].param_groups[0][AVERAGES_KEY] for loop in loops}
    assert len(averages) == 1 and averages != {(0.0, 0.0)}, "every owner observed the same gradients"


def test_sharded_quality_fetches_one_step_ahead_by_default_in_at_most_two_exchanges_a_step() -> None:
    """The default (``OdinRuntimeConfig.fetch_ahead`` = 1 at K = 4): each step's clean part rides on the fetch of
    the step before, so a step makes at most two exchanges, as the barrier's does; every rank makes the same ones,
    tasks run ahead, and the model equals the barrier's."""
    schedule = make_schedule(10, 2, 1, 32, focal_scale=6.0)
    cuts = ShardCuts.even(120, 2)
    barrier, _ = sharded(schedule, cuts, "barrier", lr_scale=0.02)
    logs: list[list[str]] = [[], []]
    quality, loops = sharded(schedule, cuts, "quality", lr_scale=0.02, logs=logs, fetch_ahead=1)
    assert_identical(quality, barrier)
    assert logs[0] == logs[1], "every rank made the same exchanges"
    assert all(loop.depth == 1 for loop in loops) and OdinRuntimeConfig().fetch_ahead == 1
    assert len(logs[0]) <= 2 * len(schedule), "the clean part rode on the fetch: at most two exchanges a step"
    assert any(what.startswith("fetch of the rest") for what in logs[0]), "some step fetched its rest"
    assert sum(loop.counters.ran_ahead for loop in loops) > 0


@pytest.mark.parametrize("gain", [False, True])
def test_sharded_quality_fetches_k_minus_1_steps_ahead_and_still_equals_the_barrier(gain: bool) -> None:
    """K = 4: the clean parts of three steps are in flight at once, culled against every unpublished step's writes
    (and the rows a step fetched ahead may still take in its rest) with the movement of every publication before
    them, and riding on the returns; tasks sure of their C(t) three steps ahead run before the two steps before
    them are published."""
    schedule = make_schedule(10, 2, 1, 64, focal_scale=10.0)  # narrow views of a ring: few share rows
    cuts = ShardCuts.even(120, 2)
    rule = AdaptiveGain(2) if gain else None
    barrier, _ = sharded(schedule, cuts, "barrier", lr_scale=0.002, gain=rule)
    logs: list[list[str]] = [[], []]
    quality, loops = sharded(schedule, cuts, "quality", lr_scale=0.002, gain=rule, logs=logs)
    assert_identical(quality, barrier)
    assert all(loop.depth == 3 for loop in loops)
    assert max(loop.counters.most_ahead for loop in loops) >= 2, "a task ran with two steps before it unpublished"
    # Step 1's clean part on the fetch of step 0, those of steps 2 and 3 on the return of step 0, and from then on
    # each step's return carries the clean part K - 1 steps ahead: no exchange of its own.
    assert logs[0][:2] == ["fetch of step 0", "return of step 0"]
    assert not any(what.startswith("fetch of the clean part") for what in logs[0])


@pytest.mark.parametrize("gain", [False, True])
def test_an_owner_publishes_early_the_rows_only_its_rank_writes_and_its_tasks_run_ahead_on_them(gain: bool) -> None:
    """Quality-first, one step fetched ahead: a task of step s + 1 whose only doubt is its own rank's owner's, about
    rows only that rank's tasks of step s write, is settled by the owner's early publication of those rows (before
    the other ranks' gradients arrive) and takes the rest of its rows locally; the model equals the barrier's bit
    for bit (with the adaptive rule too: the row norms of step s - 1 ride on step s's fetch, so its gain is set
    before the early publication). Every rank makes the same exchanges, at most two a step."""
    steps = 12
    schedule = make_schedule(steps, 2, 2, 32, focal_scale=4.0)
    cuts = ShardCuts.even(120, 2)
    rule = AdaptiveGain(4) if gain else None
    barrier, _ = sharded(schedule, cuts, "barrier", lr_scale=0.02, gain=rule)
    logs: list[list[str]] = [[], []]
    quality, loops = sharded(schedule, cuts, "quality", lr_scale=0.02, gain=rule, logs=logs, fetch_ahead=1)
    assert_identical(quality, barrier)
    assert all(loop.counters.published_early > 0 for loop in loops), "each owner published a step early"
    assert all(loop.counters.settled_locally > 0 for loop in loops), "each rank settled a task locally"
    assert logs[0] == logs[1] and len(logs[0]) <= 2 * steps + (1 if gain else 0)
    if gain:
        averages = {loop.owner.optimizers["means"].param_groups[0][AVERAGES_KEY] for loop in loops}
        assert len(averages) == 1 and averages != {(0.0, 0.0)}


def test_sharded_quality_skips_the_rest_fetch_where_no_owner_held_a_row_back() -> None:
    """One view per worker over 10 steps: some steps fetched ahead hold nothing back anywhere, and every rank skips
    their rest exchange alike; the others fetch it; the model still equals the barrier's."""
    steps = 10
    schedule = make_schedule(steps, 2, 1, 16, focal_scale=2.0)
    cuts = ShardCuts.even(120, 2)
    barrier, _ = sharded(schedule, cuts, "barrier", lr_scale=0.02)
    quality, loops = sharded(schedule, cuts, "quality", lr_scale=0.02)
    assert_identical(quality, barrier)
    rests = {loop.counters.rest_fetches for loop in loops}
    assert len(rests) == 1, "every rank fetches the rest of the same steps"
    assert 0 < rests.pop() < steps - 1, "the rest is fetched where an owner held rows back, skipped elsewhere"


def test_sharded_throughput_reads_stale_and_its_gradient_rule_reruns_on_the_published_state() -> None:
    """Throughput-first on a dense ring admits stale reads of the unpublished step's rows (share of C(t) <= 0.5).
    With the gradient ratio at 0 the owners refuse every row a stale read missed a write of, and the re-runs on the
    published state give the barrier's model bit for bit; at 100 they refuse none, and the stale values reach the
    model, which stays near the barrier's."""
    schedule = make_schedule(8, 2, 2, 16, focal_scale=1.0)
    cuts = ShardCuts.even(120, 2)
    barrier, _ = sharded(schedule, cuts, "barrier", lr_scale=0.02)
    strict, loops = sharded(schedule, cuts, "throughput", lr_scale=0.02, stale=(0.5, 0.0))
    assert_identical(strict, barrier)
    assert sum(loop.counters.reruns for loop in loops) > 0
    loose, loops = sharded(schedule, cuts, "throughput", lr_scale=0.02, stale=(0.5, 100.0))
    assert sum(loop.counters.stale_reads for loop in loops) > 0
    assert sum(loop.counters.reruns for loop in loops) == 0
    assert any(not torch.equal(loose[key], barrier[key]) for key in barrier), "stale values reached the model"
    assert max(float((loose[key] - barrier[key]).abs().max()) for key in PARAMS) < 0.05
