"""Synthetic scenes in the COLMAP layout: procedural 3D Gaussians, rendered views and SfM-like tracks.

Odin's gain depends on how sparsely the training views share primitives: dense object captures gain little,
long sparse captures gain most (docs/architecture.md). Real captures are few and fixed; this generator makes both regimes on
demand, with known Gaussians, exact poses and tracks, in the layout nerfstudio's colmap dataparser reads::

    <output>/images/frame_00001.png ...
    <output>/sparse/0/cameras.bin, images.bin, points3D.bin   (pycolmap 4 also writes rigs.bin, frames.bin)

The world is a set of flat, textured surface Gaussians rendered by :func:`odin_nerfstudio.rendering.rasterize.rasterization`.
The 3D points are a seeded subset of the Gaussians' centers. A view observes a point as SfM would match it: the
point projects inside the image, lies in front of the camera and within the preset's matching range, faces the
camera (not at a grazing angle) and is not occluded (its camera-space depth agrees with the rendered expected depth
"RGB+ED" at its pixel, bilinearly sampled, within a relative tolerance). Points seen by fewer than two views are
dropped. Each observation is a points2D entry at the projected pixel (COLMAP convention: the top-left pixel's
center is (0.5, 0.5)) plus seeded Gaussian pixel noise.

Presets: ``object`` (a torus around a ball, cameras on a wavy ring looking at it: dense overlap), ``street``
(two facades and a road, cameras driving down it while panning left and right: sparse overlap) and ``city`` (the
city generator's grid of streets, :mod:`odin_nerfstudio.scenes.synth_city`). Output is
deterministic given the options: the world, the camera path and the noise each draw from their own generator.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable, Literal, Optional

import numpy as np
import torch
import tyro
from numpy.random import Generator
from PIL import Image
from torch import Tensor

from odin_nerfstudio.rendering.rasterize import rasterization
from odin_nerfstudio.scenes.synth_city import city_generators
from odin_nerfstudio.scenes.surfaces import (
    FACADE_HEIGHT,
    STREET_WIDTH,
    GaussianWorld,
    f32,
    facade_colors,
    ground_colors,
    look_at,
    palette,
    sample_rectangle,
    split_count,
    surface_gaussians,
    with_noise,
)
from odin_nerfstudio.scheduling.colmap_model import import_pycolmap

pycolmap = import_pycolmap()

PresetName = Literal["object", "street", "city"]
PRESET_SIZES = {"object": (24, 20_000, 2_000), "street": (24, 20_000, 2_000), "city": (80, 100_000, 20_000)}
"""Views, Gaussians and offered 3D points of each preset when the options leave them out."""

NEAR = 0.05
"""Nearest camera-space depth at which a point is observed (world units)."""
DEPTH_TOLERANCE = 0.04
"""Largest relative gap |z - rendered expected depth| / z for a point to count as unoccluded."""
MIN_ALPHA = 0.5
"""Smallest rendered opacity at a point's pixel for its depth test to be trusted."""
MIN_FACING_COS = 0.2
"""Smallest cosine between a point's normal and its direction to the camera (about 78 degrees)."""


@dataclass
class SynthConfig:
    """Options of one synthetic scene; `make_scene` writes it, `odin-synth` exposes every field."""

    preset: PresetName = "object"
    """World and camera path: 'object' (dense overlap), 'street' (sparse overlap) or 'city' (the city generator's
    grid of streets: views on different streets share almost nothing)."""
    num_views: Optional[int] = None
    """Number of rendered views (COLMAP images); default: the preset's (24; city: 80)."""
    width: int = 128
    """Image width in pixels."""
    height: int = 96
    """Image height in pixels."""
    num_gaussians: Optional[int] = None
    """Number of Gaussians in the procedural world; default: the preset's (20,000; city: 100,000)."""
    street_length: float = 30.0
    """Length of the street in meters (street preset): longer streets at the same view count overlap less."""
    num_points: Optional[int] = None
    """Number of Gaussian centers offered as 3D points, those seen by fewer than 2 views dropped; default: the
    preset's (2,000; city: 20,000)."""
    block_size: float = 20.0
    """Distance between parallel streets in meters (city preset): about sqrt(num_views / block_size) streets run
    each way, cameras about 2 m apart (scenes/citygen.py)."""
    pixel_noise: float = 0.25
    """Standard deviation of the Gaussian noise added to each observation, in pixels."""
    seed: int = 0
    """Seed of the world, the 3D point subset and the pixel noise."""
    output: Optional[Path] = None
    """Scene folder; defaults to data/synth/<preset>."""
    overwrite: bool = False
    """Replace images/ and sparse/ if the scene folder already holds them."""

    def __post_init__(self) -> None:
        """Fill in the preset's sizes; reject options that cannot make a scene with tracks."""
        views, gaussians, points = PRESET_SIZES[self.preset]
        self.num_views = views if self.num_views is None else self.num_views
        self.num_gaussians = gaussians if self.num_gaussians is None else self.num_gaussians
        self.num_points = points if self.num_points is None else self.num_points
        if self.num_views < 2 or self.width < 2 or self.height < 2:
            raise ValueError("need num_views >= 2 and an image of at least 2x2 pixels")
        if self.num_gaussians < 1 or self.num_points < 1 or self.pixel_noise < 0:
            raise ValueError("need num_gaussians >= 1, num_points >= 1 and pixel_noise >= 0")
        if self.street_length < 8.0:
            raise ValueError("need street_length >= 8 (m): the cameras keep 2 m from each end")
        if self.block_size <= STREET_WIDTH:
            raise ValueError(f"need block_size > {STREET_WIDTH} (m), the street's width, or no building stands")

    def output_dir(self) -> Path:
        """The scene folder this config writes to."""
        return self.output if self.output is not None else Path("data") / "synth" / self.preset


@dataclass(frozen=True)
class CameraPath:
    """Views of a scene: world-to-camera matrices (OpenCV axes: x right, y down, z forward) and one pinhole camera.

    viewmats [C, 4, 4] float64, K [3, 3] float64, images of width x height pixels.
    """

    viewmats: np.ndarray
    K: np.ndarray
    width: int
    height: int


@dataclass(frozen=True)
class Observations:
    """Which view observes which 3D point, and where.

    visible [C, P] bool, pixels [C, P, 2] float64 (x, y in COLMAP pixel coordinates, noise included).
    """

    visible: np.ndarray
    pixels: np.ndarray


@dataclass(frozen=True)
class Preset:
    """A world generator, a camera path and the matching range of one preset."""

    world: Callable[[int, Generator], GaussianWorld]
    """(num_gaussians, rng) -> world."""
    cameras: Callable[[int], np.ndarray]
    """num_views -> viewmats [C, 4, 4]."""
    horizontal_fov_deg: float
    """Horizontal field of view of the pinhole camera, degrees."""
    max_depth: float
    """Farthest camera-space depth at which SfM would still match a feature (world units)."""


def sample_torus(n: int, major: float, minor: float, rng: Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Area-uniform samples on a torus around the z axis: points [n, 3], normals [n, 3], (u, v) angles [n, 2].

    The tube angle v is drawn by inverting its marginal CDF, (major * v + minor * sin v) / (2 pi major).
    """
    grid = np.linspace(0.0, 2.0 * np.pi, 4097)
    cdf = (major * grid + minor * np.sin(grid)) / (2.0 * np.pi * major)
    u = rng.uniform(0.0, 2.0 * np.pi, size=n)
    v = np.interp(rng.uniform(0.0, 1.0, size=n), cdf, grid)
    normals = np.stack([np.cos(v) * np.cos(u), np.cos(v) * np.sin(u), np.sin(v)], axis=1)
    centers = major * np.stack([np.cos(u), np.sin(u), np.zeros(n)], axis=1)
    return centers + minor * normals, normals, np.stack([u, v], axis=1)


def sample_sphere(n: int, radius: float, rng: Generator) -> tuple[np.ndarray, np.ndarray]:
    """Area-uniform samples on a sphere at the origin: points [n, 3], outward normals [n, 3]."""
    normals = rng.normal(size=(n, 3))
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    return radius * normals, normals


def rotation_x(angle: float) -> np.ndarray:
    """Rotation matrix [3, 3] about the x axis by `angle` radians."""
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def torus_colors(uv: np.ndarray) -> np.ndarray:
    """Torus texture: rainbow stripes around the ring, wavy along the tube, under a checker. uv [n, 2] -> [n, 3]."""
    u, v = uv[:, 0], uv[:, 1]
    checker = np.sign(np.sin(9.0 * u) * np.sin(5.0 * v))
    return palette(3.0 * u / (2.0 * np.pi) + 0.15 * np.sin(3.0 * v)) * (0.8 + 0.2 * checker)[:, None]


def ball_colors(normals: np.ndarray) -> np.ndarray:
    """Ball texture: 12 latitude bands of distinct colors, split into 16 meridian segments. normals [n, 3] -> [n, 3]."""
    bands = np.floor(6.0 * (normals[:, 2] + 1.0))
    segments = np.sign(np.sin(8.0 * np.arctan2(normals[:, 1], normals[:, 0])))
    return palette(0.37 * bands + 0.5) * (0.85 + 0.15 * segments)[:, None]


def object_world(num_gaussians: int, rng: Generator) -> GaussianWorld:
    """A striped, checkered torus (major radius 1, tube 0.35, tilted 30 degrees) around a banded ball (radius 0.45).

    Both are centered on the origin; the tilt lets the ring views look through the hole and see self-occlusion.
    """
    major, minor, ball = 1.0, 0.35, 0.45
    torus_area, ball_area = 4.0 * np.pi**2 * major * minor, 4.0 * np.pi * ball**2
    n_torus, n_ball = split_count(num_gaussians, [torus_area, ball_area])
    torus_points, torus_normals, uv = sample_torus(n_torus, major, minor, rng)
    ball_points, ball_normals = sample_sphere(n_ball, ball, rng)
    tilt = rotation_x(math.radians(30.0))
    return surface_gaussians(
        np.concatenate([torus_points @ tilt.T, ball_points]),
        np.concatenate([torus_normals @ tilt.T, ball_normals]),
        with_noise(np.concatenate([torus_colors(uv), ball_colors(ball_normals)]), rng),
        torus_area + ball_area,
        rng,
    )


def street_world(num_gaussians: int, rng: Generator, length: float = 30.0) -> GaussianWorld:
    """A straight street along +x (z up): two facades facing each other at y = +-4 and the road between them.

    The street runs from x = 0 to `length` (m), facades are 4 m high; all normals face the street.
    """
    half = STREET_WIDTH / 2.0
    facade_area, ground_area = length * FACADE_HEIGHT, length * STREET_WIDTH
    counts = split_count(num_gaussians, [facade_area, facade_area, ground_area])
    along_x, up_z = np.array([length, 0.0, 0.0]), np.array([0.0, 0.0, FACADE_HEIGHT])
    parts = []
    for count, side in zip(counts[:2], (-1.0, 1.0)):
        points, _ = sample_rectangle(count, np.array([0.0, side * half, 0.0]), along_x, up_z, rng)
        normal = np.tile([0.0, -side, 0.0], (count, 1))
        parts.append((points, normal, facade_colors(points[:, 0], points[:, 2], length, rng)))
    across_y = np.array([0.0, STREET_WIDTH, 0.0])
    points, _ = sample_rectangle(counts[2], np.array([0.0, -half, 0.0]), along_x, across_y, rng)
    parts.append((points, np.tile([0.0, 0.0, 1.0], (counts[2], 1)), ground_colors(points[:, 0], points[:, 1])))
    points, normals, colors = (np.concatenate(arrays) for arrays in zip(*parts))
    return surface_gaussians(points, normals, with_noise(colors, rng), 2.0 * facade_area + ground_area, rng)


def object_cameras(num_views: int) -> np.ndarray:
    """Views [C, 4, 4] on a ring of radius 3.6 around the origin, elevation waving between 5 and 45 degrees."""
    azimuth = 2.0 * np.pi * np.arange(num_views) / num_views
    elevation = np.radians(25.0 + 20.0 * np.sin(3.0 * azimuth))
    ring = np.stack([np.cos(azimuth), np.sin(azimuth)], axis=1) * np.cos(elevation)[:, None]
    eyes = 3.6 * np.concatenate([ring, np.sin(elevation)[:, None]], axis=1)
    return look_at(eyes, np.zeros_like(eyes), np.array([0.0, 0.0, 1.0]))


def street_cameras(num_views: int, length: float = 30.0) -> np.ndarray:
    """Views [C, 4, 4] driving down the street at 1.6 m, panning between 75 degrees left and right every 8 views."""
    step = np.arange(num_views)
    x = np.linspace(2.0, length - 2.0, num_views)
    yaw = np.radians(75.0) * np.sin(2.0 * np.pi * step / 8.0)
    eyes = np.stack([x, 0.5 * np.sin(2.0 * np.pi * step / 11.0), np.full(num_views, 1.6)], axis=1)
    directions = np.stack([np.cos(yaw), np.sin(yaw), np.full(num_views, -0.08)], axis=1)
    return look_at(eyes, eyes + directions, np.array([0.0, 0.0, 1.0]))


def street_rig_cameras(length: float, spacing: float = 2.5) -> np.ndarray:
    """Views [C, 4, 4] of a street-scan rig: every ``spacing`` m (2 m from each end) a left and a right camera at 1.6 m.

    They look at the facades (yaw +-90 degrees), turned 20 degrees forward or backward at alternate positions so that
    neighbouring views overlap, and 8 degrees down: each sees a few metres of street, the sparse regime Odin is for.
    """
    eyes, targets = [], []
    for index, x in enumerate(np.arange(2.0, length - 2.0, spacing)):
        turn = math.radians(20.0 if index % 2 else -20.0)
        for side in (1.0, -1.0):
            yaw = side * (math.pi / 2 + turn)
            eye = np.array([x, 0.0, 1.6])
            eyes.append(eye)
            targets.append(eye + np.array([math.cos(yaw), math.sin(yaw), -math.tan(math.radians(8.0))]))
    return look_at(np.array(eyes), np.array(targets), np.array([0.0, 0.0, 1.0]))


PRESETS: dict[str, Preset] = {
    "object": Preset(object_world, object_cameras, horizontal_fov_deg=50.0, max_depth=math.inf),
    "street": Preset(street_world, street_cameras, horizontal_fov_deg=70.0, max_depth=12.0),
}


def intrinsics(width: int, height: int, horizontal_fov_deg: float) -> np.ndarray:
    """Pinhole matrix K [3, 3] with square pixels and the principal point at the image center."""
    focal = 0.5 * width / math.tan(math.radians(horizontal_fov_deg) / 2.0)
    return np.array([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]])


def render_view(world: GaussianWorld, viewmat: np.ndarray, path: CameraPath) -> tuple[Tensor, Tensor, Tensor]:
    """Render one view (viewmat [4, 4]) of the path's camera, "RGB+ED": rgb [H, W, 3], depth [H, W], alpha [H, W]."""
    render, alpha, _ = rasterization(
        world.means,
        world.quats,
        world.scales,
        world.opacities,
        world.colors,
        f32(viewmat)[None],
        f32(path.K)[None],
        path.width,
        path.height,
        packed=False,
        render_mode="RGB+ED",
    )
    return render[0, ..., :3], render[0, ..., 3], alpha[0, ..., 0]


def project(points: np.ndarray, viewmat: np.ndarray, K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixel coordinates [P, 2] (COLMAP convention) and camera-space depths [P] of world points [P, 3]."""
    cam = points @ viewmat[:3, :3].T + viewmat[:3, 3]
    depth = cam[:, 2]
    safe = np.where(np.abs(depth) > 1e-12, depth, 1e-12)
    pixels = cam[:, :2] / safe[:, None] * np.diag(K)[:2] + K[:2, 2]
    return pixels, depth


def bilinear(image: np.ndarray, pixels: np.ndarray) -> np.ndarray:
    """Sample image [H, W] at continuous pixel coordinates [P, 2] (pixel centers at +0.5), clamped at the border."""
    height, width = image.shape
    x = np.clip(pixels[:, 0] - 0.5, 0.0, width - 1.0)
    y = np.clip(pixels[:, 1] - 0.5, 0.0, height - 1.0)
    x0, y0 = np.minimum(np.floor(x).astype(int), width - 2), np.minimum(np.floor(y).astype(int), height - 2)
    fx, fy = x - x0, y - y0
    top = image[y0, x0] * (1.0 - fx) + image[y0, x0 + 1] * fx
    bottom = image[y0 + 1, x0] * (1.0 - fx) + image[y0 + 1, x0 + 1] * fx
    return top * (1.0 - fy) + bottom * fy


def observed(
    points: np.ndarray,
    normals: np.ndarray,
    viewmat: np.ndarray,
    K: np.ndarray,
    depth_map: np.ndarray,
    alpha_map: np.ndarray,
    max_depth: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Which points [P, 3] (unit normals [P, 3]) one view observes: mask [P] bool and exact pixels [P, 2].

    Observed = inside the image, NEAR < depth < max_depth, facing the camera (cosine > MIN_FACING_COS) and
    unoccluded: rendered alpha > MIN_ALPHA and |depth - expected depth| <= DEPTH_TOLERANCE * depth there.
    depth_map, alpha_map [H, W] are the view's "RGB+ED" render.
    """
    height, width = depth_map.shape
    pixels, depth = project(points, viewmat, K)
    inside = (pixels[:, 0] >= 0) & (pixels[:, 0] < width) & (pixels[:, 1] >= 0) & (pixels[:, 1] < height)
    in_range = (depth > NEAR) & (depth < max_depth)
    eye = -viewmat[:3, :3].T @ viewmat[:3, 3]
    to_eye = eye - points
    facing = np.einsum("pi,pi->p", normals, to_eye) > MIN_FACING_COS * np.linalg.norm(to_eye, axis=1)
    unoccluded = (bilinear(alpha_map, pixels) > MIN_ALPHA) & (
        np.abs(depth - bilinear(depth_map, pixels)) <= DEPTH_TOLERANCE * depth
    )
    return inside & in_range & facing & unoccluded, pixels


def render_and_observe(
    world: GaussianWorld,
    point_ids: np.ndarray,
    path: CameraPath,
    max_depth: float,
    images: Path,
    on_view: Optional[Callable[[], None]] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Render every view ("RGB+ED"), write its RGB under images/ and find the points it observes.

    point_ids [P] are the Gaussian rows offered as 3D points; `on_view` is called after each view (progress).
    Returns visible [C, P] bool and exact pixels [C, P, 2]; one view's render is dropped before the next is made,
    so memory does not grow with C.
    """
    points = world.means[point_ids].double().numpy()
    normals = world.normals[point_ids].double().numpy()
    masks, pixels = [], []
    for c, viewmat in enumerate(path.viewmats):
        with torch.no_grad():
            rgb, depth, alpha = render_view(world, viewmat, path)
        write_image(rgb, images / image_name(c))
        mask, xy = observed(points, normals, viewmat, path.K, depth.double().numpy(), alpha.double().numpy(), max_depth)
        masks.append(mask)
        pixels.append(xy)
        if on_view is not None:
            on_view()
    return np.stack(masks), np.stack(pixels)


def sfm_observations(visible: np.ndarray, pixels: np.ndarray, noise: np.ndarray, path: CameraPath) -> Observations:
    """Keep the points seen by >= 2 views (visible [C, P]) and add the noise [C, P, 2] to their pixels [C, P, 2].

    Noisy pixels are clamped to the path's image.
    """
    kept = visible & (visible.sum(axis=0, keepdims=True) >= 2)
    return Observations(visible=kept, pixels=np.clip(pixels + noise, 0.0, [path.width, path.height]))


def build_reconstruction(
    world: GaussianWorld, point_ids: np.ndarray, path: CameraPath, obs: Observations
) -> pycolmap.Reconstruction:
    """A COLMAP model: one PINHOLE camera, one posed image per view (frame_00001.png...), one 3D point per track.

    Image c gets image_id c + 1 and keeps as points2D exactly its observations, in point order; 3D point ids
    follow the order of point_ids among the kept points. Point errors are the mean reprojection errors (the noise).
    """
    rec = pycolmap.Reconstruction()
    fx, fy, cx, cy = path.K[0, 0], path.K[1, 1], path.K[0, 2], path.K[1, 2]
    rec.add_camera_with_trivial_rig(
        pycolmap.Camera(camera_id=1, model="PINHOLE", width=path.width, height=path.height, params=[fx, fy, cx, cy])
    )
    for c, viewmat in enumerate(path.viewmats):
        keypoints = obs.pixels[c][obs.visible[c]]
        image = pycolmap.Image(name=image_name(c), keypoints=keypoints, camera_id=1, image_id=c + 1)
        pose = pycolmap.Rigid3d(pycolmap.Rotation3d(viewmat[:3, :3]), viewmat[:3, 3])
        rec.add_image_with_trivial_frame(image, pose)
    point2D_index = np.cumsum(obs.visible, axis=1) - 1
    xyz = world.means[point_ids].double().numpy()
    rgb = np.round(world.colors[point_ids].double().numpy() * 255.0).astype(np.uint8)
    for p in np.flatnonzero(obs.visible.any(axis=0)):
        views = np.flatnonzero(obs.visible[:, p])
        track = pycolmap.Track([pycolmap.TrackElement(int(c) + 1, int(point2D_index[c, p])) for c in views])
        rec.add_point3D(xyz[p], track, rgb[p])
    rec.update_point_3d_errors()
    return rec


def image_name(view: int) -> str:
    """File name of view `view` (0-based) under images/."""
    return f"frame_{view + 1:05d}.png"


def write_image(rgb: Tensor, path: Path) -> None:
    """Write rgb [H, W, 3] in [0, 1] as an 8-bit PNG."""
    pixels = (rgb.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).numpy()
    Image.fromarray(pixels).save(path, format="PNG")


def view_point_sets(rec: pycolmap.Reconstruction) -> list[set[int]]:
    """The 3D point ids each image observes, in image-id order (the RLG's P_i)."""
    return [{p.point3D_id for p in rec.images[i].points2D if p.has_point3D()} for i in sorted(rec.images)]


def jaccard(a: set[int], b: set[int]) -> float:
    """|a n b| / |a u b| (0 when both are empty)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def mean_consecutive_jaccard(sets: list[set[int]]) -> float:
    """Mean Jaccard similarity of consecutive views' point sets."""
    return float(np.mean([jaccard(a, b) for a, b in zip(sets, sets[1:])])) if len(sets) > 1 else 0.0


def mean_pairwise_jaccard(sets: list[set[int]]) -> float:
    """Mean Jaccard similarity over all pairs of views' point sets."""
    values = [jaccard(sets[i], sets[j]) for i in range(len(sets)) for j in range(i + 1, len(sets))]
    return float(np.mean(values)) if values else 0.0


def camera_path(config: SynthConfig, preset: Preset) -> CameraPath:
    """The preset's views for this config's view count and resolution."""
    K = intrinsics(config.width, config.height, preset.horizontal_fov_deg)
    return CameraPath(viewmats=preset.cameras(config.num_views), K=K, width=config.width, height=config.height)


def prepare_output(config: SynthConfig) -> Path:
    """Create the scene folder with empty images/ and sparse/0/; refuse to replace them unless config.overwrite."""
    out = config.output_dir()
    existing = [out / name for name in ("images", "sparse") if (out / name).exists()]
    if existing and not config.overwrite:
        raise FileExistsError(f"{existing[0]} exists; pass --overwrite to replace it")
    for folder in existing:
        shutil.rmtree(folder)
    (out / "images").mkdir(parents=True)
    (out / "sparse" / "0").mkdir(parents=True)
    return out


def preset_for(config: SynthConfig) -> Preset:
    """The preset of `config`, sized by its options (the street's length; the city's views and block size)."""
    if config.preset == "city":  # the street's camera model over the city generator's layout
        street = PRESETS["street"]
        return replace(street, **city_generators(config.num_views, config.block_size, street.max_depth))
    preset = PRESETS[config.preset]
    if config.preset != "street":
        return preset
    return replace(
        preset,
        world=partial(street_world, length=config.street_length),
        cameras=partial(street_cameras, length=config.street_length),
    )


def make_scene(config: SynthConfig, on_view: Optional[Callable[[], None]] = None) -> Path:
    """Generate the scene `config` describes and write it in the COLMAP layout; returns the scene folder.

    `on_view` is called once per rendered view (rendering is most of the time: about a minute for the default
    24 views on two busy cores).
    """
    preset = preset_for(config)
    world = preset.world(config.num_gaussians, np.random.default_rng([config.seed, 0]))
    rng = np.random.default_rng([config.seed, 1])
    num_points = min(config.num_points, config.num_gaussians)
    point_ids = np.sort(rng.choice(config.num_gaussians, size=num_points, replace=False))
    noise = rng.normal(0.0, config.pixel_noise, size=(config.num_views, num_points, 2))
    path = camera_path(config, preset)
    out = prepare_output(config)
    visible, pixels = render_and_observe(world, point_ids, path, preset.max_depth, out / "images", on_view)
    obs = sfm_observations(visible, pixels, noise, path)
    build_reconstruction(world, point_ids, path, obs).write(out / "sparse" / "0")
    return out


def summary(scene: Path) -> str:
    """One paragraph on a written scene: views, points, mean track length, overlap of consecutive and all views."""
    rec = pycolmap.Reconstruction(scene / "sparse" / "0")
    sets = view_point_sets(rec)
    return (
        f"wrote {scene}: {rec.num_images()} views, {rec.num_points3D()} points3D, "
        f"mean track length {rec.compute_mean_track_length():.2f}, "
        f"mean overlap (Jaccard) consecutive {mean_consecutive_jaccard(sets):.3f}, "
        f"all pairs {mean_pairwise_jaccard(sets):.3f}"
    )


DESCRIPTION = (
    "Write a synthetic scene in the COLMAP layout that ns-train and odin-schedule read (images/ and sparse/0/): "
    "procedural 3D Gaussians rendered along a camera path, with SfM-like tracks from what each view sees. "
    "Presets: object (cameras around an object, dense overlap), street (a long street, sparse overlap) and city "
    "(a grid of streets, each view seeing its own street)."
)
"""odin-synth's --help description (the config's docstring speaks to the code that uses it)."""


def main() -> None:
    """Console entry point `odin-synth`: parse a SynthConfig from the command line, write the scene with a progress
    bar of the views rendered (as nerfstudio shows its own long steps), summarize."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from odin_nerfstudio.core.help_text import reflow_help_texts

    reflow_help_texts()
    config = tyro.cli(SynthConfig, prog="odin-synth", description=DESCRIPTION)
    columns = (
        TextColumn(f"Rendering {config.preset} views"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(elapsed_when_finished=True, compact=True),
    )
    with Progress(*columns) as progress:
        task = progress.add_task("render", total=config.num_views)
        scene = make_scene(config, on_view=lambda: progress.advance(task))
    print(summary(scene))


if __name__ == "__main__":
    main()
