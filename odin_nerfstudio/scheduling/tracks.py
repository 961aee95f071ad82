"""SfM tracks of a COLMAP model: which 3D points each training view observes.

The Relative Locality Graph (Odin, arXiv 2607.19893) predicts which views will touch the same Gaussians from the
SfM tracks alone, before training starts. This module reads those tracks with pycolmap, from a binary or a text
model, into plain numpy arrays that the RLG builder consumes; it imports neither torch nor nerfstudio. Each view
also gets its in-view set: the points it observes plus every point inside its field of view, which is what the
rasterizer draws and so what conflicts at run time (:func:`in_view_point_ids`).

Every image of the model is kept, registered or not: an image with no triangulated observation has an empty
point set and becomes an isolated node of the RLG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from odin_nerfstudio.scheduling.colmap_model import import_pycolmap, validate_binary_model

pycolmap = import_pycolmap()

MODEL_FILES = ("cameras", "images", "points3D")

RlgPoints = Literal["observed", "in-view"]
"""Which points stand for a view in the RLG: those SfM observed in it, or those plus every point in its field of view."""


@dataclass(frozen=True, eq=False)
class SfMTracks:
    """Per-view observed SfM point ids plus the points themselves, views sorted by image name.

    Attributes:
        image_names: COLMAP image names (paths relative to ``images/``), sorted, [V].
        point_ids: per image, the sorted unique int64 point3D ids it observes, V arrays of shape [n_i].
        points_xyz: point positions, [P, 3] float64.
        points_rgb: point colours, [P, 3] uint8.
        point3d_ids: the COLMAP id of each row of ``points_xyz``, [P] int64.
        pixels: width * height of each image's camera, [V] int64; None when unknown (hand-built tracks).
        in_view_ids: per image, the sorted int64 point3D ids it observes or holds in its field of view
            (:func:`in_view_point_ids`), V arrays; None when unknown (hand-built tracks).
    """

    image_names: list[str]
    point_ids: list[np.ndarray]
    points_xyz: np.ndarray
    points_rgb: np.ndarray
    point3d_ids: np.ndarray
    pixels: np.ndarray | None = field(default=None)
    in_view_ids: list[np.ndarray] | None = field(default=None)

    def for_names(self, names: Sequence[str], points: RlgPoints = "observed") -> list[np.ndarray]:
        """Per-view point ids for each of ``names``, in that order (e.g. a dataset's train split): those it
        observes, or with ``points="in-view"`` those it observes or holds in its field of view.

        Raises:
            ValueError: some names are not images of the model (the message lists them), or in-view sets were
                asked of tracks that have none.
        """
        if points not in ("observed", "in-view"):
            raise ValueError(f"points must be 'observed' or 'in-view', got {points!r}")
        if points == "in-view" and self.in_view_ids is None:
            raise ValueError("these tracks hold no in-view point sets (hand-built?); use points='observed'")
        sets = self.point_ids if points == "observed" else self.in_view_ids
        return [sets[i] for i in self.indices_of(names)]

    def pixels_for_names(self, names: Sequence[str]) -> np.ndarray | None:
        """Pixel counts for each of ``names`` in that order, [len(names)] int64, or None when unknown."""
        if self.pixels is None:
            return None
        return self.pixels[self.indices_of(names)]

    def indices_of(self, names: Sequence[str]) -> np.ndarray:
        """Row of each name in ``image_names``, [len(names)] int64; ValueError naming any missing image."""
        row = {name: i for i, name in enumerate(self.image_names)}
        missing = [name for name in names if name not in row]
        if missing:
            shown = ", ".join(repr(name) for name in missing[:10])
            more = f" (and {len(missing) - 10} more)" if len(missing) > 10 else ""
            raise ValueError(
                f"{len(missing)} of {len(names)} images are not in the COLMAP model: {shown}{more}. "
                f"Names must be paths relative to images/ as COLMAP stores them, e.g. {self.image_names[:1]}; "
                "rebuild the model if the image set changed."
            )
        return np.array([row[name] for name in names], dtype=np.int64)


def read_colmap_tracks(sparse_dir: Path) -> SfMTracks:
    """Read the SfM tracks of the COLMAP model in ``sparse_dir`` (binary or text, e.g. ``scene/sparse/0``).

    Raises:
        FileNotFoundError: the folder does not exist or holds no COLMAP model files.
        ValueError: a binary model file is truncated or corrupt (the message names it), pycolmap cannot parse
            the model, or the model has no 3D points.
    """
    sparse_dir = Path(sparse_dir)
    reconstruction = load_reconstruction(sparse_dir)
    if reconstruction.num_points3D() == 0:
        raise ValueError(
            f"the COLMAP model in {sparse_dir} has no 3D points, so it has no SfM tracks; "
            "triangulate points first (colmap point_triangulator or pycolmap.triangulate_points)."
        )
    images = sorted(reconstruction.images.values(), key=lambda image: image.name)
    point3d_ids = np.array(sorted(reconstruction.points3D.keys()), dtype=np.int64)
    points = [reconstruction.points3D[int(i)] for i in point3d_ids]
    xyz = np.array([p.xyz for p in points], dtype=np.float64).reshape(-1, 3)
    observed = [_observed_point_ids(image) for image in images]
    in_view = []
    for image, seen in zip(images, observed):
        if not image.has_pose:  # an unregistered image has no field of view to speak of
            in_view.append(seen)
            continue
        camera = reconstruction.cameras[image.camera_id]
        pose, K = np.asarray(image.cam_from_world().matrix()), np.asarray(camera.calibration_matrix())
        rows = in_view_point_ids(xyz, pose, K, int(camera.width), int(camera.height))
        in_view.append(np.union1d(seen, point3d_ids[rows]))
    return SfMTracks(
        image_names=[image.name for image in images],
        point_ids=observed,
        points_xyz=xyz,
        points_rgb=np.array([p.color for p in points], dtype=np.uint8).reshape(-1, 3),
        point3d_ids=point3d_ids,
        pixels=np.array([_pixels(reconstruction, image) for image in images], dtype=np.int64),
        in_view_ids=in_view,
    )


IN_VIEW_MARGIN = 0.1
"""How far beyond the image a point still counts as in view, as a share of the image's width and height: a point
stands for a Gaussian, which is drawn wherever its footprint meets the image."""


def in_view_point_ids(
    xyz: np.ndarray, cam_from_world: np.ndarray, K: np.ndarray, width: int, height: int, margin: float = IN_VIEW_MARGIN
) -> np.ndarray:
    """Rows of ``xyz`` [P, 3] in front of a pinhole camera (``cam_from_world`` [3, 4], ``K`` [3, 3]) that project
    into its ``width`` x ``height`` image widened by ``margin`` of its size on every side, sorted int64.

    Why: Odin's active set A(t) is every Gaussian the rasterizer draws, wherever it lies in the view, while SfM
    observes only the points it matched, which on a street stops a few metres from the camera although a view
    down the street draws Gaussians far beyond. Distortion is ignored; the margin covers it. The numpy twin, for
    points, of the culling layer's drawable region (this layer imports no torch).

    Cost: O(P) per view, so O(V P) for a model, and the in-view sets are larger than the tracks: a point in view
    of every camera of a dense capture joins every view's set, which the RLG's sparse product then pays for
    squared. Large dense captures schedule faster from the tracks alone (``rlg-points observed``).
    """
    camera = xyz @ cam_from_world[:, :3].T + cam_from_world[:, 3]
    z = camera[:, 2]
    front = z > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        u = K[0, 0] * camera[:, 0] / z + K[0, 2]
        v = K[1, 1] * camera[:, 1] / z + K[1, 2]
    pad_u, pad_v = margin * width, margin * height
    inside = front & (u >= -pad_u) & (u <= width + pad_u) & (v >= -pad_v) & (v <= height + pad_v)
    return np.flatnonzero(inside).astype(np.int64)


def load_reconstruction(sparse_dir: Path) -> pycolmap.Reconstruction:
    """pycolmap reconstruction of ``sparse_dir``, its binary files validated first (pycolmap's readers allocate
    by the counts they read), with errors that say what is wrong and how to fix it."""
    if not sparse_dir.is_dir():
        raise FileNotFoundError(
            f"COLMAP model folder {sparse_dir} does not exist; pass the folder holding cameras/images/points3D "
            "(.bin or .txt), usually <scene>/sparse/0."
        )
    present = [name for name in MODEL_FILES if any((sparse_dir / f"{name}{ext}").is_file() for ext in (".bin", ".txt"))]
    if len(present) < len(MODEL_FILES):
        missing = [f"{name}.bin/.txt" for name in MODEL_FILES if name not in present]
        raise FileNotFoundError(
            f"{sparse_dir} is not a COLMAP model: missing {', '.join(missing)}; "
            "pass the folder COLMAP's mapper wrote, usually <scene>/sparse/0."
        )
    validate_binary_model(sparse_dir)
    try:
        return pycolmap.Reconstruction(str(sparse_dir))
    except ValueError as error:
        raise ValueError(f"pycolmap cannot read the COLMAP model in {sparse_dir}: {error}") from error


def _observed_point_ids(image: pycolmap.Image) -> np.ndarray:
    """Sorted unique point3D ids observed by ``image``, [n] int64."""
    ids = [p.point3D_id for p in image.points2D if p.has_point3D()]
    return np.unique(np.array(ids, dtype=np.int64))


def _pixels(reconstruction: pycolmap.Reconstruction, image: pycolmap.Image) -> int:
    """Width * height of the camera of ``image``."""
    camera = reconstruction.cameras[image.camera_id]
    return int(camera.width) * int(camera.height)
