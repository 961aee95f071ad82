"""Lanes: up to ``tasks_in_flight`` admitted tasks rendering at once in one process (the paper's B_gpu).

A lane runs one admitted read's gather, render and backward: the driver's own thread is one lane, ``count - 1``
threads (on CUDA each with its own stream) are the others. A round of the driver's reads starts together
(:meth:`Lanes.dispatch`): all but the last on lane threads, the last on the driver's thread meanwhile, so a
process with a single task to run renders it where it would without lanes (a lane thread would only add an idle
driver, whose OpenMP workers, still spinning after its last op, take a core from the render). The driver's thread
keeps every decision: it reads (culls, checks against pending writes, declares), stages what a lane
finished, validates, exchanges and publishes. A publication therefore runs beside the lanes' gathers, the case the
kernels' seqlocks exist for: a gather reads each row whole, old or new, and reads a row a publication holds again
once it is released (``ShadowGraph.gather``); validation then judges the read as it would any other. Torch
releases the GIL inside its ops, so two renders share the cores. Each lane runs torch at the driver's intra-op
thread count, so a task renders to the same bits on whichever thread runs it.

With one lane (the default) nothing runs on another thread: a read renders at once, when it starts.
"""

from __future__ import annotations

import concurrent.futures as futures
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from odin_nerfstudio.runtime.reads import Read

LaneWork = Callable[[Read, bool], dict[str, Any]]
"""(read, inline) -> the render's info: the read's gather, render and backward (``inline``: on the driver's
thread, which may then publish between render and backward)."""


class LaneFuture(Protocol):
    """A lane's work in flight, as ``concurrent.futures.Future`` offers it."""

    def done(self) -> bool: ...

    def result(self) -> Any: ...


class LaneExecutor(Protocol):
    """Where the lane threads' work runs: threads (:class:`ThreadExecutor`), or a simulation's virtual lanes."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> LaneFuture: ...

    def wait_any(self, running: Sequence[LaneFuture], timeout: float) -> bool: ...

    def shutdown(self) -> None: ...


class ThreadExecutor:
    """``count`` lane threads, each running torch at the driver's intra-op thread count (made on first use)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._pool: futures.ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> futures.Future:
        if self._pool is None:
            threads = torch.get_num_threads()
            self._pool = futures.ThreadPoolExecutor(
                self.count, "odin-lane", initializer=torch.set_num_threads, initargs=(threads,)
            )
        return self._pool.submit(fn, *args)

    def wait_any(self, running: Sequence[futures.Future], timeout: float) -> bool:
        """Block until one of ``running`` is done (at most ``timeout`` s); whether one is."""
        return bool(futures.wait(running, timeout, futures.FIRST_COMPLETED).done)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class Lanes:
    """The tasks in flight of one process: started in rounds, handed back (with their render's info) as they finish.

    Args:
        work: what a lane runs for a read (:data:`LaneWork`).
        count: the lanes, ``tasks_in_flight``: the driver's thread and ``count - 1`` threads.
        device: the model's device (on CUDA each lane has its own stream).
        timeout_s: the longest the driver waits for a lane (then TimeoutError naming the tasks in flight).
        executor: where the lane threads' work runs (default: ``count - 1`` threads).
    """

    def __init__(
        self,
        work: LaneWork,
        count: int,
        device: torch.device,
        timeout_s: float,
        executor: LaneExecutor | None = None,
    ) -> None:
        if count < 1:
            raise ValueError(f"tasks_in_flight must be >= 1, got {count}")
        self.work = work
        self.count = count
        self.device = device
        self.timeout_s = timeout_s
        self.executor = executor if executor is not None else ThreadExecutor(count - 1)
        self._queued: list[Read] = []
        self._running: list[tuple[Read, futures.Future]] = []
        self._done: list[tuple[Read, dict[str, Any]]] = []
        self._thread = threading.local()  # on CUDA: each lane thread's stream

    @property
    def in_flight(self) -> int:
        """Reads started and not yet handed back."""
        return len(self._queued) + len(self._running) + len(self._done)

    @property
    def free(self) -> bool:
        """Whether another read may start."""
        return self.in_flight < self.count

    def start(self, read: Read) -> None:
        """Start ``read``'s gather, render and backward: with one lane now, on this thread; else with this round's
        other reads, at the next :meth:`dispatch`."""
        if self.count == 1:
            self._done.append((read, self.work(read, True)))
        else:
            self._queued.append(read)

    def dispatch(self) -> None:
        """Start the round's reads: all but the last on lane threads, then the last on this thread (now)."""
        if not self._queued:
            return
        queued, self._queued = self._queued, []
        for read in queued[:-1]:
            driver = ready = None
            if self.device.type == "cuda":
                driver, ready = torch.cuda.current_stream(self.device), torch.cuda.Event()
                ready.record(driver)  # what the driver queued before: its publications
            self._running.append((read, self.executor.submit(self._run, read, driver, ready)))
        self._done.append((queued[-1], self.work(queued[-1], True)))

    def finished(self, block: bool = False) -> list[tuple[Read, dict[str, Any]]]:
        """:meth:`dispatch`, then the reads whose backward is done with their render's info (the driver's own first,
        then the lane threads' in start order); ``block``: wait for one first (bounded by ``timeout_s``) if none
        is. A lane's exception is raised here."""
        self.dispatch()
        if block and self._running and not self._done and not any(f.done() for _, f in self._running):
            if not self.executor.wait_any([f for _, f in self._running], self.timeout_s):
                keys = [read.task.key for read, _ in self._running]
                raise TimeoutError(f"tasks {keys} still rendering after {self.timeout_s} s (wait_timeout_s)")
        out, self._done = self._done, []
        still = []
        for read, future in self._running:
            if future.done():
                out.append((read, self._handed_over(future.result())))
            else:
                still.append((read, future))
        self._running = still
        return out

    def _run(
        self, read: Read, driver: torch.cuda.Stream | None, ready: torch.cuda.Event | None
    ) -> tuple[dict[str, Any], torch.cuda.Event | None]:
        """A lane thread's work for ``read``; on CUDA on the thread's stream, after what the ``driver`` stream
        queued before it (``ready``)."""
        if driver is None:
            return self.work(read, False), None
        if not hasattr(self._thread, "stream"):
            self._thread.stream = torch.cuda.Stream(self.device)
        stream = self._thread.stream
        with torch.cuda.stream(stream):
            stream.wait_event(ready)
            info = self.work(read, False)
            # The driver's stream uses the leaves' gradients and the info: keep their memory until it is done.
            for tensor in [*read.leaves.values(), *(leaf.grad for leaf in read.leaves.values()), *info.values()]:
                if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                    tensor.record_stream(driver)
            done = torch.cuda.Event()
            done.record(stream)
        return info, done

    def _handed_over(self, result: tuple[dict[str, Any], torch.cuda.Event | None]) -> dict[str, Any]:
        """A lane's result on the driver's thread: on CUDA its stream first waits for the lane's work."""
        info, done = result
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)
        return info

    def close(self) -> None:
        """Stop the lanes' threads (after the last read is handed back)."""
        self.executor.shutdown()
