"""odin-colmap: nerfstudio cameras plus pycolmap tracks, matched by file name, with clear errors on bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pycolmap
import pytest

from odin_nerfstudio.ns.dataparser import OdinColmapDataParserConfig
from tests.conftest import real_scene


def parse(scene: Path, split: str = "train"):
    """Dataparser outputs of a scene's split."""
    return OdinColmapDataParserConfig(data=scene).setup().get_dataparser_outputs(split=split)


def test_tracks_match_pycolmap_by_image_name(any_real_scene: Path) -> None:
    reconstruction = pycolmap.Reconstruction(str(any_real_scene / "sparse" / "0"))
    by_name = {
        image.name: sorted({p.point3D_id for p in image.points2D if p.has_point3D()})
        for image in reconstruction.images.values()
    }
    for split in ("train", "val"):
        outputs = parse(any_real_scene, split)
        tracks = outputs.metadata["sfm_tracks"]
        assert len(tracks) == len(outputs.image_filenames) > 0
        for filename, observed in zip(outputs.image_filenames, tracks):
            assert observed.tolist() == by_name[Path(filename).name]


def test_every_observation_of_a_point_is_kept(kermit_320: Path) -> None:
    """nerfstudio's reader keeps one observation per point; the tracks here keep the whole track."""
    reconstruction = pycolmap.Reconstruction(str(kermit_320 / "sparse" / "0"))
    outputs = OdinColmapDataParserConfig(data=kermit_320, eval_mode="all").setup().get_dataparser_outputs("train")
    observations = sum(len(t) for t in outputs.metadata["sfm_tracks"])
    seen_by = {(e.image_id, pid) for pid, p in reconstruction.points3D.items() for e in p.track.elements}
    assert observations == len(seen_by)


def test_seed_points_are_the_model_points_in_nerfstudio_frame(kermit_320: Path) -> None:
    outputs = parse(kermit_320)
    reconstruction = pycolmap.Reconstruction(str(kermit_320 / "sparse" / "0"))
    xyz = outputs.metadata["points3D_xyz"]
    ids = outputs.metadata["points3D_ids"]
    assert xyz.shape == (reconstruction.num_points3D(), 3)
    assert set(ids.tolist()) == set(reconstruction.points3D.keys())
    camera_centres = outputs.cameras.camera_to_worlds[:, :3, 3]
    assert float(camera_centres.abs().max()) <= 1.0 + 1e-5
    assert float(xyz.median(dim=0).values.norm()) < 10.0


def copy_scene(scene: Path, target: Path) -> Path:
    """A writable copy of a scene."""
    shutil.copytree(scene, target)
    return target


def test_missing_model_says_where_it_looked(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    with pytest.raises(FileNotFoundError, match="no COLMAP model at .*sparse/0"):
        parse(tmp_path)


def test_missing_data_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist; pass --data"):
        parse(tmp_path / "nowhere")


def test_missing_images_are_listed(tmp_path: Path) -> None:
    scene = copy_scene(real_scene("kermit_320"), tmp_path / "kermit")
    victims = sorted((scene / "images").iterdir())[:2]
    for image in victims:
        image.unlink()
    with pytest.raises(FileNotFoundError, match=f"2 image\\(s\\) .* missing .*{victims[0].name}"):
        parse(scene)


def test_model_without_points_is_rejected(tmp_path: Path) -> None:
    scene = copy_scene(real_scene("kermit_320"), tmp_path / "kermit")
    model = pycolmap.Reconstruction(str(scene / "sparse" / "0"))
    for point_id in list(model.points3D.keys()):
        model.delete_point3D(point_id)
    model.write(str(scene / "sparse" / "0"))
    with pytest.raises(ValueError, match="no 3D points"):
        parse(scene)


def test_view_without_observations_warns_and_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    scene = copy_scene(real_scene("kermit_320"), tmp_path / "kermit")
    model = pycolmap.Reconstruction(str(scene / "sparse" / "0"))
    image_id = sorted(model.images.keys())[1]
    while observed := [(i, p.point3D_id) for i, p in enumerate(model.images[image_id].points2D) if p.has_point3D()]:
        index, point_id = observed[0]
        if model.points3D[point_id].track.length() <= 2:
            model.delete_point3D(point_id)
        else:
            model.delete_observation(image_id, index)
    lonely = model.images[image_id]
    model.write(str(scene / "sparse" / "0"))
    outputs = parse(scene, "train")
    names = [Path(f).name for f in outputs.image_filenames]
    assert lonely.name in names
    assert outputs.metadata["sfm_tracks"][names.index(lonely.name)].size == 0
    assert f"view {lonely.name} observes no SfM point" in capsys.readouterr().out.replace("\n", " ")


def test_text_models_are_read_too(tmp_path: Path) -> None:
    scene = copy_scene(real_scene("kermit_320"), tmp_path / "kermit")
    model_dir = scene / "sparse" / "0"
    model = pycolmap.Reconstruction(str(model_dir))
    for path in model_dir.glob("*.bin"):
        path.unlink()
    model.write_text(str(model_dir))
    tracks = parse(scene).metadata["sfm_tracks"]
    assert np.all([t.size > 0 for t in tracks])


@pytest.mark.parametrize("stem", ["cameras", "images", "points3D"])
def test_a_truncated_model_file_is_refused_naming_it(tmp_path: Path, stem: str) -> None:
    """ns-train's and odin-train's dataparser validate the binary files before pycolmap or nerfstudio read them."""
    scene = copy_scene(real_scene("kermit_320"), tmp_path / "kermit")
    path = scene / "sparse" / "0" / f"{stem}.bin"
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{stem}\.bin \({len(data) // 2} bytes\) is corrupt"):
        parse(scene)
