"""The modeled link under the sharded mode's row exchanges: each exchange is delivered at the latest arrival of the
ranks' messages (sent + latency + the bytes sent to the other ranks / bandwidth), exchanges keyed by their order;
the rows delivered are the real exchange's."""

from __future__ import annotations

import pytest
import torch

from odin_nerfstudio.comm.inprocess import VirtualRowExchange
from odin_nerfstudio.comm.link import LocalBoard
from odin_nerfstudio.comm.row_link import LinkedRowExchange, sent_bytes
from tests.comm.test_link import LINK, FakeClock


def _pieces(rank: int, rows: list[int]) -> list[dict[str, torch.Tensor]]:
    """Rank ``rank``'s pieces: ``rows[d]`` rows (int64 ids and 3 float32 columns: 20 bytes a row) for rank d."""
    return [
        {"ids": torch.arange(n, dtype=torch.int64) + 100 * rank, "means": torch.full((n, 3), float(rank))}
        for n in rows
    ]


def test_sent_bytes_count_every_piece_but_the_ranks_own() -> None:
    assert sent_bytes(_pieces(0, [5, 2, 1]), rank=0) == (2 + 1) * 20
    assert sent_bytes(_pieces(1, [5, 2, 1]), rank=1) == (5 + 1) * 20


def test_each_row_exchange_is_delivered_at_its_latest_arrival_in_order() -> None:
    clock, real = FakeClock(), VirtualRowExchange(2)
    board = LocalBoard(2)
    ends = [LinkedRowExchange(real.endpoint(r), LINK, board, r, clock, clock.sleep) for r in range(2)]
    sizes = [[4, 50], [0, 7]]  # rank 0 sends 50 rows on, rank 1 keeps 7 and sends none
    first = [end.start(_pieces(r, sizes[r]), "fetch of step 0") for r, end in enumerate(ends)]
    clock.now = 3.0
    second = [end.start(_pieces(r, [1, 1]), "return of step 0") for r, end in enumerate(ends)]
    delivery = max(LINK.delay_s(50 * 20), LINK.delay_s(0))
    assert delivery == pytest.approx(2.0) and clock.slept == [], "starting an exchange never sleeps"
    received = first[1].wait(timeout=10.0)
    assert clock.slept == [], "the fetch was delivered at 2 s, before the clock's 3 s"
    assert [part["ids"].tolist() for part in received] == [list(range(50)), list(range(100, 107))]
    later = 3.0 + LINK.delay_s(20)  # the return: one row to the other rank each, started at 3 s
    second[0].wait(timeout=10.0)
    assert clock.now == pytest.approx(later) and len(clock.slept) == 1
    with pytest.raises(TimeoutError, match=r"return of step 0 \(row exchange 1\): the modeled link"):
        clock.now = 3.0
        second[1].wait(timeout=0.5)
