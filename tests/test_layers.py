"""The folder tree is the architecture: a module imports only its own sub-package and the layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "odin_nerfstudio"
LAYER = {
    "core": 0,
    "adapter": 1,
    "scheduling": 1,
    "culling": 1,
    "rendering": 2,
    "comm": 2,
    "kernels": 2,
    "runtime": 3,
    "drivers": 4,
    "scenes": 4,
    "simulation": 5,
    "ns": 5,
    "method_configs": 6,
}
"""Rank of each sub-package, bottom (0) to top: imports go to a strictly lower rank or stay inside the package."""


def _subpackage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "odin_nerfstudio" else None


def _imports(path: Path) -> list[str]:
    """Every odin_nerfstudio module a file imports, at the top or inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            if node.module == "odin_nerfstudio":
                found.extend(f"odin_nerfstudio.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name for name in found if name.startswith("odin_nerfstudio.")]


def _files() -> list[tuple[str, Path]]:
    files = [(path.relative_to(PACKAGE).parts[0], path) for path in PACKAGE.glob("*/**/*.py")]
    return files + [("method_configs", path) for path in (REPO / "method_configs").glob("*.py")]


def test_every_subpackage_has_a_layer() -> None:
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders <= set(LAYER), f"sub-packages without a layer: {sorted(folders - set(LAYER))}"
    assert not [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"], "modules outside any layer"


def test_imports_only_go_down() -> None:
    upward = []
    for layer, path in _files():
        for module in _imports(path):
            target = _subpackage(module)
            if target is not None and target != layer and LAYER.get(target, 99) >= LAYER[layer]:
                upward.append(f"{path.relative_to(REPO)} imports {module}")
    assert not upward, "imports that run up (or across) a layer:\n" + "\n".join(upward)
