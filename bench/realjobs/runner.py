"""One run of the real-job grid: a workload under ``artemis run``, a fault from outside.

The job runs under ``artemis run --jsonl --summary-json`` (the agent path: a real
coordinator and node agent on loopback). The runner polls the job's folder: on the
workload's onset file it starts the fault's injector on the rank's pid (from the
workload's pid file), and it notes when each findings line first appears (seconds to
flag). When the job ends it stops the injector (undoing the fault), reads rank 0's
trace, the findings and the summary, and judges the run (bench/realjobs/judge.py).
The load average (1 min) is read at the start and end of the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.realjobs import faults
from bench.realjobs.judge import Expected, judge, onset_step
from bench.realjobs.workloads import pinned_cpu

ROOT = Path(__file__).resolve().parents[2]
ARTEMIS = Path(sys.executable).parent / "artemis"
MECHANISMS = ("none", "sigstop", "quota", "hog", "loader", "bridge", "net")
ISLANDS = "nvidia,nvidia,amd,amd"
# as the islands end-to-end test judges a 2-rank island (tests/test_torch_islands_e2e.py)
ISLAND_SETTINGS: dict[str, str | float] = {
    "mode": "seed",
    "suspect_ratio": 1.5,
    "min_island_peers": 2,
    "drift_ratio": 2.0,
    "collective_ratio": 3.0,
    "link_ratio": 3.0,
}
POLL_S = 0.02
RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Cell:
    workload: str
    mechanism: str
    size: float
    window_steps: int = 25
    rank: int = 2
    world: int = 4
    before_windows: int = 10  # healthy windows before the fault
    after_windows: int = 8  # windows under it

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism {self.mechanism!r}: one of {', '.join(MECHANISMS)}")

    @property
    def fault_from(self) -> int:
        # mid-window, so the onset window (the first whole one) is unambiguous
        return -1 if self.mechanism == "none" else self.onset_step

    @property
    def onset_step(self) -> int:
        return onset_step(self.before_windows, self.window_steps)

    @property
    def steps(self) -> int:
        return (self.before_windows + self.after_windows + 1) * self.window_steps

    def expected(self) -> Expected | None:
        if self.mechanism == "none":
            return None
        if self.mechanism == "bridge":
            return Expected("link")
        if self.mechanism == "net":
            return Expected("collective")  # every rank's collectives, one island
        if self.mechanism == "hog":
            return Expected(
                "rank",
                tuple(faults.ranks_on_cpu(pinned_cpu(self.rank, self.world), self.world)),
                "host",
            )
        return Expected("rank", (self.rank,), "host")


def _job_args(cell: Cell, out: Path) -> list[str]:
    args = [
        "--model",
        cell.workload,
        "--world",
        str(cell.world),
        "--steps",
        str(cell.steps),
        "--out",
        str(out),
        "--fault-from",
        str(cell.fault_from),
    ]
    if cell.mechanism == "loader":
        args += ["--loader-sleep-rank", str(cell.rank), "--loader-sleep-ms", str(cell.size)]
    if cell.mechanism == "bridge":
        args += ["--islands", ISLANDS, "--bridge-delay-ms", str(cell.size)]
    if cell.mechanism == "hog":
        # The hog's CPU must be the rank's. Not the quota's: pinned, two ranks a CPU
        # here share its every disturbance (the grid's own processes): 20 pinned quota
        # runs made 21 false flags, 20 unpinned ones 3 (bench/README.md "Real jobs").
        args += ["--pin"]
    return args


def _injector(
    cell: Cell, out: Path, tag: str, ns: faults.NetNamespace | None = None
) -> faults.Injector:
    if ns is not None:
        return faults.NetRate(ns.name, cell.size)
    pid = int(json.loads((out / f"pid{cell.rank}").read_text()))
    if cell.mechanism == "sigstop":
        return faults.DutyStop(pid, cell.size)
    if cell.mechanism == "quota":
        return faults.CpuQuota(pid, cell.size, f"artemis-realjobs-{tag}")
    if cell.mechanism == "hog":
        return faults.CpuHog(pinned_cpu(cell.rank, cell.world), cell.size)
    return faults.InJob()


def _read_lines(path: Path, have: list[dict[str, Any]], seen: list[float]) -> None:
    """Append the findings lines written since the last call, noting when."""
    if not path.exists():
        return
    now = time.monotonic()
    with path.open() as fh:
        text = fh.read()
    done = text.rsplit("\n", 1)[0].splitlines() if "\n" in text else []
    for line in done[len(have) :]:
        have.append(json.loads(line))
        seen.append(now)


def run(cell: Cell, keep: Path, tag: str) -> dict[str, Any]:
    """One run of ``cell``; its record (also what the grid writes as JSONL)."""
    work = Path(tempfile.mkdtemp(prefix=f"realjobs-{tag}-"))
    out, jsonl, summ = work / "job", work / "findings.jsonl", work / "summary.json"
    cmd = [
        str(ARTEMIS),
        "run",
        "--job",
        f"rj-{tag}",
        "--jsonl",
        str(jsonl),
        "--summary-json",
        str(summ),
    ]
    cmd += ["--window-steps", str(cell.window_steps)]
    if cell.mechanism == "bridge":
        toml = "\n".join(f"{k} = {json.dumps(v)}" for k, v in ISLAND_SETTINGS.items())
        (work / "coordinator.toml").write_text(f"[detector]\n{toml}\n")
        cmd += ["--config", str(work / "coordinator.toml")]
    cmd += ["--", sys.executable, "-m", "bench.realjobs.workloads", *_job_args(cell, out)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    lines: list[dict[str, Any]] = []
    seen: list[float] = []
    inj: faults.Injector | None = None
    onset: dict[str, Any] | None = None
    log = (work / "run.log").open("w")
    # the `net` cell's job runs in a network namespace of its own (faults.NetRate)
    ns = faults.NetNamespace(f"rj{os.getpid()}-{int(t0)}") if cell.mechanism == "net" else None
    try:
        proc = subprocess.Popen(
            cmd if ns is None else ns.wrap(cmd),
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        while proc.poll() is None:
            if time.monotonic() - t0 > RUN_TIMEOUT_S:
                proc.kill()
                break
            if onset is None and (out / "onset.json").exists():
                onset = json.loads((out / "onset.json").read_text())
                inj = _injector(cell, out, tag, ns)
                inj.start()
            _read_lines(jsonl, lines, seen)
            time.sleep(POLL_S)
    finally:
        if inj is not None:
            inj.stop()
        if ns is not None:
            ns.close()
        log.close()
    _read_lines(jsonl, lines, seen)
    load1 = os.getloadavg()[0]
    rec: dict[str, Any] = {
        "cell": asdict(cell),
        "expected": None if cell.expected() is None else asdict(cell.expected()),  # type: ignore[arg-type]
        "tag": tag,
        "exit_code": proc.returncode,
        "load": [round(load0, 2), round(load1, 2)],
        "wall_s": round(time.monotonic() - t0, 1),
        "kept": str(keep / "runs" / tag),
    }
    try:
        return _finish(rec, cell, work, onset, lines, seen, keep / "runs" / tag)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _finish(
    rec: dict[str, Any],
    cell: Cell,
    work: Path,
    onset: dict[str, Any] | None,
    lines: list[dict[str, Any]],
    seen: list[float],
    keep: Path,
) -> dict[str, Any]:
    """Judge a finished run; keep what it was judged from (rank 0's trace, the onset,
    the findings and the summary) under ``keep``, enough to judge it again."""
    out, summ = work / "job", work / "summary.json"
    trace_path = out / "trace0.json"
    if rec["exit_code"] != 0 or not trace_path.exists() or not summ.exists():
        rec["error"] = (work / "run.log").read_text()[-2000:]
        return rec
    keep.mkdir(parents=True, exist_ok=True)
    # the journal holds every window's summaries (a short job's is never compacted):
    # enough to score the run again offline, with a changed rule
    journal = work / "artemis-out" / f"rj-{rec['tag']}" / "state" / "journal.assembly"
    for src in (
        trace_path,
        out / "onset.json",
        summ,
        work / "findings.jsonl",
        work / "run.log",
        journal,
    ):
        if src.exists():
            shutil.copy(src, keep / src.name)
    summary = json.loads(summ.read_text())
    seen_s = None
    if onset is not None:
        t_on = onset["t_ns"] / 1e9
        seen_s = {i: round(s - t_on, 2) for i, s in enumerate(seen)}
    rec |= judge(
        json.loads(trace_path.read_text()),
        cell.window_steps,
        onset,
        lines,
        summary,
        cell.expected(),
        seen_s,
        healthy_from=cell.onset_step,
    )
    (keep / "record.json").write_text(json.dumps(rec, indent=1))
    return rec
