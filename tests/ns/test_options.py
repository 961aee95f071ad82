"""Out-of-range options are refused before any work, naming the CLI flag; a step larger than the scene warns."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tyro
from nerfstudio.configs.method_configs import AnnotatedBaseConfigUnion

from odin_nerfstudio.ns.options import OptionError, check_options, warn_if_step_exceeds_views
from odin_nerfstudio.scheduling.balance import MIN_BAND_GROUPS
from odin_nerfstudio.scheduling.schedule import ScheduleConfig

BIN = Path(sys.executable).parent


def parsed(*flags: str):
    """odin-splat's config from an ns-train command line (its data folder does not exist: no work can start)."""
    return tyro.cli(AnnotatedBaseConfigUnion, args=["odin-splat", "--data", "/nonexistent/scene", *flags])


def method_config(path: str, value: object):
    """odin-splat's method config with the option at ``path`` set to ``value``."""
    from odin_nerfstudio.method_configs.odin_splat import odin_splat

    config = copy.deepcopy(odin_splat.config)
    *parents, name = path.split(".")
    owner = config
    for parent in parents:
        owner = getattr(owner, parent)
    setattr(owner, name, value)
    return config


@pytest.mark.parametrize(
    "path, value, flag",
    [
        ("runtime.stale_fraction", 1.5, "--runtime.stale-fraction 1.5"),
        ("runtime.max_staleness", -1, "--runtime.max-staleness -1"),
        ("runtime.wait_timeout_s", 0.0, "--runtime.wait-timeout-s 0.0"),
        ("runtime.stale_grad_ratio", -0.1, "--runtime.stale-grad-ratio -0.1"),
        ("runtime.candidate_margin", float("nan"), "--runtime.candidate-margin nan"),
        ("replica_check_every", -5, "--replica-check-every -5"),
        ("pipeline.datamanager.num_workers", 0, "--pipeline.datamanager.num-workers 0"),
        ("pipeline.datamanager.views_per_step", 0, "--pipeline.datamanager.views-per-step 0"),
        ("pipeline.datamanager.rebalance_every", -1, "--pipeline.datamanager.rebalance-every -1"),
        ("pipeline.datamanager.balance_tolerance", -0.1, "--pipeline.datamanager.balance-tolerance -0.1"),
        ("pipeline.datamanager.band_floor", 0, "--pipeline.datamanager.band-floor 0"),
    ],
)
def test_out_of_range_option_is_refused_naming_the_flag(path: str, value: object, flag: str) -> None:
    with pytest.raises(OptionError, match=re.escape(flag)):
        check_options(method_config(path, value))


def test_defaults_pass() -> None:
    check_options(method_config("runtime.mode", "quality"))


def test_the_trainer_refuses_before_reading_the_scene(tmp_path: Path) -> None:
    """The data folder does not exist, yet the error is the option's: nothing was read before the check."""
    config = parsed("--runtime.stale-fraction", "1.5", "--output-dir", str(tmp_path))
    config.machine.device_type = "cpu"
    trainer = config.setup(local_rank=0, world_size=1)
    with pytest.raises(OptionError, match="--runtime.stale-fraction"):
        trainer.setup()


def test_odin_train_exits_with_one_line_naming_the_flag() -> None:
    command = [str(BIN / "odin-train"), "odin-splat", "--data", "/nonexistent", "--runtime.wait-timeout-s", "0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert result.returncode == 2
    assert "--runtime.wait-timeout-s 0.0: must be a number of seconds > 0" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_a_step_larger_than_the_scene_warns_naming_the_flag(capsys: pytest.CaptureFixture) -> None:
    assert warn_if_step_exceeds_views(64, 1, 9)
    out = capsys.readouterr().out.replace("\n", " ")
    assert "--pipeline.datamanager.num-workers" in out and "9 train views" in out
    assert not warn_if_step_exceeds_views(4, 2, 9)


def test_sharded_refuses_the_modes_it_does_not_run_and_takes_the_link() -> None:
    config = method_config("sharded", True)
    config.interconnect = "10gbe"
    check_options(config)
    config.runtime.mode = "ddp"
    with pytest.raises(OptionError, match=r"--runtime.mode 'ddp' with --sharded True"):
        check_options(config)


def test_rebalancing_runs_in_either_mode_and_every_order() -> None:
    """Re-balancing by measured costs: in either mode and every order (the regional orders' cost bands follow the
    measured costs)."""
    config = method_config("pipeline.datamanager.rebalance_every", 2)
    check_options(config)
    config.sharded = True
    check_options(config)
    datamanager = method_config("pipeline.datamanager.rebalance_every", 1).pipeline.datamanager
    for order in ("rlg", "random", "regions", "halves"):
        datamanager.schedule_order = order
        assert datamanager.schedule_config(world_size=2).order == order


def test_the_balance_options_reach_the_schedule() -> None:
    """``--pipeline.datamanager.balance-tolerance`` and ``--pipeline.datamanager.band-floor`` (a barrier's evenest
    steps: 0 and 1) are the schedule's; their defaults are the schedule's own."""
    datamanager = method_config("pipeline.datamanager.band_floor", 1).pipeline.datamanager
    datamanager.balance_tolerance = 0.0
    check_options(method_config("pipeline.datamanager.band_floor", 1))
    config = datamanager.schedule_config(world_size=2)
    assert (config.balance_tolerance, config.band_floor) == (0.0, 1)
    default = method_config("runtime.mode", "quality").pipeline.datamanager.schedule_config(world_size=2)
    assert (default.balance_tolerance, default.band_floor) == (ScheduleConfig().balance_tolerance, MIN_BAND_GROUPS)
