"""What the benchmarks share: the CPU's name and the locked read-modify-write of one section of BENCHMARKS.md.

Why: several benchmarks write the same markdown file, possibly at the same time; each owns the text between
its ``<!-- name:start -->`` and ``<!-- name:end -->`` markers and must leave the other sections as they are.
"""

from __future__ import annotations

import fcntl
import os
import platform
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def markers(name: str) -> tuple[str, str]:
    """The start and end markers of benchmark ``name``'s section."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def write_section(name: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace the section of benchmark ``name`` in ``path`` with ``body`` under an exclusive file lock.

    The file is created (with a ``# Benchmarks`` title) if missing, and the section appended if absent.
    """
    start, end = markers(name)
    section = f"{start}\n{body.rstrip()}\n{end}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        content = handle.read() or "# Benchmarks\n"
        if start in content and end in content:
            head, rest = content.split(start, 1)
            content = head + section + rest.split(end, 1)[1]
        else:
            content = content.rstrip("\n") + "\n\n" + section + "\n"
        handle.seek(0)
        handle.write(content)
        handle.truncate()


def publish(name: str, text: str, output: Path | None) -> None:
    """Print benchmark ``name``'s section and, unless ``output`` is None, write it into that file."""
    print(text)
    if output is not None:
        write_section(name, text, output)
        print(f"updated {output}")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
