"""`odin-simulate` end to end on the shipped kermit_320 scene and a synthetic run's timeline."""

from __future__ import annotations

from pathlib import Path

import pytest
import tyro

from odin_nerfstudio.scheduling.balance import BALANCE_TOLERANCE, MIN_BAND_GROUPS
from odin_nerfstudio.simulation import cli
from odin_nerfstudio.simulation.run_folder import read_run_settings
from tests.conftest import TESTS_DATA
from tests.simulation.runs import write_config, write_run


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


def test_run_settings_are_read_from_config_yml_without_nerfstudio(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    write_config(run, TESTS_DATA / "kermit_320", mode="barrier", interconnect="10gbe", steps=30)
    settings = read_run_settings(run)
    assert settings.scene == (TESTS_DATA / "kermit_320").resolve()
    assert (settings.mode, settings.interconnect, settings.steps) == ("barrier", "10gbe", 30)
    assert (settings.num_workers, settings.processes, settings.views_per_worker, settings.ring_slots) == (2, 2, 1, 4)
    assert settings.schedule_order == "auto"  # a config without the key: the run's default


def test_replay_compares_a_run_with_its_simulation(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_run(tmp_path / "run")
    write_config(run, TESTS_DATA / "kermit_320", steps=30)
    cli.main(["--run", str(run), "--replay", "--save-costs", str(tmp_path / "costs.json")])
    out = capsys.readouterr().out
    assert "quality, W = 2 in 2 process(es)" in out
    assert "views/s measured" in out and "predicted" in out
    # the saved model reads back and drives a simulation of the scene without any run
    cli.main(["--costs", str(tmp_path / "costs.json"), "--scene", str(TESTS_DATA / "kermit_320"), "--workers", "2"])
    assert "| 2 | quality |" in capsys.readouterr().out


def test_cli_simulates_the_sharded_mode_and_refuses_what_it_does_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = write_run(tmp_path / "run")
    argv = ["--run", str(run), "--scene", str(TESTS_DATA / "kermit_320"), "--workers", "2", "--steps", "4"]
    cli.main([*argv, "--sharded", "--modes", "barrier", "quality", "--interconnect", "10gbe"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["barrier", "quality"]
    assert all(float(row.split("|")[3]) > 0 for row in rows)
    with pytest.raises(SystemExit, match="--sharded runs a rank per worker"):
        cli.main([*argv, "--sharded", "--modes", "ddp"])


def test_cli_simulates_a_rebalanced_schedule_and_refuses_to_replay_a_rebalanced_run(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = write_run(tmp_path / "run")
    argv = ["--run", str(run), "--scene", str(TESTS_DATA / "kermit_320"), "--workers", "2", "--steps", "4"]
    cli.main([*argv, "--rebalanced", "--modes", "barrier"])
    assert "| 2 | barrier |" in capsys.readouterr().out
    cli.main([*argv, "--rebalanced", "--sharded", "--modes", "barrier"])  # sharded, the regions order
    assert "| 2 | barrier |" in capsys.readouterr().out
    cli.main([*argv, "--rebalanced", "--sharded", "--schedule-order", "halves", "--modes", "barrier"])
    assert "| 2 | barrier |" in capsys.readouterr().out
    write_config(run, TESTS_DATA / "kermit_320")
    config = run / "config.yml"
    config.write_text(config.read_text().replace("    schedule_seed: 0", "    schedule_seed: 0\n    rebalance_every: 1"))
    assert read_run_settings(run).rebalance_every == 1
    with pytest.raises(SystemExit, match="rebalance-every 1"):
        cli.main(["--run", str(run), "--replay"])


def test_a_replay_rebuilds_the_runs_cost_bands(tmp_path: Path) -> None:
    """A run's ``--pipeline.datamanager.balance-tolerance`` and ``band-floor`` (the defaults in a config saved
    before them) reach the schedule a replay rebuilds."""
    run = write_run(tmp_path / "run")
    write_config(run, TESTS_DATA / "kermit_320")
    settings = read_run_settings(run)
    assert (settings.balance_tolerance, settings.band_floor) == (BALANCE_TOLERANCE, MIN_BAND_GROUPS)
    config = run / "config.yml"
    evenest = "    schedule_seed: 0\n    balance_tolerance: 0.0\n    band_floor: 1"
    config.write_text(config.read_text().replace("    schedule_seed: 0", evenest))
    settings = read_run_settings(run)
    assert (settings.balance_tolerance, settings.band_floor) == (0.0, 1)
    schedule = cli.replay_config(settings, "drawn").schedule_config()
    assert (schedule.balance_tolerance, schedule.band_floor) == (0.0, 1)


def test_a_sharded_simulation_schedules_in_the_regional_order_unless_told() -> None:
    # as odin-train: --pipeline.datamanager.schedule-order auto is the regional order with --sharded (in two halves
    # from 16 workers), rlg without
    def order(*argv: str, workers: int = 8) -> str:
        parsed = tyro.cli(cli.SimulateCliConfig, args=list(argv))
        return cli.simulation_config(parsed, "quality", workers).schedule_config().order

    assert order("--sharded") == "regions" and order("--sharded", workers=16) == "halves" and order() == "rlg"
    assert order("--sharded", "--schedule-order", "rlg") == "rlg" and order("--schedule-order", "random") == "random"
