"""Candidate set C(t): the primitives a task may read, found before it reads by frustum and bounding-sphere culling.

C(t) must be a conservative superset of what the rasterizer will see (the active set A(t)). Each Gaussian is
bounded by a sphere of radius ``3 * max(scale) * (1 + margin)`` around its mean (gsplat's 3-sigma extent); the
view frustum is the pinhole image widened by ``margin`` of the image size plus ``BLUR_SLACK_PX`` pixels on every
side (gsplat's eps2d = 0.3 px^2 screen-space blur reaches ``3 * sqrt(0.3) < 2`` pixels), and the near plane is
moved towards the camera by the radius. A Gaussian is a candidate when its sphere is not entirely outside one of
the five planes. No far plane is used (conservative). Whether the superset held is checked after the fact by the
runtime's validation, never assumed.

The margin is needed: the sphere test is exact for the true perspective image of a sphere, but the rasterizer
projects each Gaussian through the EWA linearization at its mean, which over-estimates the screen extent of a
Gaussian close to the camera and off-axis (e.g. a 44 px radius for a sphere whose true image stays outside the
frame). With margin 0 such a Gaussian can be visible yet culled; the default 0.1 covered every case in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

BLUR_SLACK_PX = 2.0


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


@dataclass
class BoundingSpheres:
    """The culling bounds of every Gaussian, kept column-major so that culling a task is one [3, 3] x [3, N] product.

    Row-major means [N, 3] make the camera transform a matmul with an inner size of 3, slow on CPU; the centres
    are kept transposed, and the radii precomputed, and both are refreshed only on the rows a publication wrote.

    Attributes:
        centres: Gaussian centres in world space, [3, N].
        radii: 3-sigma bounding radii, ``3 * max(scale)``, [N].
    """

    centres: Tensor
    radii: Tensor

    @classmethod
    def of(cls, means: Tensor, scales: Tensor) -> BoundingSpheres:
        """Bounds of Gaussians with centres [N, 3] and activated (world-space) scales [N, 3]."""
        return cls(means.detach().T.contiguous(), 3.0 * scales.detach().max(dim=-1).values)

    def update(self, rows: Tensor, means: Tensor, scales: Tensor) -> None:
        """Refresh the bounds of ``rows`` (int64 [R]) from their new centres [R, 3] and scales [R, 3]."""
        self.centres[:, rows] = means.detach().T.to(self.centres.dtype)
        self.radii[rows] = 3.0 * scales.detach().max(dim=-1).values.to(self.radii.dtype)

    def in_region(self, camera: Camera, margin: float, near_plane: float = 0.01) -> Tensor:
        """Whether each sphere, widened by ``margin``, meets the widened frustum of ``camera``, bool [N]."""
        rotation = camera.viewmat[:3, :3].to(self.centres.dtype)
        translation = camera.viewmat[:3, 3].to(self.centres.dtype)
        x, y, z = torch.addmm(translation[:, None], rotation, self.centres)
        radius = self.radii * (1.0 + margin)
        fx, fy = float(camera.K[0, 0]), float(camera.K[1, 1])
        cx, cy = float(camera.K[0, 2]), float(camera.K[1, 2])
        pad_x = margin * camera.width + BLUR_SLACK_PX
        pad_y = margin * camera.height + BLUR_SLACK_PX
        left, right = (-pad_x - cx) / fx, (camera.width + pad_x - cx) / fx
        top, bottom = (-pad_y - cy) / fy, (camera.height + pad_y - cy) / fy
        inside = z >= near_plane - radius
        inside &= (x - left * z) >= -radius * (1.0 + left * left) ** 0.5
        inside &= (right * z - x) >= -radius * (1.0 + right * right) ** 0.5
        inside &= (y - top * z) >= -radius * (1.0 + top * top) ** 0.5
        inside &= (bottom * z - y) >= -radius * (1.0 + bottom * bottom) ** 0.5
        return inside


def in_candidate_region(
    means: Tensor,
    scales: Tensor,
    camera: Camera,
    margin: float,
    near_plane: float = 0.01,
) -> Tensor:
    """Whether each Gaussian's bounding sphere meets the widened frustum, bool [M].

    Args:
        means: Gaussian centres in world space, [M, 3].
        scales: activated (world-space) scales, [M, 3].
        camera: the task's camera.
        margin: widening of the frustum (fraction of the image size) and of the sphere radius (fraction).
        near_plane: the rasterizer's near plane.
    """
    return BoundingSpheres.of(means, scales).in_region(camera, margin, near_plane)


def candidate_set(
    means: Tensor,
    scales: Tensor,
    camera: Camera,
    margin: float,
    near_plane: float = 0.01,
) -> Tensor:
    """The candidate set C(t): sorted rows of the Gaussians whose bounding sphere meets the frustum, int64 [M].

    Args:
        means: Gaussian centres in world space, [N, 3].
        scales: activated (world-space) scales, [N, 3].
        camera: the task's camera.
        margin: see :func:`in_candidate_region`.
        near_plane: the rasterizer's near plane.
    """
    return torch.nonzero(in_candidate_region(means, scales, camera, margin, near_plane)).flatten()
