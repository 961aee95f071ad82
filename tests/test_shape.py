"""The package keeps its shape: small modules, a small runtime facade, and no import cycle between modules.

Why: a module that grows past a few hundred lines stops owning one job, and two modules that import each other (at
the top or inside a function) cannot be read, tested or layered apart. ``tests/test_layers.py`` keeps the imports
between sub-packages going down; this file keeps the modules themselves small and acyclic (``docs/architecture.md``,
"The runtime's parts").
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "odin_nerfstudio"
MAX_LINES = 500
"""No module of the package is longer than this, except :data:`LONG_MODULES`."""
LONG_MODULES = {"rendering/cpu_rasterizer.py", "scenes/synth.py"}
"""Modules allowed past :data:`MAX_LINES`: gsplat's rasterizer in pure torch, and the scene generator."""
FACADE = "runtime/runtime.py"
FACADE_MAX_LINES = 300
"""The runtime facade stays under this many lines: what grows goes into a part of ``runtime/``."""
TYPE_ONLY_IMPORTS_COUNT = False
"""Whether imports under ``if TYPE_CHECKING:`` are edges. They never run, so a cycle through one is no import
cycle: an annotation may name a type of a module that imports this one."""


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``'s name)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a file, at the top or nested, less those under ``if TYPE_CHECKING:``
    (unless :data:`TYPE_ONLY_IMPORTS_COUNT`)."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        if isinstance(node, ast.If) and not TYPE_ONLY_IMPORTS_COUNT and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules a file imports anywhere in it: at the top, inside functions, under ``if`` (but not
    under ``if TYPE_CHECKING:``, see :data:`TYPE_ONLY_IMPORTS_COUNT`).

    ``from a.b import c`` names the module ``a.b.c`` when that is a module, else ``a.b``; relative imports are
    resolved against the file's package. Implicit imports of parent packages are not edges (every ``__init__`` of
    the package imports nothing of it, the top one only lazily, by name).
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # each name is a submodule (``from odin_nerfstudio.kernels import ops``) or a name of the module
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names
            ]
        for target in targets:
            # the longest module name the import names (``import a.b.c`` imports the module a.b.c)
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module (Tarjan), as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, set(component)) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One cycle through the component's first module, by breadth-first search back to it."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if nxt not in parents:
                    parents[nxt] = node
                    following.append(nxt)
        frontier = following
    return sorted(component)


def test_no_module_is_longer_than_500_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): _lines(path)
        for path in PACKAGE.rglob("*.py")
        if str(path.relative_to(PACKAGE)) not in LONG_MODULES and _lines(path) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {dict(sorted(long.items()))}"


def test_the_runtime_facade_stays_under_300_lines() -> None:
    lines = _lines(PACKAGE / FACADE)
    assert lines < FACADE_MAX_LINES, f"{FACADE} has {lines} lines; move what grows into a part of runtime/"


def test_no_import_cycle_between_modules() -> None:
    modules = _modules()
    graph = {name: _imported(path, name, modules) for name, path in modules.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles between modules (at the top or inside functions):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a planted two-module cycle and a three-module cycle are found, a chain is not."""
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "x": {"y"}, "y": {"z"}, "z": {"x"}}
    assert sorted(map(tuple, _cycles(graph))) == [("a", "b", "a"), ("x", "y", "z", "x")]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_are_read_at_the_top_inside_functions_and_relative(tmp_path: Path) -> None:
    """What counts as an edge: top-level and function-level imports, a submodule named by ``from``, relative
    imports; not a name of a module, and not an import under ``if TYPE_CHECKING:``."""
    modules = {name: tmp_path / "x.py" for name in ["p.a", "p.b", "p.c", "p.d", "p.e", "p.q", "p.q.f"]}
    source = tmp_path / "x.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import p.b\n"
        "from p.q import f\n"
        "from . import c\n"
        "if TYPE_CHECKING:\n"
        "    from p.e import Thing\n"
        "def later():\n"
        "    from .d import name\n"
    )
    assert _imported(source, "p.a", modules) == {"p.b", "p.q.f", "p.c", "p.d"}
