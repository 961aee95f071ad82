"""Synthetic scenes with cameras inside the content: the configurations where candidate sets used to miss rows.

Real object-centric and indoor captures put Gaussians right beside the camera, large and flat ones among them, and
the resolution schedule renders small images. These builders make such configurations on demand (seeded), in
gsplat's row layout (means, quats, log-scales), for the culling tests and ``benchmarks/bench_escapes.py``:

- :func:`inside_shell`: cameras on a small ring inside a shell of Gaussians (a room, or a capture whose SfM points
  surround the rig), looking outwards and tilted, portrait or landscape: Gaussians near the camera and off the
  corners of its frustum, where gsplat's square radius box reaches furthest beyond the Gaussian's sphere;
- :func:`border_specks`: tiny Gaussians just outside the image border, drawn through the blur and the ceil of
  gsplat's radius, which at a coarse render resolution span several pixels of the task's camera.
See ``culling/candidates.py`` and ``docs/architecture.md`` for why these used to escape C(t).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from odin_nerfstudio.core.camera import Camera


def pinhole(width: int, height: int, horizontal_fov_deg: float, viewmat: Tensor) -> Camera:
    """A centred pinhole camera with square pixels and the given horizontal field of view."""
    focal = 0.5 * width / math.tan(math.radians(horizontal_fov_deg) / 2.0)
    K = torch.tensor([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]])
    return Camera(viewmat, K, width, height)


def _outward_viewmat(angle: float, radius: float, tilt: float) -> Tensor:
    """World-to-camera of a camera at ``angle`` on a horizontal ring of ``radius``, looking outwards, pitched by
    ``tilt`` radians (OpenCV axes: +z forward, +y down; world +z is up)."""
    eye = torch.tensor([radius * math.cos(angle), radius * math.sin(angle), 0.0])
    forward = torch.tensor([math.cos(angle) * math.cos(tilt), math.sin(angle) * math.cos(tilt), math.sin(tilt)])
    right = torch.linalg.cross(forward, torch.tensor([0.0, 0.0, 1.0]))
    right = right / right.norm()
    down = torch.linalg.cross(forward, right)
    rotation = torch.stack([right, down, forward])
    viewmat = torch.eye(4)
    viewmat[:3, :3] = rotation
    viewmat[:3, 3] = -rotation @ eye
    return viewmat


def inside_shell(
    num_gaussians: int, num_views: int, width: int, height: int, fov_deg: float = 60.0, seed: int = 0
) -> tuple[list[Camera], dict[str, Tensor]]:
    """Cameras on a ring of radius 0.5 inside a cloud of Gaussians between radius 0.2 and 3 (denser near the ring),
    scales from tiny to about their distance to the camera, a third of them flat (one axis 50x thinner).

    Returns:
        the cameras, and the rows: means [N, 3], quats [N, 4] (not normalized), scales [N, 3] (log).
    """
    generator = torch.Generator().manual_seed(seed)
    direction = torch.randn(num_gaussians, 3, generator=generator)
    direction = direction / direction.norm(dim=1, keepdim=True)
    distance = 0.2 + 2.8 * torch.rand(num_gaussians, generator=generator) ** 2
    means = direction * distance[:, None]
    scales = torch.empty(num_gaussians, 3).uniform_(-5.0, -1.0, generator=generator)
    flat = torch.rand(num_gaussians, generator=generator) < 1.0 / 3.0
    scales[flat, 2] -= math.log(50.0)
    quats = torch.randn(num_gaussians, 4, generator=generator)
    tilts = torch.empty(num_views).uniform_(-0.4, 0.4, generator=generator).tolist()
    cameras = [
        pinhole(width, height, fov_deg, _outward_viewmat(2.0 * math.pi * i / num_views, 0.5, tilts[i]))
        for i in range(num_views)
    ]
    return cameras, {"means": means, "quats": quats, "scales": scales}


def border_specks(camera: Camera, num_gaussians: int, reach_px: float, seed: int = 0) -> dict[str, Tensor]:
    """Tiny Gaussians (a thousandth of their depth) whose centres project within ``reach_px`` pixels outside the
    border of ``camera``'s image, at depths 1 to 5, in gsplat's row layout (log-scales)."""
    generator = torch.Generator().manual_seed(seed)
    width, height = camera.width, camera.height
    side = torch.randint(0, 4, (num_gaussians,), generator=generator)
    along = torch.rand(num_gaussians, generator=generator)
    out = torch.rand(num_gaussians, generator=generator) * reach_px
    u = torch.where(side == 0, -out, torch.where(side == 1, width + out, along * width))
    v = torch.where(side == 2, -out, torch.where(side == 3, height + out, along * height))
    depth = 1.0 + 4.0 * torch.rand(num_gaussians, generator=generator)
    (fx, _, cx), (_, fy, cy), _ = camera.K.tolist()
    local = torch.stack([(u - cx) / fx * depth, (v - cy) / fy * depth, depth], dim=1)
    rotation, translation = camera.viewmat[:3, :3], camera.viewmat[:3, 3]
    means = (local - translation) @ rotation
    scales = torch.log(depth * 1e-3)[:, None].expand(-1, 3).clone()
    return {"means": means, "quats": torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(num_gaussians, -1), "scales": scales}
