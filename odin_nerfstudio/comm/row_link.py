"""The emulated link (``link.py``) under the sharded mode's row all-to-all, so that ``--interconnect`` stages the
sharded modes as it stages the replicated ones.

The model is the replicated one's, per exchange instead of per step: rank r's message leaves when r starts the
exchange and arrives everywhere at ``sent_r + latency + bytes_r / bandwidth``, bytes_r being the rows r sends to the
other ranks (the piece it keeps crosses no link); the exchange is delivered on every rank at the latest arrival.
Every rank starts the same row exchanges in the same order (``runtime/sharding.py``'s ``RowExchange``), so their
sequence number keys the arrivals on the board.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from odin_nerfstudio.comm.link import ArrivalBoard, Clock, LinkedHandle, LinkModel, LocalBoard, Sleep, StoreBoard


def sent_bytes(pieces: Sequence[Mapping[str, Tensor]], rank: int) -> int:
    """Bytes of the row tables ``rank`` sends to the other ranks (every column of every piece but its own)."""
    return sum(
        tensor.numel() * tensor.element_size()
        for destination, piece in enumerate(pieces)
        if destination != rank
        for tensor in piece.values()
    )


class LinkedRowExchange:
    """A rank's row exchange with every message delayed by a :class:`~odin_nerfstudio.comm.link.LinkModel`.

    Args:
        inner: the real row exchange (this rank's end; ``runtime/sharding.py``'s ``RowExchange``).
        link: the modeled link.
        board: where the ranks post their messages' arrivals (shared by all of them).
        rank: this rank.
        clock: seconds, the same clock on every rank.
        sleep: how a wait sleeps (tests pass one that advances a fake clock).
    """

    def __init__(
        self,
        inner: Any,
        link: LinkModel,
        board: ArrivalBoard,
        rank: int,
        clock: Clock = time.time,
        sleep: Sleep = time.sleep,
    ) -> None:
        self.inner, self.link, self.board = inner, link, board
        self.worker, self.clock, self.sleep = rank, clock, sleep
        self._started = 0

    def start(self, pieces: Sequence[Mapping[str, Tensor]], what: str) -> LinkedHandle:
        """Post the message's departure and modeled arrival, then start the real exchange; never blocks."""
        number, now = self._started, self.clock()
        self._started += 1
        self.board.post(number, self.worker, now, now + self.link.delay_s(sent_bytes(pieces, self.worker)))
        return LinkedHandle(self.inner.start(pieces, what), number, self, f"{what} (row exchange {number})")

    def close(self) -> None:
        """Close the real exchange, where it has anything to close."""
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


def linked_rows(inner: Any, link: LinkModel, rank: int, world_size: int) -> LinkedRowExchange:
    """This rank's row exchange behind ``link``: arrivals on the process group's store for several ranks, on an
    in-process board for one."""
    board = StoreBoard(world_size, namespace="rows") if world_size > 1 else LocalBoard(1)
    return LinkedRowExchange(inner, link, board, rank)
