"""Synthetic scenes: the COLMAP model reads back, tracks are SfM-like and correct, output is deterministic."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pycolmap
import pytest
from PIL import Image

from odin_nerfstudio.scenes import surfaces, synth
from odin_nerfstudio.scenes.synth import SynthConfig, make_scene

NOISE = 0.25
SMALL = dict(num_views=16, width=80, height=60, num_gaussians=6_000, num_points=1_500, pixel_noise=NOISE, seed=3)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small object scene and a small street scene, generated once for the module."""
    root = tmp_path_factory.mktemp("synth")
    return {p: make_scene(SynthConfig(preset=p, output=root / p, **SMALL)) for p in ("object", "street")}


def read(scene: Path) -> pycolmap.Reconstruction:
    """The scene's COLMAP model."""
    return pycolmap.Reconstruction(scene / "sparse" / "0")


@pytest.mark.parametrize("preset", ["object", "street"])
def test_model_counts_and_images(scenes: dict[str, Path], preset: str) -> None:
    """One PINHOLE camera, one posed image per view with its PNG at the right size, a few hundred points."""
    rec = read(scenes[preset])
    assert rec.num_cameras() == 1 and rec.num_images() == SMALL["num_views"] == rec.num_reg_images()
    camera = rec.cameras[1]
    assert camera.model == pycolmap.CameraModelId.PINHOLE
    assert (camera.width, camera.height) == (SMALL["width"], SMALL["height"])
    assert 200 < rec.num_points3D() <= SMALL["num_points"]
    for image in rec.images.values():
        with Image.open(scenes[preset] / "images" / image.name) as png:
            assert png.size == (SMALL["width"], SMALL["height"]) and png.mode == "RGB"
            assert np.asarray(png).std() > 20.0, "views should be textured, not flat"
    assert sorted(p.name for p in (scenes[preset] / "images").iterdir()) == sorted(
        im.name for im in rec.images.values()
    )


@pytest.mark.parametrize("preset", ["object", "street"])
def test_tracks_are_consistent_and_reproject(scenes: dict[str, Path], preset: str) -> None:
    """Every track has >= 2 views, points back-reference their 3D point, observations reproject within the noise."""
    rec = read(scenes[preset])
    errors = []
    for point_id, point in rec.points3D.items():
        elements = point.track.elements
        assert len({e.image_id for e in elements}) == len(elements) >= 2
        for element in elements:
            image = rec.images[element.image_id]
            observation = image.points2D[element.point2D_idx]
            assert observation.point3D_id == point_id
            errors.append(np.linalg.norm(image.project_point(point.xyz) - observation.xy))
    errors = np.asarray(errors)
    assert errors.max() < 6.0 * NOISE
    assert abs(errors.mean() / (NOISE * math.sqrt(math.pi / 2.0)) - 1.0) < 0.15, "mean error should be Rayleigh's"
    for image in rec.images.values():
        assert all(p.has_point3D() for p in image.points2D), "points2D hold only track observations"


def test_street_overlap_is_much_sparser_than_object(scenes: dict[str, Path]) -> None:
    """The street's views share far fewer points than the object's (all pairs and consecutive views)."""
    obj, street = (synth.view_point_sets(read(scenes[p])) for p in ("object", "street"))
    assert synth.mean_pairwise_jaccard(street) < synth.mean_pairwise_jaccard(obj) / 3.0
    assert synth.mean_consecutive_jaccard(street) < synth.mean_consecutive_jaccard(obj) / 1.5
    assert read(scenes["street"]).compute_mean_track_length() < read(scenes["object"]).compute_mean_track_length()


def test_same_seed_same_bytes_other_seed_differs(scenes: dict[str, Path], tmp_path: Path) -> None:
    """Regenerating with the same options writes identical files; another seed changes the model."""
    again = make_scene(SynthConfig(preset="street", output=tmp_path / "again", **SMALL))
    for original in sorted(scenes["street"].rglob("*")):
        if original.is_file():
            assert (again / original.relative_to(scenes["street"])).read_bytes() == original.read_bytes(), original
    tiny = dict(num_views=4, width=32, height=24, num_gaussians=1_000, num_points=200)
    models = [make_scene(SynthConfig(output=tmp_path / str(seed), seed=seed, **tiny)) for seed in (1, 2)]
    assert len({(m / "sparse/0/points3D.bin").read_bytes() for m in models}) == 2


def test_existing_scene_needs_overwrite(tmp_path: Path) -> None:
    """A second write into the same folder refuses without overwrite and replaces the scene with it."""
    tiny = SynthConfig(num_views=4, width=32, height=24, num_gaussians=500, num_points=100, output=tmp_path)
    make_scene(tiny)
    with pytest.raises(FileExistsError):
        make_scene(tiny)
    make_scene(replace(tiny, num_views=3, overwrite=True))
    assert len(list((tmp_path / "images").iterdir())) == 3


def test_cli_prints_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """`odin-synth` parses its options with tyro, writes the scene and reports views, points, tracks, overlap."""
    args = ["--preset", "street", "--num-views", "6", "--width", "48", "--height", "32", "--num-gaussians", "2000"]
    monkeypatch.setattr(sys, "argv", ["odin-synth", *args, "--output", str(tmp_path / "s")])
    synth.main()
    out = capsys.readouterr().out
    assert str(tmp_path / "s") in out and "6 views" in out and "mean track length" in out and "Jaccard" in out
    assert "Rendering street views" in out and "6/6" in out, "odin-synth shows its progress in views rendered"
    assert (tmp_path / "s" / "sparse" / "0" / "points3D.bin").is_file()


def test_make_scene_reports_each_rendered_view(tmp_path: Path) -> None:
    """`on_view` is called once per view, after it is rendered (what odin-synth's progress bar counts)."""
    rendered: list[int] = []
    config = SynthConfig(preset="object", num_views=4, width=24, height=16, num_gaussians=500, output=tmp_path)
    make_scene(config, on_view=lambda: rendered.append(len(list((tmp_path / "images").iterdir()))))
    assert rendered == [1, 2, 3, 4]


def test_look_at_is_opencv() -> None:
    """The target projects to the image center in front of the camera; world up points to smaller image y."""
    eye, target = np.array([[3.0, 1.0, 2.0]]), np.array([[0.0, 0.0, 0.0]])
    viewmat = synth.look_at(eye, target, np.array([0.0, 0.0, 1.0]))[0]
    K = synth.intrinsics(64, 48, 60.0)
    pixels, depth = synth.project(np.concatenate([target, target + [[0.0, 0.0, 0.1]]]), viewmat, K)
    np.testing.assert_allclose(pixels[0], [32.0, 24.0], atol=1e-9)
    assert depth[0] == pytest.approx(np.linalg.norm(eye)) and pixels[1, 1] < pixels[0, 1]
    np.testing.assert_allclose(viewmat[:3, :3] @ viewmat[:3, :3].T, np.eye(3), atol=1e-12)


def test_quats_rotate_z_onto_the_normal_up_to_sign() -> None:
    """quats_from_normals maps the disc's local z axis onto +-normal, including normals along -z."""
    normals = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0], [1.0, 0.0, 0.0], [0.6, -0.8, 0.0], [0.48, 0.6, -0.64]])
    w, x, y, z = surfaces.quats_from_normals(normals).T
    rotated_z = np.stack([2 * (x * z + w * y), 2 * (y * z - w * x), 1 - 2 * (x * x + y * y)], axis=1)
    np.testing.assert_allclose(np.abs(np.einsum("ni,ni->n", rotated_z, normals)), 1.0, atol=1e-12)


def test_observed_rejects_outside_behind_far_grazing_and_occluded() -> None:
    """Only points inside the image, in range, facing the camera and at the rendered depth are observed."""
    viewmat, K = np.eye(4), synth.intrinsics(40, 30, 90.0)
    depth_map, alpha_map = np.full((30, 40), 5.0), np.ones((30, 40))
    depth_map[:, :10] = 3.0
    toward, side = [0.0, 0.0, -1.0], [1.0, 0.0, 0.0]
    points = np.array([[0, 0, 5], [0, 0, 5], [0, 0, 8], [9, 0, 5], [0, 0, -5], [-3.5, 0, 5], [-2.1, 0, 3]], float)
    normals = np.array([toward, side, toward, toward, [0.0, 0.0, 1.0], toward, toward])
    seen, pixels = synth.observed(points, normals, viewmat, K, depth_map, alpha_map, max_depth=math.inf)
    assert seen.tolist() == [True, False, False, False, False, False, True]
    np.testing.assert_allclose(pixels[0], [20.0, 15.0])
    seen_near, _ = synth.observed(points, normals, viewmat, K, depth_map, alpha_map, max_depth=4.0)
    assert seen_near.tolist() == [False] * 6 + [True]
    transparent, _ = synth.observed(points, normals, viewmat, K, depth_map, 0.0 * alpha_map, max_depth=math.inf)
    assert not transparent.any()


def test_config_rejects_degenerate_options() -> None:
    """Too few views, a sub-2-pixel image or negative noise raise at construction (tyro reports it)."""
    for bad in (dict(num_views=1), dict(width=1), dict(pixel_noise=-1.0), dict(num_points=0)):
        with pytest.raises(ValueError):
            SynthConfig(**bad)
