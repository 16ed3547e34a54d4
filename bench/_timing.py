"""The median wall time of a call, the benches' usual figure."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_s(fn: Callable[[], object], runs: int, *, warm: bool = False) -> float:
    """Median seconds of `runs` calls of `fn` (`warm`: one untimed call first, for caches
    and lazy imports)."""
    if warm:
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
