"""Which ranks of a torchrun job still answer: a heartbeat per rank in torchrun's key-value store.

Why: a collective that times out only knows that some rank did not take part. Each rank's heartbeat thread bumps a
counter in the store every second (its own store client, so the main thread's collectives and store calls are never
shared with it). When a wait fails, :meth:`Heartbeat.silent` reads every rank's counter twice a few seconds apart:
ranks whose counter did not move are stopped or hung (SIGSTOP, a dead host), and the error can name them with their
host and pid. The comparison needs no synchronized clocks.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from dataclasses import dataclass

import torch.distributed as dist

PREFIX = "odin/liveness"
BEAT_INTERVAL_S = 1.0
"""How often each rank bumps its counter."""
SILENCE_S = 3.0
"""How long :meth:`Heartbeat.silent` watches the counters (three beats)."""
STORE_TIMEOUT = datetime.timedelta(seconds=10)
"""How long a store call waits (the store is torchrun's, on the master node)."""


@dataclass(frozen=True)
class Silent:
    """A rank whose heartbeat did not move, with where it runs."""

    rank: int
    host: str
    pid: int

    def __str__(self) -> str:
        return f"rank {self.rank} (pid {self.pid} on {self.host})"


def _client() -> dist.TCPStore:
    """A new client of torchrun's store (MASTER_ADDR:MASTER_PORT)."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=STORE_TIMEOUT
    )


class Heartbeat:
    """This rank's heartbeat (a daemon thread) and the view of every rank's."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._store = _client()
        self._store.set(f"{PREFIX}/where/{rank}", f"{socket.gethostname()} {os.getpid()}")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(_client(),), name="odin-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the heartbeat before the process group goes: a thread still inside a store call when the interpreter
        exits aborts the process ("terminate called without an active exception")."""
        self._stopped.set()
        self._thread.join(timeout=BEAT_INTERVAL_S + STORE_TIMEOUT.total_seconds())

    @staticmethod
    def _beat_key(rank: int) -> str:
        return f"{PREFIX}/beat/{rank}"

    def _beat(self, store: dist.TCPStore) -> None:
        """Bump this rank's counter every second until :meth:`stop` (a store error ends the thread)."""
        try:
            while not self._stopped.is_set():
                store.add(self._beat_key(self.rank), 1)
                self._stopped.wait(BEAT_INTERVAL_S)
        except RuntimeError:
            return

    def _counters(self) -> list[int]:
        return [self._store.add(self._beat_key(rank), 0) for rank in range(self.world_size)]

    def silent(self) -> list[Silent]:
        """The other ranks whose heartbeat did not move during :data:`SILENCE_S` seconds (blocks that long)."""
        before = self._counters()
        time.sleep(SILENCE_S)
        after = self._counters()
        ranks = [r for r in range(self.world_size) if r != self.rank and after[r] == before[r]]
        out = []
        for rank in ranks:
            host, pid = self._store.get(f"{PREFIX}/where/{rank}").decode().rsplit(" ", 1)
            out.append(Silent(rank, host, int(pid)))
        return out
