"""Soak (docs/RELIABILITY.md section 7): the coordinator's footprint sampled over a long run.

`Sampler` reads, every `every_s`, the coordinator process's RSS and open file
descriptors (/proc) and the sizes of its assembly journal (with the saved job
states), findings file and incident store. `summary` drops the warm-up and
compares the mean of the second half of what is left with the first half's:
a leak shows as a second half larger than the first, whatever the noise
within each.

Two loads: `artemis loadtest` (synthetic agents over the real protocol, as
many ranks as wanted, windows as fast as the coordinator takes them: the
virtual hour at 1k ranks), and a small simulated job in real time
(sim/scenarios/reliability/soak_small.toml through sim/cluster.py).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
METRICS = ("rss_kb", "fds", "journal_b", "findings_b", "store_b")


def _size(p: Path) -> int:
    try:
        if p.is_dir():
            return sum(q.stat().st_size for q in p.iterdir() if q.is_file())
        return p.stat().st_size
    except FileNotFoundError:
        return 0


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@dataclass
class Sampler:
    findings: Path
    every_s: float = 0.5
    pid: int | None = None  # set when the coordinator is up (and again after a restart)
    samples: list[dict[str, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def sample(self) -> dict[str, float] | None:
        if self.pid is None:
            return None
        journal = self.findings.with_suffix(".assembly")
        db = self.findings.parent / "artemis.db"
        try:
            return {
                "t": time.monotonic(),
                "rss_kb": _rss_kb(self.pid),
                "fds": len(os.listdir(f"/proc/{self.pid}/fd")),
                "journal_b": _size(journal) + _size(journal.with_name(journal.name + ".jobs")),
                "findings_b": _size(self.findings),
                "store_b": sum(_size(db.with_name(db.name + x)) for x in ("", "-wal", "-shm")),
            }
        except (FileNotFoundError, ProcessLookupError):
            return None  # the process is gone

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            s = self.sample()
            if s is not None:
                self.samples.append(s)


def summary(samples: list[dict[str, float]], warmup: float = 0.25) -> dict[str, Any]:
    """Per metric: the first and second half's mean after the warm-up, the growth between
    them (%), and the min and max after the warm-up; plus how many samples and seconds."""
    keep = samples[int(len(samples) * warmup) :]
    if len(keep) < 4:
        raise ValueError(f"{len(samples)} samples: too few to judge")
    half = len(keep) // 2
    a, b = keep[:half], keep[half:]
    out: dict[str, Any] = {
        "samples": len(samples),
        "seconds": round(samples[-1]["t"] - samples[0]["t"], 1),
    }
    for m in METRICS:
        m1 = statistics.fmean(x[m] for x in a)
        m2 = statistics.fmean(x[m] for x in b)
        out[m] = {
            "first": round(m1, 1),
            "second": round(m2, 1),
            "growth_pct": round(100.0 * (m2 - m1) / m1, 2) if m1 else 0.0,
            "min": min(x[m] for x in keep),
            "max": max(x[m] for x in keep),
        }
    return out


def loadtest_soak(
    tmp: Path, *, ranks: int, per_agent: int, windows: int, window_s: float, every_s: float
) -> tuple[dict[str, Any], dict[str, float | None]]:
    """A real coordinator under `artemis loadtest` for `windows` windows; returns the
    summary and the coordinator's scored/late counts at the end."""
    from daemon_harness import BIN, Coordinator, wait_for, write_secret

    secret = write_secret(tmp / "secret")
    c = Coordinator(tmp, secret, deadline_s=10.0).start()
    assert c.daemon is not None
    s = Sampler(c.jsonl, every_s=every_s, pid=c.daemon.pid).start()
    try:
        r = subprocess.run(
            [
                str(BIN / "artemis"), "loadtest",
                "--coordinator", c.address,
                "--secret-file", str(secret),
                "--ranks", str(ranks),
                "--ranks-per-agent", str(per_agent),
                "--windows", str(windows),
                "--window-s", str(window_s),
                "--straggler", f"{ranks // 3}:1.3",
            ],
            capture_output=True,
            text=True,
            timeout=windows * window_s * 4 + 300,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr[-3000:]

        def scored() -> float | None:
            return c.value("straggler_windows_scored_total", job="loadtest")

        wait_for(lambda: (scored() or 0) >= windows, 120, f"{windows} windows scored")
        counts = {
            "scored": scored(),
            "late": c.value("straggler_windows_late_total", job="loadtest"),
        }
    finally:
        s.stop()
        if c.daemon is not None:
            c.daemon.stop()
    return summary(s.samples), counts


def realtime_soak(tmp: Path, seconds: float, every_s: float) -> tuple[dict[str, Any], int]:
    """A small simulated job in real time for about `seconds` (sim/scenarios/reliability/soak_small.toml,
    one second a window); returns the summary and the windows scored."""
    import tomllib
    from artemis.sim.cluster import SimCluster, SimContext, SimOptions

    base = REPO / "sim" / "scenarios" / "reliability" / "soak_small.toml"
    sc = tomllib.loads(base.read_text())
    window_s = sc["job"]["step_ms"] * sc["job"]["window_steps"] / 1000.0
    sc_text = base.read_text().replace(
        f"windows = {sc['job']['windows']}", f"windows = {max(8, int(seconds / window_s))}"
    )
    path = tmp / "soak_small.toml"
    path.write_text(sc_text)
    s = Sampler(tmp / "findings.jsonl", every_s=every_s)

    def on_tick(ctx: SimContext) -> None:
        if s.pid is None:
            s.pid = ctx.procs["coordinator"].pid
            s.start()

    res = SimCluster(
        path,
        SimOptions(
            jsonl=tmp / "findings.jsonl",
            speed="realtime",
            workdir=tmp / "work",
            timeout_s=seconds * 2 + 120,
            on_tick=on_tick,
        ),
    ).run()
    s.stop()
    assert res.ok, res.reason
    return summary(s.samples), res.windows_scored
