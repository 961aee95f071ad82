"""The runtime runs the compiled kernel ops by default (CPU build here) and their reference on request, bit for bit.

tests/kernels shows each op equal to its reference on random inputs; these tests show that the runtime's hooks
actually call the compiled ops (the profiler names them) and that a whole training run across a densification
gives the same bits with either backend, in quality-first and barrier mode alike.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from odin_nerfstudio.drivers.virtual import run_virtual
from odin_nerfstudio.kernels import _backend, ops
from odin_nerfstudio.runtime.config import Topology
from odin_nerfstudio.runtime.runtime import OdinRuntimeConfig
from tests.runtime.test_runtime import SPARSE, schedule_of, structural_change
from odin_nerfstudio.scenes.toy import assert_identical, make_params, make_runtime, snapshot

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OPS = (
    "odin::cull_conflicts",
    "odin::gather_rows",
    "odin::stage_rows",
    "odin::scatter_in_order",
    "odin::publish_adam",
    "odin::refresh_bounds",
    "odin::validate_read",
    "odin::union_rows",
    "odin::declare_rows",
    "odin::settle_rows",
)
INTERLEAVINGS = {"round-robin": [], "worker 1 ahead": [1] * 40}


def require_compiled() -> None:
    """Skip (fail under CI) unless the CPU ops are built and loaded, naming the reason."""
    if ops.compiled("cpu"):
        return
    forced = os.environ.get("ODIN_KERNELS")
    message = f"the compiled odin ops are not loaded (flavour {_backend.load()!r}, ODIN_KERNELS={forced!r})"
    if os.environ.get("CI") and os.environ.get("ODIN_KERNELS", "").lower() != "reference":
        pytest.fail(message)
    pytest.skip(message)


def densified_run(mode: str, interleaving: list[int]) -> dict[str, torch.Tensor]:
    """Two workers with two views each for 8 steps, with a densification (duplicate + prune) behind the drain at
    step 4; returns the model, its Adam state and the per-row versions."""
    runtime = make_runtime(OdinRuntimeConfig(mode=mode), make_params(), lr_scale=8.0, topology=Topology(2, 2))
    run_virtual(runtime, schedule_of(SPARSE, 2, 2), interleaving, structural_changes={4: structural_change})
    assert runtime.counters.publications == 8
    return {**snapshot(runtime), "versions": runtime.tables.versions}


def op_names(mode: str) -> set[str]:
    """The odin ops the profiler saw during a densified quality-first run (the runtime's hooks only call them)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        densified_run(mode, [1] * 40)
    return {event.name for event in prof.events() if event.name.startswith("odin::")}


def test_the_runtime_runs_the_compiled_ops_by_default_and_none_under_use_reference() -> None:
    require_compiled()
    assert op_names("quality") == set(OPS)
    with ops.use_reference():
        assert op_names("quality") == set()


@pytest.mark.parametrize("interleaving", INTERLEAVINGS.values(), ids=INTERLEAVINGS.keys())
def test_compiled_quality_equals_barrier_and_the_reference_across_a_densification(interleaving: list[int]) -> None:
    """quality == barrier bit for bit on the compiled ops, and both equal the reference backend's runs."""
    require_compiled()
    compiled = {mode: densified_run(mode, interleaving) for mode in ("quality", "barrier")}
    with ops.use_reference():
        reference = densified_run("quality", interleaving)
    assert compiled["quality"]["versions"].max() > 0, "no row was published"
    assert_identical(compiled["quality"], compiled["barrier"])
    assert_identical(compiled["quality"], reference)
