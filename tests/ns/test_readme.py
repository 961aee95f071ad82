"""The README's figures do not drift: what a run measures (PSNR, time per iteration, the number of tests and how long
they took, the length of --help) is printed by the commands themselves or kept in BENCHMARKS.md, and the README
shows the quickstart's last line as the script prints it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
QUICKSTART = (ROOT / "scripts" / "quickstart.sh").read_text()


def shape(text: str, field: str) -> str:
    """``text`` with each field (``field``: a regex) replaced by ``#``."""
    return re.sub(field, "#", text)


def test_the_readme_shows_the_quickstarts_last_line_as_the_script_prints_it() -> None:
    printed = re.search(r"print\(\n((?:\s+f\".*\"\n)+)\s*\)", QUICKSTART)
    assert printed, "scripts/quickstart.sh's summary print(...) of f-strings"
    template = "".join(re.findall(r'f"(.*)"', printed.group(1)))
    shown = [line for line in README.splitlines() if line.startswith("held-out PSNR ")]
    assert len(shown) == 1, shown
    assert shape(shown[0], r"<[^>]+>") == shape(template, r"\{[^}]+\}")


def test_the_readme_states_no_figure_that_a_run_measures() -> None:
    drifting = {
        r"held-out PSNR \d": "a run's PSNR",
        r"\d+ ms per iteration": "a run's time per iteration",
        r"\(\d+ tests\)|\d+ passed": "the number of tests",
        r"prints some \d+ lines": "the length of --help",
        r"about a minute for \d+ views": "odin-synth's time",
        r"took \d+ min": "a run's wall time",
    }
    found = {what: re.findall(pattern, README) for pattern, what in drifting.items()}
    assert not any(found.values()), {what: hits for what, hits in found.items() if hits}
