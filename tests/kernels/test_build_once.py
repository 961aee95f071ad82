"""The kernels are built once per install, whatever the PATH: a later process, from a script (``.venv/bin/python``
without ``.venv/bin`` on PATH: the system's ninja) or from an activated shell (the venv's ninja), loads the cached
library without a rebuild and without a word; a build, when one happens, says so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from odin_nerfstudio.kernels import _backend

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)
SYSTEM_PATH = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != VENV_BIN) or (
    "/usr/local/bin:/usr/bin:/bin"
)
"""PATH as scripts/setup.sh and scripts/test.sh see it (no venv folder: ninja, if any, is the system's)."""
ACTIVATED_PATH = os.pathsep.join([VENV_BIN, SYSTEM_PATH])
"""PATH as an activated venv sees it."""

LOAD = """
import json, sys
from pathlib import Path
from odin_nerfstudio.kernels import _backend
if len(sys.argv) > 1:
    _backend.CSRC = Path(sys.argv[1])
flavour = _backend.build("cpu") and "cpu" if len(sys.argv) > 1 else _backend.load()
print(json.dumps({"flavour": flavour, "builder": "torch.utils.cpp_extension" in sys.modules}))
"""
"""A process that loads the kernels (or, given a sources folder, builds it) and tells whether it imported torch's
builder at all."""


def load_in_a_new_process(path: str, csrc: Path | None = None) -> tuple[dict, str]:
    """Run LOAD with ``PATH=path`` in a fresh interpreter; its answer and its stderr."""
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", LOAD, *([str(csrc)] if csrc else [])]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def odin_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("odin kernels")]


def test_a_load_with_another_path_finds_the_built_kernels(capfd: pytest.CaptureFixture[str]) -> None:
    """The installed kernels (built by scripts/setup.sh): loaded from either PATH without torch's builder, unchanged."""
    if os.environ.get("ODIN_KERNELS", "").lower() == "reference":
        pytest.skip("ODIN_KERNELS=reference: the compiled kernels are not loaded")
    _backend.build("cpu")  # a no-op after setup.sh; builds the cache otherwise
    capfd.readouterr()
    _, _, library = _backend._library("cpu")
    built = library.stat().st_mtime_ns
    for path in (SYSTEM_PATH, ACTIVATED_PATH):
        answer, stderr = load_in_a_new_process(path)
        assert answer == {"flavour": "cpu", "builder": False}, (path, stderr)
        assert odin_lines(stderr) == [], stderr
    assert library.stat().st_mtime_ns == built, "the library was rebuilt"


TINY = "int odin_build_once_probe() { return 36; }\n"
"""A source that compiles in a moment (no torch headers), so the whole build path runs in seconds."""


@pytest.fixture
def tiny_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A one-file ``cuda/csrc`` and an empty kernels cache, both under tmp_path."""
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "probe.cpp").write_text(TINY)
    monkeypatch.setenv("ODIN_KERNELS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_backend, "CSRC", csrc)
    return csrc


def test_a_build_says_so_once_and_later_processes_reuse_it_whatever_the_path(
    tiny_sources: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """First build (from an activated shell): one line with its time; then a process from a script's PATH, one from
    an activated shell's and one from a script's whose stamp was lost (torch's builder runs, with the venv's ninja
    first, not the system's, and finds nothing to do): none rebuilds or prints a line."""
    monkeypatch.setenv("PATH", ACTIVATED_PATH)
    folder = _backend.build("cpu")
    monkeypatch.setenv("PATH", SYSTEM_PATH)
    lines = odin_lines(capfd.readouterr().err)
    assert len(lines) == 1 and "building the cpu ops" in lines[0] and " built in " in lines[0], lines
    _, _, library = _backend._library("cpu")
    assert library.parent == folder and _backend.is_built("cpu")
    built = library.stat().st_mtime_ns
    for path in (SYSTEM_PATH, ACTIVATED_PATH):
        answer, stderr = load_in_a_new_process(path, tiny_sources)
        assert answer == {"flavour": "cpu", "builder": False}, (path, stderr)
        assert odin_lines(stderr) == [], stderr

    library.with_name(library.name + ".built").unlink()
    answer, stderr = load_in_a_new_process(SYSTEM_PATH, tiny_sources)
    assert answer == {"flavour": "cpu", "builder": True}
    assert odin_lines(stderr) == [], f"the venv's ninja must find the venv's build up to date: {stderr}"
    assert library.stat().st_mtime_ns == built, "the library was rebuilt"
    assert _backend.is_built("cpu"), "the builder's run stamps the build again"


def test_the_stamp_names_the_flags_and_the_library(tiny_sources: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Other flags, another compiler or another library file: not the stamped build, so the builder decides."""
    _, folder, library = _backend._library("cpu")
    folder.mkdir(parents=True)
    library.write_bytes(b"built")
    assert not _backend.is_built("cpu")
    _backend.mark_built("cpu")
    assert _backend.is_built("cpu")
    stamp = json.loads(library.with_name(library.name + ".built").read_text())
    assert stamp["identity"]["cxx_flags"] == _backend.CXX_FLAGS
    monkeypatch.setattr(_backend, "CXX_FLAGS", [*_backend.CXX_FLAGS, "-g"])
    assert not _backend.is_built("cpu")
    monkeypatch.undo()
    monkeypatch.setenv("ODIN_KERNELS_CACHE", str(library.parents[1]))
    monkeypatch.setattr(_backend, "CSRC", tiny_sources)
    assert _backend.is_built("cpu")
    monkeypatch.setenv("CXX", "clang++")
    assert not _backend.is_built("cpu")
    monkeypatch.delenv("CXX")
    library.write_bytes(b"rebuilt by another build")
    assert not _backend.is_built("cpu")


def test_the_builder_runs_the_interpreters_ninja(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the build the interpreter's folder comes first on PATH (the venv's ninja), and PATH is restored."""
    monkeypatch.setenv("PATH", SYSTEM_PATH)
    with _backend.interpreter_tools_first():
        assert os.environ["PATH"].split(os.pathsep)[0] == VENV_BIN
        if (Path(VENV_BIN) / "ninja").exists():
            import shutil

            assert shutil.which("ninja") == str(Path(VENV_BIN) / "ninja")
    assert os.environ["PATH"] == SYSTEM_PATH
