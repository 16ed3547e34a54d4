"""Full disks (docs/RELIABILITY.md "3. Full disks"): the coordinator's outputs on tiny tmpfs
mounts that fill up, with a real coordinator, real agents and the real plugin.

The test re-runs itself under ``unshare -m --propagation private`` (root: this
machine's tests run as root; elsewhere it is skipped, saying why), so its tmpfs
mounts exist only in its own mount namespace and vanish with it. Inside, the
findings (with incidents.jsonl), the assembly journal (with the job state
files), the plans, the hang dumps and the SQLite store each sit on their own
tmpfs of a few hundred KiB. The job is tests/daemon_harness.py's lockstep job:
6 ranks on two agents, rank 4 slow, so every window after the flag has a
finding line.

1. Everything but the journal fills: windows are still scored (the metrics say
   so), the finding lines wait in memory (``straggler_write_backlog_lines``), one
   ERROR names each file, ``straggler_disk_full{file}`` is 1.
2. The journal fills too: the coordinator stops taking window batches (it does
   not ack them: ``straggler_windows_not_taken_total``), so nothing is scored
   from data it could not keep; it still serves its metrics.
3. The filler files are deleted: with no restart, the agents' resent windows are
   taken and scored, the backlog is written in order, and the findings file
   holds one line per window exactly as a run without the outage would.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import (
    JOB,
    Daemon,
    LockstepFeeder,
    free_port,
    metric,
    scrape,
    serve_argv,
    start_agent,
    wait_for,
    write_secret,
)

pytestmark = pytest.mark.slow

IN_NS = "ARTEMIS_TEST_IN_MOUNTNS"
W_STEPS, COLLS, SLOW = 10, 4, 4
BASE_MS = (10.0, 5.0, 5.0, 5.0)
SPEED = (1.00, 1.01, 1.02, 0.99, 1.30, 1.015)
HOST_OF = (0, 0, 0, 1, 1, 1)
DISKS = ("findings", "journal", "plans", "dumps", "store")


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root for tmpfs mounts in a private mount namespace"
    if shutil.which("unshare") is None:
        return "needs unshare(1) (util-linux)"
    return None


def test_full_disks_lose_nothing_acknowledged(tmp_path: Path, plugin_lib: Path) -> None:
    if os.environ.get(IN_NS) != "1":
        why = _why_not()
        if why:
            pytest.skip(why)
        figures = tmp_path / "figures.json"
        proc = subprocess.run(
            [
                "unshare",
                "-m",
                "--propagation",
                "private",
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                "--tb=short",
                f"{__file__}::test_full_disks_lose_nothing_acknowledged",
            ],
            env={**os.environ, IN_NS: "1", "ARTEMIS_TEST_FIGURES": str(figures)},
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]
        print(figures.read_text())
        return
    _inside(tmp_path, plugin_lib)


def _fill(d: Path) -> Path:
    """Write a filler file in `d` until its filesystem is full."""
    filler = d / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as e:
        assert e.errno == 28, e  # ENOSPC
        try:
            while True:
                os.write(fd, b"\0" * 512)
        except OSError:
            pass
    finally:
        os.close(fd)
    return filler


def _by_reason(samples: dict[Any, float], name: str, file: str) -> dict[str, float]:
    """{reason: value} of a `{file, reason}` series for one file."""
    out = {}
    for (n, labels), v in samples.items():
        d = dict(labels)
        if n == name and d.get("file") == file:
            out[d["reason"]] = v
    return out


def _rank_windows(path: Path) -> list[int]:
    out = []
    for line in path.read_text().splitlines():
        f = json.loads(line)  # a cut line would fail here
        if f["kind"] == "rank":
            assert f["rank"] == SLOW
            out.append(f["window"])
    return out


def _inside(tmp: Path, plugin: Path) -> None:
    dirs = {}
    for name in DISKS:
        d = dirs[name] = tmp / name
        d.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(d)], check=True
        )
    secret = write_secret(tmp / "secret")
    shm = [tmp / "shm" / f"h{h}" for h in range(2)]
    job = LockstepFeeder(
        plugin, [shm[h] for h in HOST_OF], [[b * f for b in BASE_MS] for f in SPEED]
    )
    findings = dirs["findings"] / "findings.jsonl"
    port, mport = free_port(), free_port()
    url = f"http://127.0.0.1:{mport}/metrics"
    cfg = tmp / "coordinator.toml"
    cfg.write_text(
        "\n".join(
            [
                # Long enough that no window is scored while one agent is refused: a
                # window waits for all its ranks (late summaries are another story).
                "assembly_deadline_s = 120.0",
                "assembly_grace_s = 0.5",
                "tick_s = 0.05",
                'metrics_addr = "127.0.0.1"',
                f"control_socket = {json.dumps(str(tmp / 'coordinator.sock'))}",
                f"journal = {json.dumps(str(dirs['journal'] / 'findings.assembly'))}",
                f"dumps_dir = {json.dumps(str(dirs['dumps']))}",
                f"store = {json.dumps('sqlite:///' + str(dirs['store'] / 'artemis.db'))}",
                "[detector]",
                "hang_floor_s = 600.0",
            ]
        )
        + "\n"
    )
    coord = Daemon(
        "coordinator",
        serve_argv(port, mport, findings, dirs["plans"] / "plans.jsonl", secret, cfg),
        tmp / "coordinator.log",  # the log is not on a full disk (journald's job)
    ).start()
    agents: list[Daemon] = []
    try:
        wait_for(lambda: metric(scrape(url), "straggler_detector_active") == 1, 30, "up")
        for h in range(2):
            agents.append(
                start_agent(
                    tmp,
                    f"127.0.0.1:{port}",
                    shm[h],
                    secret,
                    f"h{h}",
                    window_steps=W_STEPS,
                    colls_per_step=COLLS,
                )
            )
        wait_for(lambda: metric(scrape(url), "straggler_agents_connected") == 2, 30, "agents")

        def last() -> int:
            s = scrape(url)
            v = metric(s, "straggler_last_window", job=JOB)
            return (
                -1
                if v is None or not metric(s, "straggler_windows_scored_total", job=JOB)
                else int(v)
            )

        def write_window(w: int) -> None:
            job.write_steps(W_STEPS)
            if w:  # a window closes once the next one's first step arrived
                wait_for(lambda: last() >= w - 1, 30, f"window {w - 1} scored")

        for w in range(6):
            write_window(w)
        wait_for(lambda: _rank_windows(findings), 30, "the slow rank flagged")
        on_disk = len(findings.read_text().splitlines())

        # 1. Every output but the journal fills: scoring goes on, lines wait in memory.
        fillers = [_fill(dirs[n]) for n in DISKS if n != "journal"]
        # A full tmpfs still takes bytes into the findings file's last, part-used block:
        # a window's lines that fit there are written whole (seen: one ~1 KiB line).
        block = os.statvfs(dirs["findings"]).f_bsize
        room = -(-findings.stat().st_size // block) * block
        for w in range(6, 10):
            write_window(w)
        wait_for(lambda: last() >= 8, 30, "window 8 scored on full disks")
        s = scrape(url)
        assert metric(s, "straggler_disk_full", file="findings") == 1.0
        # Every window scored has one line (rank 4's): those not on disk wait in memory.
        waiting = metric(s, "straggler_last_window", job=JOB) - max(_rank_windows(findings))
        assert waiting >= 1, waiting
        assert metric(s, "straggler_write_backlog_lines", file="findings") == waiting
        errors = _by_reason(s, "straggler_write_errors_total", "findings")
        assert set(errors) == {"no_space"} and errors["no_space"] >= 1, errors
        wait_for(
            lambda: metric(scrape(url), "straggler_disk_full", file="store") == 1.0, 30, "store"
        )
        # Nothing cut (every line parses), nothing past the last block the file had.
        assert len(findings.read_text().splitlines()) >= on_disk and _rank_windows(findings)
        assert findings.stat().st_size <= room, (findings.stat().st_size, room)
        backlog_peak = metric(s, "straggler_write_backlog_lines", file="findings")

        # 2. The journal fills too: batches are refused (not acked), nothing is scored.
        fillers.append(_fill(dirs["journal"]))
        scored_before = last()
        for _ in range(10, 14):
            job.write_steps(W_STEPS)
        wait_for(
            lambda: (metric(scrape(url), "straggler_windows_not_taken_total") or 0) >= 2,
            30,
            "window batches refused while the journal is full",
        )
        s = scrape(url)
        assert s, "metrics not served while the disks are full"
        assert metric(s, "straggler_disk_full", file="journal") == 1.0
        assert last() == scored_before, "a window was scored from data the journal could not keep"
        refused = metric(s, "straggler_windows_not_taken_total")
        logs = coord.log_records()
        named = {r.get("file") for r in logs if r.get("event", "").startswith("write failed")}
        assert {"findings", "journal", "store"} <= named, named
        assert all(r.get("path") for r in logs if r.get("event", "").startswith("write failed"))

        # 3. Space returns: no restart, everything drains and is scored once.
        for f in fillers:
            f.unlink()
        job.write_steps(W_STEPS)  # closes window 13
        wait_for(lambda: last() >= 13, 90, "the refused windows resent and scored")
        wait_for(
            lambda: all(
                metric(scrape(url), "straggler_disk_full", file=n) == 0.0
                for n in ("findings", "journal", "store")
            ),
            30,
            "every output writable again",
        )
        s = scrape(url)
        assert metric(s, "straggler_write_backlog_lines", file="findings") == 0.0
        lost = {n: _by_reason(s, "straggler_write_lost_total", n) for n in DISKS}
        job.finish()
    finally:
        for a in agents:
            a.stop()
        coord.stop()
    windows = _rank_windows(findings)
    counts = collections.Counter(windows)
    first = min(windows)
    assert windows == sorted(windows), "finding lines out of window order"
    assert all(counts[w] == 1 for w in range(first, 14)), counts
    assert not [ln for ln in findings.read_text().splitlines() if '"kind": "missing"' in ln]
    assert not lost["findings"] and not lost["journal"], lost  # nothing given up there
    # The store gave up rows while full (counted), then wrote again: the last windows are in.
    from artemis.store.sqlite import SqliteStore

    st = SqliteStore(dirs["store"] / "artemis.db", readonly=True)
    try:
        rows = {r["window"] for r in st.job_windows(JOB)}
    finally:
        st.close()
    assert {12, 13} <= rows, sorted(rows)
    figures = {
        "windows": 14,
        "windows_refused_batches": refused,
        "findings_backlog_peak_lines": backlog_peak,
        "rank_lines": len(windows),
        "lost": {k: v for k, v in lost.items() if v},
    }
    print(json.dumps(figures))
    out = os.environ.get("ARTEMIS_TEST_FIGURES")
    if out:
        Path(out).write_text(json.dumps(figures, indent=1) + "\n")
