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
