"""The modeled link: an exchange is delivered at the latest arrival of its messages (send + latency + bytes /
bandwidth), on the model's clock, whatever the real transport; the merged update is the real one; nothing waits
at the start nor in ``done``; the boards forget a step once every worker has read it; over two gloo ranks a handle
is not done before its modeled delivery and is done after."""

from __future__ import annotations

import os
import threading
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from odin_nerfstudio.adapter.gsplat import STATS_SCHEMA
from odin_nerfstudio.comm.link import (
    PRESETS,
    LinkModel,
    LocalBoard,
    StoreBoard,
    link_preset,
    linked_distributed,
    linked_virtual,
)
from odin_nerfstudio.comm.distributed import DistributedTransport
from odin_nerfstudio.comm.inprocess import VirtualTransport
from odin_nerfstudio.comm.wire import asked_bytes, rows_of_runs, runs_of
from odin_nerfstudio.core.sparse import sum_in_order
from tests.comm.test_transport import assert_same, local_update, template

LINK = LinkModel("test", latency_s=1.0, bandwidth_bytes_per_s=1000.0)


class FakeClock:
    """A clock that moves only when told to (``sleep`` moves it), recording what slept."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_an_exchange_is_delivered_at_its_messages_latest_arrival_on_the_model_clock() -> None:
    clock = FakeClock()
    ends = linked_virtual(VirtualTransport(2, template()), LINK, clock, clock.sleep)
    updates = [local_update(0, w) for w in range(2)]
    first = ends[0].start_exchange(0, updates[0])
    clock.now = 2.0
    second = ends[1].start_exchange(0, updates[1])
    delivery = max(0.0 + LINK.delay_s(updates[0].nbytes), 2.0 + LINK.delay_s(updates[1].nbytes))
    assert delivery > 3.0 and clock.slept == [], "starting an exchange never sleeps"
    clock.now = delivery - 1e-6
    assert not first.done() and not second.done(), "the real exchange is complete, the modeled link is not"
    assert clock.slept == [], "done() never sleeps"
    clock.now = delivery
    assert first.done() and second.done()
    expected = sum_in_order(updates, template())
    assert_same(first.wait(timeout=0.01), expected)
    assert_same(second.wait(timeout=0.01), expected)
    assert clock.slept == []


def test_wait_sleeps_only_what_remains_of_the_modeled_delay_and_times_out_by_name() -> None:
    clock = FakeClock()
    ends = linked_virtual(VirtualTransport(2, template()), LINK, clock, clock.sleep)
    updates = [local_update(1, w) for w in range(2)]
    handles = [end.start_exchange(1, update) for end, update in zip(ends, updates, strict=True)]
    delivery = max(LINK.delay_s(u.nbytes) for u in updates)
    clock.now = 0.25
    with pytest.raises(TimeoutError, match="step 1: the modeled link"):
        handles[0].wait(timeout=0.5)
    assert clock.slept == []
    handles[0].wait(timeout=10.0)
    assert clock.slept == [pytest.approx(delivery - 0.25)] and clock.now == pytest.approx(delivery)
    handles[1].wait(timeout=10.0)
    assert len(clock.slept) == 1, "the other worker's handle is delivered at the same time"


def test_a_handle_waits_for_the_real_exchange_first() -> None:
    """A worker that has not sent keeps the exchange undelivered whatever the clock says."""
    clock = FakeClock()
    ends = linked_virtual(VirtualTransport(2, template()), LINK, clock, clock.sleep)
    handle = ends[0].start_exchange(0, local_update(0, 0))
    clock.now = 1e6
    assert not handle.done()
    with pytest.raises(TimeoutError, match=r"workers \[1\]"):
        handle.wait(timeout=0.01)


def test_local_board_forgets_a_step_once_every_worker_read_it() -> None:
    board = LocalBoard(2)
    board.post(3, 1, 1.0, 5.0)
    board.post(3, 0, 2.0, 7.0)
    assert board.posts(3, 0) == [(2.0, 7.0), (1.0, 5.0)] == board.posts(3, 1)
    assert not board._steps
    board.post(4, 0, 0.5, 1.0)
    with pytest.raises(RuntimeError, match=r"workers \[1\]"):
        board.posts(4, 0)


def test_store_board_reads_every_rank_and_deletes_its_keys() -> None:
    store = dist.HashStore()
    boards = [StoreBoard(2, store) for _ in range(2)]
    boards[0].post(9, 0, 1.5, 2.5)
    boards[1].post(9, 1, 0.25, 4.0)
    assert [board.posts(9, rank) for rank, board in enumerate(boards)] == [[(1.5, 2.5), (0.25, 4.0)]] * 2
    assert not any(store.check([key]) for key in ("odin/link/9/0", "odin/link/9/1", "odin/link/9/read"))


class ThreadRecordingStore:
    """A HashStore that records the names of the threads that call it."""

    def __init__(self) -> None:
        self.inner = dist.HashStore()
        self.threads: set[str] = set()

    def __getattr__(self, name: str):
        method = getattr(self.inner, name)

        def call(*args, **kwargs):
            self.threads.add(threading.current_thread().name)
            return method(*args, **kwargs)

        return call


def test_store_board_talks_to_the_store_in_its_own_thread_and_is_ready_once_every_rank_posted() -> None:
    store = ThreadRecordingStore()
    boards = [StoreBoard(2, store) for _ in range(2)]
    boards[0].post(9, 0, 1.5, 2.5)
    time.sleep(0.2)
    assert not boards[0].ready(9), "rank 1 has not posted step 9"
    with pytest.raises(TimeoutError, match="arrivals of step 9"):
        boards[0].posts(9, 0, timeout=0.05)
    boards[1].post(9, 1, 0.25, 4.0)
    assert boards[1].posts(9, 1, timeout=10.0) == [(1.5, 2.5), (0.25, 4.0)]
    deadline = time.monotonic() + 10.0
    while not boards[0].ready(9) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert boards[0].ready(9)
    assert boards[0].posts(9, 0, timeout=0.0) == [(1.5, 2.5), (0.25, 4.0)]
    assert store.threads == {"odin-link-board"}, f"the store was called from {store.threads}"


def test_presets_and_none() -> None:
    assert link_preset("none") is None
    assert link_preset("10gbe") is PRESETS["10gbe"] and link_preset("pcie") is PRESETS["pcie"]
    assert PRESETS["pcie"].delay_s(300_000) < PRESETS["10gbe"].delay_s(300_000)
    with pytest.raises(ValueError, match="choose one of none, 10gbe, pcie"):
        link_preset("infiniband")
    with pytest.raises(ValueError, match="bandwidth"):
        LinkModel("bad", 0.0, 0.0)


GLOO_LINK = LinkModel("gloo test", latency_s=2.0, bandwidth_bytes_per_s=1e9)


def _rank_main(rank: int, init_file: str, out_dir: str) -> None:
    """One gloo rank: exchange 2 steps behind GLOO_LINK; record, per step, whether the handle was done while the
    real exchange was complete and the clock before the delivery, and the clock after ``wait``."""
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        transport = DistributedTransport(template(), timeout=30.0, stats_schema=STATS_SCHEMA)
        end = linked_distributed(transport, GLOO_LINK)
        lines = []
        for step in range(2):
            handle = end.start_exchange(step, local_update(step, rank))
            while not handle.inner.done():
                time.sleep(0.001)
            early = (end.clock() < handle.delivery_s(), handle.done())
            merged = handle.wait(timeout=30.0)
            lines.append(f"{early[0]} {early[1]} {end.clock() >= handle.delivery_s()} {handle.done()}")
            expected = sum_in_order([local_update(step, w) for w in range(2)], template())
            assert_same(merged, expected)
            spent = handle.bytes  # the real exchange's bytes, through the link's handle
            assert spent.sent == spent.predicted[spent.choice] > 0, spent
        (Path(out_dir) / f"rank{rank}.txt").write_text("\n".join(lines))
        dist.barrier()
    except BaseException:
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def test_two_gloo_ranks_see_a_handle_undone_before_its_modeled_delivery_and_done_after(tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    errors = [p.read_text() for p in tmp_path.glob("error*.txt")]
    assert not errors, errors
    for rank in range(2):
        for line in (tmp_path / f"rank{rank}.txt").read_text().splitlines():
            before, done_before, after, done_after = line.split()
            assert before == "True", "2 s of modeled latency had not passed when the real exchange completed"
            assert done_before == "False" and after == "True" and done_after == "True"


def test_a_first_part_is_delivered_when_the_rows_and_asked_gradients_have_crossed() -> None:
    """Worker 1 asks for rows first: the first part (every row, the asked rows' summed gradients) is delivered at the
    latest ``send + latency + bytes up to it / bandwidth``, before the whole exchange, and sums as the whole does."""
    clock = FakeClock()
    ends = linked_virtual(VirtualTransport(2, template()), LINK, clock, clock.sleep)
    updates = [local_update(1, w) for w in (1, 2)]
    asked = torch.tensor([0, 3, 5, 7, 11, 13, 17, 19, 23])
    handles = [end.start_exchange(0, update, first) for end, update, first in zip(ends, updates, [None, asked])]
    whole = sum_in_order(updates, template())
    part = handles[0].inner.first()
    chosen = whole.rows[torch.isin(whole.rows, asked)]
    assert chosen.numel() > 0 and torch.equal(part.rows, whole.rows) and torch.equal(part.update.rows, chosen)
    for name, grad in part.update.grads.items():
        assert torch.equal(grad, whole.grads[name][torch.isin(whole.rows, asked)]), name
    first_at = max(LINK.delay_s(n) for n in part.sent_bytes)
    whole_at = max(LINK.delay_s(u.nbytes + asked_bytes(a)) for u, a in zip(updates, [None, asked]))
    assert first_at < whole_at
    clock.now = first_at - 1e-6
    assert handles[0].first() is None and handles[1].first() is None
    clock.now = first_at
    assert handles[0].first() is part and not handles[0].done()
    assert handles[1].wait_first(timeout=10.0) is part and clock.slept == []
    handles[0].wait(timeout=10.0)
    assert clock.now == pytest.approx(whole_at)


def test_asked_rows_travel_as_runs_of_consecutive_rows() -> None:
    rows = torch.tensor([2, 3, 4, 9, 11, 12])
    assert runs_of(rows).tolist() == [2, 5, 9, 10, 11, 13]
    for case in (rows, torch.arange(7), torch.tensor([5]), torch.empty(0, dtype=torch.int64)):
        assert torch.equal(rows_of_runs(runs_of(case)), case)
    assert asked_bytes(None) == 0 and asked_bytes(torch.arange(1000)) == 16
