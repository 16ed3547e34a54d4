"""`artemis loadtest` against a real coordinator process: 10k ranks, every window scored,
the injected straggler flagged and nobody else; and a job whose agents speak both
protocol minors (1.0 per-rank maps, 1.1 columns) scored from both."""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess
from pathlib import Path

import pytest
from artemis.protocol.auth import load_secret
from artemis.protocol.messages import PROTOCOL_VERSION
from artemis.sim.loadtest import LoadSpec, parse_straggler, run_load
from daemon_harness import BIN, Coordinator, wait_for, write_secret

pytestmark = pytest.mark.slow


def _scored(c: Coordinator, windows: int, job: str = "loadtest") -> bool:
    v = c.value("straggler_windows_scored_total", job=job)
    return v is not None and v >= windows


def test_loadtest_10k_ranks_every_window_scored_straggler_flagged(tmp_path: Path) -> None:
    secret = write_secret(tmp_path / "secret")
    c = Coordinator(tmp_path, secret, deadline_s=10.0).start()
    windows, straggler = 6, 4321
    try:
        r = subprocess.run(
            [
                str(BIN / "artemis"),
                "loadtest",
                "--coordinator", c.address,
                "--secret-file", str(secret),
                "--ranks", "10000",
                "--ranks-per-agent", "500",
                "--windows", str(windows),
                "--window-s", "0.2",
                "--straggler", f"{straggler}:1.4",
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr[-3000:]
        assert f"{10000 * windows}/{10000 * windows} summaries acknowledged" in r.stdout
        wait_for(lambda: _scored(c, windows), 60, f"{windows} windows scored")
        assert c.value("straggler_windows_scored_total", job="loadtest") == windows
        assert c.value("straggler_last_window", job="loadtest") == windows - 1
        found = c.findings()
        assert {f["rank"] for f in found} == {straggler}, collections.Counter(
            (f["kind"], f["rank"]) for f in found
        )
        states = [f["state"] for f in found if f["kind"] == "rank"]
        assert "flagged" in states
        assert all(f["window"] < windows for f in found)
        # No window was short of a rank (a missing-rank finding would say so).
        assert not [f for f in found if f["kind"] == "missing"]
    finally:
        assert c.daemon is not None
        c.daemon.stop()


def test_agents_of_both_protocol_minors_in_one_job_are_both_scored(tmp_path: Path) -> None:
    secret_path = write_secret(tmp_path / "secret")
    c = Coordinator(tmp_path, secret_path, deadline_s=10.0).start()
    windows = 6
    # Ranks 0-3 on a 1.0 agent (one map per rank), 4-7 on a 1.1 agent (columns);
    # a straggler on each, so each agent's summaries must have been scored.
    spec = LoadSpec(
        coordinator=c.address,
        secret=load_secret(secret_path),
        ranks=8,
        ranks_per_agent=4,
        windows=windows,
        window_s=0.05,
        stragglers={1: 1.35, 6: 1.3},
        job="mixed",
        old_agents=1,
    )
    try:
        res = asyncio.run(run_load(spec))
        assert res.ok and res.acked == 8 * windows
        wait_for(lambda: _scored(c, windows, "mixed"), 60, f"{windows} windows scored")
        assert c.value("straggler_windows_scored_total", job="mixed") == windows
        found = c.findings()
        flagged = {f["rank"] for f in found if f["state"] == "flagged"}
        assert flagged == {1, 6}, found
        assert {f["rank"] for f in found} == {1, 6}
        # The coordinator saw one agent of each minor.
        versions = {
            rec.get("agent"): rec.get("version")
            for rec in c.daemon.log_records()  # type: ignore[union-attr]
            if rec.get("event") == "agent connected" and "version" in rec
        }
        now = ".".join(map(str, PROTOCOL_VERSION))  # the newest minor, whichever it is
        assert sorted(versions.values()) == ["1.0", now], versions
    finally:
        assert c.daemon is not None
        c.daemon.stop()


def test_straggler_option_parsing() -> None:
    assert parse_straggler("17:1.3") == (17, 1.3)
    for bad in ("17", "x:1.3", "17:slow"):
        with pytest.raises(ValueError, match="RANK:SLOWDOWN"):
            parse_straggler(bad)
    with pytest.raises(ValueError, match="not in"):
        LoadSpec("h:1", b"s", ranks=4, ranks_per_agent=2, windows=1, stragglers={9: 1.2})


def test_loadtest_says_so_when_it_cannot_connect(tmp_path: Path) -> None:
    from daemon_harness import free_port

    secret = write_secret(tmp_path / "secret")
    r = subprocess.run(
        [
            str(BIN / "artemis"), "loadtest", "--coordinator", f"127.0.0.1:{free_port()}",
            "--secret-file", str(secret), "--ranks", "4", "--ranks-per-agent", "2",
            "--windows", "1", "--connect-timeout-s", "1",
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and "could connect" in r.stderr, r.stderr[-2000:]


def test_straggler_factor_must_slow_the_rank(tmp_path: Path) -> None:
    """SLOWDOWN is a step-time factor (1.3 = 30% slower), not a scenario file's fraction:
    0.25 once ran silently as a rank four times faster."""
    for bad in ("3:0.25", "3:1", "3:1.0", "3:-2", "3:inf", "3:nan"):
        with pytest.raises(ValueError, match=r"step-time factor > 1 \(1\.3 = 30% slower\)"):
            parse_straggler(bad)
    with pytest.raises(ValueError, match="step-time factor > 1"):
        LoadSpec("h:1", b"s", ranks=4, ranks_per_agent=2, windows=1, stragglers={1: 0.25})
    secret = write_secret(tmp_path / "secret")
    wide = dict(os.environ, COLUMNS="400")  # rich wraps the error box at the terminal's width
    r = subprocess.run(
        [
            str(BIN / "artemis"), "loadtest", "--coordinator", "127.0.0.1:1",
            "--secret-file", str(secret), "--ranks", "4", "--ranks-per-agent", "2",
            "--windows", "1", "--straggler", "1:0.25",
        ],
        capture_output=True, text=True, timeout=60, env=wide,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert "step-time factor > 1 (1.3 = 30%" in " ".join(r.stderr.split()), r.stderr
    h = subprocess.run(
        [str(BIN / "artemis"), "loadtest", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=wide,
    )
    assert "step-time factor" in " ".join(h.stdout.split()), h.stdout
