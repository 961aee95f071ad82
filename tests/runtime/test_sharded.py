"""The sharded mode against the replicated barrier: W ranks (threads of one process here; gloo processes in
``tests/ns/test_sharded_ranks.py``) each own a shard, fetch rows, return gradients; the model gathered in global-id
order equals the replicated barrier's bit for bit, and quality-first's reads run ahead of unpublished steps."""

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
from odin_nerfstudio.core.row_order import restore_spatial_order
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.drivers.sharded_loop import ShardedLoop
from odin_nerfstudio.drivers.virtual import run_virtual
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology
from odin_nerfstudio.runtime.metering import Meter
from odin_nerfstudio.runtime.ownership import ShardCuts
from odin_nerfstudio.runtime.sharding import Owner, Reader
from odin_nerfstudio.scenes.toy import LRS, assert_identical, make_params, make_runtime, make_schedule, render, snapshot

STEPS, VIEWS, LR_SCALE = 6, 12, 8.0


def replicated_barrier(schedule: list, workers: int, per_worker: int) -> dict[str, torch.Tensor]:
    """The reference: the replicated barrier on W virtual workers."""
    runtime = make_runtime(
        OdinRuntimeConfig(mode="barrier"), make_params(), lr_scale=LR_SCALE, topology=Topology(workers, per_worker)
    )
    run_virtual(runtime, schedule)
    return snapshot(runtime)


def make_loop(rank: int, schedule: list, cuts: ShardCuts, mode: str, lr_scale: float, exchange) -> ShardedLoop:
    """Rank ``rank``'s shard of the toy model (its Z-order range) and its loop over ``exchange``."""
    params = make_params()
    restore_spatial_order(params, {}, None)
    config = OdinRuntimeConfig(mode=mode)
    lo, hi = cuts.range(rank)
    shard = {name: torch.nn.Parameter(p.detach()[lo:hi].clone()) for name, p in params.items()}
    optimizers = selective_adams(shard, {name: lr * lr_scale for name, lr in LRS.items()})
    owner = Owner(shard, optimizers, cuts, rank, GsplatAdapter(), config.candidate_margin, config.near_plane)
    reader = Reader(cuts, shard, render, GsplatAdapter(), Meter(torch.device("cpu")), 0, config.ring_slots)
    return ShardedLoop(owner, reader, exchange, rank, lambda s: schedule[s], mode, len(schedule) - 1, 30.0)


def shard_snapshot(loop: ShardedLoop) -> dict[str, torch.Tensor]:
    """A shard's parameters and Adam state, keyed as ``toy.snapshot``."""
    out = {}
    for name, param in loop.owner.params.items():
        out[name] = param.detach().clone()
        state = loop.owner.optimizers[name].state[param]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            out[f"{name}.{key}"] = state[key].clone()
    return out


def gathered(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The shards' snapshots in global-id order (the step counts are every shard's, the same)."""
    return {key: shards[0][key] if key.endswith(".step") else torch.cat([s[key] for s in shards]) for key in shards[0]}


def sharded(
    schedule: list, cuts: ShardCuts, mode: str, lr_scale: float = LR_SCALE
) -> tuple[dict[str, torch.Tensor], list[ShardedLoop]]:
    """The schedule on ``cuts.num_shards`` sharded ranks (threads); the model gathered in global-id order."""
    exchange = VirtualRowExchange(cuts.num_shards)
    loops = [make_loop(rank, schedule, cuts, mode, lr_scale, exchange.endpoint(rank)) for rank in range(cuts.num_shards)]
    errors = []

    def run(loop: ShardedLoop) -> None:
        try:
            for step in range(len(schedule)):
                loop.iteration(step)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=run, args=(loop,)) for loop in loops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return gathered([shard_snapshot(loop) for loop in loops]), loops


def _gloo_rank_main(rank: int, workers: int, init_file: str, out_dir: str, mode: str) -> None:
    """One gloo rank of a sharded run of the W = ``workers`` schedule of :func:`test_gloo_ranks_shard_the_model`."""
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=workers)
        schedule, cuts = gloo_run(workers)
        exchange = TableAllToAll(RowAllToAll(timeout=60.0))
        loop = make_loop(rank, schedule, cuts, mode, LR_SCALE, exchange)
        for step in range(len(schedule)):
            loop.iteration(step)
        exchange.close()
        torch.save({"model": shard_snapshot(loop), "counters": vars(loop.counters)}, Path(out_dir) / f"rank{rank}.pt")
    except BaseException:
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def gloo_run(workers: int) -> tuple[list, ShardCuts]:
    """The schedule and uneven shards of the gloo runs."""
    bounds = [0, 37, 120] if workers == 2 else [0, 30, 71, 120]
    return make_schedule(STEPS, workers, 2, VIEWS, focal_scale=2.0), ShardCuts(torch.tensor(bounds))


@pytest.mark.parametrize("workers", [2, 3])
def test_gloo_ranks_shard_the_model_and_equal_the_replicated_barrier(tmp_path: Path, workers: int) -> None:
    """W processes over gloo (the variable all-to-all of ``comm/all_to_all.py``), each holding only its shard."""
    mp.spawn(_gloo_rank_main, args=(workers, str(tmp_path / "init"), str(tmp_path), "barrier"), nprocs=workers)
    errors = [p.read_text() for p in tmp_path.glob("error*.txt")]
    assert not errors, errors
    results = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(workers)]
    schedule, cuts = gloo_run(workers)
    assert [r["model"]["means"].shape[0] for r in results] == cuts.sizes
    assert_identical(gathered([r["model"] for r in results]), replicated_barrier(schedule, workers, 2))
    assert all(r["counters"]["rows_fetched"] > 0 and r["counters"]["rows_returned"] > 0 for r in results)


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
def test_sharded_quality_equals_the_sharded_barrier_and_reads_ran_ahead(workers: int) -> None:
    """Learning rates of a real run's size (the toy's x 0.02), so that one publication moves a row a little: tasks
    far from the previous step's rows are sure of their C(t) before it is published."""
    schedule = make_schedule(STEPS, workers, 2, 8 * workers, focal_scale=2.0)
    cuts = ShardCuts.even(120, workers)
    barrier, _ = sharded(schedule, cuts, "barrier", lr_scale=0.02)
    quality, loops = sharded(schedule, cuts, "quality", lr_scale=0.02)
    assert_identical(quality, barrier)
    assert sum(loop.counters.ran_ahead for loop in loops) > 0
