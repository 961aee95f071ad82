"""Odin for nerfstudio: primitive-level synchronization for distributed 3D Gaussian Splatting.

What a user of the core imports (no nerfstudio needed): the runtime and its config, the schedule, the Relative
Locality Graph, tasks and cameras, selective Adam, the drivers and the transports. The nerfstudio layer lives in
:mod:`odin_nerfstudio.ns` and :mod:`odin_nerfstudio.method_configs`. See ``docs/architecture.md`` for the layers.

Names load on first use (PEP 562), so importing the package (as nerfstudio's entry points do) imports nothing
heavy, and a broken optional dependency (pycolmap, scipy) cannot break every ``ns-*`` command.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Camera": "odin_nerfstudio.core.camera",
    "Task": "odin_nerfstudio.core.tasks",
    "SelectiveAdam": "odin_nerfstudio.core.selective_adam",
    "RelativeLocalityGraph": "odin_nerfstudio.scheduling.rlg",
    "Schedule": "odin_nerfstudio.scheduling.schedule",
    "ScheduleConfig": "odin_nerfstudio.scheduling.schedule",
    "OdinRuntime": "odin_nerfstudio.runtime.runtime",
    "OdinRuntimeConfig": "odin_nerfstudio.runtime.runtime",
    "Read": "odin_nerfstudio.runtime.runtime",
    "Wait": "odin_nerfstudio.runtime.runtime",
    "VirtualTransport": "odin_nerfstudio.comm.inprocess",
    "DistributedTransport": "odin_nerfstudio.comm.distributed",
    "run_step": "odin_nerfstudio.drivers.step_loop",
    "settle": "odin_nerfstudio.drivers.step_loop",
    "run_virtual": "odin_nerfstudio.drivers.virtual",
    "rasterization": "odin_nerfstudio.rendering.rasterize",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import an exported name's module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'odin_nerfstudio' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
