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
import signal
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import (
    JOB,
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
        v = self.coord.value("straggler_last_window", job=JOB)
        scored = self.coord.value("straggler_windows_scored_total", job=JOB)
        return -1 if v is None or not scored else int(v)

    def wait_window(self, w: int, timeout: float = 30) -> None:
        wait_for(lambda: self.last_window() >= w, timeout, f"window {w} scored")

    def write_windows(self, n: int) -> None:
        """Writes windows 0 to n - 1; after each window w > 0, waits for window w - 1 to be
        scored, so the job stays about a window ahead of the coordinator."""
        for w in range(n):
            self.job.write_steps(W_STEPS)
            if w:
                self.wait_window(w - 1)

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
    job = frozenset({("job", JOB)})
    assert s[("straggler_windows_scored_total", job)] == n
    assert s[("straggler_missing_ranks", job)] == 0
    # Pace of every rank and the step time of the last window, from the inputs alone.
    pace = metric_by_label(s, "straggler_rank_pace_ratio", "rank")
    assert sorted(pace) == [str(r) for r in range(c.job.nranks)]
    for r in range(c.job.nranks):
        assert _close(pace[str(r)], c.job.pace(r)), (r, pace[str(r)], c.job.pace(r))
    assert _close(s[("straggler_step_ms", job)], c.job.step_ms())
    # One report of the slow rank per judged window (window 0 is never judged),
    # flagged after 3 suspect windows, with the numbers of what was fed.
    lines = c.rank_lines()
    assert [f["window"] for f in lines] == list(range(1, n))
    assert [f["state"] for f in lines] == ["suspect", "suspect", "flagged", "ongoing", "ongoing"]
    for f in lines:
        _check_rank_finding(f, c.job)
    assert {f["kind"] for f in c.coord.findings()} == {"rank"}


# ---------------------------------------------------------------- b. coordinator killed


def _windows(lines: list[dict[str, Any]]) -> collections.Counter[int]:
    return collections.Counter(f["window"] for f in lines)


def test_coordinator_sigkill_and_restart(cluster: Any) -> None:
    """Windows written while the coordinator is down are kept by the agents, resent to the
    new coordinator and scored exactly once, with every rank; windows the dead coordinator
    already scored stay in the findings file once; none is scored twice. What may be lost:
    windows the dead one had acked but not yet scored (its assembly state dies with it)."""
    c = cluster(deadline_s=8.0).start()
    n, kill_after = 14, 5
    c.write_windows(kill_after)
    c.job.write_steps(W_STEPS)  # window kill_after - 1 closes; it may be in flight at the kill
    assert c.coord.daemon is not None
    c.coord.daemon.kill()
    before = _windows(c.rank_lines())
    first_after = kill_after  # its records were all written after the kill
    c.job.write_steps(3 * W_STEPS)
    # The host of the slow rank reconnects first (the other agent is stopped meanwhile),
    # as happens whenever the back-off jitter orders them so.
    other = c.agents[1 - HOST_OF[SLOW]]
    os.kill(other.pid, signal.SIGSTOP)
    try:
        c.coord.start()
        c.wait_connected(1)
    finally:
        os.kill(other.pid, signal.SIGCONT)
    c.wait_connected(len(c.shm))
    c.job.write_steps((n - first_after - 3) * W_STEPS)
    c.job.finish()
    c.wait_window(n - 1, timeout=60)
    lines = c.rank_lines()
    seen = _windows(lines)
    assert all(v == 1 for v in seen.values()), f"windows reported twice: {seen}"
    assert all(before[w] == 1 for w in range(1, kill_after - 1)), before
    # Every window from the first one written after the kill is reported, with all ranks.
    lost = sorted(set(range(first_after, n)) - set(seen))
    assert not lost, f"windows written after the kill and never scored: {lost}"
    for f in lines:
        if f["window"] >= first_after:
            _check_rank_finding(f, c.job)
    assert not [f for f in c.coord.findings() if f["kind"] == "missing"]


# ---------------------------------------------------------------- c. agent killed


def test_agent_sigkill_and_restart_reads_rings_again_without_double_counting(cluster: Any) -> None:
    c = cluster(deadline_s=8.0).start()
    n, kill_after = 10, 4
    c.write_windows(kill_after)
    h = HOST_OF[SLOW]
    c.agents[h].kill()
    c.job.write_steps(W_STEPS)  # window kill_after - 1 closes while that agent is down
    c.start_agent(h)  # a new incarnation: reads every ring from its start again
    c.wait_connected(len(c.shm))
    c.job.write_steps((n - kill_after - 1) * W_STEPS)
    c.job.finish()
    c.wait_window(n - 1)
    # The restarted agent shipped windows 0.. again: the assembly dropped them as late.
    log = c.agents[h].log_records()
    found = [r["path"] for r in log if r.get("event") == "ring found"]
    assert len(found) == 2 * HOST_OF.count(h), found  # every ring opened again by the new one
    lines = c.rank_lines()
    assert [f["window"] for f in lines] == list(range(1, n)), _windows(lines)
    # One detector for the whole run: the flag persists across the agent's restart.
    assert [f["state"] for f in lines] == ["suspect", "suspect"] + ["flagged"] + ["ongoing"] * (
        n - 4
    )
    for f in lines:
        _check_rank_finding(f, c.job)
    assert c.coord.value("straggler_windows_scored_total", job=JOB) == n
    assert not [f for f in c.coord.findings() if f["kind"] != "rank"]


# ---------------------------------------------------------------- d. wrong secret


def test_wrong_secret_is_refused_while_a_good_agent_is_served(cluster: Any) -> None:
    c = cluster()
    c.coord.start()
    c.start_agent(0)
    bad = write_secret(c.tmp / "wrong-secret")
    c.start_agent(1, secret=bad)
    c.wait_connected(1)

    def refused() -> dict[str, float]:
        return metric_by_label(
            c.coord.samples(), "straggler_protocol_refused_peers_total", "reason"
        )

    # Every known reason is exported from the start at 0: wait for a count.
    reasons = wait_for(
        lambda: {k: v for k, v in refused().items() if v >= 1}, 30, "a refused peer counted"
    )
    bad_log = wait_for(
        lambda: [
            r
            for r in c.agents[1].log_records()
            if r.get("event") == "coordinator connection refused"
        ],
        30,
        "the agent with the wrong secret logs the refusal",
    )
    assert bad_log[0]["level"] == "error" and bad_log[0]["reason"] in reasons, bad_log[0]
    assert c.agents[1].alive()  # it retries with back-off, it does not die
    # The good agent's ranks are scored meanwhile (only them: the others never got in).
    n = 4
    c.job.write_steps(n * W_STEPS)
    c.job.finish()
    c.wait_window(n - 1)
    pace = metric_by_label(c.coord.samples(), "straggler_rank_pace_ratio", "rank")
    good = [r for r in range(c.job.nranks) if HOST_OF[r] == 0]
    assert sorted(pace) == [str(r) for r in good]
    for r in good:
        peers = sorted(c.job.gap_ms(q) for q in good if q != r)
        expect = c.job.gap_ms(r) / ((peers[0] + peers[1]) / 2)
        assert _close(pace[str(r)], expect), (r, pace[str(r)], expect)
    assert c.coord.value("straggler_agents_connected") == 1


# ---------------------------------------------------------------- e. corrupt ring


def test_corrupt_ring_is_named_and_skipped(cluster: Any) -> None:
    c = cluster()
    junk = c.shm[0] / f"e2ejob.{0xBAD:016x}.r9.ring"
    junk.write_bytes(bytes(range(256)) * 64)
    c.start()
    log = wait_for(
        lambda: [r for r in c.agents[0].log_records() if r.get("event") == "ring rejected"],
        30,
        "the agent rejects the corrupt ring",
    )
    assert log[0]["level"] == "error" and log[0]["path"] == str(junk), log[0]
    assert log[0]["error"]
    n = 4
    c.job.write_steps(n * W_STEPS)
    c.job.finish()
    c.wait_window(n - 1)
    pace = metric_by_label(c.coord.samples(), "straggler_rank_pace_ratio", "rank")
    assert sorted(pace) == [str(r) for r in range(c.job.nranks)]
    for r in range(c.job.nranks):
        assert _close(pace[str(r)], c.job.pace(r))
    assert [f["window"] for f in c.rank_lines()] == list(range(1, n))
    assert c.agents[0].alive()
    # Reported once, not at every scan.
    assert sum(r.get("event") == "ring rejected" for r in c.agents[0].log_records()) == 1
