"""Work only rank 0 does (evaluation, checkpoints) never counts against the other ranks' wait timeouts.

Why: after rank 0 settles and starts evaluating, the other ranks used to go on to the next step and wait for
rank 0's exchange, failing after ``--runtime.wait-timeout-s`` although nothing was wrong. Now every rank meets at a
barrier right after that work, which knows what it waits for and has its own, generous timeout
(``--rank0-work-timeout-s``). It is issued after the runtime settled, when no exchange is in flight, so it keeps
the collectives in the same order on every rank.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable

import torch.distributed as dist
from nerfstudio.utils.rich_utils import CONSOLE

from odin_nerfstudio.comm.distributed import DistributedTransport, require_no_exchange_in_flight


def wait_for_rank0(what: str, step: int, timeout_s: float, transports: Iterable[DistributedTransport] = ()) -> float:
    """Every rank waits here until rank 0 has done ``what`` of ``step``; returns the seconds waited. No exchange
    of ``transports`` (the caller's) may be in flight.

    gloo's monitored barrier names the ranks that did not arrive; NCCL's barrier waits up to the process group's
    timeout.

    Raises:
        TimeoutError: the barrier was not reached by every rank within ``timeout_s``; names ``what`` and ``step``.
    """
    require_no_exchange_in_flight(f"the barrier after rank 0's {what} of step {step}", transports)
    start = time.monotonic()
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
        else:
            dist.barrier()
    except RuntimeError as error:
        raise TimeoutError(
            f"waited {time.monotonic() - start:.3g} s (--rank0-work-timeout-s {timeout_s:g}) at the barrier after "
            f"rank 0's {what} of step {step}: {error}"
        ) from error
    waited = time.monotonic() - start
    if dist.get_rank() != 0:
        CONSOLE.log(f"odin: waited {waited:.1f} s for rank 0's {what} of step {step}")
    return waited
