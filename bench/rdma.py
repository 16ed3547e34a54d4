"""RDMA transport stack overhead: frames/s and MB/s through the loopback adapter.

What it measures: the Python cost of the whole RDMA stack (stream state
machine, fragmentation into 64 KiB buffers, credits, completion fd on the
event loop, reassembly) with the NIC replaced by the in-process loopback
adapter, so the number is an upper bound of what the software adds, not a
NIC figure. Baseline, measured in the same run: an asyncio socketpair
stream moving the same frames with a 4-byte length prefix (what the TCP
transport does on loopback). Each cell is the median of 5 runs; one sender
task, one receiver task, one event loop.

A last row says whether a real device is present (``verbs.probe()``); with
one, run tests/test_rdma_device.py for correctness, and a device benchmark
would go here.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

from artemis.protocol.rdma.loopback import LoopbackAdapter
from artemis.protocol.rdma.transport import RdmaTransport
from artemis.protocol.rdma.verbs import probe
from artemis.protocol.transport import FrameChannel

SIZES = [256, 4096, 64 * 1024, 1 << 20]
TOTAL_BYTES = 24 * 1024 * 1024  # per run and size, capped in frames below
MAX_FRAMES = 20_000
RUNS = 5


def _count(size: int) -> int:
    return max(20, min(MAX_FRAMES, TOTAL_BYTES // size))


async def _rdma_once(size: int, n: int) -> float:
    frame = bytes(size)
    done = asyncio.get_running_loop().create_future()

    async def sink(ch: FrameChannel) -> None:
        for _ in range(n):
            await ch.recv()
        done.set_result(time.perf_counter())

    server = RdmaTransport(LoopbackAdapter)
    listener = await server.listen("127.0.0.1:0", sink)
    ch = await RdmaTransport(LoopbackAdapter).connect(listener.address)
    t0 = time.perf_counter()
    for _ in range(n):
        await ch.send(frame)
    t1 = await done
    await ch.close()
    await listener.close()
    return t1 - t0


async def _socket_once(size: int, n: int) -> float:
    frame = len(bytes(size)).to_bytes(4, "big") + bytes(size)
    a, b = socket.socketpair()
    ra, wa = await asyncio.open_connection(sock=a)
    rb, wb = await asyncio.open_connection(sock=b)

    async def sink() -> float:
        for _ in range(n):
            k = int.from_bytes(await rb.readexactly(4), "big")
            await rb.readexactly(k)
        return time.perf_counter()

    task = asyncio.ensure_future(sink())
    t0 = time.perf_counter()
    for _ in range(n):
        wa.write(frame)
        await wa.drain()
    t1 = await task
    for w in (wa, wb):
        w.close()
    del ra
    return t1 - t0


def _median(fn: Callable[[int, int], Coroutine[Any, Any, float]], size: int, n: int) -> float:
    return statistics.median(asyncio.run(fn(size, n)) for _ in range(RUNS))


def measure() -> list[tuple[int, int, float, float]]:
    rows = []
    for size in SIZES:
        n = _count(size)
        rows.append((size, n, _median(_rdma_once, size, n), _median(_socket_once, size, n)))
    return rows


def _fmt_size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1024 else f"{n} B"


def main() -> int:
    print(
        f"RDMA stack over the loopback adapter vs asyncio socketpair stream (median of {RUNS} runs)"
    )
    print(
        f"{'frame':>8} {'frames':>7} {'rdma fr/s':>11} {'rdma MB/s':>10} "
        f"{'sock fr/s':>11} {'sock MB/s':>10} {'rdma/sock':>10}"
    )
    for size, n, t_rdma, t_sock in measure():
        fr_r, fr_s = n / t_rdma, n / t_sock
        print(
            f"{_fmt_size(size):>8} {n:>7} {fr_r:>11,.0f} {fr_r * size / 1e6:>10,.1f} "
            f"{fr_s:>11,.0f} {fr_s * size / 1e6:>10,.1f} {t_sock / t_rdma:>9.2f}x"
        )
    ok, why = probe()
    print(f"device: {'present (' + why + ')' if ok else 'not present (' + why + ')'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
