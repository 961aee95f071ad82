"""Waiting for a collective in flight, the one way every progress thread of ``comm/`` does it.

Why not ``work.wait(timeout)``: on gloo a work-level timeout is handed to the collective's own sends and receives,
so a short one fails the collective when a peer is late (seen as step 0's exchange hanging on both ranks under
load), and on NCCL an expired one may abort the communicator. So a wait is bounded here, by the caller's timeout
(``TimeoutError`` naming what it waited for), and only then waits on the work, which raises a failed collective's
error and, on NCCL, orders the thread's stream after it.

On gloo the thread sleeps until the work's future completes (woken by gloo, checking whether its owner closed every
:data:`CLOSE_CHECK_S`): polling ``is_completed`` every 0.5 ms woke it about 150 times per exchange while a peer
rendered, CPU taken from the renders beside it on a loaded machine. On NCCL, whose future completes once the
collective is enqueued, it polls ``is_completed`` (the GPU's completion) every :data:`POLL_S`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

POLL_S = 0.0005
"""How often a wait polls a collective in flight on NCCL."""
CLOSE_CHECK_S = 0.05
"""How often a wait, asleep on a gloo collective, checks whether its owner was closed."""


class Closed(Exception):
    """The owner of a progress thread was closed while the thread waited for a collective."""


def wait_for_work(work: Any, device: torch.device, timeout: float, closed: threading.Event | None, what: str) -> None:
    """Wait for a collective's ``work`` on ``device``'s backend at most ``timeout`` s, noticing ``closed``
    (:class:`Closed`); raises ``TimeoutError`` ("waited ... for ``what``") or the collective's error ("``what``
    failed: ...")."""
    deadline = time.monotonic() + timeout
    arrived = _arrival(work) if device.type == "cpu" else None
    while not (work.is_completed() if arrived is None else arrived.is_set()):
        if closed is not None and closed.is_set():
            raise Closed
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"waited {timeout:.3g} s for {what}")
        if arrived is None:
            time.sleep(POLL_S)
        else:
            arrived.wait(min(CLOSE_CHECK_S, deadline - now))
    try:
        work.wait()
    except RuntimeError as error:
        raise RuntimeError(f"{what} failed: {error}") from error


def wait_for_handle(
    condition: threading.Condition,
    arrived: Callable[[], bool],
    error: Callable[[], BaseException | None],
    timeout: float,
    what: Callable[[], str],
) -> None:
    """What a handle's ``wait`` does, with ``condition`` held: wait at most ``timeout`` s until ``arrived()`` or the
    progress thread's ``error()``; raise that error, or ``TimeoutError`` naming ``what()``."""
    finished = condition.wait_for(lambda: arrived() or error() is not None, timeout=max(timeout, 0.0))
    failed = error()
    if failed is not None:
        raise failed
    if not finished:
        raise TimeoutError(f"waited {timeout:.3g} s for {what()}")


def _arrival(work: Any) -> threading.Event:
    """An event set once ``work``'s future completes (with its result or its error)."""
    arrived = threading.Event()
    work.get_future().add_done_callback(lambda _: arrived.set())
    return arrived
