"""How many intra-op torch threads a process of odin-splat runs on the CPU: the plugin's rule, per rank.

Why the plugin chooses: torch takes as many threads as the machine has cores, whoever else runs there. The CPU
rasterizer's many small operations meet at a barrier of every thread each time, so a thread that waits for a core
stalls all of them: on the 2-core development machine with other jobs beside it, a render on 2 threads ran 3 to 20
times slower than on one (ns-eval: 0.53 against 11.1 views/s). The rule gives each process the cores it really has:

- the cores it may run on (``os.sched_getaffinity``: a container's or ``taskset``'s CPU set, not the machine's
  count), within the container's CPU quota (cgroup ``cpu.max``) when it sets one;
- shared among the processes of its node (``LOCAL_WORLD_SIZE``, which torchrun sets; one otherwise);
- for a command that does not train (ns-eval, ns-export, ns-render, ns-viewer), fewer when the machine is already
  busy: no more than its share of the cores the 1-minute load average leaves idle. Training (ns-train, odin-train)
  never looks at the load: its count depends only on the machine and the ranks, so two runs of one command on one
  machine reduce in the same order and resume is exact (CPU float sums can change with the thread count);
- at least one.

``ODIN_CPU_THREADS=N`` (or the trainer's flag, when given) sets the count instead; ``OMP_NUM_THREADS``, when set,
is left as torch applied it. Applied once by every entry point: ``odin-train`` and the ns-* commands that load
odin-splat (``ns-train``, ``ns-eval``, ``ns-export``, ``ns-viewer``, ``ns-render``, through the method's entry point,
``odin_nerfstudio/ns/startup.py``). Odin's exactness (quality-first equals the barrier bit for bit) holds at any
count: the tests that show it run at one thread and at :func:`machine_threads`, the rule's count on an idle machine
(``tests/conftest.py``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

ENV = "ODIN_CPU_THREADS"
"""The environment variable that sets the thread count per process instead of the rule."""
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
"""cgroup v2's CPU quota of this container ("max 100000" when unlimited)."""


def affinity_cores() -> int:
    """The cores this process may run on (its CPU set), within the cgroup's CPU quota when one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def local_ranks(environ: Mapping[str, str] = os.environ) -> int:
    """The processes of this node that share its cores: torchrun's ``LOCAL_WORLD_SIZE``, else 1."""
    try:
        return max(1, int(environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def busy_cores() -> float:
    """The machine's 1-minute load average (runnable tasks), 0 where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def rule(cores: int, ranks: int, busy: float = 0.0) -> int:
    """Threads per process: the process's share of ``cores`` among ``ranks``, and no more than its share of the
    cores ``busy`` leaves idle (rounded to the nearest), at least 1."""
    share = max(1, cores // max(1, ranks))
    idle = max(0.0, cores - busy) / max(1, ranks)
    return max(1, min(share, int(idle + 0.5)))


def machine_threads(environ: Mapping[str, str] = os.environ) -> int:
    """The rule on this machine as if it were idle: each local rank's share of the cores it may run on."""
    return rule(affinity_cores(), local_ranks(environ))


def _positive(name: str, value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{name}={value!r}: must be a whole number of threads >= 1")
    return count


def cpu_threads(requested: int = 0, environ: Mapping[str, str] = os.environ, training: bool = True) -> int | None:
    """The thread count for this process: ``requested`` when > 0, else ``ODIN_CPU_THREADS``, else None when
    ``OMP_NUM_THREADS`` is set (the user's choice, applied by torch), else the rule (with the current load for a
    command that does not train)."""
    if requested > 0:
        return requested
    if environ.get(ENV):
        return _positive(ENV, environ[ENV])
    if environ.get("OMP_NUM_THREADS"):
        return None
    return rule(affinity_cores(), local_ranks(environ), 0.0 if training else busy_cores())


def apply_cpu_threads(requested: int = 0, environ: Mapping[str, str] = os.environ, training: bool = True) -> int:
    """Set torch's intra-op thread count by :func:`cpu_threads`; returns the count now in force."""
    import torch

    count = cpu_threads(requested, environ, training)
    if count is not None and count != torch.get_num_threads():
        torch.set_num_threads(count)
    return torch.get_num_threads()
