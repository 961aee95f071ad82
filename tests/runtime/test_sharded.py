"""The sharded mode against the replicated barrier: W ranks (threads of one process here; gloo processes in
``tests/ns/test_sharded_ranks.py``) each own a shard, fetch rows, return gradients; the model gathered in global-id
order equals the replicated barrier's bit for bit, and quality-first's reads run ahead of unpublished steps."""

from __future__ import annotations

import threading

import pytest
import torch

from odin_nerfstudio.adapter.gsplat import GsplatAdapter
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


def sharded(schedule: list, cuts: ShardCuts, mode: str, lr_scale: float = LR_SCALE) -> tuple[dict[str, torch.Tensor], list[ShardedLoop]]:
    """The same schedule on ``cuts.num_shards`` sharded ranks (threads); the shards' snapshots in global-id order."""
    params = make_params()
    restore_spatial_order(params, {}, None)
    exchange = VirtualRowExchange(cuts.num_shards)
    config = OdinRuntimeConfig(mode=mode)
    loops, errors = [], []
    for rank in range(cuts.num_shards):
        lo, hi = cuts.range(rank)
        shard = {name: torch.nn.Parameter(p.detach()[lo:hi].clone()) for name, p in params.items()}
        optimizers = selective_adams(shard, {name: lr * lr_scale for name, lr in LRS.items()})
        owner = Owner(shard, optimizers, cuts, rank, GsplatAdapter(), config.candidate_margin, config.near_plane)
        reader = Reader(cuts, shard, render, GsplatAdapter(), Meter(torch.device("cpu")), 0, config.ring_slots)
        loops.append(ShardedLoop(owner, reader, exchange.endpoint(rank), rank, lambda s: schedule[s], mode,
                                 len(schedule) - 1, 30.0))

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
    out = {}
    for name in params:
        rows = [loop.owner.params[name].detach() for loop in loops]
        out[name] = torch.cat(rows)
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"{name}.{key}"] = torch.cat([loop.owner.optimizers[name].state[loop.owner.params[name]][key]
                                              for loop in loops])
        out[f"{name}.step"] = loops[0].owner.optimizers[name].state[loops[0].owner.params[name]]["step"].clone()
    return out, loops


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
