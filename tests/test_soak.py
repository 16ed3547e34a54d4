"""Soak: the coordinator's memory, open files and journal stay flat (docs/RELIABILITY.md
section 7; the harness: tests/soak.py).

Inside `make test`: `artemis loadtest` with 64 ranks, 300 windows 0.1 s apart
(half a minute). `make soak` sets ARTEMIS_SOAK=long: a virtual hour at 1k
ranks (720 windows of the loadtest's 4.9 s, one a second) and a real-time hour of a small
simulated job (ARTEMIS_SOAK_REAL_S shortens it), figures in
ARTEMIS_RELIABILITY_OUT (default out/soak).

The bounds are what a leak breaks, with room for the noise of a shared
machine: RSS in the second half of the run within 10% of the first half's
(the goal is 5%), no open file gained, the journal never above a few times
its compaction threshold (coordinator/journal.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from artemis.coordinator.journal import COMPACT_MIN_BYTES
from soak import loadtest_soak, realtime_soak

pytestmark = pytest.mark.slow

LONG = os.environ.get("ARTEMIS_SOAK") == "long"
OUT = Path(os.environ.get("ARTEMIS_RELIABILITY_OUT", "out/soak"))


def _check_flat(s: dict[str, Any], rss_pct: float = 10.0) -> None:
    assert s["rss_kb"]["growth_pct"] <= rss_pct, s["rss_kb"]
    # Connections come and go (agents, scrapes): no trend, not a constant.
    assert s["fds"]["second"] <= s["fds"]["first"] + 1, s["fds"]
    assert s["fds"]["max"] - s["fds"]["min"] <= 8, s["fds"]
    # Compacted at COMPACT_MIN_BYTES or 4x its live part: it never runs away.
    assert s["journal_b"]["max"] <= 4 * COMPACT_MIN_BYTES, s["journal_b"]


def _save(name: str, s: dict[str, Any], **extra: Any) -> None:
    if LONG or "ARTEMIS_RELIABILITY_OUT" in os.environ:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.json").write_text(json.dumps({**s, **extra}, indent=1) + "\n")


@pytest.mark.timeout(3600 if LONG else 600)
def test_soak_loadtest(tmp_path: Path) -> None:
    if LONG:
        s, counts = loadtest_soak(
            tmp_path, ranks=1000, per_agent=125, windows=720, window_s=1.0, every_s=2.0
        )
    else:
        s, counts = loadtest_soak(
            tmp_path, ranks=64, per_agent=16, windows=300, window_s=0.1, every_s=0.25
        )
    _save("soak-loadtest", s, counts=counts)
    print(json.dumps(s))
    _check_flat(s)


@pytest.mark.skipif(not LONG, reason="the real-time hour runs under `make soak` only")
@pytest.mark.timeout(2 * float(os.environ.get("ARTEMIS_SOAK_REAL_S", "3600")) + 600)
def test_soak_realtime_small_job(tmp_path: Path) -> None:
    seconds = float(os.environ.get("ARTEMIS_SOAK_REAL_S", "3600"))
    s, scored = realtime_soak(tmp_path, seconds, every_s=5.0)
    _save("soak-realtime", s, windows_scored=scored)
    print(json.dumps(s))
    _check_flat(s)
