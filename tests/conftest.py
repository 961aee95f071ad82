"""Shared fixtures: the real scenes. kermit_320 ships in tests/data and is always there; fern, fountain_p11 and kermit
(640x480) live in ../shared/data, skipped with a reason outside CI when absent, required inside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS_DATA = Path(__file__).resolve().parent / "data"
SHARED_DATA = Path(os.environ.get("ODIN_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
SHIPPED_SCENE = "kermit_320"
SHARED_SCENES = ("fern", "fountain_p11", "kermit")
# The real scenes a test over "each real scene" runs on: the shipped one always, the shared ones when ../shared/data
# exists or under CI (where a missing one fails). Without ../shared/data they are not collected (see the header).
REAL_SCENES = (SHIPPED_SCENE, *SHARED_SCENES) if SHARED_DATA.is_dir() or os.environ.get("CI") else (SHIPPED_SCENE,)


def real_scene(name: str) -> Path:
    """Path of a real scene: kermit_320 in tests/data, the others in ../shared/data (skips when absent, fails when
    absent under CI)."""
    if name == SHIPPED_SCENE:
        return TESTS_DATA / name
    path = SHARED_DATA / name
    if not (path / "sparse" / "0").is_dir():
        message = f"real scene {name!r} not found at {path} (set ODIN_SHARED_DATA to the folder holding it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def pytest_report_header(config: pytest.Config) -> str:
    if len(REAL_SCENES) > 1:
        return f"real scenes: {SHIPPED_SCENE} (tests/data), {', '.join(SHARED_SCENES)} from {SHARED_DATA}"
    return (
        f"real scenes: {SHIPPED_SCENE} (tests/data) only; {SHARED_DATA} not found, so the cases on "
        f"{', '.join(SHARED_SCENES)} are not collected and the tests tied to them skip (set ODIN_SHARED_DATA)"
    )


@pytest.fixture(params=REAL_SCENES)
def any_real_scene(request: pytest.FixtureRequest) -> Path:
    """Each real scene in turn (kermit_320 only when ../shared/data is absent)."""
    return real_scene(request.param)


@pytest.fixture
def kermit_320() -> Path:
    """Bundler's kermit at 320x240 (11 views, SIMPLE_RADIAL), shipped in tests/data: always available."""
    return real_scene(SHIPPED_SCENE)


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
