"""odin-synth's city preset: the city generator's grid of streets and cameras, built as a world and rendered.

:mod:`odin_nerfstudio.scenes.citygen` makes a city's SfM tracks without images, so nothing can train on it. This
module gives the same layout (:func:`~odin_nerfstudio.scenes.citygen.city_layout`: a square grid of streets, cameras
along every street looking forward, backward, left or right in turn) a world of surface Gaussians
(:mod:`odin_nerfstudio.scenes.surfaces`): blocks of buildings between the streets, whose street-facing facades and the
road are textured as the street preset's, and cameras at the generator's positions and headings with the street
preset's camera model (field of view, matching range). As in the generator, a view sees its own street: views on
parallel streets share nothing (a block is wider than twice a camera's reach), views on crossing streets share only
what both see across their crossing, views along one street overlap locally (README, "Synthetic scenes").
"""

from __future__ import annotations

from functools import partial

import numpy as np
from numpy.random import Generator

from odin_nerfstudio.scenes.citygen import CityConfig, CityLayout, city_layout
from odin_nerfstudio.scenes.surfaces import (
    FACADE_HEIGHT,
    STREET_WIDTH,
    GaussianWorld,
    facade_colors,
    ground_colors,
    look_at,
    sample_rectangle,
    split_count,
    surface_gaussians,
    with_noise,
)

CAMERA_TILT = 0.08
"""Downward slope of every camera's view direction (rise over run), as the street preset's cameras look."""


def layout(num_views: int, block_size: float) -> CityLayout:
    """The city generator's streets and cameras for ``num_views`` views and blocks of ``block_size`` m."""
    return city_layout(CityConfig(num_views=num_views, block_size=block_size, street_half_width=STREET_WIDTH / 2.0))


def city_cameras(num_views: int, block_size: float) -> np.ndarray:
    """Views [V, 4, 4] at the generator's camera centres (1.6 m high) and yaws, tilted down by :data:`CAMERA_TILT`."""
    city = layout(num_views, block_size)
    yaw = city.camera_headings
    directions = np.stack([np.cos(yaw), np.sin(yaw), np.full(yaw.shape, -CAMERA_TILT)], axis=1)
    eyes = city.camera_positions
    return look_at(eyes, eyes + directions, np.array([0.0, 0.0, 1.0]))


def block_extents(city: CityLayout, block_size: float, reach: float) -> np.ndarray:
    """Extents [K, 2] (start, stop in m along a street) of the blocks lining every street: between its crossings,
    and past its first and last crossing by ``reach`` (so that the end cameras see facades up to their range)."""
    crossings = np.arange(city.streets_per_direction) * block_size
    half = STREET_WIDTH / 2.0
    starts = np.concatenate([[-reach], crossings + half])
    stops = np.concatenate([crossings - half, [city.street_length + reach]])
    return np.stack([starts, stops], axis=1)


def city_world(num_gaussians: int, rng: Generator, num_views: int, block_size: float, reach: float) -> GaussianWorld:
    """The street-facing facades (4 m high) of the blocks along every street of the layout, and the road.

    Every street has facades on both sides at its half-width, interrupted by the crossing streets, and its road
    (8 m wide, from ``-reach`` to its length + ``reach``); a street along y lays its road between the crossings
    only (the streets along x pave the crossings). Gaussians are spread by area, all normals face the street.
    """
    city = layout(num_views, block_size)
    half, extents = STREET_WIDTH / 2.0, block_extents(city, block_size, reach)
    full_length = city.street_length + 2.0 * reach
    # (street, kind, along start, along stop, side): kind 0 = facade on `side`, 1 = road
    pieces = []
    for street in range(2 * city.streets_per_direction):
        along_x = street < city.streets_per_direction
        pieces += [(street, 0, start, stop, side) for start, stop in extents for side in (-1.0, 1.0)]
        pieces += [(street, 1, -reach, city.street_length + reach, 0.0)] if along_x else []
        pieces += [] if along_x else [(street, 1, start, stop, 0.0) for start, stop in extents]
    areas = [(stop - start) * (FACADE_HEIGHT if kind == 0 else STREET_WIDTH) for _, kind, start, stop, _ in pieces]
    parts = []
    for count, (street, kind, start, stop, side) in zip(split_count(num_gaussians, areas), pieces):
        if kind == 0:
            up = np.array([0.0, 0.0, FACADE_HEIGHT])
            local, _ = sample_rectangle(count, np.array([start, side * half, 0.0]), [stop - start, 0.0, 0.0], up, rng)
            colors = facade_colors(local[:, 0] + reach, local[:, 2], full_length, rng)
            normals = np.tile([0.0, -side, 0.0], (count, 1))
        else:
            across = np.array([0.0, STREET_WIDTH, 0.0])
            local, _ = sample_rectangle(count, np.array([start, -half, 0.0]), [stop - start, 0.0, 0.0], across, rng)
            colors = ground_colors(local[:, 0], local[:, 1])
            normals = np.tile([0.0, 0.0, 1.0], (count, 1))
        parts.append((*_to_world(local, normals, street, city, block_size), colors))
    points, normals, colors = (np.concatenate(arrays) for arrays in zip(*parts))
    return surface_gaussians(points, normals, with_noise(colors, rng), float(np.sum(areas)), rng)


def _to_world(
    local: np.ndarray, normals: np.ndarray, street: int, city: CityLayout, block_size: float
) -> tuple[np.ndarray, np.ndarray]:
    """Points and normals [n, 3] from a street's frame (along, across, up) to the world: the first half of the
    streets runs along x at y = index * block_size, the other along y at x = (index - half) * block_size."""
    n = city.streets_per_direction
    offset = (street % n) * block_size
    if street < n:
        return local + [0.0, offset, 0.0], normals
    swap = [1, 0, 2]
    return local[:, swap] + [offset, 0.0, 0.0], normals[:, swap]


def city_generators(num_views: int, block_size: float, reach: float) -> dict[str, partial]:
    """The preset's world and cameras (``synth.Preset`` fields) for this view count and block size; ``reach`` is the
    camera model's matching range (m)."""
    return {
        "world": partial(city_world, num_views=num_views, block_size=block_size, reach=reach),
        "cameras": partial(city_cameras, block_size=block_size),
    }
