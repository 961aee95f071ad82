"""The ``ns-train`` / ``odin-train`` command line of a training run, as the benchmarks and the end-to-end tests run it.

Why one place: a run through nerfstudio's CLI repeats the same dozen flags (CPU device, tensorboard without the
viewer, no evaluation during training, a fixed timestamp, a save at the end); each caller adds its own options and
data parser. ``train_command`` builds the whole command: the program (``ns-train``, or ``odin-train`` on N ranks
under ``torchrun``), the method, the common flags, the caller's options, then the data parser subcommand (last:
tyro reads every flag after it as the data parser's). ``train_args`` is the same without the program, for a caller
with a launcher of its own (``torchrun`` with a rendezvous across nodes).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from pathlib import Path

BIN = Path(sys.executable).parent
"""The folder of this environment's console scripts (``ns-train``, ``odin-train``, ``torchrun``)."""


def free_port() -> int:
    """A TCP port nothing listens on now (torchrun's rendezvous, the viewer's websocket)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def train_args(
    method: str,
    data: Path | str,
    output_dir: Path | str,
    iterations: int,
    *,
    device_type: str = "cpu",
    vis: str = "tensorboard",
    experiment_name: str | None = None,
    timestamp: str = "run",
    steps_per_save: int | None = None,
    options: Sequence[str] = (),
    dataparser: Sequence[str] = (),
) -> list[str]:
    """The method and its flags: what follows the program on a training command line.

    Args:
        method: the method config (``odin-splat``, ``odin-splat-quick``).
        data: the scene folder (``--data``).
        output_dir: where the run's folder goes (``--output-dir``).
        iterations: ``--max-num-iterations``.
        device_type: ``--machine.device-type`` (``cpu`` or ``cuda``).
        vis: ``--vis``; the viewer quits when training completes.
        experiment_name: ``--experiment-name`` (None: nerfstudio's default, the scene folder's name).
        timestamp: ``--timestamp``, the run folder's name.
        steps_per_save: ``--steps-per-save`` (None: ``iterations``, one checkpoint at the end).
        options: further flags of the method (runtime, pipeline, machine ...), after the common ones.
        dataparser: the data parser subcommand and its flags (empty: the method's default parser).

    Evaluation during training is off (``--steps-per-eval-all-images 0 --steps-per-eval-image 0``).
    """
    named = ["--experiment-name", experiment_name] if experiment_name is not None else []
    return [
        method,
        "--data", str(data),
        "--machine.device-type", device_type,
        "--vis", vis,
        "--viewer.quit-on-train-completion", "True",
        "--output-dir", str(output_dir),
        *named,
        "--timestamp", timestamp,
        "--max-num-iterations", str(iterations),
        "--steps-per-save", str(iterations if steps_per_save is None else steps_per_save),
        "--steps-per-eval-all-images", "0",
        "--steps-per-eval-image", "0",
        *options,
        *dataparser,
    ]  # fmt: skip


def launcher(ranks: int | None = None, master_port: int | None = None) -> list[str]:
    """The program: ``ns-train`` (one process), or ``torchrun --nproc-per-node N --master-port P --no-python
    odin-train`` on N ranks (``master_port`` None: a free one)."""
    if ranks is None:
        return [str(BIN / "ns-train")]
    port = free_port() if master_port is None else master_port
    torchrun = [str(BIN / "torchrun"), "--nproc-per-node", str(ranks), "--master-port", str(port), "--no-python"]
    return [*torchrun, str(BIN / "odin-train")]


def train_command(
    method: str,
    data: Path | str,
    output_dir: Path | str,
    iterations: int,
    *,
    ranks: int | None = None,
    master_port: int | None = None,
    **flags,
) -> list[str]:
    """A whole training command: :func:`launcher` (``ns-train``, or ``odin-train`` on ``ranks`` ranks under
    torchrun) then :func:`train_args` (``flags`` are its keyword arguments)."""
    return [*launcher(ranks, master_port), *train_args(method, data, output_dir, iterations, **flags)]
