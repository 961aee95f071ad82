"""Transports: the in-process exchange and torch.distributed over 2 gloo processes merge sparse updates in worker
order, bit for bit as ``sum_in_order``, and every wait times out with a message naming what it waited for."""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from odin_nerfstudio.runtime import OdinRuntime, OdinRuntimeConfig
from odin_nerfstudio.selective_adam import selective_adams
from odin_nerfstudio.sparse import SparseUpdate, sum_in_order
from odin_nerfstudio.transport import DistributedTransport, VirtualTransport
from odin_nerfstudio.virtual import run_virtual
from tests.toy_scene import LRS, assert_identical, make_params, make_runtime, make_schedule, render, snapshot

N = 30
STEPS = 3


def template() -> dict[str, torch.Tensor]:
    return {"means": torch.zeros(N, 3), "opacities": torch.zeros(N), "features_rest": torch.zeros(N, 2, 3)}


def local_update(step: int, worker: int) -> SparseUpdate:
    """A deterministic sparse update of ``worker`` in ``step`` (possibly empty)."""
    generator = torch.Generator().manual_seed(100 * step + worker)
    rows = torch.nonzero(torch.rand(N, generator=generator) < 0.3 * worker).flatten()
    grads = {name: torch.randn(rows.numel(), *ref.shape[1:], generator=generator) for name, ref in template().items()}
    return SparseUpdate(rows, grads)


def assert_same(a: SparseUpdate, b: SparseUpdate) -> None:
    assert torch.equal(a.rows, b.rows)
    for name in a.grads:
        assert torch.equal(a.grads[name], b.grads[name]), name


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


def _rank_main(rank: int, init_file: str, out_dir: str) -> None:
    """One gloo rank: exchange STEPS updates, then rank 0 starts an exchange rank 1 never joins."""
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        transport = DistributedTransport(template(), timeout=1.0)
        handles = [transport.start_exchange(step, local_update(step, rank)) for step in range(STEPS)]
        merged = [handle.wait(timeout=30.0) for handle in handles]
        torch.save([(m.rows, m.grads) for m in merged], Path(out_dir) / f"merged{rank}.pt")
        if rank == 0:
            try:
                transport.start_exchange(STEPS, local_update(STEPS, 0))
                message = "no timeout"
            except TimeoutError as error:
                message = str(error)
            (Path(out_dir) / "timeout.txt").write_text(message)
        else:
            time.sleep(3.0)
    except BaseException:
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def test_gloo_transport_merges_like_sum_in_order_and_names_its_timeouts(tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    errors = [p.read_text() for p in tmp_path.glob("error*.txt")]
    assert not errors, errors
    for rank in range(2):
        merged = torch.load(tmp_path / f"merged{rank}.pt")
        for step, (rows, grads) in enumerate(merged):
            expected = sum_in_order([local_update(step, w) for w in range(2)], template())
            assert_same(SparseUpdate(rows, grads), expected)
    message = (tmp_path / "timeout.txt").read_text()
    assert f"step {STEPS}" in message and "row counts" in message and "ranks 0..1" in message


SPARSE_SCHEDULE = {"num_steps": 6, "num_workers": 2, "per_worker": 2, "num_views": 12, "focal_scale": 2.0}
SPARSE_LR_SCALE = 8.0


def _runtime_rank_main(rank: int, init_file: str, out_dir: str) -> None:
    """One rank of a distributed quality-first run: its own runtime, replica and worker, gloo in between."""
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        params = make_params()
        runtime = OdinRuntime(
            OdinRuntimeConfig(mode="quality", num_workers=1, tasks_per_worker=2, wait_timeout_s=60.0),
            params,
            selective_adams(params, {name: lr * SPARSE_LR_SCALE for name, lr in LRS.items()}),
            [DistributedTransport(params, timeout=60.0)],
            render,
        )
        schedule = make_schedule(**SPARSE_SCHEDULE)
        mine = [[[dataclasses.replace(task, worker=0) for task in step[rank]]] for step in schedule]
        run_virtual(runtime, mine)
        torch.save(snapshot(runtime), Path(out_dir) / f"snapshot{rank}.pt")
    except BaseException:
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def test_two_gloo_ranks_train_bit_identical_to_the_virtual_barrier(tmp_path: Path) -> None:
    """One runtime per rank (quality-first, sparse updates over gloo): both replicas end bit-identical to each
    other and to the virtual barrier run of the same schedule."""
    mp.spawn(_runtime_rank_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    errors = [p.read_text() for p in tmp_path.glob("error*.txt")]
    assert not errors, errors
    barrier = make_runtime(
        OdinRuntimeConfig(mode="barrier", num_workers=2, tasks_per_worker=2), make_params(), lr_scale=SPARSE_LR_SCALE
    )
    run_virtual(barrier, make_schedule(**SPARSE_SCHEDULE))
    for rank in range(2):
        assert_identical(torch.load(tmp_path / f"snapshot{rank}.pt"), snapshot(barrier))
