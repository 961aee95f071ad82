"""Keep freed CPU memory in the process heap: what torch's caching allocator does on CUDA, for glibc's malloc.

Every task allocates its leaves, their gradients and the renderer's intermediates afresh and frees them when it is
staged. glibc returns large freed blocks to the kernel (``munmap`` above its mmap threshold, a trim of the heap's
top above its trim threshold), so the next task maps them again and takes a page fault per 4 KiB page it touches:
measured on the 300 m street (bench_runtime, one thread), freeing a task's leaves took 1.5 ms and render + backward
ran about 25% slower than with the heap kept. :func:`keep_freed_memory` raises both thresholds, so freed blocks
stay in the heap for the next task; the heap's size then follows the peak of a task, as on CUDA.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
"""glibc's ``mallopt`` parameters (malloc.h)."""

MMAP_THRESHOLD = 32 << 20
"""Blocks below it come from the heap (glibc's ceiling for the threshold on 64-bit: larger blocks stay mmapped)."""
TRIM_THRESHOLD = 1 << 30
"""Free bytes at the heap's top before glibc gives them back to the kernel."""
TOP_PAD = 64 << 20
"""Extra bytes glibc asks for whenever the heap grows (fewer, larger ``brk`` calls)."""


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's thresholds (:data:`MMAP_THRESHOLD`, :data:`TRIM_THRESHOLD`, :data:`TOP_PAD`) once per process;
    returns whether they were set (False off glibc: macOS, musl, where the allocator is left as it is)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return False
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD))
    return all(libc.mallopt(parameter, value) == 1 for parameter, value in settings)
