"""SfM tracks read from COLMAP models: content against pycolmap's own tracks, bin/txt parity, clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pycolmap
import pytest

from odin_nerfstudio.scheduling.tracks import SfMTracks, read_colmap_tracks


def test_tracks_match_pycolmap_point_tracks(any_real_scene: Path) -> None:
    """Each view's point set is exactly the set of points whose track lists that image."""
    sparse = any_real_scene / "sparse" / "0"
    tracks = read_colmap_tracks(sparse)
    reconstruction = pycolmap.Reconstruction(str(sparse))
    expected: dict[str, set[int]] = {image.name: set() for image in reconstruction.images.values()}
    for point_id, point in reconstruction.points3D.items():
        for element in point.track.elements:
            expected[reconstruction.images[element.image_id].name].add(point_id)

    assert tracks.image_names == sorted(expected)
    for name, ids in zip(tracks.image_names, tracks.point_ids):
        assert ids.dtype == np.int64
        assert np.all(np.diff(ids) > 0)
        assert set(ids.tolist()) == expected[name]
    assert tracks.points_xyz.shape == (reconstruction.num_points3D(), 3)
    assert tracks.points_xyz.dtype == np.float64
    assert tracks.points_rgb.dtype == np.uint8 and tracks.points_rgb.shape == tracks.points_xyz.shape
    assert np.array_equal(tracks.point3d_ids, np.sort(list(reconstruction.points3D.keys())))
    some_id = int(tracks.point3d_ids[-1])
    np.testing.assert_array_equal(tracks.points_xyz[-1], reconstruction.points3D[some_id].xyz)
    assert tracks.pixels is not None and np.all(tracks.pixels > 0)


def test_text_model_reads_like_binary(kermit_320: Path, tmp_path: Path) -> None:
    """pycolmap's text export of a real model gives the same tracks as the binary model."""
    sparse = kermit_320 / "sparse" / "0"
    pycolmap.Reconstruction(str(sparse)).write_text(str(tmp_path))
    binary, text = read_colmap_tracks(sparse), read_colmap_tracks(tmp_path)
    assert binary.image_names == text.image_names
    for a, b in zip(binary.point_ids, text.point_ids):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(binary.point3d_ids, text.point3d_ids)
    np.testing.assert_allclose(binary.points_xyz, text.points_xyz, rtol=1e-9)
    np.testing.assert_array_equal(binary.pixels, text.pixels)


def test_for_names_follows_the_given_order(kermit_320: Path) -> None:
    """for_names returns point sets in the caller's (e.g. a train split's) order."""
    tracks = read_colmap_tracks(kermit_320 / "sparse" / "0")
    names = tracks.image_names[::-3]
    for name, ids in zip(names, tracks.for_names(names)):
        np.testing.assert_array_equal(ids, tracks.point_ids[tracks.image_names.index(name)])
    np.testing.assert_array_equal(tracks.pixels_for_names(names), tracks.pixels[tracks.indices_of(names)])


def test_for_names_names_the_missing_images(kermit_320: Path) -> None:
    """Unknown names give a ValueError that lists them, never a bare KeyError."""
    tracks = read_colmap_tracks(kermit_320 / "sparse" / "0")
    with pytest.raises(ValueError, match="not_there.png"):
        tracks.for_names([tracks.image_names[0], "not_there.png"])


def test_hand_built_tracks_have_no_pixels() -> None:
    """Tracks built by hand may omit pixel counts."""
    tracks = SfMTracks(["a.png"], [np.array([1, 2])], np.zeros((2, 3)), np.zeros((2, 3), np.uint8), np.array([1, 2]))
    assert tracks.pixels_for_names(["a.png"]) is None


def test_missing_folder(tmp_path: Path) -> None:
    """A folder that does not exist is a FileNotFoundError that says where to point."""
    with pytest.raises(FileNotFoundError, match="does not exist.*sparse/0"):
        read_colmap_tracks(tmp_path / "nope")


def test_folder_without_model(tmp_path: Path) -> None:
    """A folder without cameras/images/points3D is named as not a COLMAP model."""
    (tmp_path / "cameras.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="not a COLMAP model.*images.bin"):
        read_colmap_tracks(tmp_path)


def test_unreadable_model(tmp_path: Path) -> None:
    """Corrupt model files are refused naming the first bad file."""
    for name in ("cameras", "images", "points3D"):
        (tmp_path / f"{name}.bin").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cameras.bin .*is corrupt"):
        read_colmap_tracks(tmp_path)


def test_model_without_points(kermit_320: Path, tmp_path: Path) -> None:
    """A model with no points3D has no tracks: ValueError telling to triangulate."""
    reconstruction = pycolmap.Reconstruction(str(kermit_320 / "sparse" / "0"))
    for point_id in list(reconstruction.point3D_ids()):
        reconstruction.delete_point3D(point_id)
    reconstruction.write(str(tmp_path))
    with pytest.raises(ValueError, match="no 3D points.*triangulat"):
        read_colmap_tracks(tmp_path)


def test_in_view_points_are_those_in_front_that_project_into_the_widened_image() -> None:
    """A pinhole camera at the origin looking down +z, 200 x 100 pixels, f = 100: far points ahead are in view
    (SfM would not have matched them), points behind or beyond the margin are not."""
    from odin_nerfstudio.scheduling.tracks import in_view_point_ids

    K = np.array([[100.0, 0.0, 100.0], [0.0, 100.0, 50.0], [0.0, 0.0, 1.0]])
    cam_from_world = np.hstack([np.eye(3), np.zeros((3, 1))])
    xyz = np.array(
        [
            [0.0, 0.0, 1000.0],  # far ahead: in
            [0.0, 0.0, -1.0],  # behind: out
            [1.1, 0.0, 1.0],  # u = 210, within the 10% margin (220): in
            [1.3, 0.0, 1.0],  # u = 230: out
            [0.0, -0.55, 1.0],  # v = -5, within the margin (-10): in
            [0.0, 0.7, 1.0],  # v = 120: out
        ]
    )
    assert in_view_point_ids(xyz, cam_from_world, K, 200, 100).tolist() == [0, 2, 4]


def test_in_view_sets_hold_the_observed_points(any_real_scene: Path) -> None:
    """Each view's in-view set is its observed set plus points in its field of view, never fewer."""
    tracks = read_colmap_tracks(any_real_scene / "sparse" / "0")
    assert tracks.in_view_ids is not None
    for observed, in_view in zip(tracks.point_ids, tracks.in_view_ids):
        assert np.all(np.diff(in_view) > 0) and np.isin(observed, in_view).all()
    assert sum(map(len, tracks.in_view_ids)) > sum(map(len, tracks.point_ids))
    with pytest.raises(ValueError, match="observed.*in-view"):
        tracks.for_names(tracks.image_names[:1], "visible")
