"""Node agent CPU per rank per window: a real `artemis-agent run` reading real rings.

``python -m bench agent_cpu``. The bench process is the training job: it drives
the real compiled plugin through the NCCL stand-in (sim/nccl.py) for RANKS ranks
at a fixed rate (COLLS collectives per step, STEP_S per step), so the rings fill
as in a job. A real agent (host telemetry, default poll and heartbeat
intervals, the step length inferred from the pattern) reads them and ships
window summaries to a real `artemis-coordinator serve` over loopback. The
agent's CPU time (utime + stime from /proc/<pid>/stat) is taken over a fixed
wall time after a warm-up, and divided by the rank-windows the coordinator
scored in that time. Baseline, same run and same wall time: the same agent on
an empty shm dir (idle: polling, heartbeats, scans). Median of RUNS runs.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

RANKS = 8
COLLS = 5
STEP_S = 0.01  # wall seconds per step: 100 steps/s, 4000 collectives/s over all ranks
WINDOW_STEPS = 20  # 5 windows/s of 8 ranks
MEASURE_S = 6.0
WARMUP_S = 3.0
RUNS = 3
JOB = "bench-agent"
BIN = Path(sys.executable).parent
CLK = os.sysconf("SC_CLK_TCK")
PATTERN = (
    ("AllReduce", 1 << 20),
    ("AllReduce", 1 << 18),
    ("AllGather", 1 << 16),
    ("AllReduce", 1 << 12),
    ("ReduceScatter", 1 << 14),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK


def _metric(url: str, name: str) -> float | None:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):  # any job label
            return float(line.rsplit(" ", 1)[1])
    return None


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT)


class _Job:
    """RANKS ranks of one communicator, lockstep, rank 3 a little slow."""

    def __init__(self, shm: Path) -> None:
        from artemis.agent.plugin_path import plugin_path
        from artemis.sim.nccl import NcclStandIn

        self.nccl = NcclStandIn(str(plugin_path()), version=7)
        os.environ.update(ARTEMIS_SHM_DIR=str(shm), ARTEMIS_JOB=JOB)
        self.comms = []
        for r in range(RANKS):
            os.environ["RANK"] = str(r)
            self.comms.append(self.nccl.comm_init(0xBE7C4, r, RANKS, nnodes=1, name="dp"))
        self.t = 10**12

    def step(self) -> None:
        for func, nbytes in PATTERN[:COLLS]:
            arrive = [self.t + 2_000_000 + (300_000 if r == 3 else 1000 * r) for r in range(RANKS)]
            end = max(arrive) + 1_000_000
            for r, c in enumerate(self.comms):
                c.collective(func, nbytes // 4, "ncclFloat32", 1, kernel_times=[(arrive[r], end)])
            self.t = end

    def close(self) -> None:
        for c in self.comms:
            c.finalize()


def run_once(busy: bool) -> tuple[float, float, int]:
    """(agent CPU seconds, wall seconds, rank-windows scored) over MEASURE_S."""
    from artemis.sim.cluster import stop_process

    with tempfile.TemporaryDirectory(prefix="bench-agent-cpu-") as tmp:
        work = Path(tmp)
        secret = work / "secret"
        secret.write_text(secrets.token_hex(32))
        os.chmod(secret, 0o600)
        shm = work / "shm"
        shm.mkdir()
        port, mport = _free_port(), _free_port()
        ccfg = work / "coordinator.toml"
        ccfg.write_text(
            # One agent that announces its ranks: no grace needed before windows count.
            'metrics_addr = "127.0.0.1"\ntick_s = 0.1\nassembly_grace_s = 0.0\n'
            f"control_socket = {json.dumps(str(work / 'c.sock'))}\n"
        )
        coord = _spawn(
            [
                str(BIN / "artemis-coordinator"), "serve", "--listen", f"127.0.0.1:{port}",
                "--metrics-port", str(mport), "--jsonl", str(work / "f.jsonl"),
                "--plans-jsonl", str(work / "p.jsonl"), "--secret-file", str(secret),
                "--config", str(ccfg),
            ],
            work / "coordinator.log",
        )  # fmt: skip
        url = f"http://127.0.0.1:{mport}/metrics"
        job = None
        agent = None
        try:
            end = time.monotonic() + 30
            while _metric(url, "straggler_detector_active") != 1:
                if time.monotonic() > end or coord.poll() is not None:
                    raise RuntimeError("coordinator did not come up")
                time.sleep(0.05)
            if busy:
                job = _Job(shm)
            acfg = work / "agent.toml"
            acfg.write_text(f'telemetry = ["host"]\nwindow_steps = {WINDOW_STEPS}\n')
            agent = _spawn(
                [
                    str(BIN / "artemis-agent"), "run", "--coordinator", f"127.0.0.1:{port}",
                    "--shm-dir", str(shm), "--secret-file", str(secret), "--host", "bench",
                    "--config", str(acfg),
                ],
                work / "agent.log",
            )  # fmt: skip
            t0 = time.monotonic()
            cpu0 = scored0 = 0.0
            measuring = False
            next_step = t0
            while True:
                now = time.monotonic()
                if not measuring and now - t0 >= WARMUP_S:
                    cpu0 = _cpu_s(agent.pid)
                    scored0 = _metric(url, "straggler_windows_scored_total") or 0.0
                    t_m = now
                    measuring = True
                if measuring and now - t_m >= MEASURE_S:
                    cpu = _cpu_s(agent.pid) - cpu0
                    scored = (_metric(url, "straggler_windows_scored_total") or 0.0) - scored0
                    return cpu, now - t_m, int(scored) * RANKS
                if job is not None and now >= next_step:
                    job.step()
                    next_step += STEP_S
                else:
                    time.sleep(min(STEP_S, max(0.0, next_step - now)) if job else 0.05)
        finally:
            if agent is not None:
                stop_process(agent)
            if job is not None:
                job.close()
            stop_process(coord)


def main() -> int:
    print(
        f"agent CPU: {RANKS} ranks x {COLLS} collectives/step, {1 / STEP_S:.0f} steps/s, "
        f"{WINDOW_STEPS} steps/window; {MEASURE_S:.0f} s measured after {WARMUP_S:.0f} s "
        f"warm-up; median of {RUNS} runs"
    )
    busy = [run_once(True) for _ in range(RUNS)]
    idle = [run_once(False) for _ in range(RUNS)]
    b_cpu = statistics.median(c for c, _, _ in busy)
    i_cpu = statistics.median(c for c, _, _ in idle)
    wall = statistics.median(w for _, w, _ in busy)
    rw = statistics.median(n for _, _, n in busy)
    hdr = f"{'agent':<22} {'cpu s':>7} {'wall s':>7} {'cpu %':>6} {'rank-windows':>12} {'ms/rank-window':>15}"
    print(hdr)
    print("-" * len(hdr))
    print(
        f"{'idle (no rings)':<22} {i_cpu:>7.3f} {wall:>7.2f} {100 * i_cpu / wall:>6.2f} {0:>12} {'':>15}"
    )
    per = 1000 * b_cpu / rw if rw else float("nan")
    print(
        f"{'busy':<22} {b_cpu:>7.3f} {wall:>7.2f} {100 * b_cpu / wall:>6.2f} {rw:>12} {per:>15.3f}"
    )
    net = 1000 * (b_cpu - i_cpu) / rw if rw else float("nan")
    print(f"{'busy - idle':<22} {b_cpu - i_cpu:>7.3f} {'':>7} {'':>6} {rw:>12} {net:>15.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
