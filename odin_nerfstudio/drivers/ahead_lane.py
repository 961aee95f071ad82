"""The lane the sharded loop renders tasks ahead on (``drivers/sharded_loop.py``): a thread beside the loop's (or a
simulation's virtual lane), so that the loop publishes and starts the next exchange as soon as a return arrives,
not when a render ends; every rank waits for that exchange."""

from __future__ import annotations

from collections.abc import Callable

from odin_nerfstudio.runtime.lanes import LaneExecutor, LaneFuture


class AheadLane:
    """One batch of renders at a time beside the loop, joined before the loop renders again or reads which tasks
    started.

    Args:
        executor: where the renders run (``runtime/lanes.LaneExecutor``: threads, or virtual time).
        rank: the loop's rank (a timeout names it).
        timeout_s: the longest a join waits.
    """

    def __init__(self, executor: LaneExecutor, rank: int, timeout_s: float) -> None:
        self.executor, self.rank, self.timeout_s = executor, rank, timeout_s
        self._work: tuple[int, LaneFuture] | None = None
        """The renders in flight and the step during which they started."""

    def start(self, step: int, renders: Callable[[], None]) -> None:
        """Start ``renders`` on the lane during step ``step`` (the lane joined first)."""
        self.join()
        self._work = (step, self.executor.submit(renders))

    def join(self) -> None:
        """Wait for the renders in flight (bounded by ``timeout_s``); re-raises their error."""
        if self._work is None:
            return
        step, work = self._work
        self._work = None
        if not work.done() and not self.executor.wait_any([work], self.timeout_s):
            raise TimeoutError(
                f"rank {self.rank}: the tasks rendered ahead during step {step} did not finish in {self.timeout_s} s"
            )
        work.result()

    def close(self) -> None:
        """Join, then stop the lane's thread (at the end of a run)."""
        self.join()
        self.executor.shutdown()
