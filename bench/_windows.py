"""The benches' synthetic window summaries (bench.scoring, bench.baselines)."""

from __future__ import annotations

from typing import Any

import numpy as np
from artemis.protocol.records import RankWindow


def bench_window(r: int, window: int, gap: np.ndarray, **extra: Any) -> RankWindow:
    """Rank `r`'s 50-step window of a lockstep job of len(gap) ranks, 8 ranks a host: its
    compute gap gap[r] ms, its collectives waiting for the slowest rank (`extra`: more
    fields, e.g. its island)."""
    n = len(gap)
    return RankWindow(
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
        **extra,
    )
