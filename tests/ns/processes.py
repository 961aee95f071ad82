"""Commands of this environment run as a user runs them, several at once where a test has independent ones: on 2
cores much of a command is its start-up (importing torch and nerfstudio), so commands started together overlap."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
"""Where this environment's commands are (ns-train, odin-train, torchrun, ...)."""
TIMEOUT_S = 600.0
"""The longest a test waits for one command."""


@dataclass
class Started:
    """A command started (:func:`start`), to be waited for by :func:`finish`."""

    name: str
    process: subprocess.Popen


def environment(one_thread: bool = False) -> dict[str, str]:
    """A command's environment: this one with wandb offline; with ``one_thread``, one intra-op thread per process
    (as each torchrun rank has, so that runs round alike)."""
    return {**os.environ, "WANDB_MODE": "offline", **({"OMP_NUM_THREADS": "1"} if one_thread else {})}


def start(*args: str, one_thread: bool = False) -> Started:
    """Start a command (``args[0]`` a program of :data:`BIN` by name or by path) in :func:`environment`."""
    command = [str(BIN / args[0]), *args[1:]]
    env = environment(one_thread)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return Started(Path(args[0]).name, process)


def finish(run: Started, timeout: float = TIMEOUT_S) -> str:
    """Wait for ``run`` (killed after ``timeout`` seconds); its output, once it succeeded (else an AssertionError
    with the output's tails)."""
    try:
        stdout, stderr = run.process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        run.process.kill()
        stdout, stderr = run.process.communicate()
    assert run.process.returncode == 0, f"{run.name} failed:\n{stdout[-3000:]}\n{stderr[-5000:]}"
    return stdout + stderr
