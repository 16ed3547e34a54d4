"""protocol/heap.py: with the threshold kept, a big block is still mapped on its own
after a bigger one was freed (glibc would otherwise have raised its threshold to the
freed block's size and served the next from the heap, where freed memory stays)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, json, sys
from artemis.protocol.heap import keep_heap_compact

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
kept = keep_heap_compact() if sys.argv[1] == "kept" else None
big = bytearray(8 << 20)  # mapped on its own (over any threshold)
del big  # freed: glibc's dynamic threshold rises to 8 MiB
before = libc.mallinfo2().hblks
block = bytearray(1 << 20)
print(json.dumps({"kept": kept, "mapped": libc.mallinfo2().hblks - before}))
"""


def _run(mode: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, check=True
    )
    got: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return got


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_big_block_is_mapped_on_its_own_after_a_bigger_one_was_freed() -> None:
    try:
        plain = _run("plain")
    except subprocess.CalledProcessError as e:
        pytest.skip(f"no glibc mallinfo2 here: {e.stderr[-200:]}")
    kept = _run("kept")
    assert plain["mapped"] == 0  # the cause: the next 1 MiB block came from the heap
    assert kept["kept"] is True and kept["mapped"] == 1


def test_the_environment_setting_stands() -> None:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    code = "from artemis.protocol.heap import keep_heap_compact; print(keep_heap_compact())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "False", out.stderr


RELEASE = r"""
import json
from artemis.protocol.heap import keep_heap_compact, release_free

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

keep_heap_compact()
# 48 MiB of 16 KiB blocks from the heap (under the mmap threshold), filled so their
# pages are resident; every 64th kept, so the heap's top cannot simply shrink.
blocks = [bytearray(b"x" * (16 << 10)) for _ in range(3072)]
kept = blocks[::64]
del blocks
before = rss()
saw = release_free()
after = rss()
print(json.dumps({"free": saw, "released": before - after, "kept": len(kept)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_pages_go_back_once_they_add_up() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", RELEASE], capture_output=True, text=True, env=env, check=True
    )
    got = json.loads(out.stdout.splitlines()[-1])
    if got["free"] == 0:
        pytest.skip("no glibc mallinfo2 here")
    assert got["free"] >= 40 << 20  # the freed blocks, left in the middle of the heap
    assert got["released"] >= 32 << 20, got  # ...and their pages handed back
