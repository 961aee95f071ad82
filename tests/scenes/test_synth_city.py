"""odin-synth's city: citygen's cameras, a COLMAP model the dataparser reads, views that share only near crossings."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pycolmap
import pytest

from odin_nerfstudio.ns.command_line import train_command
from odin_nerfstudio.ns.dataparser import OdinColmapDataParserConfig
from odin_nerfstudio.scenes import synth, synth_city
from odin_nerfstudio.scenes.citygen import CityConfig, city_point_sets
from odin_nerfstudio.scenes.synth import SynthConfig, make_scene
from tests.ns.processes import environment

BLOCK = 20.0
# 48 views over a 2 x 2 grid of streets (12 a street, 3.3 m apart), small images and world: a few seconds
SMALL = dict(preset="city", num_views=48, width=48, height=36, num_gaussians=5_000, num_points=5_000, block_size=BLOCK)


@pytest.fixture(scope="module")
def city(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small city scene, generated once for the module."""
    return make_scene(SynthConfig(output=tmp_path_factory.mktemp("city") / "city", **SMALL))


def read(scene: Path) -> pycolmap.Reconstruction:
    """The scene's COLMAP model."""
    return pycolmap.Reconstruction(scene / "sparse" / "0")


def test_preset_sizes_fill_what_the_options_leave_out() -> None:
    """The city defaults to its own size (80 views, 100k Gaussians, 20k points); given options win."""
    default = SynthConfig(preset="city")
    assert (default.num_views, default.num_gaussians, default.num_points) == synth.PRESET_SIZES["city"]
    assert SynthConfig(preset="city", num_views=64).num_views == 64
    assert SynthConfig(preset="street").num_views == synth.PRESET_SIZES["street"][0]
    with pytest.raises(ValueError, match="block_size"):
        SynthConfig(preset="city", block_size=8.0)


def test_cameras_are_where_citygen_puts_them(city: Path) -> None:
    """Every image's centre and yaw are citygen's camera position and heading, in citygen's order."""
    reference = city_point_sets(CityConfig(num_views=SMALL["num_views"], block_size=BLOCK))
    layout = synth_city.layout(SMALL["num_views"], BLOCK)
    assert layout.streets_per_direction == 2
    rec = read(city)
    for view, image_id in enumerate(sorted(rec.images)):
        image = rec.images[image_id]
        assert image.name == synth.image_name(view)
        np.testing.assert_allclose(image.projection_center(), reference.camera_positions[view], atol=1e-9)
        direction = image.viewing_direction()
        yaw = math.atan2(direction[1], direction[0])
        assert math.cos(yaw - reference.camera_headings[view]) == pytest.approx(1.0, abs=1e-9)
        assert direction[2] < 0.0, "cameras look slightly down, as the street's"


def test_model_reads_through_the_dataparser(city: Path) -> None:
    """odin-colmap reads the city: one track per train image, equal to the image's observations in the model."""
    rec = read(city)
    observed = {image.name: sorted(p.point3D_id for p in image.points2D) for image in rec.images.values()}
    outputs = OdinColmapDataParserConfig(data=city).setup().get_dataparser_outputs(split="train")
    tracks = outputs.metadata["sfm_tracks"]
    assert len(tracks) == len(outputs.image_filenames) == SMALL["num_views"] - SMALL["num_views"] // 8
    for filename, track in zip(outputs.image_filenames, tracks):
        assert track.tolist() == observed[Path(filename).name]
    assert outputs.metadata["points3D_xyz"].shape == (rec.num_points3D(), 3) and rec.num_points3D() > 10


def test_views_of_two_streets_share_points_only_near_a_crossing(city: Path) -> None:
    """Views of two streets share points only when both stand within the matching range of one crossing (the
    blocks occlude the rest); views of one street do share points."""
    sets = synth.view_point_sets(read(city))
    layout = synth_city.layout(SMALL["num_views"], BLOCK)
    reach = synth.preset_for(SynthConfig(**SMALL)).max_depth
    grid = np.arange(layout.streets_per_direction) * BLOCK
    crossings = np.stack(np.meshgrid(grid, grid), axis=-1).reshape(-1, 2)
    near = np.linalg.norm(layout.camera_positions[:, None, :2] - crossings[None], axis=2) <= reach  # [V, crossings]
    same, other, far_apart = [], [], 0
    for i in range(len(sets)):
        for j in range(i + 1, len(sets)):
            overlap = synth.jaccard(sets[i], sets[j])
            if layout.street[i] == layout.street[j]:
                same.append(overlap)
                continue
            other.append(overlap)
            if not (near[i] & near[j]).any():
                far_apart += 1
                assert overlap == 0.0, (i, j, layout.camera_positions[[i, j]])
    assert far_apart > 100, "the test needs view pairs of different streets that no crossing joins"
    assert max(same) > 0.0 and np.mean(other) < 0.02


@pytest.mark.slow
def test_ns_train_odin_splat_trains_on_the_city(tmp_path: Path) -> None:
    """A few ns-train odin-splat steps on a small city scene: it trains and saves its checkpoint."""
    scene = make_scene(SynthConfig(output=tmp_path / "city", **SMALL))
    command = train_command("odin-splat", scene, tmp_path, 10, options=["--pipeline.model.num-downscales", "0"])
    env = environment()
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    assert (tmp_path / "city" / "odin-splat" / "run" / "nerfstudio_models" / "step-000000009.ckpt").is_file()
