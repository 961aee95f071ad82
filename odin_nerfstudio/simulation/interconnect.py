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
- every collective adds ``base_s`` after the last part is sent: the real transport's own time (gloo on loopback).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from odin_nerfstudio.comm.link import link_preset

Collective = Literal["emulated", "allgather", "ring-allreduce"]


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
        dense_bytes: the model's bytes, for ``ring-allreduce``.
    """

    name: str = "none"
    latency_s: float = 0.0
    bandwidth_bytes_per_s: float = math.inf
    collective: Collective = "emulated"
    hops: Literal["ring", "tree"] = "ring"
    base_s: float = 0.0
    dense_bytes: int = 0

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.base_s < 0 or not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"interconnect {self.name}: latency and base must be >= 0, bandwidth > 0")

    @classmethod
    def preset(cls, name: str, collective: Collective = "emulated", base_s: float = 0.0) -> Interconnect:
        """``comm/link.py``'s preset ``name`` (``none``: loopback, no link term) under ``collective``."""
        link = link_preset(name)
        if link is None:
            return cls("none", collective=collective, base_s=base_s)
        return cls(name, link.latency_s, link.bandwidth_bytes_per_s, collective, base_s=base_s)

    def delivery_s(self, sends: Sequence[float], nbytes: Sequence[int]) -> float:
        """When every worker holds the step's merged update: ``sends`` [W] the parts' send times, ``nbytes`` [W]
        their sizes."""
        workers = len(sends)
        last = max(sends) + self.base_s
        if self.collective == "emulated":
            arrivals = [send + self.latency_s + size / self.bandwidth_bytes_per_s for send, size in zip(sends, nbytes)]
            return max(last, *arrivals)
        if workers == 1:
            return last
        if self.collective == "allgather":
            hops = workers - 1 if self.hops == "ring" else math.ceil(math.log2(workers))
            return last + hops * self.latency_s + (workers - 1) * max(nbytes) / self.bandwidth_bytes_per_s
        ring = 2 * (workers - 1)
        return last + ring * self.latency_s + ring / workers * self.dense_bytes / self.bandwidth_bytes_per_s
