"""Every CUDA kernel compiles with nvcc for sm_89 (RTX 4090) and sm_90 (H200), so a broken .cu fails CI without a GPU.

Every ``cuda/csrc/*.cu`` is compiled (``-c``, both architectures in one nvcc call on two threads, the four files in
one translation unit: the host side is parsed once) against this torch's headers with the flags the JIT build uses.
nvcc is found through ``CUDA_HOME``, then ``/usr/local/cuda``, then ``PATH``; without it the test skips with the
reason, except under ``CI`` (which has nvcc), where a missing nvcc fails. Timing (CUDA 13.0, nvcc on the shared
2-core development machine at a load of about 15): the four files one by one for sm_89 + sm_90 took 693 s wall; in
one translation unit 102 s wall, 38 s of CPU; with ``--threads 2`` (the architectures' device code compiled side by
side) 35 s wall against 50 s at a low load. Most of it is parsing torch's headers on the host side.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from torch.utils.cpp_extension import include_paths

from odin_nerfstudio.kernels._backend import CSRC, CUDA_FLAGS
from tests.conftest import missing

ARCHS = ("89", "90")


def find_nvcc() -> Path | None:
    """nvcc from CUDA_HOME, /usr/local/cuda or PATH (the PATH one may be a wrapper script), or None."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return Path(home) / "bin" / "nvcc"
    found = shutil.which("nvcc")
    return Path(found) if found else None


def nvcc_command(nvcc: Path, source: Path, output: Path) -> list[str]:
    """The compile-only command for ``source``: sm_89 and sm_90 code (one thread each), torch's and CUDA's include
    folders."""
    cuda_include = nvcc.resolve().parent.parent / "include"
    includes = [f"-I{p}" for p in include_paths()] + [f"-I{cuda_include}"]
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(__import__('torch')._C._GLIBCXX_USE_CXX11_ABI)}"
    flags = [*CUDA_FLAGS, "-Xcompiler", "-fPIC", abi, *gencode, *includes]
    return [str(nvcc), "-c", str(source), "-o", str(output), "--threads", "2", *flags]


def test_every_cu_compiles_for_sm89_and_sm90(tmp_path: Path) -> None:
    nvcc = find_nvcc()
    if nvcc is None:
        missing("nvcc not found (CUDA_HOME, /usr/local/cuda, PATH): the CUDA kernels were not compiled")
    sources = sorted(CSRC.glob("*.cu"))
    assert len(sources) == 4, f"expected the four kernels' .cu files, found {[s.name for s in sources]}"
    # One translation unit that includes every kernel: torch's headers are parsed once instead of once per file
    # (about 7x less time). A header a file forgets to include could hide behind an earlier file here; the JIT
    # build of the extension (scripts/gpu_check.sh) compiles the files one by one.
    unity = tmp_path / "odin_kernels_unity.cu"
    unity.write_text("".join(f'#include "{source}"\n' for source in sources))
    start = time.perf_counter()
    result = subprocess.run(nvcc_command(nvcc, unity, tmp_path / "unity.o"), capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, "nvcc rejected the kernels:\n" + result.stderr[-6000:]
    assert (tmp_path / "unity.o").stat().st_size > 0
    print(f"nvcc {', '.join(s.name for s in sources)} for sm_{'+sm_'.join(ARCHS)}: {elapsed:.1f} s")
