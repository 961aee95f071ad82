"""Shared fixtures: the real scenes in ../shared/data, skipped with a reason outside CI, required inside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(os.environ.get("ODIN_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
REAL_SCENES = ("fern", "fountain_p11", "kermit")


def real_scene(name: str) -> Path:
    """Path of a real scene in ../shared/data; skips when absent, fails when absent under CI."""
    path = SHARED_DATA / name
    if not (path / "sparse" / "0").is_dir():
        message = f"real scene {name!r} not found at {path} (set ODIN_SHARED_DATA to the folder holding it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(params=REAL_SCENES)
def any_real_scene(request: pytest.FixtureRequest) -> Path:
    """Each of the three real scenes in turn."""
    return real_scene(request.param)


@pytest.fixture
def fern() -> Path:
    """The LLFF fern scene (20 views, PINHOLE)."""
    return real_scene("fern")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module: small tensors on a shared 2-core machine run far faster that way."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def default_torch_threads() -> int:
    """Torch's default intra-op thread count, for tests that show results do not depend on thread scheduling.

    Skips on a machine with one core (no threads to race); elsewhere fails if the count is 1 (OMP_NUM_THREADS=1 or a
    leftover set_num_threads(1)), so such a test cannot pass single-threaded.
    """
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores < 2:
        pytest.skip("one CPU core: torch runs one intra-op thread, so thread scheduling cannot change any result")
    threads = torch.get_num_threads()
    assert threads > 1, f"needs the default thread count (> 1) on {cores} cores, got {threads}: unset OMP_NUM_THREADS"
    return threads
