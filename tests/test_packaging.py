"""Packaging: the top-level method_configs/ folder installs as odin_nerfstudio.method_configs, editable or not.

The editable install (the README's, which every other test runs under) maps the folder through setuptools'
package-dir; a wheel must carry it inside the package, never as a bare top-level ``method_configs`` that could
collide with another project's. This test builds the wheel with pip into a fresh virtual environment that borrows
the installed dependencies (nerfstudio, gsplat, torch) from the running one, then asks ``ns-train`` for
odin-splat's help there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_method_configs_inside_the_package(tmp_path: Path) -> None:
    # Build from a copy of the tracked files: setuptools writes build/ beside the sources.
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, check=True, capture_output=True, text=True).stdout
    for name in tracked.splitlines():
        if (REPO / name).is_file() and not name.startswith("tests/data/"):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(source)],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("odin_nerfstudio-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "odin_nerfstudio/method_configs/odin_splat.py" in names
    assert not any(name.startswith("method_configs/") for name in names), "a bare top-level method_configs package"

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # Borrow the dependencies as a plain path entry: .pth files there (our editable finder) are not executed.
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        cwd=tmp_path,
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    where = subprocess.run(
        [str(python), "-c", "import odin_nerfstudio.method_configs.odin_splat as m; print(m.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    ).stdout.strip()
    assert Path(where).is_relative_to(site), f"method configs imported from {where}, not the wheel"
    help_text = subprocess.run(
        [str(python), "-c", "from nerfstudio.scripts.train import entrypoint; entrypoint()", "odin-splat", "--help"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "COLUMNS": "200"},
        timeout=300,
    ).stdout
    assert "--runtime.mode" in help_text
