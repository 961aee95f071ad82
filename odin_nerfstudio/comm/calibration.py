"""The link's latency x bandwidth, measured at start-up, for the exchange choice's predicted time
(``exchange_choice.RingBytes.fastest``).

Why measured: the choice between the sparse all-gather, union-then-reduce and the dense all_reduce depends on how
many bytes one latency is worth, and that is a property of the cluster (a few KB on one machine's loopback, tens of
KB behind 10 GbE, MB on NVLink), not of the scene. Two timed all_reduces give it: a tiny one costs 2 (W - 1)
latencies L, one of n bytes adds 2 (W - 1) / W n / bandwidth, so L x bandwidth = t_tiny n / (W (t_n - t_tiny)).
Rank 0's figure is broadcast so that every rank makes the same choice.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

PROBE_BYTES = 4 << 20
"""The large all_reduce's size: large enough that bandwidth dominates it on 10 GbE and faster links."""


def _timed_all_reduce(tensor: torch.Tensor, group: Any, repeats: int) -> float:
    """The median seconds of ``repeats`` all_reduces of ``tensor`` (after one to warm up)."""
    times = []
    for index in range(repeats + 1):
        if tensor.is_cuda:
            torch.cuda.synchronize(tensor.device)
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        if tensor.is_cuda:
            torch.cuda.synchronize(tensor.device)
        if index:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_latency_bytes(device: torch.device, group: Any = None, repeats: int = 5) -> float:
    """The link's latency x bandwidth in bytes, measured by rank 0's timed all_reduces (every rank takes part) and
    the same on every rank; from the main thread, before any exchange is in flight."""
    world = dist.get_world_size(group)
    tiny = _timed_all_reduce(torch.zeros(1, device=device), group, repeats)
    large = _timed_all_reduce(torch.zeros(PROBE_BYTES // 4, device=device), group, repeats)
    figure = tiny * PROBE_BYTES / (world * max(large - tiny, 1e-9))
    shared = torch.tensor([figure], dtype=torch.float64, device=device)
    dist.broadcast(shared, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return float(shared.item())


def link_latency_bytes(latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """A modeled link's latency x bandwidth (``comm/link.py``'s presets: their slowing cancels out)."""
    return latency_s * bandwidth_bytes_per_s
