"""SIGTERM in a training process: pycolmap's native handler is kept out (no "*** Aborted" stack trace), and
odin-train's handler ends the process at once with one line, even while its main thread is blocked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

BLOCKED_AFTER_IMPORT = """
import sys, time
from odin_nerfstudio.scheduling import tracks  # imports pycolmap through import_pycolmap
{install}
print("ready", flush=True)
time.sleep(60)
"""


def run_and_terminate(install: str) -> tuple[int, str, float]:
    """Start a Python process that imports pycolmap the package's way, SIGTERM it once ready; exit code, output,
    seconds from the signal to the exit."""
    process = subprocess.Popen(
        [sys.executable, "-c", BLOCKED_AFTER_IMPORT.format(install=install)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
    )
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    output, _ = process.communicate(timeout=30)
    return process.returncode, output, time.monotonic() - sent


def test_pycolmap_import_keeps_the_default_sigterm() -> None:
    code, output, _ = run_and_terminate("")
    assert code == -signal.SIGTERM, output
    assert "Aborted" not in output and "***" not in output, output


def test_exit_on_sigterm_prints_one_line_and_exits_at_once() -> None:
    install = "from odin_nerfstudio.ns.signals import exit_on_sigterm; exit_on_sigterm('odin-train rank 1')"
    code, output, elapsed = run_and_terminate(install)
    assert code == 128 + signal.SIGTERM
    assert output.strip().splitlines() == [
        "odin-train rank 1: stopped by SIGTERM (the job is ending; the first failing rank says why)"
    ]
    assert elapsed < 10.0, f"took {elapsed:.1f} s"
