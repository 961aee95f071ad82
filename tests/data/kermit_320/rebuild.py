"""Rebuild this folder from the 640x480 Bundler kermit scene: images and COLMAP model downscaled by 1/2 to 320x240.

Usage: python tests/data/kermit_320/rebuild.py SOURCE  (SOURCE holds images/kermit000.jpg ... and sparse/0, e.g. ../shared/data/kermit)

Images: Lanczos resize, JPEG quality 90, no EXIF. Model: the SIMPLE_RADIAL focal length and principal point are halved
(the radial coefficient acts on normalized coordinates, so it stays), every 2D observation and every point's
reprojection error (pixels) is halved; ids, poses, 3D points and tracks are unchanged. Written with pycolmap, then read
back and checked against the source.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pycolmap
from PIL import Image

SCALE = 0.5
HERE = Path(__file__).resolve().parent


def rebuild(source: Path, target: Path = HERE) -> None:
    (target / "images").mkdir(parents=True, exist_ok=True)
    (target / "sparse" / "0").mkdir(parents=True, exist_ok=True)
    for path in sorted((source / "images").glob("*.jpg")):
        image = Image.open(path).convert("RGB")
        size = (round(image.width * SCALE), round(image.height * SCALE))
        image.resize(size, Image.Resampling.LANCZOS).save(target / "images" / path.name, quality=90, optimize=True)
    model = pycolmap.Reconstruction(str(source / "sparse" / "0"))
    for camera in model.cameras.values():
        assert camera.model_name == "SIMPLE_RADIAL", camera
        f, cx, cy, k = camera.params
        camera.width, camera.height = round(camera.width * SCALE), round(camera.height * SCALE)
        camera.params = [f * SCALE, cx * SCALE, cy * SCALE, k]
    for image in model.images.values():
        for point2d in image.points2D:
            point2d.xy = point2d.xy * SCALE
    for point3d in model.points3D.values():
        point3d.error = point3d.error * SCALE
    model.write(str(target / "sparse" / "0"))
    for extra in ("rigs.bin", "frames.bin"):  # trivial rig and frames, as in the source model: pycolmap rebuilds them
        (target / "sparse" / "0" / extra).unlink(missing_ok=True)
    check(source, target)


def check(source: Path, target: Path = HERE) -> None:
    """The written model reads back with the source's ids, poses and tracks, and observations scaled by SCALE."""
    a = pycolmap.Reconstruction(str(source / "sparse" / "0"))
    b = pycolmap.Reconstruction(str(target / "sparse" / "0"))
    assert sorted(a.images) == sorted(b.images) and sorted(a.points3D) == sorted(b.points3D)
    for camera_id, camera in a.cameras.items():
        f, cx, cy, k = camera.params
        assert np.allclose(b.cameras[camera_id].params, [f * SCALE, cx * SCALE, cy * SCALE, k], rtol=0, atol=1e-12)
    for image_id, image in a.images.items():
        other = b.images[image_id]
        assert image.name == other.name and image.camera_id == other.camera_id
        assert np.array_equal(image.cam_from_world().matrix(), other.cam_from_world().matrix())
        assert Image.open(target / "images" / other.name).size == (b.cameras[other.camera_id].width,
                                                                   b.cameras[other.camera_id].height)
        assert len(image.points2D) == len(other.points2D)
        for p, q in zip(image.points2D, other.points2D):
            assert p.point3D_id == q.point3D_id and np.array_equal(p.xy * SCALE, q.xy)
    for point_id, point in a.points3D.items():
        other = b.points3D[point_id]
        assert np.array_equal(point.xyz, other.xyz) and np.array_equal(point.color, other.color)
        assert [(e.image_id, e.point2D_idx) for e in point.track.elements] == [
            (e.image_id, e.point2D_idx) for e in other.track.elements
        ]
    print(b.summary())


if __name__ == "__main__":
    rebuild(Path(sys.argv[1]))
