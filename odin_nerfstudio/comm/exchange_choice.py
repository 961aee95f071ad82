"""The byte model of an exchange, and the choice it drives between sparse all-gather, union-then-reduce and dense
all-reduce; one model for the distributed transport (``comm/distributed.py``) and the simulator's interconnect.

Per step, the gradient rows travel by the cheapest of three exchanges (bytes a rank sends, as many received, ring
model, :class:`RingBytes`; D the packed gradient width, R the longest rows of any rank, W ranks;
:meth:`ExchangeShape.predict`):
(a) ``sparse``, the all-gather of every rank's rows padded to R with their indices, (W - 1) R (8 + 4 D),
O(W |A|); (b) ``union``, all-gather the row indices ((a) needs them anyway), agree on their union U, then all_reduce
(sum) only [|U|, D], (W - 1) 8 R + 2 (W - 1) / W |U| 4 D; (c) ``dense``, all_reduce [N, D + 1] with no indices at
all (the last column counts the ranks that touched a row: U is where it is positive), 2 (W - 1) / W N 4 (D + 1),
O(N) whatever W, N being the largest row touched + 1. The choice is made from what every rank knows, so it is the
same on every rank: after the header, dense if its bytes are below sparse's and union's with |U| estimated from
the sizes (:func:`estimated_union`); otherwise after the indices, with the exact |U|, union if cheaper than sparse.
Cheaper means less predicted time, in bytes (:meth:`RingBytes.fastest`): bytes plus each collective's latencies at
the link's latency x bandwidth (``latency_bytes``: measured at start-up, ``comm/calibration.py``, or the emulated
link's), so that a few bytes saved do not cost many latencies. The tasks' statistics always travel by all-gather.
A transport may force one (``choice``; the trainer's ``--exchange``).

Every choice gives every rank the same merged update (rows, bits, statistics in rank order). For W = 2 all three
equal ``sum_in_order`` bit for bit: a row's sum is g0 + g1, g0 + 0 or 0 + g1, and two-term float addition
commutes (``sum_in_order`` starts a row from 0 and adds each rank's part, so a rank without the row adds
nothing; only the sign of a zero can differ, which no consumer tells apart). For W > 2, union and dense sum in
the order of the backend's all_reduce algorithm (chunk by chunk around a ring or tree), not in rank order: the
bits may differ from ``sum_in_order``'s (and so from the in-process transport's) in the last place, while every
rank gets the same bits (a ring reduces each chunk once and copies it to every rank; shown for gloo with W = 4
by tests/comm/test_exchange_choice.py, not tested on NCCL). Force ``sparse`` where W > 2 runs must match the
in-process run bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from odin_nerfstudio.comm.wire import INDEX_BYTES, Sizes, StatsLayout, longest_of

ExchangeChoice = Literal["auto", "sparse", "union", "dense"]
"""How the gradient rows of an exchange travel: chosen per step by predicted time ("auto"), or forced."""
CHOICES: tuple[str, ...] = ("sparse", "union", "dense")
"""The three exchanges, in the order a tie is broken (the sparse all-gather first)."""


@dataclass(frozen=True)
class RingBytes:
    """The bytes a rank sends (and as many received) in ring collectives of W = ``world_size`` ranks, and so per
    exchange."""

    world_size: int

    def all_gather(self, nbytes: int) -> int:
        """Bytes a rank sends (and receives) in a ring all_gather of ``nbytes`` per rank: (W - 1) x nbytes."""
        return (self.world_size - 1) * nbytes

    def all_reduce(self, nbytes: int) -> int:
        """Bytes a rank sends (and receives) in a ring all_reduce of ``nbytes``: 2 (W - 1) / W x nbytes."""
        return 2 * (self.world_size - 1) * nbytes // self.world_size

    def sent(self, collectives: Iterable[tuple[str, int]]) -> int:
        """Bytes a rank sends (and receives) in ``collectives``: (kind, bytes of the tensor a rank passes), kind
        "all_gather" or "all_reduce"."""
        return sum(self.all_gather(n) if kind == "all_gather" else self.all_reduce(n) for kind, n in collectives)

    def choices(self, indices: int, gradients: int, union: int, dense: int, gathered: int = 0) -> dict[str, int]:
        """Per exchange (in :data:`CHOICES` order), the bytes a rank sends: ``gathered``, what every exchange
        all-gathers per rank besides the rows (header, statistics); ``indices`` and ``gradients``, the longest rank's
        row indices and gradient rows; ``union``, the gradient rows of the union U; ``dense``, the [N, D + 1] of the
        dense exchange."""
        return {
            "sparse": self.all_gather(gathered + indices + gradients),
            "union": self.all_gather(gathered + indices) + self.all_reduce(union),
            "dense": self.all_gather(gathered) + self.all_reduce(dense),
        }

    def latencies(self) -> dict[str, int]:
        """Per exchange, the latency terms of the collectives that differ between them (ring model): the sparse
        all-gather W - 1, union-then-reduce's all-gather and all_reduce 3 (W - 1), the dense all_reduce 2 (W - 1)."""
        hops = self.world_size - 1
        return {"sparse": hops, "union": 3 * hops, "dense": 2 * hops}

    def fastest(self, predicted: dict[str, int], latency_bytes: float = 0.0) -> str:
        """The exchange of ``predicted`` (some of :data:`CHOICES`, their bytes) with the least predicted time,
        counted in bytes: its bytes plus its latencies x ``latency_bytes``, a link's latency x bandwidth (the bytes
        it moves while one message waits; 0: the fewest bytes win). Behind a 10 GbE-class link (62.5 KB) at W = 8,
        union-then-reduce's 14 latencies more than the all-gather's cost 875 KB: it must save that many bytes."""
        latencies = self.latencies()
        return cheapest({name: nbytes + latencies[name] * latency_bytes for name, nbytes in predicted.items()})


def cheapest(predicted: dict[str, int | float]) -> str:
    """The exchange of ``predicted`` (some of :data:`CHOICES`, their costs) with the least cost; a tie goes to the
    earlier in :data:`CHOICES`."""
    return min(sorted(predicted, key=CHOICES.index), key=predicted.__getitem__)


@dataclass(frozen=True)
class ExchangeShape(RingBytes):
    """What the byte formulas need besides the ranks' sizes: W, the packed gradient width D and its element size,
    the statistics' layout, and G, the parameters (whose squared norms ride in the header)."""

    width: int
    itemsize: int
    layout: StatsLayout
    num_params: int

    def predict(self, sizes: Sequence[Sizes], union_rows: int) -> dict[str, int]:
        """Per choice, the bytes a rank sends (and as many received) in the exchange of these sizes (every
        collective: header, indices, statistics, gradient rows), with ``union_rows`` = |U|.

        sparse: (W - 1) [R (8 + 4 D) + S], union: (W - 1) (8 R + S) + 2 (W - 1) / W |U| 4 D,
        dense: (W - 1) S' + 2 (W - 1) / W N (4 D + 4), with R the longest rows of any rank, S (S') the statistics'
        message with (without) the rows' padding, N the largest span, 4 the gradients' element size.
        """
        longest = longest_of(sizes)
        header = (len(dataclasses.fields(Sizes)) + self.num_params) * INDEX_BYTES
        index_columns = longest.entries * len(self.layout.index_names) + longest.tasks
        values = 0
        if longest.entries and self.layout.value_names:
            values = longest.entries * len(self.layout.value_names) * _itemsize(self.layout.value_dtype)
        row = self.width * self.itemsize
        return self.choices(
            indices=INDEX_BYTES * longest.rows,
            gradients=longest.rows * row,
            union=union_rows * row,
            dense=longest.span * (self.width + 1) * self.itemsize,
            gathered=header + INDEX_BYTES * index_columns + values,
        )


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def estimated_union(sizes: Sequence[Sizes]) -> int:
    """|U| predicted from the sizes alone: rows drawn independently from [0, N) (N the largest span),
    N (1 - prod(1 - R_r / N)), clamped to the bounds max R_r <= |U| <= min(N, sum R_r)."""
    span = max(s.span for s in sizes)
    if span == 0:
        return 0
    missed = math.prod(1.0 - s.rows / span for s in sizes)
    estimate = round(span * (1.0 - missed))
    return min(max(estimate, max(s.rows for s in sizes)), span, sum(s.rows for s in sizes))


@dataclass(frozen=True)
class ExchangeBytes:
    """What one exchange cost one rank, for the meter and the interconnect model.

    Attributes:
        choice: the exchange that ran ("sparse", "union" or "dense").
        predicted: per choice, the bytes :meth:`ExchangeShape.predict` gives (sent, and as many received); the
            union's is exact when the rows were gathered (``union_exact``), else from :func:`estimated_union`.
        union_exact: whether |U| was known.
        sent: bytes this rank sent, counted from the tensors passed to the collectives (ring model: an all_gather
            of b bytes per rank sends (W - 1) b, an all_reduce of b bytes 2 (W - 1) / W b).
        received: bytes received, counted the same way (the ring receives what it sends).
        collectives: each collective issued, in order: (kind, bytes of the tensor a rank passed).
    """

    choice: str
    predicted: dict[str, int]
    union_exact: bool
    sent: int
    received: int
    collectives: tuple[tuple[str, int], ...]
