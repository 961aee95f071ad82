"""The distributed exchange's progress thread and its per-step choice, over real gloo processes.

W = 2: every choice (sparse all-gather, union-then-reduce, dense all_reduce, auto) merges bit for bit as
``sum_in_order``, and counts the bytes its formula predicts; six exchanges are in flight at once and complete in
step order; rank 0's wait returns while rank 1, which started its part, sleeps without polling; a collective the
thread waits for past the transport's timeout fails the exchange naming the step; closing fails what is in flight.
W = 2 with rows asked for first: every choice delivers the first part (every row, the asked rows' sums) as the
in-process transport does, then the whole update bit for bit as without asking.
W = 4: every choice gives every rank the same bits; "auto" picks sparse for small disjoint rows, union-reduce for
shared rows, dense when every rank touches every row.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from odin_nerfstudio.adapter.gsplat import STATS_SCHEMA
from odin_nerfstudio.comm.distributed import DistributedTransport, require_no_exchange_in_flight
from odin_nerfstudio.comm.calibration import link_latency_bytes, measure_latency_bytes
from odin_nerfstudio.comm.exchange_choice import CHOICES, ExchangeShape, RingBytes, cheapest, estimated_union
from odin_nerfstudio.comm.inprocess import VirtualTransport
from odin_nerfstudio.comm.wire import Sizes, StatsLayout
from odin_nerfstudio.core.sparse import SparseUpdate, sum_in_order
from odin_nerfstudio.simulation.interconnect import Interconnect
from tests.comm.test_transport import N, assert_same, local_update, template

D = 10
"""The packed gradient width of ``template()``: means 3 + opacities 1 + features_rest 6."""
STEPS = 4
IN_FLIGHT = 6


def spawn(main, tmp_path: Path, nprocs: int) -> None:
    """Run ``main(rank, init_file, out_dir)`` on ``nprocs`` gloo ranks; fail with any rank's traceback."""
    mp.spawn(main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=nprocs, join=True)
    errors = [p.read_text() for p in tmp_path.glob("error*.txt")]
    assert not errors, errors


def update_of(step: int, rank: int) -> SparseUpdate:
    """Rank ``rank``'s update (densities 0.3 and 0.6 for ranks 0 and 1, with task statistics)."""
    return local_update(step, rank + 1)


def expected(step: int, world_size: int = 2) -> SparseUpdate:
    return sum_in_order([update_of(step, rank) for rank in range(world_size)], template())


def saved(update: SparseUpdate) -> tuple:
    return update.rows, update.grads, list(update.stats), update.sq_norms


def _two_rank_main(rank: int, init_file: str, out_dir: str) -> None:
    """Rank 0 and 1 of the W = 2 checks (see the module); results saved to ``out_dir``."""
    torch.set_num_threads(1)
    out = Path(out_dir)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        results = {}
        for choice in ("auto", *CHOICES):
            transport = DistributedTransport(template(), timeout=30.0, stats_schema=STATS_SCHEMA, choice=choice)
            handles = [transport.start_exchange(step, update_of(step, rank)) for step in range(STEPS)]
            results[choice] = [(saved(h.wait(timeout=30.0)), h.bytes) for h in handles]
            transport.close()

        transport = DistributedTransport(template(), timeout=30.0, stats_schema=STATS_SCHEMA)
        if rank == 1:
            time.sleep(0.5)  # rank 0's exchanges cannot complete before rank 1 starts: all six are in flight
        handles = [transport.start_exchange(step, update_of(step, rank)) for step in range(IN_FLIGHT)]
        results["in_flight"] = transport.in_flight()
        try:
            require_no_exchange_in_flight("a replica check", [transport])
            results["guard"] = "no error"
        except RuntimeError as error:
            results["guard"] = str(error)
        last = handles[-1].wait(timeout=30.0)
        results["done_before_last"] = [h.done() for h in handles]
        results["ordered"] = [saved(h.wait(timeout=0.01)) for h in handles[:-1]] + [saved(last)]

        # Progress without polling: rank 1 starts its part, then sleeps without touching its handle.
        handle = transport.start_exchange(IN_FLIGHT, update_of(IN_FLIGHT, rank))
        if rank == 1:
            time.sleep(3.0)
            results["woke"] = time.time()
            results["unpolled"] = saved(handle.wait(timeout=30.0))
        else:
            results["unpolled"] = saved(handle.wait(timeout=30.0))
            results["returned"] = time.time()
        transport.close()
        torch.save(results, out / f"results{rank}.pt")
        dist.barrier()

        # Rank 0 alone from here: its thread waits 1 s (the transport's timeout) for rank 1's row counts.
        if rank == 0:
            lonely = DistributedTransport(template(), timeout=1.0, stats_schema=STATS_SCHEMA)
            handle = lonely.start_exchange(0, update_of(0, 0))
            started = time.monotonic()
            try:
                handle.wait(timeout=30.0)
                message = "no timeout"
            except TimeoutError as error:
                message = str(error)
            waited = time.monotonic() - started
            try:
                lonely.start_exchange(1, update_of(1, 0)).done()
                later = "no error"
            except TimeoutError as error:
                later = str(error)
            closing = DistributedTransport(template(), timeout=30.0, stats_schema=STATS_SCHEMA)
            handle = closing.start_exchange(0, update_of(0, 0))
            closing.close()
            try:
                handle.wait(timeout=5.0)
                closed = "no error"
            except RuntimeError as error:
                closed = str(error)
            torch.save({"message": message, "waited": waited, "later": later, "closed": closed}, out / "alone.pt")
        else:
            time.sleep(3.0)
    except BaseException:
        (out / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def test_two_ranks_every_choice_merges_like_sum_in_order_in_flight_and_without_polling(tmp_path: Path) -> None:
    spawn(_two_rank_main, tmp_path, 2)
    results = [torch.load(tmp_path / f"results{rank}.pt", weights_only=False) for rank in range(2)]
    for result in results:
        for choice in ("auto", *CHOICES):
            for step, ((rows, grads, stats, norms), spent) in enumerate(result[choice]):
                assert_same(SparseUpdate(rows, grads, tuple(stats), norms), expected(step))
                assert choice == "auto" or spent.choice == choice
                assert spent.sent == spent.received == spent.predicted[spent.choice], (choice, step, spent)
                kind, nbytes = spent.collectives[-1]
                longest = max(update_of(step, r).rows.numel() for r in range(2))
                if spent.choice == "sparse":
                    assert kind == "all_gather" and nbytes == longest * D * 4
                else:
                    reduced = rows.numel() if spent.choice == "union" else int(rows[-1]) + 1
                    assert kind == "all_reduce" and nbytes == reduced * (D + (spent.choice == "dense")) * 4
        for step in range(STEPS):
            # the int64 message of the dense exchange carries no rows: the union's is longer by the longest rows
            union, dense = result["union"][step][1], result["dense"][step][1]
            longest = max(update_of(step, r).rows.numel() for r in range(2))
            assert union.collectives[1][1] - dense.collectives[1][1] == 8 * longest
        assert result["in_flight"] == list(range(IN_FLIGHT)) or result is results[1]
        assert all(result["done_before_last"]), "a later exchange completed before an earlier one"
        for step, (rows, grads, stats, norms) in enumerate(result["ordered"]):
            assert_same(SparseUpdate(rows, grads, tuple(stats), norms), expected(step))
        rows, grads, stats, norms = result["unpolled"]
        assert_same(SparseUpdate(rows, grads, tuple(stats), norms), expected(IN_FLIGHT))
    assert results[0]["in_flight"] == list(range(IN_FLIGHT))
    assert "a replica check" in results[0]["guard"] and "[0, 1, 2, 3, 4, 5]" in results[0]["guard"]
    assert results[0]["returned"] < results[1]["woke"], "rank 0's wait needed rank 1 to poll"
    alone = torch.load(tmp_path / "alone.pt", weights_only=False)
    assert "step 0" in alone["message"] and "row counts" in alone["message"] and "ranks 0..1" in alone["message"]
    assert alone["waited"] < 10.0, "the progress thread's wait is bounded by the transport's timeout"
    assert alone["later"] == alone["message"], "the thread's error reaches every later exchange"
    assert "closed" in alone["closed"] and "step 0" in alone["closed"]


SCENARIOS = {
    "sparse": lambda rank: torch.tensor([rank]),
    "union": lambda rank: torch.arange(20, 30),
    "dense": lambda rank: torch.arange(N),
}
"""Rows per rank (W = 4) for which "auto" must pick the named exchange: one disjoint row each (the all-gather of
4 rows is cheapest), the same 10 of 30 rows (|U| = 10: reduce them), every row (no indices: reduce all)."""


def scenario_update(name: str, rank: int) -> SparseUpdate:
    rows = SCENARIOS[name](rank)
    generator = torch.Generator().manual_seed(rank)
    grads = {key: torch.randn(rows.numel(), *ref.shape[1:], generator=generator) for key, ref in template().items()}
    return SparseUpdate(rows, grads)


def _four_rank_main(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=4)
        results = {}
        for choice in ("auto", *CHOICES):
            transport = DistributedTransport(template(), timeout=30.0, choice=choice)
            handles = {name: transport.start_exchange(step, scenario_update(name, rank)) for step, name in enumerate(SCENARIOS)}
            results[choice] = {name: (saved(h.wait(timeout=30.0)), h.bytes) for name, h in handles.items()}
            transport.close()
        torch.save(results, out / f"results{rank}.pt")
    except BaseException:
        (out / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def test_four_ranks_get_the_same_bits_and_auto_picks_the_cheapest(tmp_path: Path) -> None:
    spawn(_four_rank_main, tmp_path, 4)
    results = [torch.load(tmp_path / f"results{rank}.pt", weights_only=False) for rank in range(4)]
    for name in SCENARIOS:
        reference = sum_in_order([scenario_update(name, rank) for rank in range(4)], template())
        for choice in ("auto", *CHOICES):
            (rows, grads, _, _), spent = results[0][choice][name]
            assert torch.equal(rows, reference.rows)
            for key in grads:
                torch.testing.assert_close(grads[key], reference.grads[key], rtol=1e-6, atol=1e-6)
            for other in results[1:]:
                (other_rows, other_grads, _, _), other_spent = other[choice][name]
                assert torch.equal(other_rows, rows) and all(torch.equal(other_grads[k], grads[k]) for k in grads)
                assert other_spent == spent
            assert spent.sent == spent.predicted[spent.choice]
        auto = results[0]["auto"][name][1]
        assert auto.choice == name, (name, auto)
        assert auto.predicted[name] == min(auto.predicted.values())
        if name == "sparse":
            assert torch.equal(results[0]["sparse"][name][0][1]["means"], reference.grads["means"])


def test_the_byte_formulas_by_hand() -> None:
    """W = 4, D = 10 float32 in 2 parameters, no statistics, ranks of 5, 3, 0, 2 rows with spans 30, 9, 0, 20."""
    shape = ExchangeShape(4, D, 4, StatsLayout.of(None), 2)
    sizes = [Sizes(5, 0, 0, 30), Sizes(3, 0, 0, 9), Sizes(0, 0, 0, 0), Sizes(2, 0, 0, 20)]
    predicted = shape.predict(sizes, union_rows=8)
    header = 3 * 64  # eight int64 per rank: rows, entries, tasks, span, asked rows, asks, 2 squared norms
    assert predicted["sparse"] == header + 3 * 5 * 8 + 3 * 5 * D * 4
    assert predicted["union"] == header + 3 * 5 * 8 + 2 * 3 * 8 * D * 4 // 4
    assert predicted["dense"] == header + 2 * 3 * 30 * (D + 1) * 4 // 4
    # independent draws: 30 (1 - (25/30)(27/30)(28/30)) = 9.0, within [5, min(30, 10)]
    assert estimated_union(sizes) == 9
    assert estimated_union([Sizes(0, 0, 0, 0)] * 2) == 0


def test_ties_go_to_the_earlier_exchange_and_the_interconnect_prices_bytes_as_the_transport() -> None:
    """:func:`cheapest` breaks a tie in ``CHOICES`` order; the simulator's interconnect takes its bytes from the
    same model: parts of R rows (an int64 index and D float32 gradients each, no statistics) cost what
    :meth:`ExchangeShape.predict` gives the transport, less the header, for every exchange."""
    assert cheapest({"dense": 5, "union": 5, "sparse": 5}) == "sparse"
    assert cheapest({"dense": 3, "union": 3, "sparse": 4}) == "union"
    shape = ExchangeShape(4, D, 4, StatsLayout.of(None), 2)
    sizes = [Sizes(5, 0, 0, 30), Sizes(3, 0, 0, 9), Sizes(0, 0, 0, 0), Sizes(2, 0, 0, 20)]
    predicted = shape.predict(sizes, union_rows=8)
    row = 8 + 4 * D
    link = Interconnect("l", collective="chosen", dense_bytes=30 * (D + 1) * 4, row_bytes=row)
    header = 3 * 64
    costs = link.costs(4, longest=5 * row, union_rows=8)
    assert {name: nbytes + header for name, (nbytes, _) in costs.items()} == predicted


def test_bad_choice_and_steps_out_of_order_are_errors(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="--exchange"):
            DistributedTransport(template(), choice="ring")
        transport = DistributedTransport(template(), stats_schema=STATS_SCHEMA)
        assert_same(transport.start_exchange(3, update_of(3, 0)).wait(timeout=10.0), update_of(3, 0))
        with pytest.raises(ValueError, match="step 2 started after step 3"):
            transport.start_exchange(2, update_of(2, 0))
        transport.close()
    finally:
        dist.destroy_process_group()


ASKED = {0: torch.tensor([1, 4, 9, 16, 25]), 1: torch.arange(10, 20)}
"""Rows each rank asks for first (W = 2)."""


def _asking_rank_main(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        results = {}
        for choice in ("auto", *CHOICES):
            transport = DistributedTransport(template(), timeout=30.0, stats_schema=STATS_SCHEMA, choice=choice)
            handles = [transport.start_exchange(step, update_of(step, rank), ASKED[rank]) for step in range(STEPS)]
            parts = [h.wait_first(timeout=30.0) for h in handles]
            results[choice] = [
                (saved(h.wait(timeout=30.0)), p.rows, saved(p.update), p.sent_bytes, h.bytes.choice)
                for h, p in zip(handles, parts)
            ]
            transport.close()
        torch.save(results, out / f"asking{rank}.pt")
    except BaseException:
        (out / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def test_two_ranks_asking_for_rows_first_get_the_first_part_then_the_same_bits(tmp_path: Path) -> None:
    spawn(_asking_rank_main, tmp_path, 2)
    for rank in range(2):
        results = torch.load(tmp_path / f"asking{rank}.pt", weights_only=False)
        for choice in ("auto", *CHOICES):
            for step, ((rows, grads, stats, norms), union, first, sent, ran) in enumerate(results[choice]):
                first_rows, first_grads, _, _ = first
                assert_same(SparseUpdate(rows, grads, tuple(stats), norms), expected(step))
                virtual = VirtualTransport(2, template())
                handle = [virtual.contribute(step, r, update_of(step, r), ASKED[r]) for r in range(2)][0]
                reference = handle.first()
                assert torch.equal(union, reference.rows) and torch.equal(first_rows, reference.update.rows)
                assert first_rows.numel() > 0, "the asked rows meet the step's rows"
                for name, grad in first_grads.items():
                    assert torch.equal(grad, reference.update.grads[name]), (choice, step, name)
                if ran == "dense":
                    assert sent is None, "the dense exchange's first part comes with the whole update"
                else:
                    assert sent == reference.sent_bytes


def test_the_choice_weighs_latencies_at_the_links_latency_times_bandwidth() -> None:
    """BENCHMARKS.md's street at W = 8 (bench_exchange): union-then-reduce sends 2,332 KiB, the sparse all-gather
    2,703 KiB. By bytes alone union wins; behind a 10 GbE-class link (50 us x 1.25 GB/s = 62.5 KB a latency) its
    14 more latencies (3 (W - 1) against W - 1) cost 875 KB, and the all-gather is faster; the simulator's chosen
    exchange picks as the transport does."""
    ring = RingBytes(8)
    predicted = {"sparse": 2703 * 1024, "union": 2332 * 1024, "dense": 20669 * 1024}
    assert ring.latencies() == {"sparse": 7, "union": 21, "dense": 14}
    assert ring.fastest(predicted) == "union"
    ten_gbe = link_latency_bytes(50e-6, 1.25e9)
    assert ten_gbe == pytest.approx(62_500)
    assert ring.fastest(predicted, ten_gbe) == "sparse"
    link = Interconnect("10gbe", 50e-6 * 75, 1.25e9 / 75, collective="chosen", row_bytes=0, dense_bytes=0)
    assert link.latency_bytes == pytest.approx(ten_gbe), "a preset's slowing cancels out of latency x bandwidth"


def _calibration_main(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        figure = measure_latency_bytes(torch.device("cpu"), repeats=2)
        (Path(out_dir) / f"rank{rank}.txt").write_text(repr(figure))
        dist.barrier()
    except BaseException:
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def test_every_rank_measures_the_same_latency_bytes(tmp_path: Path) -> None:
    mp.spawn(_calibration_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    errors = [p.read_text() for p in tmp_path.glob("error*.txt")]
    assert not errors, errors
    figures = [float((tmp_path / f"rank{r}.txt").read_text()) for r in range(2)]
    assert figures[0] == figures[1] and figures[0] > 0, figures
