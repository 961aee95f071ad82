"""Checkpoints: written atomically, a damaged one is named and skipped for the newest intact one, and the strategy
state travels with them, so N + N resumed iterations equal 2N straight ones bit for bit across a refinement."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from odin_nerfstudio.ns.checkpoints import (
    STRATEGY_KEY,
    checkpoint_path,
    load_checkpoint,
    newest_intact_checkpoint,
    save_atomically,
)
from odin_nerfstudio.scenes.synth import SynthConfig, make_scene
from tests.ns.test_trainer import DENSIFY, assert_identical, snapshot, train, trainer_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HALF = 12
"""N: the refinement after step 20 (warm-up 5, every 10, paused for 7 train views + 10 after a reset) falls in the
resumed half of 2N = 24 steps."""
GROWTH = {**DENSIFY, "warmup_length": 5, "densify_grad_thresh": 6e-3, "stop_screen_size_at": 0}
"""The refinement after step 20 grows by mean gradient alone (no split by screen size), at about the median: it
grows the small street from 316 to 453 Gaussians, and to 481 when the resumed run forgets the statistics of steps
0 to 11."""


def state(step: int) -> dict:
    return {"step": step, "pipeline": {"x": torch.full((4,), float(step))}, "optimizers": {}}


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_an_interrupted_save_leaves_the_previous_checkpoint_and_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "nerfstudio_models"
    path = checkpoint_path(models, 5)
    save_atomically(state(5), path)

    def killed_while_writing(obj, file) -> None:
        file.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr(torch, "save", killed_while_writing)
    with pytest.raises(KeyboardInterrupt):
        save_atomically(state(6), path)
    assert load_checkpoint(path)["step"] == 5
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["nerfstudio_models", path.name]


def test_a_truncated_checkpoint_is_named(tmp_path: Path) -> None:
    path = checkpoint_path(tmp_path, 3)
    save_atomically(state(3), path)
    truncate(path)
    with pytest.raises(ValueError, match=rf"checkpoint {path} \(\d+ bytes\) cannot be read.*truncated"):
        load_checkpoint(path)


def test_the_newest_intact_checkpoint_is_taken_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for step in (3, 7, 11):
        save_atomically(state(step), checkpoint_path(tmp_path, step))
    truncate(checkpoint_path(tmp_path, 11))
    checkpoint_path(tmp_path, 7).write_bytes(b"")
    path, loaded = newest_intact_checkpoint(tmp_path)
    assert path == checkpoint_path(tmp_path, 3) and loaded["step"] == 3
    out = capsys.readouterr().out.replace("\n", "")
    assert "step-000000011.ckpt" in out and "step-000000007.ckpt" in out and "skipping a damaged checkpoint" in out


def test_no_intact_checkpoint_names_each(tmp_path: Path) -> None:
    checkpoint_path(tmp_path, 1).write_bytes(b"junk")
    with pytest.raises(ValueError, match="no checkpoint in .* can be read: checkpoint .*step-000000001.ckpt"):
        newest_intact_checkpoint(tmp_path)


@pytest.fixture(scope="module")
def small_street(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic street of 8 views (7 train): refinements pause for only 17 steps after a reset."""
    return make_scene(SynthConfig(preset="street", num_views=8, output=tmp_path_factory.mktemp("street8")))


def test_resume_across_a_refinement_from_the_newest_intact_checkpoint_is_exact(
    small_street: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    straight = train(trainer_config(small_street, tmp_path / "straight", 2 * HALF, **GROWTH))
    first = train(trainer_config(small_street, tmp_path / "first", HALF, **GROWTH))
    saved = torch.load(checkpoint_path(first.checkpoint_dir, HALF - 1), map_location="cpu")
    assert saved[STRATEGY_KEY]["grad2d"] is not None and saved[STRATEGY_KEY]["count"].sum() > 0
    damaged = checkpoint_path(first.checkpoint_dir, HALF + 50)
    damaged.write_bytes(checkpoint_path(first.checkpoint_dir, HALF - 1).read_bytes()[:1000])

    resumed_config = trainer_config(small_street, tmp_path / "resumed", HALF, **GROWTH)
    resumed_config.load_dir = first.checkpoint_dir
    resumed = train(resumed_config)
    assert f"skipping a damaged checkpoint: checkpoint {damaged}" in capsys.readouterr().out.replace("\n", "")
    assert resumed.runtime.published_through == 2 * HALF - 1
    assert first.pipeline.model.num_points != straight.pipeline.model.num_points, "a refinement ran after resume"
    assert resumed.pipeline.model.num_points == straight.pipeline.model.num_points
    assert_identical(snapshot(resumed), snapshot(straight))
    for name in ("grad2d", "count"):
        assert torch.equal(resumed.runtime.strategy_state[name], straight.runtime.strategy_state[name]), name
