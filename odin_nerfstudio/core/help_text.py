"""tyro's --help with each option's description as one paragraph, not cut where the source wraps its docstring.

Used by every command that builds its help with tyro: the ns-* commands (through ``odin_nerfstudio/ns/startup.py``),
``odin-train``, ``odin-schedule``, ``odin-synth``, ``odin-simulate`` and ``odin-timeline``.
"""

from __future__ import annotations

import re

LIST_ITEM = re.compile(r"([-*\u2022]|\d+[.)])\s")
"""A line that starts a list item, which keeps its line break in --help."""


def reflowed(text: str) -> str:
    """A field's docstring with the source's line wrapping undone: the lines of each paragraph joined by spaces,
    blank lines and list items kept."""
    paragraphs: list[str] = []
    for line in text.split("\n"):
        line = line.strip()
        if not line:
            paragraphs.append("")
        elif not paragraphs or not paragraphs[-1] or LIST_ITEM.match(line):
            paragraphs.append(line)
        else:
            paragraphs[-1] += " " + line
    return "\n".join(paragraphs).strip()


def reflow_help_texts() -> None:
    """Make tyro's --help reflow a field's docstring instead of breaking its lines where the source wraps them.

    tyro (1.0.17) joins the lines of a docstring only where a line starts with a letter, and looks before it
    removes the indentation, so every continuation line of a field docstring (indented in the source) kept its
    break: ``--help`` printed sentences cut at the source's column 120, the next part on a line of its own. The
    docstrings are handed to tyro with each paragraph on one line (:func:`reflowed`); every command that builds a
    help with tyro calls this first (the ns-* commands through ``ns/startup.py``, ``odin-train``,
    ``odin-schedule``, ``odin-synth``)."""
    try:
        from tyro import _docstrings
    except ImportError:
        return
    original = getattr(_docstrings, "parse_docstring_from_object", None)
    if original is None or getattr(original, "odin_reflow", False):
        return

    def parse_docstring_from_object(obj: object) -> dict[str, str]:
        return {name: reflowed(text) for name, text in original(obj).items()}

    parse_docstring_from_object.odin_reflow = True  # type: ignore[attr-defined]
    _docstrings.parse_docstring_from_object = parse_docstring_from_object
