"""Shared fixtures: the real scenes, torch's threads, and the fast default.

Scenes: kermit_320 ships in tests/data and is always there; fern, fountain_p11 and kermit (640x480) live in
../shared/data, skipped with a reason outside CI when absent, required inside it.

Threads: the session runs torch at the plugin's thread count (``odin_nerfstudio/ns/threads.py``: the cores this
process may run on, fewer when the machine is busy; ``ODIN_CPU_THREADS`` or ``OMP_NUM_THREADS`` set it instead),
as ns-train, ns-eval and odin-train do; ``one_torch_thread`` and ``default_torch_threads`` set their own per test.

Slow tests (``@pytest.mark.slow``: end-to-end training runs, the long equivalence runs) are deselected by default so
that ``pytest`` stays within minutes on a 2-core machine; ``--slow`` runs them too (``.ci/run`` does), ``-m slow``
only them, and a test named by its node id always runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

TESTS_DATA = Path(__file__).resolve().parent / "data"
SHARED_DATA = Path(os.environ.get("ODIN_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
SHIPPED_SCENE = "kermit_320"
SHARED_SCENES = ("fern", "fountain_p11", "kermit")
# The real scenes a test over "each real scene" runs on: the shipped one always, the shared ones when ../shared/data
# exists or under CI (where a missing one fails). Without ../shared/data they are not collected (see the header).
REAL_SCENES = (SHIPPED_SCENE, *SHARED_SCENES) if SHARED_DATA.is_dir() or os.environ.get("CI") else (SHIPPED_SCENE,)


def missing(message: str) -> NoReturn:
    """Something a test needs is not on this machine: skip with ``message``, or fail under CI, where the project's
    own files install or ship everything a test needs."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def real_scene(name: str) -> Path:
    """Path of a real scene: kermit_320 in tests/data, the others in ../shared/data (skips when absent, fails when
    absent under CI)."""
    if name == SHIPPED_SCENE:
        return TESTS_DATA / name
    path = SHARED_DATA / name
    if not (path / "sparse" / "0").is_dir():
        missing(f"real scene {name!r} not found at {path} (set ODIN_SHARED_DATA to the folder holding it)")
    return path


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow (CI runs them)")


def pytest_configure(config: pytest.Config) -> None:
    """torch at the plugin's thread count for the whole session (see the header)."""
    from odin_nerfstudio.ns.threads import apply_cpu_threads

    apply_cpu_threads()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the slow tests unless --slow, a -m expression, or node ids name what to run."""
    if config.getoption("--slow") or config.option.markexpr or any("::" in arg for arg in config.args):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_report_header(config: pytest.Config) -> list[str]:
    import torch

    from odin_nerfstudio.ns.threads import machine_threads

    if len(REAL_SCENES) > 1:
        scenes = f"real scenes: {SHIPPED_SCENE} (tests/data), {', '.join(SHARED_SCENES)} from {SHARED_DATA}"
    else:
        scenes = (
            f"real scenes: {SHIPPED_SCENE} (tests/data) only; {SHARED_DATA} not found, so the cases on "
            f"{', '.join(SHARED_SCENES)} are not collected and the tests tied to them skip (set ODIN_SHARED_DATA)"
        )
    threads = (
        f"torch threads: {torch.get_num_threads()} (the plugin's rule at this load; {machine_threads()} on this "
        "machine idle, which the default_torch_threads tests use)"
    )
    slow = "slow tests: run" if config.getoption("--slow") else "slow tests: deselected unless --slow or -m"
    return [scenes, threads, slow]


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
def default_torch_threads() -> Iterator[int]:
    """The plugin's thread count on this machine when it is idle (``odin_nerfstudio.ns.threads.machine_threads``:
    each local rank's share of the cores it may run on), set for the test, for tests that show results do not
    depend on how the threads are scheduled. A busy machine gets fewer threads from the rule, down to one, where
    the one-thread tests apply.

    Skips where that count is 1 (one core: no threads to race).
    """
    import torch

    from odin_nerfstudio.ns.threads import affinity_cores, machine_threads

    threads = machine_threads()
    if threads < 2:
        pytest.skip(f"the plugin runs one torch thread here ({affinity_cores()} cores): no threads to race")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    yield threads
    torch.set_num_threads(saved)
