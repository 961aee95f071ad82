"""Binary COLMAP files are validated before pycolmap reads them: truncated or padded files are refused at once,
naming the file and the record, with bounded memory, in every entry point (tracks, odin-schedule)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from odin_nerfstudio.scheduling.colmap_model import validate_binary_model
from odin_nerfstudio.scheduling.tracks import read_colmap_tracks

BIN = Path(sys.executable).parent
MAX_RSS_KB = 2_000_000
"""A refused model must not grow the process past this (pycolmap's reader took 8.6 GB on a truncated file). The
command's own imports take about 1 GB (odin-schedule lives in the nerfstudio layer, for ``--checkpoint``)."""
PEAK_RSS = (
    "import os, subprocess, sys\n"
    "process = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(process.pid, 0)\n"
    "print(f'peak rss kB: {usage.ru_maxrss}')\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)
"""Runs a command and prints its peak RSS. Linux counts, in a child's ru_maxrss, the resident size of the process
it was forked from, so the command is forked from this small process, not from the test's (which may hold GBs)."""


def truncated_model(scene: Path, target: Path, stem: str, keep: float) -> Path:
    """A copy of ``scene``'s sparse/0 whose ``<stem>.bin`` keeps the first ``keep`` fraction of its bytes."""
    shutil.copytree(scene / "sparse" / "0", target)
    path = target / f"{stem}.bin"
    data = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(data[: int(len(data) * keep)])
    assert path.stat().st_size < len(data), "the file was truncated"
    return target


def test_real_models_validate(any_real_scene: Path) -> None:
    validate_binary_model(any_real_scene / "sparse" / "0")


@pytest.mark.parametrize("stem", ["cameras", "images", "points3D"])
@pytest.mark.parametrize("keep", [0.05, 0.5, 0.999])
def test_a_truncated_file_is_refused_naming_it(kermit_320: Path, tmp_path: Path, stem: str, keep: float) -> None:
    sparse = truncated_model(kermit_320, tmp_path / "sparse", stem, keep)
    with pytest.raises(ValueError, match=rf"{stem}\.bin .*is corrupt: .*(bytes|NUL)") as error:
        read_colmap_tracks(sparse)
    assert "truncated" in str(error.value)


def test_bytes_after_the_last_record_are_refused(kermit_320: Path, tmp_path: Path) -> None:
    sparse = tmp_path / "sparse"
    shutil.copytree(kermit_320 / "sparse" / "0", sparse)
    path = sparse / "points3D.bin"
    path.chmod(0o644)
    path.write_bytes(path.read_bytes() + b"\0" * 7)
    with pytest.raises(ValueError, match=r"points3D\.bin .*7 bytes follow its \d+ 3D points"):
        read_colmap_tracks(sparse)


def test_odin_schedule_refuses_a_truncated_points3d_with_bounded_memory(kermit_320: Path, tmp_path: Path) -> None:
    # Bounded memory is the check (pycolmap's reader would allocate what the file's counts say); the timeout only
    # turns a hang into a failure, it is no speed claim (the refusal takes about a second on a quiet machine).
    scene = tmp_path / "scene"
    truncated_model(kermit_320, scene / "sparse" / "0", "points3D", 0.6)
    command = [sys.executable, "-c", PEAK_RSS, str(BIN / "odin-schedule"), "--data", str(scene)]
    result = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False, timeout=120
    )
    output = result.stdout
    assert result.returncode != 0, output
    assert "points3D.bin" in output and "corrupt" in output, output
    peak_kb = int(output.rsplit("peak rss kB: ", 1)[1].split()[0])
    assert peak_kb < MAX_RSS_KB, f"odin-schedule grew to {peak_kb} kB"
