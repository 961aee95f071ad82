"""The paper's controls, each one mode or flag of the same code: DDP-style dense barrier, HOGWILD, random order."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.test_runtime import DENSE, adversarial, run
from odin_nerfstudio.scenes.toy import snapshot

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_ddp_reads_every_row_and_steps_adam_on_every_row() -> None:
    """Every publication covers every row, and a row without a gradient in a step still moves (Adam's momentum),
    which the sparse barrier never does: the dense control differs from the sparse one in that way only."""
    ddp = run("ddp", DENSE, 2, 1, record_reads=True)
    barrier = run("barrier", DENSE, 2, 1, record_reads=True)
    num_rows = ddp.num_primitives
    assert all(rows.numel() == num_rows for rows in ddp.published_rows.values())
    assert all(read.candidate.numel() == num_rows for read in ddp.final_reads.values())
    assert any(rows.numel() < num_rows for rows in barrier.published_rows.values())
    assert not torch.equal(snapshot(ddp)["means"], snapshot(barrier)["means"])
    assert ddp.counters.reruns == 0


def test_ddp_on_its_first_step_equals_the_sparse_barrier() -> None:
    """Before any momentum exists, a dense Adam step of zero rows leaves them as they are: after one step both
    controls hold the same model (the dense update is the sparse one padded with zeros) up to float rounding (a
    render of every row, not just C(t), reduces in another order)."""
    ddp, barrier = snapshot(run("ddp", DENSE, 2, 1, steps=1)), snapshot(run("barrier", DENSE, 2, 1, steps=1))
    for name, value in barrier.items():
        torch.testing.assert_close(ddp[name], value, rtol=1e-4, atol=1e-9, msg=name)


def test_hogwild_never_waits_on_a_conflict_and_never_reruns() -> None:
    """Under the adversarial interleaving that makes quality-first wait, HOGWILD reads stale instead."""
    interleaving = adversarial(2)["last_runs_ahead"]
    quality = run("quality", DENSE, 2, 2, interleaving)
    hogwild = run("hogwild", DENSE, 2, 2, interleaving)
    assert quality.counters.waits.get("raw", 0) > 0
    assert hogwild.counters.waits.get("raw", 0) == 0
    assert len(hogwild.counters.stale_reads) > 0
    assert hogwild.counters.reruns == 0
