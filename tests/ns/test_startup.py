"""What a command running odin-splat does first (``ns/startup.py``, ``ns/threads.py``): no CUDA device stops it in one
line before anything is printed or written, torch's CPU threads follow the plugin's rule, and nerfstudio's output
loses what says nothing (an empty profiling heading, LPIPS's warning in a command that computes no metric, help
texts cut where the source wraps)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from odin_nerfstudio.ns import startup, threads

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCENE = ROOT / "tests" / "data" / "kermit_320"
WARNING_LINE = re.compile(r"^\S+\.py:\d+: \w*Warning: ")
"""A Python warning's first line (the next line is its source line): nerfstudio's own modules warn when imported
(torch.jit.script, torch.cuda.amp deprecations), before any plugin code runs."""


def printed_lines(output: str) -> list[str]:
    """The non-empty lines of ``output``, without the import-time Python warnings of nerfstudio's modules."""
    lines, skip = [], False
    for line in output.splitlines():
        if skip:
            skip = False
        elif WARNING_LINE.match(line) and "site-packages" in line:
            skip = True
        elif line.strip():
            lines.append(line)
    return lines


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a CUDA device")
@pytest.mark.parametrize("program", ["ns-train", "odin-train"])
def test_no_cuda_device_stops_in_one_line_and_writes_nothing(program: str, tmp_path: Path) -> None:
    """``--machine.device-type cuda`` (nerfstudio's default) on this CPU machine: one line naming the CPU flag, exit
    status 1, and no outputs/ folder (nerfstudio used to print its 250-line config and write config.yml first)."""
    command = [str(BIN / program), "odin-splat", "--data", str(SCENE), "--machine.device-type", "cuda"]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(name, None)
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = printed_lines(done.stdout + done.stderr)
    assert done.returncode == 1, done.stdout + done.stderr
    assert lines == [
        "odin-splat: no CUDA device found (torch.cuda.is_available() is False); "
        "add --machine.device-type cpu to train on the CPU."
    ], lines
    assert list(tmp_path.iterdir()) == [], "nothing may be written"


def test_the_command_line_check_reads_the_device_as_tyro_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flag with a value or with '=', the last one wins, nerfstudio's default (cuda) without one; help and a loaded
    config are left to tyro and the trainer."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check = startup.check_device_on_command_line
    check(["odin-splat", "--machine.device-type", "cpu"])
    check(["odin-splat", "--machine.device-type=cuda", "--machine.device-type", "cpu"])
    check(["odin-splat", "--help"])
    check(["odin-splat", "--load-config", "outputs/x/config.yml"])
    for args in (["odin-splat"], ["odin-splat-quick", "--machine.device-type=cuda"]):
        with pytest.raises(SystemExit, match=f"^{args[0]}: no CUDA device found"):
            check(args)


def test_only_commands_running_odin_are_prepared(tmp_path: Path) -> None:
    odin, other = tmp_path / "odin.yml", tmp_path / "other.yml"
    odin.write_text("!!python/object:odin_nerfstudio.ns.trainer.OdinTrainerConfig\nmethod_name: odin-splat\n")
    other.write_text("!!python/object:nerfstudio.engine.trainer.TrainerConfig\nmethod_name: splatfacto\n")
    assert startup.runs_odin("ns-train", ["odin-splat", "--data", "x"])
    assert startup.runs_odin("ns-train", ["odin-splat-quick"])
    assert not startup.runs_odin("ns-train", ["splatfacto", "--data", "x"])
    assert startup.runs_odin("ns-eval", ["--load-config", str(odin)])
    assert startup.runs_odin("ns-export", ["gaussian-splat", f"--load-config={odin}", "--output-dir", "e"])
    assert not startup.runs_odin("ns-eval", ["--load-config", str(other)])
    assert not startup.runs_odin("ns-eval", ["--load-config", str(tmp_path / "missing.yml")])


def test_ns_eval_of_an_odin_run_gets_the_plugins_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ns-eval's import of odin-splat's entry point does (``prepare_command``): the plugin's thread count,
    without OMP_NUM_THREADS; LPIPS skipped only by the commands that compute no metric."""
    from nerfstudio.utils import profiler
    from tyro import _docstrings

    from odin_nerfstudio.ns import model

    config = tmp_path / "config.yml"
    monkeypatch.setattr(_docstrings, "parse_docstring_from_object", _docstrings.parse_docstring_from_object)
    config.write_text("!!python/object:odin_nerfstudio.ns.trainer.OdinTrainerConfig\n")
    saved = torch.get_num_threads()
    monkeypatch.setattr(profiler.Profiler, "print_profile", profiler.Profiler.print_profile)  # undone afterwards
    monkeypatch.setattr(model, "make_lpips", model.make_lpips)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(threads.ENV, "1")
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(startup, "_prepared", [])
        startup.prepare_command(["ns-eval", "--load-config", str(config)])
        assert torch.get_num_threads() == 1
        assert model.make_lpips is not None and model.make_lpips.__name__ == "make_lpips", "ns-eval reports LPIPS"

        monkeypatch.delenv(threads.ENV)
        monkeypatch.setattr(startup, "_prepared", [])
        monkeypatch.setattr(threads, "busy_cores", lambda: 0.0)
        startup.prepare_command(["ns-export", "gaussian-splat", "--load-config", str(config)])
        assert torch.get_num_threads() == threads.machine_threads()
        assert model.make_lpips() is None, "ns-export computes no metric: no LPIPS, no warning about its weights"
    finally:
        torch.set_num_threads(saved)


def test_the_rule_shares_the_cores_among_the_local_ranks_and_leaves_the_busy_ones() -> None:
    assert threads.rule(cores=2, ranks=1) == 2
    assert threads.rule(cores=16, ranks=2) == 8
    assert threads.rule(cores=3, ranks=2) == 1
    assert threads.rule(cores=1, ranks=4) == 1
    assert threads.rule(cores=2, ranks=1, busy=2.0) == 1, "a busy 2-core machine: one thread, not two fighting"
    assert threads.rule(cores=2, ranks=1, busy=0.4) == 2
    assert threads.rule(cores=2, ranks=1, busy=0.7) == 1
    assert threads.rule(cores=16, ranks=2, busy=8.0) == 4
    assert threads.rule(cores=16, ranks=1, busy=40.0) == 1


def test_a_flag_or_the_environment_sets_the_count_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {"LOCAL_WORLD_SIZE": "2"}
    monkeypatch.setattr(threads, "busy_cores", lambda: 0.0)
    monkeypatch.setattr(threads, "affinity_cores", lambda: 8)
    assert threads.cpu_threads(0, environ) == 4
    assert threads.cpu_threads(3, environ) == 3
    assert threads.cpu_threads(0, {**environ, threads.ENV: "6"}) == 6
    assert threads.cpu_threads(0, {**environ, "OMP_NUM_THREADS": "1"}) is None, "torch already applied it"
    assert threads.cpu_threads(5, {"OMP_NUM_THREADS": "1"}) == 5
    with pytest.raises(ValueError, match=threads.ENV):
        threads.cpu_threads(0, {threads.ENV: "0"})


def test_training_ignores_the_load_so_its_count_does_not_change_from_run_to_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads, "affinity_cores", lambda: 8)
    monkeypatch.setattr(threads, "busy_cores", lambda: 7.0)
    assert threads.cpu_threads(0, {}, training=True) == 8
    assert threads.cpu_threads(0, {}, training=False) == 1, "an evaluation on a busy machine takes the idle core"


def test_the_cores_are_those_this_process_may_run_on() -> None:
    cores = threads.affinity_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    assert threads.machine_threads({"LOCAL_WORLD_SIZE": "1"}) == cores
    assert threads.machine_threads({"LOCAL_WORLD_SIZE": str(cores * 4)}) == 1


def test_an_empty_profile_prints_nothing(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from nerfstudio.configs.base_config import LoggingConfig
    from nerfstudio.utils import profiler

    monkeypatch.setattr(profiler.Profiler, "print_profile", profiler.Profiler.print_profile)
    startup.quiet_empty_profile()
    startup.quiet_empty_profile()  # once only
    timed = profiler.Profiler(LoggingConfig())
    profiler.Profiler(LoggingConfig()).print_profile()
    assert "Printing profiling stats" not in capsys.readouterr().out
    timed.update_time("train_iteration", 0.0, 1.0)
    timed.print_profile()
    assert "Printing profiling stats" in capsys.readouterr().out


def test_the_external_methods_catalogue_is_built_without_walking_the_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    from nerfstudio.configs import external_methods
    from rich.prompt import Confirm

    placeholder = external_methods.ExternalMethodDummyTrainerConfig
    monkeypatch.setattr(placeholder, "__post_init__", inspect.unwrap(placeholder.__post_init__))  # nerfstudio's
    walks: list[int] = []
    walk = inspect.stack
    monkeypatch.setattr(inspect, "stack", lambda *args: walks.append(1) or walk(*args)[1:])  # the caller's stack
    external_methods.get_external_methods()
    assert len(walks) == len(external_methods.get_external_methods()[0])  # nerfstudio's own: one walk per entry
    walks.clear()
    startup.skip_catalogue_stack_walk()
    startup.skip_catalogue_stack_walk()  # once only
    configs, _ = external_methods.get_external_methods()
    assert len(configs) > 10 and not walks
    # a user's choice of an external method still reaches nerfstudio's offer to install it
    offered: list[str] = []
    monkeypatch.setattr(Confirm, "ask", lambda *args, **kwargs: offered.append("asked") or False)
    method = next(iter(configs.values())).method
    with pytest.raises(SystemExit) as stopped:
        placeholder(method_name="chosen", method=method)
    assert stopped.value.code == 0 and walks and offered == ["asked"] * bool(method.pip_package)


def test_loading_the_plugin_takes_the_step_before_nerfstudio_builds_its_catalogue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib
    import inspect

    from nerfstudio.configs import external_methods

    from odin_nerfstudio.method_configs import odin_splat

    placeholder = external_methods.ExternalMethodDummyTrainerConfig
    nerfstudios = inspect.unwrap(placeholder.__post_init__)
    monkeypatch.setattr(placeholder, "__post_init__", nerfstudios)
    importlib.reload(odin_splat)  # as nerfstudio's discover_methods loads it, before get_external_methods
    assert getattr(placeholder.__post_init__, "odin_quick", False) and placeholder.__post_init__ is not nerfstudios


HELP_CHECK = """
import dataclasses, sys
from odin_nerfstudio.ns.startup import reflow_help_texts
reflow_help_texts()
from tyro._docstrings import get_field_docstring
from odin_nerfstudio.ns.trainer import OdinTrainerConfig
from odin_nerfstudio.runtime.config import OdinRuntimeConfig
from odin_nerfstudio.ns.datamanager import OdinDatamanagerConfig
from odin_nerfstudio.ns.model import OdinSplatModelConfig
from odin_nerfstudio.scheduling.cli import ScheduleCliConfig
from odin_nerfstudio.scenes.synth import SynthConfig
from odin_nerfstudio.simulation.cli import SimulateCliConfig
from odin_nerfstudio.core.timeline_cli import TimelineCliConfig
for cls in (OdinTrainerConfig, OdinRuntimeConfig, OdinDatamanagerConfig, OdinSplatModelConfig, ScheduleCliConfig,
            SynthConfig, SimulateCliConfig, TimelineCliConfig):
    own = set(getattr(cls, "__annotations__", {}))
    for field in dataclasses.fields(cls):
        text = get_field_docstring(cls, field.name, ())
        if field.name in own and text and "\\n" in text:
            print(f"{cls.__name__}.{field.name}: {text!r}")
"""


def test_help_texts_are_not_cut_where_the_source_wraps() -> None:
    """Every multi-line docstring of Odin's options reaches --help as one paragraph (in a fresh process: tyro caches
    what it has read)."""
    done = subprocess.run([sys.executable, "-c", HELP_CHECK], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "", done.stdout


def test_odin_simulate_prints_its_options_help_as_paragraphs() -> None:
    """odin-simulate --help (a console command of its own) reflows its options' texts too: a sentence its source
    wraps reaches a wide terminal on one line."""
    env = {**os.environ, "COLUMNS": "400"}
    command = [str(Path(sys.executable).with_name("odin-simulate")), "--help"]  # the venv's, whatever PATH holds
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(auto: regions with --sharded, halves from 16 workers; the locality schedule rlg otherwise)" in done.stdout


def test_reflowing_keeps_paragraphs_and_list_items() -> None:
    text = "One sentence\n    cut here (and\n    --here).\n\n    Items:\n    - first\n    - second\n    1. third"
    assert startup.reflowed(text) == "One sentence cut here (and --here).\n\nItems:\n- first\n- second\n1. third"
