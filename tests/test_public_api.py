"""The package's public API: every name in ``__all__`` resolves, and importing the package loads nothing heavy."""

from __future__ import annotations

import subprocess
import sys

import odin_nerfstudio


def test_every_exported_name_resolves() -> None:
    for name in odin_nerfstudio.__all__:
        assert getattr(odin_nerfstudio, name) is not None, name


def test_importing_the_package_imports_no_torch_nerfstudio_or_gsplat() -> None:
    code = "import sys, odin_nerfstudio; print(sorted(m for m in ('torch', 'nerfstudio', 'gsplat') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert loaded == "[]"
