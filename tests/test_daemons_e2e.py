"""The wire and the two daemons, end to end: real processes, real plugin, loopback TCP.

A lockstep "job" (tests/daemon_harness.py) writes rings through the real plugin
with compute times chosen here; one `artemis-agent run` per shm dir ("host")
reads them and ships window summaries to a real `artemis-coordinator serve`.
What the coordinator assembled is checked through what it publishes (the
findings JSONL and the Prometheus metrics) against numbers computed from the
inputs alone (daemon_harness.LockstepFeeder.gap_ms / step_ms / pace).
"""

from __future__ import annotations

import collections
import math
import os
from pathlib import Path
from typing import Any

import pytest

from daemon_harness import (
    Coordinator,
    Daemon,
    LockstepFeeder,
    metric_by_label,
    start_agent,
    wait_for,
    write_secret,
)

pytestmark = pytest.mark.slow

W_STEPS = 10  # steps per window
COLLS = 4  # collectives per step
SLOW = 4  # the straggler
# Compute before each of the 4 collectives of a step (ms), scaled per rank.
BASE_MS = (10.0, 5.0, 5.0, 5.0)
SPEED = (1.00, 1.01, 1.02, 0.99, 1.30, 1.015)
HOST_OF = (0, 0, 0, 1, 1, 1)


def _compute() -> list[list[float]]:
    return [[b * f for b in BASE_MS] for f in SPEED]


class Cluster:
    """Coordinator + one agent per host + the lockstep job, in one tmp dir."""

    def __init__(self, tmp: Path, plugin: Path, deadline_s: float = 2.0) -> None:
        self.tmp = tmp
        self.secret = write_secret(tmp / "secret")
        self.shm = [tmp / "shm" / f"h{h}" for h in range(max(HOST_OF) + 1)]
        # The rings exist before the agents start, so each agent's hello names its ranks.
        self.job = LockstepFeeder(plugin, [self.shm[h] for h in HOST_OF], _compute())
        self.coord = Coordinator(tmp, self.secret, deadline_s=deadline_s)
        self.agents: dict[int, Daemon] = {}

    def start(self) -> Cluster:
        self.coord.start()
        for h in range(len(self.shm)):
            self.start_agent(h)
        self.wait_connected(len(self.shm))
        return self

    def start_agent(self, h: int, secret: Path | None = None) -> Daemon:
        self.agents[h] = start_agent(
            self.tmp,
            self.coord.address,
            self.shm[h],
            secret or self.secret,
            f"h{h}",
            window_steps=W_STEPS,
            colls_per_step=COLLS,
        )
        return self.agents[h]

    def wait_connected(self, n: int) -> None:
        wait_for(
            lambda: self.coord.value("straggler_agents_connected") == n,
            30,
            f"{n} agents connected",
        )

    def last_window(self) -> int:
        v = self.coord.value("straggler_last_window")
        return -1 if v is None or not self.coord.value("straggler_windows_scored_total") else int(v)

    def wait_window(self, w: int, timeout: float = 30) -> None:
        wait_for(lambda: self.last_window() >= w, timeout, f"window {w} scored")

    def stop(self) -> None:
        for a in self.agents.values():
            a.stop()
        if self.coord.daemon is not None:
            self.coord.daemon.stop()

    def rank_lines(self) -> list[dict[str, Any]]:
        return [f for f in self.coord.findings() if f["kind"] == "rank"]


@pytest.fixture
def cluster(tmp_path: Path, plugin_lib: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for var in ("ARTEMIS_DISABLE", "ARTEMIS_DEVICE_TIMING", "ARTEMIS_RING_SLOTS", "ARTEMIS_CLOCK"):
        monkeypatch.delenv(var, raising=False)
    made: list[Cluster] = []

    def make(deadline_s: float = 2.0) -> Cluster:
        c = Cluster(tmp_path, plugin_lib, deadline_s)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def _check_rank_finding(f: dict[str, Any], job: LockstepFeeder) -> None:
    excess = job.gap_ms(SLOW) - job.peers_gap_ms(SLOW)
    assert f["rank"] == SLOW and f["ranks"] == [SLOW] and f["hosts"] == [f"h{HOST_OF[SLOW]}"]
    assert _close(f["ratio"], job.pace(SLOW), 1e-3), (f["ratio"], job.pace(SLOW))
    assert _close(f["excess_ms"], excess, 1e-3), (f["excess_ms"], excess)
    assert _close(f["loss_pct"], 100 * excess / job.step_ms(), 1e-3)
    assert _close(f["evidence"]["gap_ms"], job.gap_ms(SLOW))
    assert _close(f["evidence"]["peers_gap_ms"], job.peers_gap_ms(SLOW))
    assert f["evidence"]["peers"] == job.nranks - 1
    assert f["steps"] == [f["window"] * W_STEPS, (f["window"] + 1) * W_STEPS]


# ---------------------------------------------------------------- a. what was fed


def test_assembled_windows_equal_what_was_fed(cluster: Any) -> None:
    c = cluster().start()
    n = 6
    c.job.write_steps(n * W_STEPS)
    c.job.finish()
    c.wait_window(n - 1)
    s = c.coord.samples()
    assert s[("straggler_windows_scored_total", frozenset())] == n
    assert s[("straggler_missing_ranks", frozenset())] == 0
    # Pace of every rank and the step time of the last window, from the inputs alone.
    pace = metric_by_label(s, "straggler_rank_pace_ratio", "rank")
    assert sorted(pace) == [str(r) for r in range(c.job.nranks)]
    for r in range(c.job.nranks):
        assert _close(pace[str(r)], c.job.pace(r)), (r, pace[str(r)], c.job.pace(r))
    assert _close(s[("straggler_step_ms", frozenset())], c.job.step_ms())
    # One report of the slow rank per judged window (window 0 is never judged),
    # flagged after 3 suspect windows, with the numbers of what was fed.
    lines = c.rank_lines()
    assert [f["window"] for f in lines] == list(range(1, n))
    assert [f["state"] for f in lines] == ["suspect", "suspect", "flagged", "ongoing", "ongoing"]
    for f in lines:
        _check_rank_finding(f, c.job)
    assert {f["kind"] for f in c.coord.findings()} == {"rank"}
