"""The parts odin-synth's worlds are made of: flat surface Gaussians, street textures, and look-at cameras.

The presets of :mod:`odin_nerfstudio.scenes.synth` (object, street) and the city of
:mod:`odin_nerfstudio.scenes.synth_city` build their worlds from these, so a facade or a road looks the same in
every scene (README, "Synthetic scenes").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from numpy.random import Generator
from torch import Tensor


@dataclass(frozen=True)
class GaussianWorld:
    """Procedural 3D Gaussians, each a flat disc on a surface, in gsplat's parameterization (float32, CPU).

    means [N, 3], quats [N, 4] (wxyz), scales [N, 3], opacities [N] in (0, 1), colors [N, 3] RGB in [0, 1],
    normals [N, 3] unit surface normals (the side the surface is seen from).
    """

    means: Tensor
    quats: Tensor
    scales: Tensor
    opacities: Tensor
    colors: Tensor
    normals: Tensor


def quats_from_normals(normals: np.ndarray) -> np.ndarray:
    """Unit quaternions (wxyz) [N, 4] that rotate the local z axis onto the unit normals [N, 3], sign-free.

    A disc is symmetric under flipping its normal, so normals are first turned into the z >= 0 half-space; the
    shortest-arc quaternion (1 + n_z, -n_y, n_x, 0) is then never degenerate.
    """
    n = np.where(normals[:, 2:3] < 0.0, -normals, normals)
    q = np.stack([1.0 + n[:, 2], -n[:, 1], n[:, 0], np.zeros(len(n))], axis=1)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def surface_gaussians(
    points: np.ndarray, normals: np.ndarray, colors: np.ndarray, area: float, rng: Generator
) -> GaussianWorld:
    """Flat discs at surface samples: points [N, 3], unit normals [N, 3], colors [N, 3] over a total `area`.

    The disc radius follows the mean sample spacing sqrt(area / N) so neighbouring discs overlap into a closed,
    occluding surface; opacities are high with a little seeded variation.
    """
    spacing = math.sqrt(area / len(points))
    radius = 0.8 * spacing * rng.uniform(0.85, 1.15, size=(len(points), 1))
    scales = np.concatenate([radius, radius, 0.05 * radius], axis=1)
    opacities = rng.uniform(0.85, 0.98, size=len(points))
    return GaussianWorld(
        means=f32(points),
        quats=f32(quats_from_normals(normals)),
        scales=f32(scales),
        opacities=f32(opacities),
        colors=f32(np.clip(colors, 0.0, 1.0)),
        normals=f32(normals),
    )


def split_count(total: int, weights: list[float]) -> list[int]:
    """Split `total` into non-negative integers proportional to `weights` that sum to `total`."""
    shares = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    counts = np.floor(shares * total).astype(int)
    counts[np.argmax(shares)] += total - int(counts.sum())
    return counts.tolist()


def palette(t: np.ndarray) -> np.ndarray:
    """A smooth cyclic color ramp: t [...] -> RGB [..., 3] in [0, 1] (a cosine palette)."""
    phases = np.array([0.0, 1.0 / 3.0, 2.0 / 3.0])
    return 0.5 + 0.45 * np.cos(2.0 * np.pi * (t[..., None] + phases))


def sample_rectangle(
    n: int, origin: np.ndarray, edge_u: np.ndarray, edge_v: np.ndarray, rng: Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Uniform samples on the rectangle origin + a edge_u + b edge_v: points [n, 3], coordinates (a, b) [n, 2]."""
    ab = rng.uniform(0.0, 1.0, size=(n, 2))
    return origin + ab[:, :1] * edge_u + ab[:, 1:] * edge_v, ab


STREET_WIDTH, FACADE_HEIGHT = 8.0, 4.0


def facade_colors(along: np.ndarray, up: np.ndarray, length: float, rng: Generator) -> np.ndarray:
    """Building facades: per-building wall color, a window grid, floor bands. along, up [n] in meters -> [n, 3].

    Buildings are 3 to 6 m wide with seeded colors and window pitch, so no two stretches of street look alike.
    """
    edges = np.cumsum(rng.uniform(3.0, 6.0, size=int(length / 3.0) + 2))
    building = np.searchsorted(edges, along)
    hue = rng.uniform(0.0, 1.0, size=len(edges) + 1)[building]
    pitch = rng.uniform(0.9, 1.6, size=len(edges) + 1)[building]
    wall = palette(hue) * 0.7 + 0.25
    in_window = (np.mod(along / pitch, 1.0) > 0.3) & (np.mod(up / 1.4, 1.0) > 0.35) & (up > 1.0)
    window = palette(hue + 0.5) * 0.25 + np.array([0.05, 0.1, 0.2])
    floor_band = (np.mod(up / 1.4, 1.0) < 0.08)[:, None]
    colors = np.where(in_window[:, None], window, wall)
    return np.where(floor_band, colors * 0.55, colors)


def ground_colors(along: np.ndarray, across: np.ndarray) -> np.ndarray:
    """Road and sidewalks: asphalt with a dashed center line, tiled sidewalks. along, across [n] -> [n, 3]."""
    asphalt = np.tile([0.3, 0.3, 0.33], (len(along), 1))
    dash = (np.abs(across) < 0.1) & (np.mod(along, 2.0) < 1.0)
    sidewalk = np.abs(across) > STREET_WIDTH / 2.0 - 1.2
    tiles = 0.6 + 0.12 * np.sign(np.sin(np.pi * along / 0.5) * np.sin(np.pi * across / 0.5))
    colors = np.where(dash[:, None], np.array([0.95, 0.9, 0.6]), asphalt)
    return np.where(sidewalk[:, None], np.stack([tiles, 0.92 * tiles, 0.85 * tiles], axis=1), colors)


def look_at(eyes: np.ndarray, targets: np.ndarray, up: np.ndarray) -> np.ndarray:
    """World-to-camera matrices [C, 4, 4] (OpenCV: x right, y down, z forward) from eyes, targets [C, 3], up [3]."""
    forward = targets - eyes
    forward /= np.linalg.norm(forward, axis=1, keepdims=True)
    right = np.cross(forward, up)
    right /= np.linalg.norm(right, axis=1, keepdims=True)
    down = np.cross(forward, right)
    rotation = np.stack([right, down, forward], axis=1)
    viewmats = np.tile(np.eye(4), (len(eyes), 1, 1))
    viewmats[:, :3, :3] = rotation
    viewmats[:, :3, 3] = -np.einsum("cij,cj->ci", rotation, eyes)
    return viewmats


def f32(array: np.ndarray) -> Tensor:
    """A float32 CPU tensor copy of `array`."""
    return torch.as_tensor(np.asarray(array), dtype=torch.float32)


def with_noise(colors: np.ndarray, rng: Generator) -> np.ndarray:
    """Colors [n, 3] with seeded per-Gaussian jitter (std 0.06), so flat areas carry texture too."""
    return colors + rng.normal(0.0, 0.06, size=colors.shape)


