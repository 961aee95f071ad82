"""The kernels' build folder: one per set of sources and per checkout, so no two share (and rebuild) one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from odin_nerfstudio.kernels import _backend


def test_a_second_checkout_of_the_same_sources_builds_into_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = _backend.library_name("cpu")
    copy = tmp_path / "cuda" / "csrc"
    shutil.copytree(_backend.CSRC, copy)
    monkeypatch.setattr(_backend, "CSRC", copy)
    elsewhere = _backend.library_name("cpu")
    assert elsewhere != here, "torch's ninja file names sources by path: a shared folder is rebuilt in turn"
    assert elsewhere == _backend.library_name("cpu"), "the name must be stable within a checkout"
    (copy / "adam_row.h").write_text((copy / "adam_row.h").read_text() + "\n// edited\n")
    assert _backend.library_name("cpu") != elsewhere, "an edited header alone must rebuild"
