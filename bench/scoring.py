"""Benchmark: scoring one window (1k / 16k / 100k ranks) and Detector.score_window.

Run with `python -m bench.scoring` (or through `python -m bench`). Prints the
median of several runs and the peak memory traced while scoring.
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
from artemis.coordinator.detector import Detector
from artemis.coordinator.scoring import score
from artemis.coordinator.settings import Settings
from artemis.protocol.records import RankWindow

RUNS = 7


def _median_s(fn: Callable[[], object], runs: int = RUNS) -> float:
    fn()  # warm caches and imports
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _peak_mib(fn: Callable[[], object]) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def _records(n: int, window: int, rng: np.random.Generator) -> list[RankWindow]:
    gap = 100.0 * (1 + 0.01 * rng.standard_normal(n))
    gap[n // 3] *= 1.2
    isl = ["nvidia" if r < n // 2 else "amd" for r in range(n)]
    return [
        RankWindow(
            job="bench",
            comm="0" * 16,
            rank=r,
            nranks=n,
            host=f"h{r // 8}",
            window=window,
            step_lo=window * 50,
            step_hi=window * 50 + 50,
            coll_lo=0,
            coll_hi=0,
            gap_ms=float(gap[r]),
            coll_ms=10.0 + float(gap.max() - gap[r]),
            step_ms=float(gap.max()) + 10.0,
            collectives=200,
            bytes=0,
            lost=0,
            clock="device",
            island=isl[r],
        )
        for r in range(n)
    ]


def main() -> None:
    rng = np.random.default_rng(0)
    print("scoring.score: one window, leave-one-out ratio + robust z, 2 islands")
    print(f"{'ranks':>8} {'median ms':>10} {'peak MiB':>9} {'goal':>10}")
    for n in (1_000, 16_000, 100_000):
        gap = 100.0 * (1 + 0.01 * rng.standard_normal(n))
        gid = (np.arange(n) >= n // 2).astype(np.int64)
        t = _median_s(lambda g=gap, i=gid: score(g, i))  # type: ignore[misc]
        mem = _peak_mib(lambda g=gap, i=gid: score(g, i))  # type: ignore[misc]
        goal = "<= 100 ms" if n == 100_000 else ""
        print(f"{n:>8} {t * 1e3:>10.2f} {mem:>9.1f} {goal:>10}")

    print()
    print("Detector.score_window: end to end (records -> findings), after warm-up")
    print(f"{'ranks':>8} {'median ms':>10} {'peak MiB':>9}")
    for n in (1_000, 16_000):
        det = Detector(Settings(), "bench", n)
        windows = [_records(n, w, rng) for w in range(8)]
        for w in range(7):
            det.score_window(w, windows[w])
        last = windows[7]
        t = _median_s(lambda d=det, x=last: d.score_window(7, x), runs=5)  # type: ignore[misc]
        mem = _peak_mib(lambda d=det, x=last: d.score_window(7, x))  # type: ignore[misc]
        print(f"{n:>8} {t * 1e3:>10.2f} {mem:>9.1f}")


if __name__ == "__main__":
    main()
