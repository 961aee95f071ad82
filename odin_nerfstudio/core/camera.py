"""The pinhole camera a task renders with, in gsplat's conventions (a plain type every layer shares)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Camera:
    """A pinhole camera as gsplat's ``rasterization`` takes it.

    Attributes:
        viewmat: world-to-camera transform, [4, 4] (OpenCV axes: +z forward, +x right, +y down).
        K: intrinsics, [3, 3].
        width: image width in pixels.
        height: image height in pixels.
    """

    viewmat: Tensor
    K: Tensor
    width: int
    height: int
