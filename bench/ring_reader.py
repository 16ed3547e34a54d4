"""Ring reader throughput: records/s of RingReader.poll on a full ring.

Baseline: a plain numpy copy of the same slot bytes (a contiguous memcpy, the
floor any reader pays).
Each row is the median of 7 runs; the ring is written once by the job-side
writer, and every run polls it with a fresh reader (opened untimed). The
"cpu" row is a ring of 128-byte CPU slots (slot_minor 1).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from artemis.ring.format import HEADER_SIZE, KIND_COLL
from artemis.ring.reader import RingReader
from artemis.ring.writer import BridgeRingWriter, RingWriter

GOAL = 5_000_000  # records/s


def _fill(d: Path, cap: int, cpu: bool) -> tuple[Path, int]:
    w = RingWriter(d, "bench", 0xBE7C, 0, 1, cap, cpu_times=cpu)
    for t in range(cap):
        w.record(kind=KIND_COLL, func=1, nbytes=t, start=t, end=t + 1, coll_seq=t, cpu_end_ns=t)
    w.close()
    return w.path, w.slot_size


def _median_s(fn: Callable[[RingReader], object], path: Path, runs: int) -> float:
    """Median time of ``fn(reader)``; each run gets a fresh reader, opened untimed."""
    times = []
    for _ in range(runs):
        with RingReader(path) as r:
            t0 = time.perf_counter()
            fn(r)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(cap: int, runs: int = 7, cpu: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as td:
        path, slot_size = _fill(Path(td), cap, cpu)
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        body = raw[HEADER_SIZE:]
        assert body.nbytes == cap * slot_size

        def baseline(_: RingReader) -> None:
            body.copy()

        def full_poll(r: RingReader) -> None:
            assert len(r.poll().done) == cap

        def last256(r: RingReader) -> None:
            assert len(r.last(256)) == 256

        base = _median_s(baseline, path, runs)
        poll = _median_s(full_poll, path, runs)
        tail = _median_s(last256, path, runs)
    return {"cap": cap, "base": base, "poll": poll, "last": tail, "cpu": cpu}


def incremental_poll_us(batch: int = 16, polls: int = 200, runs: int = 5) -> float:
    """Median cost of one steady-state poll that finds ``batch`` new records."""
    with tempfile.TemporaryDirectory() as td:
        w = BridgeRingWriter(Path(td), "bench", 0xBE7D, 0, 1, 8192)
        per_run = []
        with RingReader(w.path) as r:
            for _ in range(runs):
                spent = 0.0
                for _ in range(polls):
                    for _ in range(batch):
                        w.append(peer=1, nbytes=1, start=1, end=2, coll_seq=0)
                    t0 = time.perf_counter()
                    got = r.poll()
                    spent += time.perf_counter() - t0
                    assert len(got.done) == batch
                per_run.append(spent / polls)
        w.close()
    return statistics.median(per_run) * 1e6


def main() -> int:
    rows = [measure(cap) for cap in (4096, 65536, 1 << 20)]
    rows.append(measure(65536, cpu=True))
    print(f"{'records':>13} {'numpy copy':>14} {'poll':>14} {'poll/copy':>10} {'last(256) us':>13}")
    for r in rows:
        n = r["cap"]
        label = f"{int(n)}{' cpu' if r['cpu'] else ''}"
        print(
            f"{label:>13} {n / r['base'] / 1e6:>10.1f} M/s {n / r['poll'] / 1e6:>10.1f} M/s"
            f" {r['poll'] / r['base']:>9.1f}x {r['last'] * 1e6:>13.0f}"
        )
    print(f"steady-state poll finding 16 new records: {incremental_poll_us():.1f} us")
    mid = rows[1]
    rate = mid["cap"] / mid["poll"]
    print(f"goal >= {GOAL / 1e6:.0f} M records/s on a 64k ring: {rate / 1e6:.1f} M/s", end=" ")
    print("(met)" if rate >= GOAL else "(NOT met)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
