"""The cheap escape check is sound: the drawable region holds every Gaussian the projection draws (with each row's
own radius factor, tight off the corners and near the camera, smaller beside the image), the block index culls
exactly what the full scan does, and validation with an EscapeCheck finds exactly the escapes of the projection of
every row, on random, synthetic-street and real configurations."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import Tensor

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion
from odin_nerfstudio.rendering.rasterize import DRAWN_ROWS_READS, drawn_rows
from odin_nerfstudio.runtime.config import Topology
from odin_nerfstudio.runtime.runtime import EscapeCheck, OdinRuntimeConfig
from odin_nerfstudio.scenes.close_cameras import pinhole
from odin_nerfstudio.scenes.synth import intrinsics, street_rig_cameras, street_world
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.drivers.virtual import run_virtual
from tests.conftest import REAL_SCENES, real_scene
from odin_nerfstudio.scenes.toy import (
    assert_identical,
    make_params,
    make_runtime,
    make_schedule,
    render_gsplat,
    snapshot,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_camera(generator: torch.Generator) -> Camera:
    """A camera at a random pose with a random focal length, off-centre principal point and image size."""
    width, height = (int(v) for v in torch.randint(6, 48, (2,), generator=generator))
    focal = float(torch.empty(1).uniform_(0.3, 3.0, generator=generator)) * width
    aspect = float(torch.empty(1).uniform_(0.7, 1.4, generator=generator))
    cx = width * float(torch.empty(1).uniform_(0.2, 0.8, generator=generator))
    cy = height * float(torch.empty(1).uniform_(0.2, 0.8, generator=generator))
    K = torch.tensor([[focal, 0.0, cx], [0.0, focal * aspect, cy], [0.0, 0.0, 1.0]])
    rotation, _ = torch.linalg.qr(torch.randn(3, 3, generator=generator))
    viewmat = torch.eye(4)
    viewmat[:3, :3] = rotation * torch.sign(torch.det(rotation))
    viewmat[:3, 3] = torch.randn(3, generator=generator)
    return Camera(viewmat, K, width, height)


def random_gaussians(camera: Camera, count: int, generator: torch.Generator) -> dict[str, Tensor]:
    """Gaussians around a camera (in front, behind, at the near plane, far off-axis) with scales from tiny to
    larger than their depth, in gsplat's layout (log-scales)."""
    local = torch.randn(count, 3, generator=generator) * torch.tensor([3.0, 3.0, 2.0])
    local[: count // 8, 2] = torch.empty(count // 8).uniform_(-0.05, 0.1, generator=generator)
    rotation, translation = camera.viewmat[:3, :3], camera.viewmat[:3, 3]
    means = (local - translation) @ rotation
    return {
        "means": means,
        "scales": torch.randn(count, 3, generator=generator) * 1.5 - 2.5,
        "quats": torch.randn(count, 4, generator=generator),
    }


def drawn(camera: Camera, rows: dict[str, Tensor], eps2d: float = 0.3, near_plane: float = 0.01) -> Tensor:
    """Rows the rasterizer's projection gives radius > 0, sorted int64 [V]."""
    return torch.nonzero(drawn_rows(camera, rows, eps2d, near_plane)).flatten()


def assert_sound_and_exact(camera: Camera, rows: dict[str, Tensor], eps2d: float = 0.3, near: float = 0.01) -> None:
    """Every drawn row meets the drawable region, and the block index finds exactly the full scan's rows."""
    bounds = BoundingSpheres.of(rows["means"], torch.exp(rows["scales"]))
    region = CullRegion.drawable(camera, eps2d, near)
    inside = torch.nonzero(bounds.meets(region)).flatten()
    visible = drawn(camera, rows, eps2d, near)
    assert torch.isin(visible, inside).all(), f"{int((~torch.isin(visible, inside)).sum())} drawn rows outside"
    assert torch.equal(bounds.rows_in(region), inside)
    candidates = CullRegion.candidates(camera, 0.1, near)
    assert torch.equal(bounds.rows_in(candidates), torch.nonzero(bounds.meets(candidates)).flatten())


@pytest.mark.parametrize("seed", range(12))
def test_drawable_region_holds_every_drawn_gaussian_on_random_configurations(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    eps2d, near = [(0.3, 0.01), (0.1, 0.2), (1.0, 0.05)][seed % 3]
    camera = random_camera(generator)
    rows = random_gaussians(camera, 3000, generator)
    assert_sound_and_exact(camera, rows, eps2d, near)
    bounds = BoundingSpheres.of(rows["means"], torch.exp(rows["scales"]))
    assert not bounds.meets(CullRegion.drawable(camera, eps2d, near)).all(), "the bound culls nothing"


def street_rig(length: float, width: int, height: int) -> list[Camera]:
    """The benchmark's street-scan rig (``synth.street_rig_cameras``, 70 deg FOV) as runtime cameras."""
    K = torch.tensor(intrinsics(width, height, 70.0), dtype=torch.float32)
    return [Camera(v.float(), K, width, height) for v in torch.tensor(street_rig_cameras(length))]


def test_drawable_region_and_block_index_on_a_street_after_updates() -> None:
    """A perturbed street world (the benchmark's scene, smaller): sound and exact before and after publications
    move rows (the block boxes grow and the index is rebuilt once they have grown enough)."""
    world = street_world(20_000, np.random.default_rng(0), 40.0)
    generator = torch.Generator().manual_seed(1)
    rows = {
        "means": world.means + 0.3 * world.scales[:, :1] * torch.randn(world.means.shape, generator=generator),
        "scales": torch.log(world.scales) + 0.2 * torch.randn(world.scales.shape, generator=generator),
        "quats": world.quats + 0.1 * torch.randn(world.quats.shape, generator=generator),
    }
    bounds = BoundingSpheres.of(rows["means"], torch.exp(rows["scales"]))
    for index, camera in enumerate(street_rig(40.0, 64, 48)[::3]):
        assert_sound_and_exact(camera, rows)
        region = CullRegion.candidates(camera, 0.1)
        assert torch.equal(bounds.rows_in(region), torch.nonzero(bounds.meets(region)).flatten())
        moved = torch.unique(torch.randint(0, world.means.shape[0], (2000,), generator=generator))
        rows["means"][moved] += (0.02 + 0.3 * (index % 4 == 3)) * torch.randn(moved.numel(), 3, generator=generator)
        rows["scales"][moved] += 0.1 * torch.randn(moved.numel(), 3, generator=generator)
        bounds.update(moved, rows["means"][moved], torch.exp(rows["scales"][moved]))
        assert torch.equal(bounds.centres, rows["means"].T)


def gsplat_visibility(task: Task, rows: dict[str, Tensor]) -> Tensor:
    """The rows ``render_gsplat`` draws for ``task`` (its projection, no compositing), bool [M]."""
    visible = torch.zeros(rows["means"].shape[0], dtype=torch.bool)
    visible[drawn(task.camera, rows)] = True
    return visible


def recorded(escaped, found: list[Tensor]):
    """An escape check (``Validator.find_escapes``) that also appends each answer to ``found``."""

    def record(task: Task, candidate: Tensor) -> Tensor:
        found.append(escaped(task, candidate))
        return found[-1]

    return record


def geometry_only(task: Task, rows: dict[str, Tensor]) -> Tensor:
    """:func:`gsplat_visibility`, asked about the rows' geometry alone (``DRAWN_ROWS_READS``), never more."""
    assert set(rows) == set(DRAWN_ROWS_READS), f"gathered {sorted(rows)} for a projection"
    return gsplat_visibility(task, rows)


def test_escape_check_finds_the_escapes_of_the_full_projection() -> None:
    """A too narrow frustum (negative margin) makes rows escape: validation with an EscapeCheck (few rows
    projected; with ``reads``, only their geometry gathered) finds exactly the escapes of the projection of all N
    rows, so the runs are bit-identical."""
    escapes = {}
    results = {}
    drawable = lambda task: CullRegion.drawable(task.camera)  # noqa: E731
    for name, check in {
        "all rows": gsplat_visibility,
        "drawable rows": EscapeCheck(gsplat_visibility, drawable),
        "drawable rows, geometry": EscapeCheck(geometry_only, drawable, DRAWN_ROWS_READS),
    }.items():
        for mode, turns in (("barrier", []), ("quality", [1] * 12)):
            config = OdinRuntimeConfig(mode=mode, candidate_margin=-0.35)
            runtime = make_runtime(
                config, make_params(80), render_fn=render_gsplat, visibility_fn=check, topology=Topology(2)
            )
            validator = runtime.validator
            validator.find_escapes = recorded(validator.find_escapes, escapes.setdefault((name, mode), []))
            run_virtual(runtime, make_schedule(4, 2, 1, 6), turns)
            results[(name, mode)] = (snapshot(runtime), runtime.counters.validation_failures.get("escape", 0))
    for mode in ("barrier", "quality"):
        full = escapes[("all rows", mode)]
        for cheap_name in ("drawable rows", "drawable rows, geometry"):
            cheap = escapes[(cheap_name, mode)]
            assert len(full) == len(cheap) and all(torch.equal(a, b) for a, b in zip(full, cheap, strict=True))
            assert results[("all rows", mode)][1] == results[(cheap_name, mode)][1] > 0
            assert_identical(results[("all rows", mode)][0], results[(cheap_name, mode)][0])
    assert_identical(results[("drawable rows", "quality")][0], results[("drawable rows", "barrier")][0])


@pytest.mark.slow
@pytest.mark.parametrize("scene_name", REAL_SCENES)
def test_escape_check_on_real_scenes(scene_name: str) -> None:
    """Real scenes (SfM-initialized Gaussians, real cameras at the model's first downscale): every Gaussian the
    renderer's projection draws meets its drawable region, and with too narrow candidate sets the restricted
    check finds exactly the rows of the full projection outside C(t)."""
    from odin_nerfstudio.ns.splat_runtime import SplatTaskRenderer, odin_camera
    from tests.runtime.test_equivalence import pipeline_config

    config = pipeline_config(real_scene(scene_name), 2, 0.5)
    config.model.num_downscales = 1
    torch.manual_seed(0)
    pipeline = config.setup(device="cpu", test_mode="val", world_size=1, local_rank=0)
    model = pipeline.model
    model.train()
    renderer = SplatTaskRenderer(model, [])
    params = {name: p.detach() for name, p in model.gauss_params.items()}
    bounds = BoundingSpheres.of(params["means"], torch.exp(params["scales"]))
    cameras = pipeline.datamanager.train_dataset.cameras
    escaped_somewhere = False
    for view in range(len(cameras)):
        task = Task(0, 0, 0, view, odin_camera(cameras, view))
        camera = renderer.render_camera(task)
        assert camera.width < task.camera.width, "the check must run at the model's downscale"
        assert_sound_and_exact(camera, params)
        visible = torch.nonzero(renderer.visible(task, params)).flatten()
        candidate = bounds.rows_in(CullRegion.candidates(camera, -0.3))
        region = bounds.rows_in(renderer.drawable(task))
        outside = region[~torch.isin(region, candidate)]
        gathered = {name: params[name][outside] for name in renderer.visible_reads}
        cheap = outside[renderer.visible(task, gathered)]
        assert torch.equal(cheap, visible[~torch.isin(visible, candidate)])
        escaped_somewhere |= cheap.numel() > 0
    assert escaped_somewhere


def test_remote_writes_are_predicted_by_the_rows_a_task_would_draw() -> None:
    """With an EscapeCheck, another rank's expected task counts as pending writes on exactly the rows the projection
    draws for it (found through the drawable region), a subset of its candidate set: fewer needless waits."""
    check = EscapeCheck(gsplat_visibility, lambda task: CullRegion.drawable(task.camera))
    runtime = make_runtime(OdinRuntimeConfig(mode="quality"), make_params(80), render_fn=render_gsplat, visibility_fn=check)
    (task,) = make_schedule(1, 1, 1, 6)[0][0]
    runtime.expect([task])
    (predicted,) = runtime.remote.writes(before_step=1, published_through=-1)
    every_row = {name: p.detach() for name, p in runtime.params.items()}
    drawn = torch.nonzero(gsplat_visibility(task, every_row)).flatten()
    assert predicted.step == 0 and torch.equal(predicted.rows, drawn)
    candidate = runtime.index.candidates(task)
    assert drawn.numel() < candidate.numel()


def test_a_view_rendered_here_is_predicted_by_its_active_rows_and_projected_once_otherwise() -> None:
    """A view's predicted writes are its A(t) from its last render on this process, else its drawn rows projected
    once and kept for its next task, carried through a structural change (remap) rather than projected again."""
    check = EscapeCheck(gsplat_visibility, lambda task: CullRegion.drawable(task.camera))
    config = OdinRuntimeConfig(mode="quality", record_reads=True)
    runtime = make_runtime(config, make_params(80), render_fn=render_gsplat, visibility_fn=check)
    schedule = make_schedule(3, 1, 1, 6)
    (first,) = schedule[0][0]
    runtime.finish(runtime.read_next([first]))
    staged = runtime.published_rows[0]
    again = Task(2, 0, 0, first.view, first.camera)
    runtime.expect([again])
    (predicted,) = runtime.remote.writes(before_step=3, published_through=0)
    assert torch.equal(predicted.rows, staged) and runtime.counters.projections == 0
    other = next(task for step in schedule for (task,) in step if task.view != first.view)
    later = [Task(s, 0, 0, other.view, other.camera) for s in (5, 6)]
    runtime.expect(later)
    writes = runtime.remote.writes(before_step=7, published_through=0)
    assert runtime.counters.projections == 1 and torch.equal(writes[1].rows, writes[2].rows)
    assert runtime.counters.projection_cpu_ns > 0, "the projection's CPU time is counted"
    runtime.remap(torch.arange(runtime.num_primitives))
    runtime.expect([Task(7, 0, 0, other.view, other.camera)])
    carried = runtime.remote.writes(before_step=8, published_through=0)[-1].rows
    assert runtime.counters.projections == 1  # carried through the remap (core/tables.remap_row_sets), not projected
    assert torch.equal(carried, runtime.remote.predict(later[0]))  # nothing published since its projection


def beside(camera: Camera, side: str, depths: list[float], scale: float, distance: float) -> dict[str, Tensor]:
    """Round Gaussians (scale ``scale`` x depth) beyond one side of ``camera``'s drawable region, at mid-height
    (left, right) or mid-width (top, bottom), at ``distance`` x their 3-sigma radius x the region's largest
    factor from the side's half-plane (camera at the origin, looking down +z)."""
    region = CullRegion.drawable(camera)
    index = ("left", "right", "top", "bottom").index(side)
    slope, factor = region.sides[index], region.side_scales[index] * region.largest_factor
    means = []
    for z in depths:
        gap = distance * factor * 3.0 * scale * z
        along = slope * z + (gap if side in ("right", "bottom") else -gap)
        means.append([along, 0.0, z] if side in ("left", "right") else [0.0, along, z])
    count = len(depths)
    scales = torch.tensor(depths).log()[:, None].expand(count, 3) + math.log(scale)
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * count)
    return {"means": torch.tensor(means), "scales": scales.contiguous(), "quats": quats}


@pytest.mark.parametrize("side", ["left", "right", "top", "bottom"])
def test_a_row_beside_the_image_takes_its_own_radius_factor(side: str) -> None:
    """A row beside the image at mid-height (or mid-width) has slopes x / z ~ the side's and y / z ~ 0: its radius box
    is about sqrt(1 + side^2) times its sphere, not the image's worst case sqrt(1 + Lx^2 + Ly^2) (a portrait 60-degree
    camera: 1.2 beside the left and right sides, 1.5 above and below, against 1.8). Rows between the two bounds are kept
    by the image-wide factor, dropped by the row's own, and the projection indeed does not draw them."""
    camera = pinhole(540, 960, 60.0, torch.eye(4))
    rows = beside(camera, side, [0.05, 0.3, 1.0, 4.0], scale=0.02, distance=0.95)
    bounds = BoundingSpheres.of(rows["means"], torch.exp(rows["scales"]))
    region = CullRegion.drawable(camera)
    image_wide = dataclasses.replace(region, slope_depth=math.inf)
    assert bool(bounds.meets(image_wide).all()), "the image-wide factor should keep every row"
    assert not bool(bounds.meets(region).any()), "the row's own factor should drop every row"
    assert not bool(drawn_rows(camera, rows).any()), "a dropped row is drawn"


def off_the_corners(camera: Camera, count: int, generator: torch.Generator) -> dict[str, Tensor]:
    """Gaussians near the camera plane (depth 0.01 to 1) off the corners and beside the sides of ``camera``'s
    image (slopes 0.8 to 1.6 times the image's), scales from 0.02 to 2 times their depth, most round, some flat or
    long: rows whose radius box just reaches the image."""
    (fx, _, cx), (_, fy, cy), _ = camera.K.tolist()
    corner = torch.tensor([max(cx, camera.width - cx) / fx, max(cy, camera.height - cy) / fy])
    slopes = corner * torch.empty(count, 2).uniform_(0.8, 1.6, generator=generator)
    slopes *= torch.randint(0, 2, (count, 2), generator=generator) * 2.0 - 1.0
    beside = torch.rand(count, generator=generator) < 0.3
    slopes[beside, 1] *= torch.rand(int(beside.sum()), generator=generator) * 0.2
    depth = torch.exp(torch.empty(count).uniform_(math.log(0.01), 0.0, generator=generator))
    size = torch.exp(torch.empty(count).uniform_(math.log(0.02), math.log(2.0), generator=generator))
    shape = torch.randn(count, 3, generator=generator) * (torch.rand(count, 1, generator=generator) < 0.3) * 2.0
    means = torch.cat([slopes * depth[:, None], depth[:, None]], dim=1)
    scales = torch.log(depth * size)[:, None] + shape
    return {"means": means, "scales": scales, "quats": torch.randn(count, 4, generator=generator)}


@pytest.mark.parametrize(("camera", "tightness"), [("portrait", 0.9), ("off-centre", 0.8)])
def test_rows_off_the_corners_and_near_the_camera_are_kept(camera: str, tightness: float) -> None:
    """The adversarial rows of the per-row factor: near the camera plane and off the corners (both slopes large,
    clamped to the projection's limits), where a round Gaussian's radius box is about the bound. Every drawn row is
    kept, and the bound is tight: side factors ``tightness`` times as large miss some drawn rows (off-centre, with
    fx != fy, the bound is looser: f / fy on the top and bottom, the larger limit on both sides)."""
    generator = torch.Generator().manual_seed(3)
    if camera == "portrait":
        render = pinhole(540, 960, 60.0, torch.eye(4))
    else:
        K = torch.tensor([[300.0, 0.0, 50.0], [0.0, 260.0, 150.0], [0.0, 0.0, 1.0]])
        render = Camera(torch.eye(4), K, 160, 200)
    rows = off_the_corners(render, 6000, generator)
    bounds = BoundingSpheres.of(rows["means"], torch.exp(rows["scales"]))
    region = CullRegion.drawable(render)
    visible = drawn_rows(render, rows)
    kept = bounds.meets(region)
    assert not bool((visible & ~kept).any()), f"{int((visible & ~kept).sum())} drawn rows outside"
    assert torch.equal(bounds.rows_in(region), torch.nonzero(kept).flatten())
    narrower = dataclasses.replace(region, side_scales=tuple(tightness * s for s in region.side_scales))
    assert bool((visible & ~bounds.meets(narrower)).any()), "no drawn row tests the factor"
    assert bool((~kept).any()), "the bound culls nothing"


def test_a_row_that_may_move_takes_the_factor_of_where_it_may_be() -> None:
    """A row's own factor holds where it is, not where a publication may move it: a large Gaussian beside the image at
    mid-height, close to the camera, reaches further once it moves up (its y / z grows from 0 to 1). The reach test (a
    shift) keeps it; the same sphere grown by the shift but with the factor of where it is would not. A row behind the
    near plane that may move in front of it is kept too. And on random rows moved at random, the reach test keeps every
    row that meets the region once moved."""
    camera = pinhole(540, 960, 60.0, torch.eye(4))
    region = CullRegion.drawable(camera).widened(0.1)
    depth, shift, radius = 0.05, 0.05, 1.0
    centre = torch.tensor([[region.sides[0] * depth - 1.5, 0.0, depth]])
    scales = torch.full((1, 3), radius / 3.0)
    bounds = BoundingSpheres.of(centre, scales)
    moved = BoundingSpheres.of(centre + torch.tensor([[0.0, shift, 0.0]]), scales)
    assert not bool(bounds.meets(region).any()) and bool(moved.meets(region).all())
    assert bool(bounds.meets(region, shift=shift).all())
    assert not bool(bounds.meets(region, grow=(radius + shift) / radius).any())
    behind = torch.tensor([[0.0, 0.0, region.near_plane - region.near_scale * 0.01 - 0.5 * shift]])
    bounds = BoundingSpheres.of(behind, torch.full((1, 3), 0.01 / 3.0))
    assert not bool(bounds.meets(region).any()) and bool(bounds.meets(region, shift=shift).all())
    generator = torch.Generator().manual_seed(5)
    rows = off_the_corners(camera, 3000, generator)
    bounds = BoundingSpheres.of(rows["means"], torch.exp(rows["scales"]))
    shift, grow = 0.02, 1.2
    reach = bounds.meets(region, grow=grow, shift=shift)
    met = torch.zeros_like(reach)
    for _ in range(10):
        step = torch.randn(3000, 3, generator=generator)
        step *= shift * torch.rand(3000, 1, generator=generator) / step.norm(dim=1, keepdim=True)
        growth = 1.0 + (grow - 1.0) * torch.rand(3000, 1, generator=generator)
        met |= BoundingSpheres.of(rows["means"] + step, torch.exp(rows["scales"]) * growth).meets(region)
    assert bool(met.any()) and not bool((met & ~reach).any())
    assert bool((reach & ~bounds.meets(region, grow=grow)).any()), "the shift widens nothing"
