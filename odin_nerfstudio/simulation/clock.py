"""A virtual clock for discrete-event simulation of processes that run real, blocking code.

Each simulated process runs the real loop (``drivers/training_loop.py``; sharded: ``drivers/sharded_loop.py``) on a
thread of its own, but only one runs at a time: the one whose next event is earliest. A process gives the clock back
when its work takes modeled time (:meth:`VirtualClock.spend`) or waits for something another process does
(:meth:`VirtualClock.wait`); the clock then advances to the next event. Nothing depends on the threads' real timing:
ties are broken by the order events were scheduled, so a simulation is deterministic.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
from collections.abc import Callable, Iterator, Sequence

When = Callable[[], float | None]
"""A condition a process waits for: the virtual time it holds from (seconds), or None while it does not."""


class Stuck(RuntimeError):
    """Every simulated process waits and no event is left: the modeled run cannot finish."""


class _Actor:
    def __init__(self, name: str, work: Callable[[], None]) -> None:
        self.name = name
        self.work = work
        self.go = threading.Event()
        self.waiting: tuple[When, str] | None = None
        self.done = False
        self.error: BaseException | None = None


class VirtualClock:
    """Runs actors (simulated processes) in virtual time, one at a time (see the module)."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self._heap: list[tuple[float, int, _Actor]] = []
        self._sequence = 0
        self._yielded = threading.Event()
        self._local = threading.local()
        self._actors: list[_Actor] = []

    def now_ns(self) -> int:
        """Virtual time in nanoseconds (a timeline's clock); inside :meth:`beside`, the lane's own time."""
        beside = getattr(self._local, "beside", None)
        return round((self.now_s if beside is None else beside[1] + beside[0]) * 1e9)

    def spend(self, seconds: float) -> None:
        """The calling process is busy for ``seconds`` of virtual time (inside :meth:`beside`: its lane is)."""
        beside = getattr(self._local, "beside", None)
        if beside is not None:
            beside[0] += max(seconds, 0.0)
            return
        actor = self._local.actor
        self._push(self.now_s + max(seconds, 0.0), actor)
        self._hand_back(actor)

    @contextlib.contextmanager
    def beside(self) -> Iterator[list[float]]:
        """Run work beside the calling process (a lane): its :meth:`spend` calls add up in the yielded ``[s, start]``
        instead of taking the process's time, and its clock reads ``start + s``; the caller decides when that work
        ends (``start + s``)."""
        self._local.beside = spent = [0.0, self.now_s]
        try:
            yield spent
        finally:
            self._local.beside = None

    def wait(self, when: When, what: str) -> None:
        """Block the calling process until ``when()`` gives a time, then resume at that time (or now, if later);
        ``what`` names the wait if the run gets stuck."""
        ready = when()
        if ready is not None and ready <= self.now_s:
            return
        actor = self._local.actor
        if ready is not None:
            self._push(ready, actor)
        else:
            actor.waiting = (when, what)
        self._hand_back(actor)

    def run(self, works: Sequence[tuple[str, Callable[[], None]]]) -> None:
        """Run every ``(name, work)`` to its end in virtual time; re-raises the first error of a work, and raises
        :class:`Stuck` naming what each process waits for if none can go on."""
        self._actors = [_Actor(name, work) for name, work in works]
        threads = [threading.Thread(target=self._body, args=(a,), name=a.name, daemon=True) for a in self._actors]
        for actor in self._actors:
            self._push(0.0, actor)
        for thread in threads:
            thread.start()
        try:
            while True:
                self._wake_waiters()
                if not self._heap:
                    break
                self.now_s, _, actor = heapq.heappop(self._heap)
                self._yielded.clear()
                actor.go.set()
                self._yielded.wait()
                if actor.error is not None:
                    raise actor.error
            waiting = {a.name: a.waiting[1] for a in self._actors if a.waiting is not None}
            if waiting:
                raise Stuck(f"simulation stuck at {self.now_s:.6f} s: {waiting}")
        finally:
            for actor in self._actors:  # release any thread still parked (after an error)
                actor.done = True
                actor.go.set()

    def _body(self, actor: _Actor) -> None:
        self._local.actor = actor
        actor.go.wait()
        actor.go.clear()
        try:
            if not actor.done:
                actor.work()
        except BaseException as error:  # handed to run(), which re-raises it
            actor.error = error
        actor.done = True
        self._yielded.set()

    def _hand_back(self, actor: _Actor) -> None:
        """Give the clock back and sleep until this actor's next event."""
        self._yielded.set()
        actor.go.wait()
        actor.go.clear()
        if actor.done:
            raise SystemExit  # the run ended with an error elsewhere: unwind this thread

    def _wake_waiters(self) -> None:
        """Schedule each waiting actor whose condition now holds."""
        for actor in self._actors:
            if actor.waiting is None:
                continue
            ready = actor.waiting[0]()
            if ready is not None:
                actor.waiting = None
                self._push(max(ready, self.now_s), actor)

    def _push(self, time: float, actor: _Actor) -> None:
        self._sequence += 1
        heapq.heappush(self._heap, (time, self._sequence, actor))
