"""The C heap of a server process: big blocks freed go back to the kernel.

glibc's malloc serves a block of at least M_MMAP_THRESHOLD bytes (128 KiB) with a
mapping of its own, unmapped when freed. But it raises that threshold to the size of
every such block freed (up to 32 MiB): after the first window, a coordinator's big
blocks (a 100k-rank window's columns, 800 KB each; its frames) come from the heap
instead, where what is freed stays in the process, scattered between live blocks. The
coordinator's RSS then holds its largest window's worth of freed memory for good (with
100k-rank windows about 0.6-0.9 KB a rank, `bench/README.md` "Coordinator ingest").
Setting the threshold explicitly turns the adjustment off (mallopt(3)).

Smaller blocks (a 64-rank agent's frames, 23 KB; decoded columns) still come from the
heap, and a burst (every agent's batch of a window at once) leaves its freed blocks in
the middle of it. `release_free` hands the free pages of the heap back (malloc_trim(3))
once they add up to `RELEASE_MIN` bytes: the coordinator calls it on its tick, so the
RSS follows what is live rather than the largest burst so far.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

import structlog

log = structlog.get_logger("artemis.protocol.heap")

MMAP_THRESHOLD = 128 * 1024  # glibc's own default, kept from now on
RELEASE_MIN = 8 << 20  # free bytes in the heap that make a malloc_trim worth its walk
_M_MMAP_THRESHOLD = -3  # malloc.h


class _Info(ctypes.Structure):
    """glibc's struct mallinfo2 (every field a size_t)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()


def keep_heap_compact(threshold: int = MMAP_THRESHOLD) -> bool:
    """Blocks of `threshold` bytes or more get mappings of their own, whatever was freed
    before. False (nothing changed) without glibc's mallopt, or when the environment
    already sets MALLOC_MMAP_THRESHOLD_ (the operator's choice stands)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.warning("mallopt refused the mmap threshold", threshold=threshold)
    return ok


def release_free(at_least: int = RELEASE_MIN) -> int:
    """Hand the heap's free pages back to the kernel when its free bytes reach
    `at_least`; returns the free bytes it saw (0 without glibc's mallinfo2)."""
    info = getattr(_LIBC, "mallinfo2", None)
    trim = getattr(_LIBC, "malloc_trim", None)
    if info is None or trim is None:
        return 0
    info.restype = _Info
    free = int(info().fordblks)
    if free >= at_least:
        trim.argtypes = (ctypes.c_size_t,)
        trim(0)
    return free
