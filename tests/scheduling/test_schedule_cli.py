"""odin-schedule on the real scenes: printed statistics match the library, the PNG is drawn, bad input is explained,
and by default the views are the training split ns-train schedules."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig
from odin_nerfstudio.scheduling.cli import main, principal_plane, training_views
from odin_nerfstudio.scheduling.tracks import read_colmap_tracks
from tests.conftest import real_scene

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def number(pattern: str, text: str) -> float:
    """The number captured by ``pattern`` in ``text``."""
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return float(found.group(1))


def test_statistics_match_the_library_and_the_png_is_drawn(
    any_real_scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    png = tmp_path / "plots" / "rlg.png"
    options = ["--workers", "2", "--views-per-step", "2", "--seed", "3", "--output", str(png)]
    main(["--data", str(any_real_scene), "--split", "all", *options])
    out = capsys.readouterr().out

    tracks = read_colmap_tracks(any_real_scene / "sparse" / "0")
    rlg = RelativeLocalityGraph.from_point_sets(tracks.in_view_ids)  # the default --rlg-points in-view
    schedule = Schedule(rlg, ScheduleConfig(num_workers=2, views_per_worker=2, seed=3), tracks.pixels)
    graph, stats = rlg.summary(), schedule.summary()
    assert number(r"RLG: (\d+) views", out) == graph["views"] == len(tracks.image_names)
    assert number(r"(\d+) edges", out) == graph["edges"]
    assert number(r"mean weight ([\d.]+)", out) == pytest.approx(graph["mean_weight"], abs=5e-5)
    assert number(r"max weight ([\d.]+)", out) == pytest.approx(graph["max_weight"], abs=5e-5)
    assert number(r"(\d+) steps per epoch", out) == schedule.steps_per_epoch
    assert number(r"([\d.]+) scheduled", out) == pytest.approx(stats["conflict_mass"], abs=5e-5)
    assert number(r"([\d.]+) random order", out) == pytest.approx(stats["random_conflict_mass"], abs=5e-5)
    assert number(r"ratio ([\d.]+)", out) == pytest.approx(stats["ratio"], abs=5e-4)
    assert number(r"balance .*: ([\d.]+)", out) == pytest.approx(stats["balance"], abs=5e-4)
    assert stats["random_conflict_mass"] == pytest.approx(schedule.random_conflict_profile(0).sum())

    assert f"wrote {png}" in out
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(png) as image:
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.shape[1] > 2 * pixels.shape[0] and pixels.std() > 10


def test_the_command_runs_as_a_module_and_draws_nothing_without_output(tmp_path: Path) -> None:
    scene = real_scene("kermit_320")
    result = subprocess.run(
        [sys.executable, "-m", "odin_nerfstudio.scheduling.cli", "--data", str(scene), "--workers", "3"]
        + ["--split", "all"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RLG: 11 views, 55 edges" in result.stdout  # in view of one another: every pair
    assert "W=3 workers x B=1 view = 3 views per step, 4 steps per epoch (the last one short: 2 views)" in (
        result.stdout
    )
    assert "wrote" not in result.stdout and not list(tmp_path.iterdir())


def test_by_default_the_views_are_the_training_split_ns_train_schedules(
    any_real_scene: Path, capsys: pytest.CaptureFixture
) -> None:
    """The same views, in the same order, as odin-colmap's train split; so the same RLG as the training run's."""
    from odin_nerfstudio.ns.dataparser import OdinColmapDataParserConfig

    train = OdinColmapDataParserConfig(data=any_real_scene).setup().get_dataparser_outputs("train")
    images = any_real_scene / "images"
    names = [Path(name).relative_to(images).as_posix() for name in train.image_filenames]
    assert training_views(any_real_scene, any_real_scene / "sparse" / "0", eval_interval=8) == names

    main(["--data", str(any_real_scene)])
    out = capsys.readouterr().out
    graph = RelativeLocalityGraph.from_point_sets(train.metadata["sfm_in_view"]).summary()
    assert f"the {len(names)} training views ns-train schedules" in out and "--split all" in out
    assert number(r"RLG: (\d+) views", out) == graph["views"] == len(names)
    assert number(r"(\d+) edges", out) == graph["edges"]
    main(["--data", str(any_real_scene), "--rlg-points", "observed"])
    observed = RelativeLocalityGraph.from_point_sets(train.metadata["sfm_tracks"]).summary()
    assert number(r"(\d+) edges", capsys.readouterr().out) == observed["edges"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--data", "{missing}"], r"scene folder .*missing does not exist; pass --data <scene>"),
        (["--data", "{empty}"], r"COLMAP model folder .*sparse/0 does not exist"),
        (
            ["--data", "{scene}", "--workers", "4", "--views-per-step", "4"],
            r"4 x 4 = 16 views per step, but the scene has only V = 9 views.*single short step.*W x B <= 9",
        ),
        (["--data", "{scene}", "--workers", "0"], r"invalid schedule options .*num_workers.*--workers"),
        (["--data", "{scene}", "--output", "{empty}/plot.jpg"], r"--output must name a .png file"),
    ],
)
def test_bad_input_is_explained(tmp_path: Path, arguments: list[str], message: str) -> None:
    places = {"missing": tmp_path / "missing", "empty": tmp_path, "scene": real_scene("kermit_320")}
    with pytest.raises(SystemExit) as exit_info:
        main([argument.format(**places) for argument in arguments])
    assert str(exit_info.value).startswith("odin-schedule: error: ")
    assert re.search(message, str(exit_info.value)), str(exit_info.value)


def test_missing_data_option_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--workers", "2"])
    assert exit_info.value.code == 2
    assert "--data" in capsys.readouterr().err


def test_principal_plane_keeps_the_two_main_axes_and_centres_unposed_views() -> None:
    line = np.array([[0.0, 0.0, 0.0], [10.0, 1.0, 0.0], [20.0, 0.0, 0.0], [np.nan, np.nan, np.nan]])
    plane = principal_plane(line)
    assert plane.shape == (4, 2)
    assert np.ptp(plane[:3, 0]) == pytest.approx(20.0, abs=0.2)
    np.testing.assert_allclose(plane[3], 0.0)
