"""When a step's exchange is delivered, given when each worker sent its part and how many bytes it carries.

Why a model: this machine has loopback only, and users run 8-64 GPUs behind real links. The simulator asks one
question per step: the time every worker holds the merged update. Four answers, by ``collective``:

- ``emulated``: ``comm/link.py``'s emulation, what ``--interconnect`` runs on this machine: each part arrives
  everywhere at ``send_r + latency + bytes_r / bandwidth`` (no contention), the exchange at the latest arrival;
  exact for two workers, optimistic for more.
- ``allgather``: a ring all-gather of the sparse parts, which starts once the last part is sent:
  ``(W - 1) x max_r bytes_r / bandwidth + latency x hops``, hops ``W - 1`` (ring) or ``ceil(log2 W)`` (tree).
- ``ring-allreduce``: the dense baseline (DDP's barrier): ``2 (W - 1) / W x dense_bytes / bandwidth`` plus
  ``2 (W - 1)`` latencies, whatever the rows touched.
- ``chosen``: what ``comm/distributed.DistributedTransport`` runs, per step the exchange of least predicted time
  (bytes and latencies, ``RingBytes.fastest`` at this link's latency x bandwidth): the sparse
  all-gather above, union-then-reduce (an all-gather of the row indices, 8 bytes a row, then a ring all-reduce of
  the union's |U| gradient rows) or the dense all-reduce, each timed as a ring.
- the bytes of every collective are the transport's own byte model (``comm/exchange_choice.py``'s
  :class:`RingBytes`, and its ``fastest`` for ``chosen``), given a part's rows of ``row_bytes`` each.
- every collective adds ``base_s`` after the last part is sent: the real transport's own time (gloo on loopback).

The sharded mode's row all-to-all (``comm/all_to_all.py``) is two collectives, the counts then the payload, and a
rank's piece for itself never crosses the link: :meth:`Interconnect.all_to_all_s` gives its time after the last
piece is sent, ``base_s`` plus one latency per collective (every rank sends to every peer at once, as gloo's and
NCCL's all-to-all post their sends together) plus the payload at the bandwidth: ``emulated``, the largest piece
(every pair its own link); any other, the most bytes one rank sends or receives (one link per rank).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from odin_nerfstudio.comm.calibration import link_latency_bytes
from odin_nerfstudio.comm.exchange_choice import RingBytes
from odin_nerfstudio.comm.link import link_preset
from odin_nerfstudio.comm.wire import INDEX_BYTES
from odin_nerfstudio.simulation.workload import ROW_BYTES

Collective = Literal["emulated", "allgather", "ring-allreduce", "chosen"]


@dataclass(frozen=True)
class Interconnect:
    """A link and the collective over it (see the module).

    Attributes:
        name: what it stands for.
        latency_s: per-message latency, seconds.
        bandwidth_bytes_per_s: bytes per second (``math.inf``: no bandwidth term).
        collective: how the parts travel.
        hops: latency terms of an all-gather: ``ring`` (W - 1) or ``tree`` (ceil(log2 W)).
        base_s: the transport's own time after the last part is sent.
        dense_bytes: the model's bytes, for ``ring-allreduce`` and ``chosen``.
        row_bytes: a part's bytes per row, its int64 index included, for ``chosen`` (the workload's ``ROW_BYTES``).
    """

    name: str = "none"
    latency_s: float = 0.0
    bandwidth_bytes_per_s: float = math.inf
    collective: Collective = "emulated"
    hops: Literal["ring", "tree"] = "ring"
    base_s: float = 0.0
    dense_bytes: int = 0
    row_bytes: int = 0

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.base_s < 0 or not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"interconnect {self.name}: latency and base must be >= 0, bandwidth > 0")

    @classmethod
    def preset(
        cls, name: str, collective: Collective = "emulated", base_s: float = 0.0, num_rows: int = 0
    ) -> Interconnect:
        """``comm/link.py``'s preset ``name`` (``none``: loopback, no link term) under ``collective``, for a model
        of ``num_rows`` rows of ``ROW_BYTES`` each (what the dense and chosen exchanges need)."""
        link = link_preset(name)
        sizes = {"base_s": base_s, "dense_bytes": num_rows * ROW_BYTES, "row_bytes": ROW_BYTES}
        if link is None:
            return cls("none", collective=collective, **sizes)
        return cls(name, link.latency_s, link.bandwidth_bytes_per_s, collective, **sizes)

    @property
    def latency_bytes(self) -> float:
        """The link's latency x bandwidth: what the transport's choice weighs a latency at."""
        return link_latency_bytes(self.latency_s, self.bandwidth_bytes_per_s)

    def delivery_s(self, sends: Sequence[float], nbytes: Sequence[int], union_rows: int = 0) -> float:
        """When every worker holds the step's merged update: ``sends`` [W] the parts' send times, ``nbytes`` [W]
        their sizes, ``union_rows`` |U| the rows of their union (for ``chosen``)."""
        workers = len(sends)
        last = max(sends) + self.base_s
        if self.collective == "emulated":
            arrivals = [send + self.latency_s + size / self.bandwidth_bytes_per_s for send, size in zip(sends, nbytes)]
            return max(last, *arrivals)
        if workers == 1:
            return last
        costs = self.costs(workers, max(nbytes), union_rows)
        if self.collective == "chosen":
            chosen = RingBytes(workers).fastest({name: cost[0] for name, cost in costs.items()}, self.latency_bytes)
            return last + costs[chosen][1]
        return last + costs["sparse" if self.collective == "allgather" else "dense"][1]

    def costs(self, workers: int, longest: int, union_rows: int) -> dict[str, tuple[float, float]]:
        """Per exchange (sparse, union, dense): the bytes a rank sends and the time it takes after the last send,
        for W = ``workers`` parts of at most ``longest`` bytes and a union of ``union_rows`` rows (union only where
        a part's rows are known: ``row_bytes``, each with its int64 index)."""
        hops = workers - 1 if self.hops == "ring" else math.ceil(math.log2(workers))
        ring = 2 * (workers - 1)
        indices = INDEX_BYTES * (longest // self.row_bytes) if self.row_bytes else 0
        union = union_rows * (self.row_bytes - INDEX_BYTES) if self.row_bytes else 0
        sent = RingBytes(workers).choices(indices, longest - indices, union, self.dense_bytes)
        if not self.row_bytes:
            del sent["union"]
        latencies = {"sparse": hops, "union": hops + ring, "dense": ring}
        return {
            name: (nbytes, latencies[name] * self.latency_s + nbytes / self.bandwidth_bytes_per_s)
            for name, nbytes in sent.items()
        }

    def all_to_all_s(self, nbytes: Sequence[Sequence[int]]) -> float:
        """Seconds a row all-to-all takes after its last piece is sent (see the module): ``nbytes[r][d]`` the bytes
        rank r sends rank d."""
        workers = len(nbytes)
        if workers == 1:
            return self.base_s
        crossing = [[0 if src == dest else size for dest, size in enumerate(row)] for src, row in enumerate(nbytes)]
        if self.collective == "emulated":
            payload = max(max(row) for row in crossing)
        else:
            received = [sum(row[dest] for row in crossing) for dest in range(workers)]
            payload = max(max(sum(row) for row in crossing), max(received))
        return self.base_s + 2 * self.latency_s + payload / self.bandwidth_bytes_per_s
