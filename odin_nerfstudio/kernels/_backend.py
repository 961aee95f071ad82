"""Build and load Odin's compiled kernels (the ``torch.ops.odin`` ops of ``cuda/csrc``), or say why not.

Like gsplat's ``cuda/_backend.py``: the sources are JIT-built once by ``torch.utils.cpp_extension.load`` into a
cache folder (``$ODIN_KERNELS_CACHE``, default ``~/.cache/odin_nerfstudio/kernels``), with a one-time message
while the build runs; later imports only load the library. Two flavours:

- ``cpu``: the ``.cpp`` files (schemas and CPU implementations); needs a C++17/20 compiler only. Built by
  ``python -m odin_nerfstudio.kernels.build`` in ``scripts/setup.sh``.
- ``cuda``: the same plus every ``.cu`` (CPU and CUDA implementations in one library); built when CUDA is
  available and nvcc is found (``CUDA_HOME``), for ``TORCH_CUDA_ARCH_LIST`` (default: the visible GPU's arch).

Loading registers the ops with the dispatcher; :func:`load` returns the flavour loaded, or None after a warning
(no compiler, a failed build) so that :mod:`odin_nerfstudio.kernels.ops` falls back to the pure-torch reference.
``ODIN_KERNELS=reference`` skips loading altogether.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import warnings
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
    from torch.utils.cpp_extension import CUDA_HOME

    return "cuda" if torch.cuda.is_available() and CUDA_HOME is not None else "cpu"


def build(flavour: str, verbose: bool = False) -> Path:
    """JIT-build (or reuse the cached build of) ``flavour`` and load it; returns the build folder. Raises on error."""
    from torch.utils.cpp_extension import load as load_extension

    name = library_name(flavour)
    folder = cache_dir() / name
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / f"{name}.so").exists():
        print(f"odin kernels: building the {flavour} ops into {folder} (once; about a minute)...", file=sys.stderr)
    load_extension(
        name=name,
        sources=[str(s) for s in sources(flavour)],
        extra_cflags=CXX_FLAGS,
        extra_cuda_cflags=CUDA_FLAGS,
        build_directory=str(folder),
        is_python_module=False,
        verbose=verbose,
    )
    return folder


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
