"""Publication and gathers run at once from two threads: with the row locks no read is torn, without them one is.

The model is built so that a torn read is visible: every row of the parameter holds one value repeated WIDTH
times, and every publication applies the same gradient to all of a row's elements, so Adam keeps a row uniform
(element-wise, the same operations on the same inputs). A gathered row whose elements differ mixes two
versions. One thread publishes all rows over and over (publish_adam), the other gathers them (gather_rows); torch
releases the GIL inside both ops, so they overlap on two cores. The rows are wide so that both threads spend most of
their time inside the ops rather than in Python under the GIL: with 512-wide rows a read met a locked row about once
in a million, and a CI run read 3 million rows without meeting one; 8,192-wide rows meet hundreds in 20,000 reads.
With the locks, rows caught mid-publication are reported ``locked`` (and that count must be positive: the mechanism
ran) and no other row is torn; with the locks switched off (``use_locks=False`` / ``check_locks=False``, the ops'
debug switch) torn rows are found, so the test can fail.
"""

from __future__ import annotations

import threading

import torch

from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.kernels import ops
from tests.kernels.conftest import require_compiled

ROWS = 16
WIDTH = 8192
MIN_READS = 20_000
MAX_READS = 2_000_000


def _race(locks: bool) -> dict[str, int]:
    """Publish and gather concurrently until MIN_READS rows were read and the awaited event (a locked row with
    locks, a torn row without) was seen, or MAX_READS; returns the counts."""
    params = {"values": torch.nn.Parameter(torch.arange(ROWS, dtype=torch.float32)[:, None].repeat(1, WIDTH))}
    optimizers = selective_adams(params, {"values": 0.05})
    seq = torch.zeros(ROWS, dtype=torch.int64)
    rows = torch.arange(ROWS, dtype=torch.int64)
    grads = {"values": torch.linspace(-1.0, 1.0, ROWS)[:, None].repeat(1, WIDTH)}
    reads = {"rows": 0, "torn": 0, "locked": 0, "publications": 0, "contention": 0}
    done = threading.Event()

    def publish() -> None:
        while not done.is_set():
            reads["contention"] += int(ops.publish_adam(optimizers, rows, grads, seq, use_locks=locks))
            reads["publications"] += 1

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        wanted = "locked" if locks else "torn"
        while reads["rows"] < MIN_READS or (reads[wanted] == 0 and reads["rows"] < MAX_READS):
            leaves, _, locked = ops.gather_rows(params, rows.repeat(8), seq, check_locks=locks)
            values = leaves["values"]
            torn = (values.amax(dim=1) != values.amin(dim=1)) & ~locked
            reads["rows"] += values.shape[0]
            reads["torn"] += int(torn.sum())
            reads["locked"] += int(locked.sum())
    finally:
        done.set()
        publisher.join()
    return reads


def test_locked_publication_never_tears_a_read(one_torch_thread: None) -> None:
    require_compiled("cpu")
    reads = _race(locks=True)
    print(f"with locks: {reads}")
    assert reads["rows"] >= MIN_READS and reads["publications"] > 0
    assert reads["locked"] > 0, f"no read met a row being published: the race did not happen ({reads})"
    assert reads["torn"] == 0, f"torn rows despite the locks: {reads}"


def test_unlocked_publication_tears_reads(one_torch_thread: None) -> None:
    require_compiled("cpu")
    reads = _race(locks=False)
    print(f"without locks: {reads}")
    assert reads["rows"] >= MIN_READS and reads["publications"] > 0
    assert reads["torn"] > 0, f"no torn row without the locks: the test could not catch a broken lock ({reads})"
