"""Build and load Odin's compiled kernels (the ``torch.ops.odin`` ops of ``cuda/csrc``), or say why not.

Like gsplat's ``cuda/_backend.py``: the sources are JIT-built once by ``torch.utils.cpp_extension.load`` into a
cache folder (``$ODIN_KERNELS_CACHE``, default ``~/.cache/odin_nerfstudio/kernels``), with one line on stderr
saying so and how long it took; later processes only load the library. Built once per install, whatever the PATH:

- a finished build leaves a stamp beside the library (the compiler flags and the library's size and mtime), and a
  process that finds the stamp matching loads the library directly, without asking torch's builder (which runs
  ninja, and ninja rebuilds everything when its log was written by another ninja version: the system's 1.11 from a
  script that runs ``.venv/bin/python`` without ``.venv/bin`` on PATH, the venv's 1.13 from an activated shell);
- when the builder does run, the interpreter's own ``bin`` folder comes first on its PATH, so the same ninja (the
  venv's) writes the build's log whichever shell started the process.

Two flavours:

- ``cpu``: the ``.cpp`` files (schemas and CPU implementations); needs a C++20 compiler only (``std::atomic_ref``).
  Built by ``python -m odin_nerfstudio.kernels.build`` in ``scripts/setup.sh``.
- ``cuda``: the same plus every ``.cu`` (CPU and CUDA implementations in one library); built when CUDA is
  available and nvcc is found (``CUDA_HOME``), for ``TORCH_CUDA_ARCH_LIST`` (default: the visible GPU's arch).

Loading registers the ops with the dispatcher; :func:`load` returns the flavour loaded, or None after a warning
(no compiler, a failed build) so that :mod:`odin_nerfstudio.kernels.ops` falls back to the pure-torch reference.
``ODIN_KERNELS=reference`` skips loading altogether.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parents[2] / "cuda" / "csrc"
"""Where the kernel sources live (top-level ``cuda/csrc`` of the checkout; the package is installed editable)."""
CXX_FLAGS = ["-O3", "-std=c++20", "-ffp-contract=off", "-march=native"]
"""-ffp-contract=off: no FMA the reference does not use (bit equality); C++20 for std::atomic_ref."""
CUDA_FLAGS = ["-O3", "-std=c++20", "--expt-relaxed-constexpr"]

_loaded: dict[str, str | None] = {}


def cache_dir() -> Path:
    """The folder builds are cached in, one sub-folder per flavour, torch version and Python version."""
    return Path(os.environ.get("ODIN_KERNELS_CACHE", Path.home() / ".cache" / "odin_nerfstudio" / "kernels"))


def sources(flavour: str) -> list[Path]:
    """The source files of a flavour (``cpu``: every .cpp; ``cuda``: every .cpp and .cu), sorted."""
    files = sorted(CSRC.glob("*.cpp"))
    return files + sorted(CSRC.glob("*.cu")) if flavour == "cuda" else files


def library_name(flavour: str) -> str:
    """The extension's name: flavour, torch and Python versions, and a digest of every file in ``cuda/csrc`` and of
    its path (torch's JIT only hashes the listed sources, so an edited header alone would reuse a stale build; and
    its ninja file names the sources by path, so two checkouts sharing one build folder would rebuild it in turn,
    a minute each time a process of the other one starts)."""
    torch_version = torch.__version__.split("+")[0].replace(".", "_")
    digest = hashlib.sha256(str(CSRC).encode())
    for path in sorted(CSRC.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    python = f"{sys.version_info.major}{sys.version_info.minor}"
    return f"odin_kernels_{flavour}_t{torch_version}_py{python}_{digest.hexdigest()[:10]}"


def wanted_flavour() -> str:
    """``cuda`` when a GPU and nvcc are both there, else ``cpu``."""
    if not torch.cuda.is_available():
        return "cpu"  # without importing torch's builder, which warns that it finds no CUDA runtime
    from torch.utils.cpp_extension import CUDA_HOME

    return "cuda" if CUDA_HOME is not None else "cpu"


def build_identity(flavour: str) -> dict:
    """What the library's name does not hold but its build depends on: the flags, the compiler named by ``CXX``
    and, for CUDA, the architectures (sources, their path, torch and Python versions are in :func:`library_name`)."""
    identity = {"cxx_flags": CXX_FLAGS, "cxx": os.environ.get("CXX", "")}
    if flavour == "cuda":
        identity |= {"cuda_flags": CUDA_FLAGS, "arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST", "")}
    return identity


def _library(flavour: str) -> tuple[str, Path, Path]:
    """The extension's name, its build folder and the library file in it."""
    name = library_name(flavour)
    folder = cache_dir() / name
    return name, folder, folder / f"{name}.so"


def _stamp(library: Path) -> Path:
    return library.with_name(library.name + ".built")


def _file_state(path: Path) -> list[int] | None:
    """Size and modification time (ns) of a file, None when absent."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return [stat.st_size, stat.st_mtime_ns]


def is_built(flavour: str) -> bool:
    """Whether the cached library of ``flavour`` is a finished build of these sources with these flags (its stamp
    matches), so that it is loaded without running torch's builder (and ninja) at all."""
    _, _, library = _library(flavour)
    try:
        stamp = json.loads(_stamp(library).read_text())
    except (OSError, ValueError):
        return False
    return stamp == {"identity": build_identity(flavour), "library": _file_state(library)}


@contextlib.contextmanager
def interpreter_tools_first() -> Iterator[None]:
    """PATH with the running interpreter's ``bin`` folder first (the venv's ``ninja``), restored afterwards.

    torch's builder runs ``ninja`` from PATH; scripts run ``.venv/bin/python`` without ``.venv/bin`` on PATH, an
    activated shell has it first, and two ninja versions do not read each other's log (a full rebuild at each
    switch). The interpreter's folder is not resolved: a venv's ``bin/python`` is a link to the base Python."""
    here = str(Path(sys.executable).parent)
    saved = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join([here, *(saved.split(os.pathsep) if saved else [])])
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = saved


def build(flavour: str, verbose: bool = False) -> Path:
    """Load ``flavour``'s library, JIT-building it first unless a finished build of it is cached; returns the build
    folder. A build (and only a build) prints one line on stderr: what is built, where, and how long it took.
    Raises on error."""
    name, folder, library = _library(flavour)
    if is_built(flavour):
        torch.ops.load_library(str(library))
        return folder
    from torch.utils.cpp_extension import load as load_extension

    folder.mkdir(parents=True, exist_ok=True)
    _stamp(library).unlink(missing_ok=True)
    before = _file_state(library)
    start = time.perf_counter()
    if before is None:
        print(f"odin kernels: building the {flavour} ops into {folder} (once per install, about a minute)...",
              end="", file=sys.stderr, flush=True)
    try:
        with interpreter_tools_first():
            load_extension(
                name=name,
                sources=[str(s) for s in sources(flavour)],
                extra_cflags=CXX_FLAGS,
                extra_cuda_cflags=CUDA_FLAGS,
                build_directory=str(folder),
                is_python_module=False,
                verbose=verbose,
            )
    except BaseException:
        if before is None:
            print(" failed", file=sys.stderr, flush=True)
        raise
    seconds = time.perf_counter() - start
    if before is None:
        print(f" built in {seconds:.0f} s", file=sys.stderr, flush=True)
    elif _file_state(library) != before:
        print(f"odin kernels: rebuilt the {flavour} ops in {folder} ({seconds:.0f} s)", file=sys.stderr, flush=True)
    mark_built(flavour)
    return folder


def mark_built(flavour: str) -> None:
    """Stamp the cached library of ``flavour`` as a finished build of these sources with these flags."""
    _, _, library = _library(flavour)
    stamp = {"identity": build_identity(flavour), "library": _file_state(library)}
    _stamp(library).write_text(json.dumps(stamp))


def load() -> str | None:
    """The flavour of compiled ops now registered (``cpu`` or ``cuda``), building it if needed; None if none.

    Tried once per process. ``ODIN_KERNELS=reference`` returns None without building.
    """
    if "flavour" in _loaded:
        return _loaded["flavour"]
    flavour = None
    if os.environ.get("ODIN_KERNELS", "").lower() == "reference":
        pass
    elif shutil.which(os.environ.get("CXX", "c++")) is None:
        warnings.warn("odin kernels: no C++ compiler found; using the pure-torch reference ops", stacklevel=2)
    else:
        wanted = wanted_flavour()
        try:
            build(wanted)
            flavour = wanted
        except Exception as error:  # a broken toolchain must not stop training: the reference is exact
            message = f"odin kernels: building the {wanted} ops failed ({error}); using the reference"
            warnings.warn(message, stacklevel=2)
    _loaded["flavour"] = flavour
    return flavour
