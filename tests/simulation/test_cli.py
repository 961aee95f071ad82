"""`odin-simulate` end to end on the shipped kermit_320 scene and a synthetic run's timeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from odin_nerfstudio.simulation import cli
from tests.conftest import TESTS_DATA
from tests.simulation.runs import write_run


def test_cli_prints_a_row_per_worker_count_and_mode(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_run(tmp_path / "run")
    argv = ["--run", str(run), "--scene", str(TESTS_DATA / "kermit_320"), "--workers", "1", "2"]
    cli.main([*argv, "--modes", "barrier", "quality", "--steps", "4", "--interconnect", "10gbe"])
    out = capsys.readouterr().out
    assert "R^2 1.00" in out
    rows = [line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["barrier", "quality"] * 2
    assert all(float(row.split("|")[3]) > 0 for row in rows)  # views/s


def test_cli_names_a_missing_scene(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    with pytest.raises(SystemExit, match="--scene"):
        cli.main(["--run", str(run), "--scene", str(tmp_path / "nowhere"), "--steps", "2"])
