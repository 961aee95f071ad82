"""gsplat's private code that ``adapter/gsplat.py`` relies on, pinned: a gsplat upgrade that changes any of it
fails here, naming the function, before it silently changes Odin's statistics, refinement or rasterizer.

``_update_state`` and ``step_post_backward`` are pinned because the adapter re-derives their arithmetic and
triggers (``task_stats``, ``refine_due``, ``reset_due``); ``_grow_gs`` and ``ops.split`` because ``edit_rows`` re-derives
them with per-row split draws; ``_prune_gs``, ``ops.duplicate`` and ``_update_param_with_optimizer`` because it calls
them; the ``_torch_impl`` / ``_wrapper`` functions because the rendering layer calls them through the adapter. When one
fails: read gsplat's change, update the adapter to match, then the hash.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import subprocess
import sys
from pathlib import Path

import gsplat
import pytest
from gsplat.cuda import _torch_impl, _wrapper
from gsplat.strategy import DefaultStrategy, ops

ROOT = Path(__file__).resolve().parents[2]
PINNED_VERSION = "1.4.0"
PINNED = {
    "DefaultStrategy._grow_gs": (DefaultStrategy._grow_gs, "0265844edac3fc3d"),
    "DefaultStrategy._prune_gs": (DefaultStrategy._prune_gs, "24509f8cac6dcf9b"),
    "DefaultStrategy._update_state": (DefaultStrategy._update_state, "3a322201b8f61740"),
    "DefaultStrategy.step_post_backward": (DefaultStrategy.step_post_backward, "0cc060d60ebde27d"),
    "_torch_impl._persp_proj": (_torch_impl._persp_proj, "056d923bac2f1607"),
    "_torch_impl._quat_scale_to_covar_preci": (_torch_impl._quat_scale_to_covar_preci, "9c15ff905c4231fb"),
    "_torch_impl._spherical_harmonics": (_torch_impl._spherical_harmonics, "feaf3fcc82a4997a"),
    "_torch_impl._world_to_cam": (_torch_impl._world_to_cam, "faf71910f6c01e2b"),
    "_wrapper.fully_fused_projection": (_wrapper.fully_fused_projection, "9937bf188600cbf5"),
    "ops.split": (ops.split, "0a0fd26573011d6f"),
    "ops.duplicate": (ops.duplicate, "974ab66b15c098b7"),
    "ops._update_param_with_optimizer": (ops._update_param_with_optimizer, "817345e3438ba954"),
}


def test_gsplat_version_is_the_pinned_one() -> None:
    assert gsplat.__version__ == PINNED_VERSION, "gsplat changed: re-check every pinned function below"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_private_gsplat_function_is_unchanged(name: str) -> None:
    function, expected = PINNED[name]
    digest = hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]
    assert digest == expected, f"gsplat's {name} changed (source hash {digest}): update adapter/gsplat.py to match"


def _gsplat_privates(path: Path) -> list[str]:
    """Where a module imports a private gsplat module or name, or calls a private method of a gsplat strategy."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gsplat":
            private_module = any(part.startswith("_") for part in node.module.split("."))
            private_names = [alias.name for alias in node.names if alias.name.startswith("_")]
            if private_module or private_names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name.split(".")[0] == "gsplat" and any(p.startswith("_") for p in alias.name.split("."))
            ]
        elif isinstance(node, ast.Attribute) and node.attr in ("_grow_gs", "_prune_gs", "_update_state"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    return found


def test_only_the_adapter_imports_gsplat_privates() -> None:
    """The goal of the adapter: no other module of the package imports gsplat's private modules or functions."""
    found = [hit for path in sorted((ROOT / "odin_nerfstudio").rglob("*.py")) for hit in _gsplat_privates(path)]
    assert found and all(hit.startswith("odin_nerfstudio/adapter/gsplat.py:") for hit in found), found


def test_adapter_imports_only_gsplat_and_core() -> None:
    """The adapter sits at the edge: importing it pulls in no other layer of the package."""
    code = (
        "import sys; import odin_nerfstudio.adapter.gsplat; "
        "layers = {m.split('.')[1] for m in sys.modules if m.startswith('odin_nerfstudio.')}; "
        "assert layers <= {'adapter', 'core'}, layers"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
