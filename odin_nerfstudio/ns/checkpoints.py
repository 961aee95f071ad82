"""Let nerfstudio's own `torch.load` calls read its checkpoints on torch >= 2.6 without turning safe loading off.

nerfstudio 1.1.5 calls `torch.load(path, map_location="cpu")` for resume, ns-eval, ns-viewer and ns-export.
Since torch 2.6 that loads with `weights_only=True`, which rejects the numpy scalars nerfstudio's LR schedulers
store (`_last_lr` is computed with numpy). Allowlisting exactly the numpy scalar and dtype types keeps the
weights-only unpickler, so a checkpoint still cannot run code.
"""

from __future__ import annotations

import numpy as np
import torch


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
