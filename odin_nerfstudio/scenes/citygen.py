"""Synthetic SfM tracks (no images) for testing and benchmarking the RLG and the schedule at any scale.

Odin (arXiv 2607.19893) compiles the RLG and schedule of city-scale captures (MatrixCity, 50k views) ahead of
time; real tracks of that size are not available offline, so :func:`city_point_sets` builds a stand-in with
the same structure: a square grid of streets, cameras along every street looking forward, backward, left or
right in turn, 3D points on the building facades lining the streets, and each point observed by the cameras
of its street that face it within a maximum range (with random detection dropout). Tracks are local and
overlapping along a street, the sparse regime where Odin gains most. Two small generators cover the extremes
for tests: :func:`street_point_sets` (one line of cameras, each seeing a local window: sparse overlap) and
:func:`object_point_sets` (views around an object, each seeing most points: dense overlap).

All generators are vectorized numpy and seeded; a 50,000-view city with about 5 million points and a mean
track length of about 6 takes a few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Camera headings relative to the street direction, cycled along each street: forward, backward, left, right.
HEADINGS = np.array([0.0, np.pi, np.pi / 2, -np.pi / 2])


@dataclass(frozen=True)
class CityConfig:
    """Shape of the synthetic city.

    Attributes:
        num_views: total number of cameras V, spread evenly over the streets.
        points_per_view: number of 3D points per camera before dropout; P is about this times V.
        block_size: distance between parallel streets (m).
        street_half_width: distance from a street's centre line to its facades (m).
        max_range: farthest facade point a camera observes (m), measured along the street.
        detection_rate: probability that a visible point is detected and matched (kept in its track), in
            steps of 1/256.
        seed: RNG seed.
    """

    num_views: int = 50_000
    points_per_view: float = 100.0
    block_size: float = 100.0
    street_half_width: float = 10.0
    max_range: float = 30.0
    detection_rate: float = 0.8
    seed: int = 0


@dataclass(frozen=True, eq=False)
class SyntheticCity:
    """Tracks of a synthetic city.

    Attributes:
        point_sets: per view, its sorted unique observed point ids, V arrays [n_i] (views into one buffer), int32
            (half the memory of int64 at city scale) unless the ids reach 2**31.
        camera_positions: camera centres, [V, 3] float64 (x, y on the ground plane, z = 1.6 m).
        camera_headings: camera yaw in radians, [V] float64.
        num_points: number of points P (ids are 0..P-1; every point has a track of length >= 2).
    """

    point_sets: list[np.ndarray]
    camera_positions: np.ndarray
    camera_headings: np.ndarray
    num_points: int

    @property
    def mean_track_length(self) -> float:
        """Observations per point."""
        return sum(len(ids) for ids in self.point_sets) / max(self.num_points, 1)


@dataclass(frozen=True, eq=False)
class CityLayout:
    """Where the city's streets and cameras are (what :func:`city_point_sets` and odin-synth's city preset share).

    Attributes:
        street_length: length L of every street (m); streets run from 0 to L.
        cameras_per_street: cameras on each street [S]; streets 0..S/2-1 run along x at y = s * block_size, the
            others along y at x = (s - S/2) * block_size.
        street: street of every camera [V]; position: its distance along the street [V] (m); heading: its index
            into ``HEADINGS`` [V].
        camera_positions: camera centres [V, 3] (z = 1.6 m); camera_headings: camera yaw in radians [V].
    """

    street_length: float
    cameras_per_street: np.ndarray
    street: np.ndarray
    position: np.ndarray
    heading: np.ndarray
    camera_positions: np.ndarray
    camera_headings: np.ndarray

    @property
    def streets_per_direction(self) -> int:
        """Parallel streets in each direction (the grid has this many squared crossings)."""
        return self.cameras_per_street.size // 2


def city_layout(config: CityConfig) -> CityLayout:
    """The street grid and the ``config.num_views`` cameras along it, in street order (forward, backward, left,
    right in turn along each street)."""
    if config.num_views < 8:
        raise ValueError(f"a city needs at least 8 views (2 streets x 4 headings), got {config.num_views}")
    street_length, cams = _street_grid(config)
    street, position, heading = _camera_layout(cams, street_length)
    return CityLayout(
        street_length=street_length,
        cameras_per_street=cams,
        street=street,
        position=position,
        heading=heading,
        camera_positions=_camera_positions(street, position, cams.size, config.block_size),
        camera_headings=np.where(street < cams.size // 2, 0.0, np.pi / 2) + HEADINGS[heading],
    )


def city_point_sets(config: CityConfig | None = None) -> SyntheticCity:
    """Generate a grid-of-streets city of exactly ``config.num_views`` cameras and their SfM tracks."""
    config = config or CityConfig()
    layout = city_layout(config)
    rng = np.random.default_rng(config.seed)
    cams, street_length = layout.cameras_per_street, layout.street_length
    facade_length = street_length + 2.0 * config.max_range
    per_facade = max(1, int(round(config.points_per_view * config.num_views / (2 * cams.size))))
    keys = _facade_point_keys(rng, 2 * cams.size, per_facade, facade_length)
    first, stop = _visible_ranges(config, keys, facade_length, layout.street, layout.position, layout.heading)
    ids, row_start = _expand_ranges(first.ravel(), stop.ravel())
    kept = rng.integers(0, 256, size=ids.size, dtype=np.uint8) < round(256 * config.detection_rate)
    ids, kept = _drop_short_tracks(ids, kept, keys.size)
    kept_before = np.concatenate([[0], np.cumsum(kept, dtype=np.int32)])[row_start[::2]]
    return SyntheticCity(
        point_sets=np.split(ids, kept_before[1:-1]),
        camera_positions=layout.camera_positions,
        camera_headings=layout.camera_headings,
        num_points=int(ids.max()) + 1 if ids.size else 0,
    )


def _street_grid(config: CityConfig) -> tuple[float, np.ndarray]:
    """Street length and cameras per street [S]: S/2 streets along x then S/2 along y, about 2 m spacing."""
    per_direction = max(1, int(round(np.sqrt(config.num_views / config.block_size))))
    num_streets = 2 * per_direction
    cams = np.full(num_streets, config.num_views // num_streets, dtype=np.int64)
    cams[: config.num_views % num_streets] += 1
    return per_direction * config.block_size, cams


def _facade_point_keys(rng: np.random.Generator, num_facades: int, per_facade: int, length: float) -> np.ndarray:
    """Sorted search keys of all facade points, [num_facades * per_facade] float64; a point's id is its row.

    Facade f (street f // 2, left side when f is even) holds ``per_facade`` points jittered on a regular grid over
    [0, length] (the street plus ``max_range`` beyond each end); the key is f * (length + 1) + position.
    """
    slot = (np.arange(per_facade) + rng.random((num_facades, per_facade))) * (length / per_facade)
    return (slot + (length + 1.0) * np.arange(num_facades)[:, None]).ravel()


def _camera_layout(cams: np.ndarray, street_length: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Street [V], position along it [V] and heading index into ``HEADINGS`` [V] of every camera."""
    street = np.repeat(np.arange(cams.size), cams)
    k = np.arange(street.size) - np.repeat(np.cumsum(cams) - cams, cams)
    return street, (k + 0.5) * street_length / cams[street], k % 4


def _visible_ranges(
    config: CityConfig,
    keys: np.ndarray,
    facade_length: float,
    street: np.ndarray,
    position: np.ndarray,
    heading: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Point-id ranges [first, stop) each camera faces on its street's left and right facades, each [V, 2].

    With a 90 degree field of view, a forward camera sees both facades at along-distance [h, R] ahead, a
    backward one the same behind, and a sideways one the facade it faces within |d| <= h (h the street
    half-width, R the range). Facade points are sorted by position, so each such set is one id range.
    """
    h, reach = config.street_half_width, config.max_range
    ahead = np.array([[h, h], [-reach, -reach], [-h, 0.0], [0.0, -h]])[heading]
    behind = np.array([[reach, reach], [-h, -h], [h, 0.0], [0.0, h]])[heading]
    facade = 2 * street[:, None] + np.arange(2)
    base = facade * (facade_length + 1.0) + position[:, None] + reach
    first = np.searchsorted(keys, base + ahead, side="left")
    stop = np.maximum(np.searchsorted(keys, base + behind, side="right"), first)
    return first, np.where(ahead == behind, first, stop)


def _expand_ranges(first: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ``arange(first[r], stop[r])`` over ranges r [R], and where each range starts [R + 1].

    The ids are int32 (half the memory traffic) unless the total reaches 2**31.
    """
    count = stop - first
    row_start = np.concatenate([[0], np.cumsum(count)])
    dtype = np.int32 if max(row_start[-1], first.max(initial=0)) < 2**31 else np.int64
    shift = (first - row_start[:-1]).astype(dtype)
    ids = np.arange(row_start[-1], dtype=dtype)
    ids += np.repeat(shift, count)
    return ids, row_start


def _drop_short_tracks(ids: np.ndarray, kept: np.ndarray, num_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Observed ids renumbered 0..P-1 over points seen >= 2 times (SfM triangulates no others), and the mask.

    Args:
        ids: point id of every candidate observation [M]; kept: whether it was detected [M].

    Returns:
        the surviving observations' new ids [M'] (``ids``' dtype) and the mask [M] of survivors.
    """
    valid = np.bincount(ids[kept], minlength=num_points) >= 2
    kept &= valid[ids]
    new_id = np.cumsum(valid, dtype=ids.dtype)
    new_id -= 1
    return new_id[ids[kept]], kept


def _camera_positions(street: np.ndarray, position: np.ndarray, num_streets: int, block_size: float) -> np.ndarray:
    """Camera centres [V, 3]: the first half of the streets runs along x, the second along y; height 1.6 m."""
    across = (street % (num_streets // 2)) * block_size
    along_x = street < num_streets // 2
    x, y = np.where(along_x, position, across), np.where(along_x, across, position)
    return np.stack([x, y, np.full(street.shape, 1.6)], 1)


def street_point_sets(
    num_views: int, window: int = 40, stride: int = 4, seed: int = 0, detection_rate: float = 0.9
) -> list[np.ndarray]:
    """Cameras along one line, view i seeing points [i * stride, i * stride + window) minus random dropouts.

    Sparse overlap: view i shares points only with views within ``window / stride`` positions of it.
    """
    rng = np.random.default_rng(seed)
    base = np.arange(window, dtype=np.int64)
    return [np.sort(i * stride + base[rng.random(window) < detection_rate]) for i in range(num_views)]


def object_point_sets(
    num_views: int, num_points: int = 2000, visible_fraction: float = 0.8, seed: int = 0
) -> list[np.ndarray]:
    """Views around an object, each seeing a random ``visible_fraction`` of all points: dense overlap."""
    rng = np.random.default_rng(seed)
    return [np.flatnonzero(rng.random(num_points) < visible_fraction).astype(np.int64) for _ in range(num_views)]
