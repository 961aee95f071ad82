"""odin-splat's checkpoints: written atomically, read with errors naming the file, resumed from the newest intact
one, and carrying the densification statistics so that a resumed run continues exactly.

Why each part:
- nerfstudio 1.1.5 writes ``step-<n>.ckpt`` in place; a run killed while saving leaves a truncated newest
  checkpoint, and ``--load-dir`` then always takes it and fails with an error naming no file. Here a checkpoint is
  written to a temporary file beside the checkpoint folder, fsynced, and renamed into place (a reader sees the old
  folder or the complete file, never a partial one); on resume the newest checkpoint that loads is taken, with a
  warning naming each one skipped and why.
- gsplat's strategy state (``grad2d``, ``count``, ``radii``: the statistics a refinement reads) lives outside the
  model's state dict; without it a refinement after resume sees only post-resume statistics. It is saved under
  :data:`STRATEGY_KEY` and restored into the runtime's strategy state after the runtime is built. Likewise the
  schedule's last re-balance by measured costs (``rebalancing.REBALANCE_KEY``), so a resumed run trains its epochs.
- nerfstudio calls ``torch.load(path, map_location="cpu")`` for resume, ns-eval, ns-viewer and ns-export. Since
  torch 2.6 that loads with ``weights_only=True``, which rejects the numpy scalars nerfstudio's LR schedulers store
  (``_last_lr`` is computed with numpy). Allowlisting exactly the numpy scalar and dtype types keeps the
  weights-only unpickler, so a checkpoint still cannot run code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from nerfstudio.utils.rich_utils import CONSOLE

from odin_nerfstudio.ns.rebalancing import REBALANCE_KEY, restore_rebalance, saved_rebalance

STRATEGY_KEY = "odin_strategy_state"
"""The checkpoint entry holding gsplat's strategy state (per-row tensors, scene scale)."""

CHECKPOINT_NAME = re.compile(r"^step-(\d+)\.ckpt$")
"""nerfstudio's checkpoint file names (``step-000000123.ckpt``)."""


def numpy_scalar_globals() -> list:
    """The numpy globals a pickled numpy scalar refers to: the scalar reconstructor, dtype and dtype classes."""
    try:
        from numpy.core.multiarray import scalar
    except ImportError:
        from numpy._core.multiarray import scalar
    dtype_classes = [type(np.dtype(kind)) for kind in ("float64", "float32", "int64", "int32", "bool")]
    return [scalar, np.dtype, *dtype_classes]


def allow_nerfstudio_checkpoints() -> None:
    """Allowlist the numpy scalar types in torch's weights-only unpickler (idempotent)."""
    torch.serialization.add_safe_globals(numpy_scalar_globals())


def checkpoint_path(directory: Path, step: int) -> Path:
    """Where nerfstudio names the checkpoint of ``step`` in ``directory``."""
    return Path(directory) / f"step-{step:09d}.ckpt"


def save_atomically(state: dict[str, Any], path: Path) -> None:
    """Write ``state`` to ``path`` so that ``path`` is never seen partially written.

    The temporary file sits in the parent of the checkpoint folder (the same file system, and never in the folder
    that ns-eval and ns-viewer list); it is fsynced, renamed over ``path``, and the folder is fsynced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.parent.parent / f".{path.parent.name}.{path.name}.{os.getpid()}.partial"
    try:
        with open(temporary, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The state saved at ``path``.

    Raises:
        FileNotFoundError: there is no such file.
        ValueError: the file cannot be read as a checkpoint (truncated or corrupt); the message names it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; pass an existing --load-dir or --load-checkpoint")
    allow_nerfstudio_checkpoints()
    try:
        state = torch.load(path, map_location="cpu")
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError... for a damaged file
        raise ValueError(
            f"checkpoint {path} ({path.stat().st_size} bytes) cannot be read: {error}. It is probably truncated "
            "(a run killed while saving); resume from an earlier one with --load-step or --load-checkpoint."
        ) from error
    if not isinstance(state, dict) or not {"step", "pipeline", "optimizers"} <= state.keys():
        raise ValueError(f"checkpoint {path} is not a nerfstudio checkpoint (no step, pipeline and optimizers)")
    return state


def newest_intact_checkpoint(directory: Path) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint in ``directory`` that loads, with its state; each newer one that does not is skipped
    with a warning naming it and why.

    Raises:
        FileNotFoundError: the folder holds no checkpoint.
        ValueError: no checkpoint in it loads; the message names each and why.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"--load-dir {directory} does not exist; pass a run's nerfstudio_models folder")
    steps = sorted(
        (int(match.group(1)) for name in os.listdir(directory) if (match := CHECKPOINT_NAME.match(name))),
        reverse=True,
    )
    if not steps:
        raise FileNotFoundError(f"--load-dir {directory} holds no step-<n>.ckpt checkpoint")
    failures = []
    for step in steps:
        path = checkpoint_path(directory, step)
        try:
            return path, load_checkpoint(path)
        except ValueError as error:
            failures.append(str(error))
            CONSOLE.print(f"[bold yellow]odin-splat: skipping a damaged checkpoint: {error}[/bold yellow]")
    raise ValueError(f"no checkpoint in {directory} can be read: " + " | ".join(failures))


def trainer_state(trainer: Any, step: int) -> dict[str, Any]:
    """What nerfstudio saves for ``trainer`` at ``step``, plus the runtime's strategy state and the schedule's last
    re-balance."""
    pipeline = trainer.pipeline.module if hasattr(trainer.pipeline, "module") else trainer.pipeline
    runtime = getattr(trainer, "runtime", None)
    strategy = None if runtime is None or runtime.strategy_state is None else dict(runtime.strategy_state)
    return {
        "step": step,
        "pipeline": pipeline.state_dict(),
        "optimizers": {name: opt.state_dict() for name, opt in trainer.optimizers.optimizers.items()},
        "schedulers": {name: sched.state_dict() for name, sched in trainer.optimizers.schedulers.items()},
        "scalers": trainer.grad_scaler.state_dict(),
        STRATEGY_KEY: strategy,
        REBALANCE_KEY: saved_rebalance(pipeline.datamanager),
    }


def save_trainer_checkpoint(trainer: Any, step: int) -> Path:
    """nerfstudio's checkpoint of ``step`` (and the strategy state), written atomically; older ones are deleted
    afterwards when ``--save-only-latest-checkpoint`` is on. Returns the checkpoint's path."""
    path = checkpoint_path(trainer.checkpoint_dir, step)
    save_atomically(trainer_state(trainer, step), path)
    if trainer.config.save_only_latest_checkpoint:
        for other in Path(trainer.checkpoint_dir).glob("*.ckpt"):
            if other != path:
                other.unlink()
    return path


def load_trainer_checkpoint(trainer: Any) -> dict[str, Any] | None:
    """nerfstudio's resume (``--load-dir``, ``--load-step``, ``--load-checkpoint``) with errors naming the file and,
    for ``--load-dir`` without a step, the newest intact checkpoint. Returns the saved strategy state (None when
    nothing was loaded or the checkpoint predates it); sets the trainer's start step."""
    config = trainer.config
    if config.load_dir is not None and config.load_step is None:
        path, state = newest_intact_checkpoint(config.load_dir)
    elif config.load_dir is not None:
        path = checkpoint_path(config.load_dir, config.load_step)
        state = load_checkpoint(path)
    elif config.load_checkpoint is not None:
        path = Path(config.load_checkpoint)
        state = load_checkpoint(path)
    else:
        CONSOLE.print("No Nerfstudio checkpoint to load, so training from scratch.")
        return None
    trainer._start_step = state["step"] + 1
    trainer.pipeline.load_pipeline(state["pipeline"], state["step"])
    trainer.optimizers.load_optimizers(state["optimizers"])
    if "schedulers" in state and config.load_scheduler:
        trainer.optimizers.load_schedulers(state["schedulers"])
    trainer.grad_scaler.load_state_dict(state["scalers"])
    CONSOLE.print(f"Done loading Nerfstudio checkpoint from {path}")
    restore_rebalance(trainer.pipeline.datamanager, state.get(REBALANCE_KEY))
    saved = state.get(STRATEGY_KEY)
    if saved is None:
        CONSOLE.print(
            f"[yellow]odin-splat: {path} holds no densification statistics (an older checkpoint); the next "
            "refinement sees only the statistics gathered after resuming.[/yellow]"
        )
    return saved


def restore_strategy_state(
    state: dict[str, Any], saved: dict[str, Any] | None, num_rows: int, device: torch.device
) -> None:
    """Put the checkpoint's strategy state ``saved`` into the runtime's ``state`` on ``device`` (the same dict
    object, which the runtime and gsplat's ops update in place).

    Raises:
        ValueError: a saved per-row tensor does not have ``num_rows`` rows (the checkpoint is inconsistent).
    """
    if saved is None:
        return
    for name, value in saved.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] != num_rows:
            raise ValueError(
                f"the checkpoint's strategy state {name} has {value.shape[0]} rows, the model {num_rows}: "
                "the checkpoint is inconsistent"
            )
    state.update({name: v.to(device) if isinstance(v, torch.Tensor) else v for name, v in saved.items()})
