"""The C heap of a server process: big blocks freed go back to the kernel.

glibc's malloc serves a block of at least M_MMAP_THRESHOLD bytes (128 KiB) with a
mapping of its own, unmapped when freed. But it raises that threshold to the size of
every such block freed (up to 32 MiB): after the first window, a coordinator's big
blocks (a 100k-rank window's columns, 800 KB each; its frames) come from the heap
instead, where what is freed stays in the process, scattered between live blocks. The
coordinator's RSS then holds its largest window's worth of freed memory for good (with
100k-rank windows about 0.6-0.9 KB a rank, `bench/README.md` "Coordinator ingest").
Setting the threshold explicitly turns the adjustment off (mallopt(3)).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import structlog

log = structlog.get_logger("artemis.protocol.heap")

MMAP_THRESHOLD = 128 * 1024  # glibc's own default, kept from now on
_M_MMAP_THRESHOLD = -3  # malloc.h


def keep_heap_compact(threshold: int = MMAP_THRESHOLD) -> bool:
    """Blocks of `threshold` bytes or more get mappings of their own, whatever was freed
    before. False (nothing changed) without glibc's mallopt, or when the environment
    already sets MALLOC_MMAP_THRESHOLD_ (the operator's choice stands)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.warning("mallopt refused the mmap threshold", threshold=threshold)
    return ok
