"""What the benchmarks share: the machine's description, the bit-for-bit comparison of two trained models, and the
locked read-modify-write of one section of BENCHMARKS.md.

Why: several benchmarks write the same markdown file, possibly at the same time; each owns the text between
its ``<!-- name:start -->`` and ``<!-- name:end -->`` markers and must leave the other sections as they are.
"""

from __future__ import annotations

import fcntl
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

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


def machine(*libraries: ModuleType, device: Any = None, memory: bool = False) -> str:
    """One line describing the machine: CPU, cores available, (RAM,) load average, (GPU,) then the versions of
    Python and of ``libraries`` (modules; torch's adds its intra-op threads).

    Args:
        libraries: modules whose ``__version__`` the line names (``torch``, ``numpy``, ...).
        device: a torch device; a CUDA one adds its GPU's name.
        memory: whether to name the RAM installed.
    """
    hardware = [f"CPU {cpu_name()}", f"{len(os.sched_getaffinity(0))} cores available"]
    if memory:
        hardware.append(f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2.0**30:.0f} GiB RAM")
    hardware.append("load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    line = ", ".join(hardware)
    if device is not None and device.type == "cuda":
        import torch

        line += f"; GPU {torch.cuda.get_device_name(device)}"
    software = [f"Python {platform.python_version()}"]
    for library in libraries:
        software.append(f"{library.__name__} {library.__version__}")
        if library.__name__ == "torch":
            software.append(f"torch threads {library.get_num_threads()}")
    return line + "; " + ", ".join(software)


def model_state(params: Mapping[str, Any], optimizers: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter and its optimizer's state tensors (Adam's moments and step), cloned, keyed ``name`` and
    ``name.<state key>``: what :func:`identical` compares."""
    import torch

    state = {}
    for name, param in params.items():
        state[name] = param.detach().clone()
        for key, value in optimizers[name].state[param].items():
            if isinstance(value, torch.Tensor):
                state[f"{name}.{key}"] = value.clone()
    return state


def identical(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two model states (:func:`model_state`) hold the same tensors under the same keys, bit for bit."""
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
