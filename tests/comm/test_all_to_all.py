"""The variable-size all-to-all of rows: per-row tables pack into one uint8 buffer and back bit for bit; over 2 and
3 gloo processes every rank receives exactly what each sender sent it (empty splits everywhere, uneven, one-sided,
a rank receiving nothing, several exchanges in flight, side tables of other row counts riding on a piece), its own
piece without a copy, with its bytes counted; the
differentiable form's backward returns the receivers' gradients to the senders; a wait on a rank that never joins
times out naming the exchange and the collective, fails every later exchange, and closes cleanly."""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from odin_nerfstudio.comm.all_to_all import (
    MessageLayout,
    RowAllToAll,
    RowLayout,
    TableAllToAll,
    all_to_all_rows,
    main_of,
    pack_message,
    pack_rows,
    side_of,
    unpack_message,
    unpack_rows,
    with_side,
)

LIMIT_S = 30.0
"""The longest a spawned test may run before its processes are killed and it fails."""


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes (NaNs compare by their bits)."""
    return tensor.contiguous().view(torch.uint8)


def tables(n: int) -> dict[str, torch.Tensor]:
    """Per-row tables of mixed dtypes, n rows, with NaN, -0, inf and int64 extremes among the values."""
    generator = torch.Generator().manual_seed(n)
    means = torch.randn(n, 3, generator=generator)
    if n:
        means[0] = torch.tensor([float("nan"), -0.0, float("inf")])
    versions = torch.randint(-(2**62), 2**62, (n,), generator=generator)
    if n:
        versions[-1] = torch.iinfo(torch.int64).min
    return {
        "means": means,
        "versions": versions,
        "alive": torch.rand(n, generator=generator) < 0.5,
        "half": torch.randn(n, 2, generator=generator).half(),
        "brain": torch.randn(n, 1, 2, generator=generator).bfloat16(),
        "bytes": torch.randint(0, 256, (n, 5), generator=generator, dtype=torch.uint8),
        "double": torch.randn(n, generator=generator, dtype=torch.float64),
    }


def assert_tables_equal(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """The same names, dtypes, shapes and bits."""
    assert ours.keys() == theirs.keys()
    for name, table in ours.items():
        assert table.dtype == theirs[name].dtype and table.shape == theirs[name].shape, name
        assert torch.equal(_bits(table), _bits(theirs[name])), name


def message(rank: int, dst: int) -> dict[str, torch.Tensor]:
    """A piece with two side tables of other row counts than its main table's (some of them empty)."""
    piece = with_side(tables(1 + rank + 2 * dst), "stats", tables(dst + rank % 2))
    return with_side(piece, "flags", {"ids": torch.arange(3 * rank + dst, dtype=torch.int64)})


def message_bytes(rank: int, dst: int) -> int:
    """Bytes of :func:`message`'s packed form: a header of 3 row counts, then its tables' rows."""
    return 8 * 3 + RowLayout.of(tables(0)).row_bytes * (1 + rank + 2 * dst + dst + rank % 2) + 8 * (3 * rank + dst)


@pytest.mark.parametrize(("rank", "dst"), [(0, 0), (1, 0), (2, 3)])
def test_side_tables_of_other_row_counts_travel_in_one_message_bit_for_bit(rank: int, dst: int) -> None:
    sent = message(rank, dst)
    packed = pack_message(sent)
    assert packed.dtype == torch.uint8 and packed.dim() == 1 and packed.numel() == message_bytes(rank, dst)
    got = unpack_message(packed, MessageLayout.of(message(0, 0)))  # a receiver's layout, from its own piece
    assert_tables_equal(got, sent)
    assert_tables_equal(main_of(got), tables(1 + rank + 2 * dst))
    assert_tables_equal(side_of(got, "stats"), tables(dst + rank % 2))
    assert side_of(got, "absent") == {}
    only = tables(2 + rank)  # one table: no header
    assert pack_message(only).numel() == RowLayout.of(only).row_bytes * (2 + rank)
    assert_tables_equal(unpack_message(pack_message(only), MessageLayout.of(tables(0))), only)


@pytest.mark.parametrize("n", [0, 1, 7])
def test_pack_rows_round_trips_mixed_dtypes_bit_for_bit(n: int) -> None:
    sent = tables(n)
    sent["means"] = sent["means"].t().contiguous().t()  # a non-contiguous table packs as well
    buffer = pack_rows(sent)
    row_bytes = 3 * 4 + 8 + 1 + 2 * 2 + 2 * 2 + 5 + 8
    assert buffer.dtype == torch.uint8 and buffer.shape == (n, row_bytes) and buffer.is_contiguous()
    layout = RowLayout.of(tables(0))  # a receiver's layout, from a zero-row template
    assert layout.row_bytes == row_bytes
    assert_tables_equal(unpack_rows(buffer, layout), sent)
    if n:
        assert_tables_equal(unpack_rows(buffer[1:], layout), {k: v[1:] for k, v in sent.items()})


def test_pack_rows_refuses_tables_of_different_row_counts_and_a_buffer_of_another_layout() -> None:
    with pytest.raises(ValueError, match="one row count"):
        pack_rows({"a": torch.zeros(3), "b": torch.zeros(2)})
    with pytest.raises(ValueError, match="uint8"):
        unpack_rows(torch.zeros(2, 3, dtype=torch.uint8), RowLayout.of(tables(0)))


# Scenarios run in spawned gloo processes: each writes result<rank>.pt, or error<rank>.txt on failure.


def _spawn(scenario: Callable[[int, int, Path], None], world_size: int, tmp_path: Path) -> None:
    """Run ``scenario(rank, world_size, out)`` on ``world_size`` gloo processes; fail (killing them) past
    LIMIT_S, and on any rank's error."""
    context = mp.spawn(_rank_main, args=(scenario, world_size, str(tmp_path)), nprocs=world_size, join=False)
    deadline = time.monotonic() + LIMIT_S
    while not context.join(timeout=0.2):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{scenario.__name__} ran past {LIMIT_S} s")
    errors = [p.read_text() for p in sorted(tmp_path.glob("error*.txt"))]
    assert not errors, "\n".join(errors)


def _rank_main(rank: int, scenario: Callable[[int, int, Path], None], world_size: int, out_dir: str) -> None:
    """One gloo rank of a scenario."""
    torch.set_num_threads(1)
    out = Path(out_dir)
    try:
        dist.init_process_group("gloo", init_method=f"file://{out / 'init'}", rank=rank, world_size=world_size)
        scenario(rank, world_size, out)
    except BaseException:
        (out / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


CASES: list[tuple[str, Callable[[int, int, int], int], tuple[int, ...], torch.dtype]] = [
    ("empty everywhere", lambda src, dst, world: 0, (), torch.float32),
    ("uneven", lambda src, dst, world: (3 * src + 2 * dst + 1) % 5, (3, 5), torch.float32),
    ("only rank 0 sends, to everyone", lambda src, dst, world: 2 + dst if src == 0 else 0, (), torch.int64),
    ("nothing to the last rank", lambda src, dst, world: 0 if dst == world - 1 else 1 + src, (3, 5), torch.float64),
]
"""Per exchange: its name, rows (source, destination, W) -> n, trailing shape and dtype."""


def piece(case: int, src: int, dst: int, world_size: int) -> torch.Tensor:
    """What ``src`` sends ``dst`` in exchange ``case``: distinct values per (case, source, destination)."""
    _, rows, trailing, dtype = CASES[case]
    generator = torch.Generator().manual_seed(1000 * case + 10 * src + dst)
    return (torch.randn(rows(src, dst, world_size), *trailing, generator=generator) * 1000).to(dtype)


def _exchanges(rank: int, world_size: int, out: Path) -> None:
    """Every case started back to back, then the packed tables, then all waited in order."""
    all_to_all = RowAllToAll(timeout=20.0)
    sent = [[piece(case, rank, dst, world_size) for dst in range(world_size)] for case in range(len(CASES))]
    handles = [all_to_all.start(pieces, f"case {case}") for case, pieces in enumerate(sent)]
    packed = [pack_rows(tables(1 + rank + 2 * dst)) for dst in range(world_size)]
    handles.append(all_to_all.start(packed, "tables"))
    messages = TableAllToAll(all_to_all).start([message(rank, dst) for dst in range(world_size)], "side tables")
    received = [handle.wait(timeout=20.0) for handle in handles]
    assert all(handle.done() for handle in handles)
    own = [got[rank] is pieces[rank] for got, pieces in zip(received, [*sent, packed], strict=True)]
    unpacked = [unpack_rows(buffer, RowLayout.of(tables(0))) for buffer in received[-1]]
    with_sides = messages.wait(timeout=20.0)
    all_to_all.close()
    result = {"received": received[:-1], "tables": unpacked, "own": own, "bytes": [h.bytes for h in handles],
              "messages": with_sides, "message_bytes": messages.bytes}
    torch.save(result, out / f"result{rank}.pt")


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_receives_what_each_sender_sent_it(tmp_path: Path, world_size: int) -> None:
    _spawn(_exchanges, world_size, tmp_path)
    row_bytes = RowLayout.of(tables(0)).row_bytes
    for rank in range(world_size):
        result = torch.load(tmp_path / f"result{rank}.pt", weights_only=False)
        assert all(result["own"]), "a rank's own piece is handed back as is"
        for case, got in enumerate(result["received"]):
            assert len(got) == world_size
            for src, rows in enumerate(got):
                expected = piece(case, src, rank, world_size)
                assert rows.dtype == expected.dtype and torch.equal(rows, expected), (CASES[case][0], src, rank)
        for src, got in enumerate(result["tables"]):
            assert_tables_equal(got, tables(1 + src + 2 * rank))
        counts = 8 * world_size
        for case, spent in enumerate(result["bytes"][:-1]):
            sent = sum(piece(case, rank, dst, world_size).nbytes for dst in range(world_size) if dst != rank)
            got = sum(piece(case, src, rank, world_size).nbytes for src in range(world_size) if src != rank)
            assert (spent.sent, spent.received) == (counts + sent, counts + got), CASES[case][0]
        others = [r for r in range(world_size) if r != rank]
        assert result["bytes"][-1].sent == counts + row_bytes * sum(1 + rank + 2 * dst for dst in others)
        assert result["bytes"][-1].received == counts + row_bytes * sum(1 + src + 2 * rank for src in others)
        for src, got in enumerate(result["messages"]):
            assert_tables_equal(got, message(src, rank))
        spent = result["message_bytes"]
        assert spent.sent == counts + sum(message_bytes(rank, dst) for dst in others)
        assert spent.received == counts + sum(message_bytes(src, rank) for src in others)


def weight(src: int, dst: int) -> float:
    """The receiver ``dst``'s weight on the rows from ``src`` in its loss (0: it leaves them out)."""
    return 0.0 if (src, dst) == (1, 1) else 1.0 + src + 10.0 * dst


def _gradients(rank: int, world_size: int, out: Path) -> None:
    """Send float pieces (rank 1 sends rank 0 none), take loss = sum over sources of weight * rows ** 2, backward."""
    rows = [0 if (rank, dst) == (1, 0) else 2 + rank + dst for dst in range(world_size)]
    pieces = [torch.randn(n, 3, generator=torch.Generator().manual_seed(10 * rank + dst)) for dst, n in enumerate(rows)]
    leaves = [p.clone().requires_grad_() for p in pieces]
    received = all_to_all_rows(leaves, timeout=20.0)
    loss = sum(weight(src, rank) * (got**2).sum() for src, got in enumerate(received) if weight(src, rank))
    loss.backward()
    result = {"pieces": pieces, "grads": [leaf.grad for leaf in leaves], "received": [r.detach() for r in received]}
    torch.save(result, out / f"result{rank}.pt")


def test_gradients_of_the_received_rows_reach_their_senders(tmp_path: Path) -> None:
    _spawn(_gradients, 2, tmp_path)
    results = [torch.load(tmp_path / f"result{rank}.pt") for rank in range(2)]
    for src in range(2):
        for dst in range(2):
            sent = results[src]["pieces"][dst]
            assert torch.equal(results[dst]["received"][src], sent)
            expected = 2.0 * weight(src, dst) * sent  # d/dx of weight * x ** 2 summed, at the receiver
            assert torch.allclose(results[src]["grads"][dst], expected, rtol=1e-6, atol=0), (src, dst)
    assert results[1]["pieces"][0].shape[0] == 0 and not results[1]["grads"][1].any(), "an unused piece gets zeros"


def _timeout(rank: int, world_size: int, out: Path) -> None:
    """Rank 0 starts an exchange rank 1 never starts: a short wait, then the progress thread's own timeout, then
    a later exchange fails with it, and close returns. Rank 1 waits for rank 0 to finish (at most 20 s)."""
    if rank == 1:
        deadline = time.monotonic() + 20.0
        while not (out / "result0.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    all_to_all = RowAllToAll(timeout=1.0)
    started = time.monotonic()
    handle = all_to_all.start([torch.ones(2, 3), torch.ones(4, 3)], "fetch of step 12")
    result = {"start_s": time.monotonic() - started, "done": handle.done()}
    for name, timeout in (("wait", 0.2), ("thread", 10.0)):
        started = time.monotonic()
        try:
            handle.wait(timeout=timeout)
            result[name] = "no timeout"
        except TimeoutError as error:
            result[name] = str(error)
        result[f"{name}_s"] = time.monotonic() - started
    later = all_to_all.start([torch.ones(1, 3), torch.ones(1, 3)], "fetch of step 13")
    try:
        later.done()
        result["later"] = "no error"
    except TimeoutError as error:
        result["later"] = str(error)
    started = time.monotonic()
    all_to_all.close()
    result["close_s"] = time.monotonic() - started
    torch.save(result, out / "result0.pt")


def test_a_wait_on_a_rank_that_never_joins_times_out_by_name_and_fails_later_exchanges(tmp_path: Path) -> None:
    _spawn(_timeout, 2, tmp_path)
    result = torch.load(tmp_path / "result0.pt")
    assert result["start_s"] < 0.5 and result["done"] is False, "start returns at once, done never blocks"
    expected = "fetch of step 12: the counts all_to_all of ranks 0..1"
    assert result["wait"] == f"waited 0.2 s for {expected}" and result["wait_s"] < 1.0
    assert result["thread"] == f"waited 1 s for {expected}", "the progress thread's own timeout"
    assert result["thread_s"] < 5.0
    assert result["later"] == result["thread"], "a later exchange fails with the same error"
    assert result["close_s"] < 1.0
