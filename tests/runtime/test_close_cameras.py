"""Candidate sets hold with cameras inside the content and at a coarse render resolution: the two causes of the
escapes seen on real object captures (``docs/architecture.md``, candidate sets), each triggered by a scene built
for it, checked against the rasterizer's own projection."""

from __future__ import annotations

import pytest
import torch

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion
from odin_nerfstudio.rendering.rasterize import drawn_rows
from odin_nerfstudio.adapter.gsplat import GsplatAdapter
from odin_nerfstudio.runtime.culling_index import CullingIndex
from odin_nerfstudio.scenes.close_cameras import border_specks, inside_shell, pinhole

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def downscaled(camera: Camera, factor: int) -> Camera:
    """The camera at 1 / ``factor`` resolution (the resolution schedule's render camera)."""
    K = camera.K.clone()
    K[:2] /= factor
    return Camera(camera.viewmat, K, camera.width // factor, camera.height // factor)


def sphere_region(camera, margin: float = 0.1) -> CullRegion:
    """The frustum widened by ``margin`` of the image plus 2 px, spheres x (1 + margin): a sphere test that
    trusts the Gaussian's sphere, blind to gsplat's square radius box and to the render's resolution."""
    return CullRegion.sphere(camera, margin * camera.width + 2.0, margin * camera.height + 2.0, 1.0 + margin, 0.01)


@pytest.mark.parametrize("size", [(540, 960), (67, 120), (120, 67)])
def test_candidates_hold_every_drawn_row_with_cameras_inside_the_content(size: tuple[int, int]) -> None:
    """Large Gaussians beside the camera and off its corners are drawn beyond their sphere (the radius box is a
    square of the largest eigenvalue, the Jacobian clamped at 1.3 tan(fov / 2)): the scene makes such rows (the
    sphere test misses some), and C(t)'s region holds every drawn row."""
    cameras, rows = inside_shell(4000, 6, *size)
    bounds = BoundingSpheres.of(rows["means"], torch.exp(rows["scales"]))
    missed_by_spheres = 0
    for camera in cameras:
        drawn = drawn_rows(camera, rows)
        assert bool(drawn.any())
        missed_by_spheres += int((drawn & ~bounds.meets(sphere_region(camera))).sum())
        outside = drawn & ~bounds.meets(CullRegion.candidates(camera, 0.1))
        assert not bool(outside.any()), f"{int(outside.sum())} drawn rows outside C(t)'s region"
    assert missed_by_spheres > 0, "the scene no longer draws rows beyond their spheres"


def test_candidates_are_culled_at_the_resolution_the_task_renders() -> None:
    """Small Gaussians just outside a small image are drawn through the blur and the ceil of the radius, a few
    pixels of the render's resolution: at 1/4 of the task camera's, more than a fixed pixel pad of the task's.
    The culling index culls with the renderer's drawable region and holds them."""
    camera = pinhole(40, 30, 60.0, torch.eye(4))
    rows = border_specks(camera, 3000, reach_px=16.0)
    render_camera = downscaled(camera, 4)
    drawn = drawn_rows(render_camera, rows)
    bounds = BoundingSpheres.of(rows["means"], torch.exp(rows["scales"]))
    assert bool((drawn & ~bounds.meets(sphere_region(camera))).any()), "no speck is drawn beyond the pixel pad"
    params = {**rows, "quats": rows["quats"].contiguous()}
    index = CullingIndex(params, GsplatAdapter(), 0.1, 0.01, lambda task: CullRegion.drawable(render_camera))
    candidates = index.candidates(Task(0, 0, 0, 0, camera))
    missing = torch.nonzero(drawn).flatten()
    missing = missing[~torch.isin(missing, candidates)]
    assert missing.numel() == 0, f"{missing.numel()} drawn rows outside C(t)"
