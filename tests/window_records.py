"""One rank's window summary for tests that care about a few of its fields.

The rest are a quiet window: job `j`, communicator `c`, host `h`, one rank, 50 steps,
100 collectives, nothing lost, on the device clock. Each test names what it varies, so
the reader sees the input that matters instead of seventeen fields spelled out again.
"""

from __future__ import annotations

from typing import Any

from artemis.protocol.records import RankWindow

QUIET: dict[str, Any] = {
    "job": "j",
    "comm": "c",
    "nranks": 1,
    "host": "h",
    "coll_lo": 0,
    "coll_hi": 0,
    "gap_ms": 100.0,
    "coll_ms": 10.0,
    "step_ms": 110.0,
    "collectives": 100,
    "bytes": 0,
    "lost": 0,
    "clock": "device",
}


def window_record(rank: int = 0, window: int = 0, *, steps: int = 50, **fields: Any) -> RankWindow:
    """Rank `rank`'s window `window` of `steps` steps; `fields` override any other field."""
    at = {"step_lo": window * steps, "step_hi": (window + 1) * steps}
    return RankWindow(rank=rank, window=window, **{**QUIET, **at, **fields})
