"""Helpers for the end-to-end tests of the two daemons (tests/test_daemons_e2e.py).

Everything here is real: `artemis-coordinator serve` and `artemis-agent run` run
as subprocesses from the venv, talk over loopback TCP with a real 0600 secret
file, and the rings they read are written by the real compiled plugin driven
through the NCCL stand-in (sim/nccl.py) in the test process.

`LockstepFeeder` is the test-side "training job": every rank runs the same
collectives per step; rank r computes `compute_ms[r][k]` before collective k,
a collective starts on a rank when it arrives and ends on every rank when the
last one arrived plus `transfer_ms`. From those numbers alone the expected
window summary is known without any Artemis code: a rank's compute gap per
step is the sum of its own compute times, and the step time is the sum over
the collectives of (slowest arrival + transfer).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from artemis.common.ports import START_TRIES, error_line, free_port, port_taken

BIN = Path(sys.executable).parent
JOB = "e2ejob"
COMM_HASH = 0xE2E0_0000_0000_0001


def write_secret(path: Path, value: str | None = None) -> Path:
    path.write_text((value or secrets.token_hex(32)) + "\n")
    os.chmod(path, 0o600)
    return path


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `cond` until it returns something truthy; fail naming `what` at the deadline."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for: {what}")
        time.sleep(0.02)


# ---------------------------------------------------------------- metrics

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(url: str, timeout: float = 2.0) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text exposition: (name, labels) -> value; {} if down."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = frozenset(_LABEL.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def metric_by_label(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, key: str
) -> dict[str, float]:
    out = {}
    for (n, labels), v in samples.items():
        if n == name:
            d = dict(labels)
            if key in d:
                out[d[key]] = v
    return out


def json_records(text: str) -> list[dict[str, Any]]:
    """The JSON objects among `text`'s lines (a log's other lines, torn ones, skipped)."""
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


# ---------------------------------------------------------------- daemons


@dataclass
class Daemon:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        fh = open(self.log, "ab")  # noqa: SIM115 - handed to the child
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
        fh.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, SIGKILL if it does not go; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_records(self) -> list[dict[str, Any]]:
        return json_records(self.log_text())


def serve_argv(
    port: int, mport: int, jsonl: Path, plans: Path, secret: Path, cfg: Path
) -> list[str]:
    """``artemis-coordinator serve`` as the tests start it: agents on loopback ``port``,
    metrics on ``mport``, findings and plans to ``jsonl`` and ``plans``, JSON logs."""
    return [
        str(BIN / "artemis-coordinator"),
        "serve",
        *("--listen", f"127.0.0.1:{port}", "--metrics-port", str(mport)),
        *("--jsonl", str(jsonl), "--plans-jsonl", str(plans)),
        *("--secret-file", str(secret), "--config", str(cfg), "--log-json"),
    ]


@dataclass
class Coordinator:
    work: Path
    secret: Path
    deadline_s: float = 2.0
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    detector: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # top-level keys of its TOML
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)  # e.g. [limits]
    daemon: Daemon | None = None
    lives: int = 0

    @property
    def jsonl(self) -> Path:
        return self.work / "findings.jsonl"

    @property
    def sock(self) -> Path:
        return self.work / "coordinator.sock"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Coordinator:
        cfg = self.work / "coordinator.toml"
        det = {"hang_floor_s": 600.0, **self.detector}
        lines = [
            f"assembly_deadline_s = {self.deadline_s}",
            "tick_s = 0.05",
            'metrics_addr = "127.0.0.1"',
            f"control_socket = {json.dumps(str(self.work / 'coordinator.sock'))}",
            *(f"{k} = {json.dumps(v)}" for k, v in self.config.items()),
            *(
                line
                for name, table in self.tables.items()
                for line in (f"[{name}]", *(f"{k} = {json.dumps(v)}" for k, v in table.items()))
            ),
            "[detector]",
            *(f"{k} = {json.dumps(v)}" for k, v in det.items()),
        ]
        cfg.write_text("\n".join(lines) + "\n")
        self.lives += 1
        for left in range(START_TRIES - 1, -1, -1):
            log = self.work / "coordinator.log"
            since = log.stat().st_size if log.exists() else 0  # earlier lives' lines
            d = self.daemon = Daemon(
                "coordinator",
                serve_argv(
                    self.port,
                    self.metrics_port,
                    self.jsonl,
                    self.work / "plans.jsonl",
                    self.secret,
                    cfg,
                ),
                log,
            ).start()
            wait_for(
                lambda: (
                    not d.alive()  # noqa: B023 - waited on within this iteration
                    or metric(scrape(self.url), "straggler_detector_active") == 1
                ),
                30,
                "coordinator metrics endpoint",
            )
            # A first life's ports, picked free, can be taken before it binds them
            # (common/ports.py): it starts on others, as `artemis run` does.
            if d.alive() or self.lives > 1 or not left:
                break
            if port_taken(error_line(d.log, since)) is None:
                break
            self.port, self.metrics_port = free_port(), free_port()
        assert d.alive(), f"coordinator exited:\n{d.log_text()[-3000:]}"
        return self

    @property
    def pid(self) -> int:
        assert self.daemon is not None
        return self.daemon.pid

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return scrape(self.url)

    def value(self, name: str, **labels: str) -> float | None:
        return metric(self.samples(), name, **labels)

    def findings(self) -> list[dict[str, Any]]:
        if not self.jsonl.exists():
            return []
        return [json.loads(line) for line in self.jsonl.read_text().splitlines() if line.strip()]


def start_agent(
    work: Path,
    coordinator: str,
    shm: Path,
    secret: Path,
    host: str,
    *,
    window_steps: int,
    colls_per_step: int,
    telemetry: str = "host",
    extra: Sequence[str] = (),  # more lines of its TOML (after the top-level keys)
) -> Daemon:
    cfg = work / f"agent-{host}.toml"
    cfg.write_text(
        "\n".join(
            [
                f'telemetry = ["{telemetry}"]',
                "poll_interval_s = 0.05",
                "heartbeat_s = 0.3",
                "scan_interval_s = 0.1",
                f"window_steps = {window_steps}",
                f"colls_per_step = {colls_per_step}",
                "remove_finished = false",
                *extra,
            ]
        )
        + "\n"
    )
    return Daemon(
        f"agent-{host}",
        [
            str(BIN / "artemis-agent"),
            "run",
            "--coordinator",
            coordinator,
            "--shm-dir",
            str(shm),
            "--secret-file",
            str(secret),
            "--host",
            host,
            "--config",
            str(cfg),
            "--log-json",
        ],
        work / f"agent-{host}.log",
    ).start()


# ---------------------------------------------------------------- the job


@contextmanager
def _env(**kv: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in kv}
    os.environ.update(kv)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


PATTERN = (
    ("AllReduce", 1 << 20),
    ("AllReduce", 1 << 18),
    ("AllGather", 1 << 16),
    ("AllReduce", 4096),
)


class LockstepFeeder:
    """Several ranks of one communicator, on one or more shm dirs ("hosts"), in lockstep.

    `compute_ms[r][k]`: rank r's compute before collective k of every step.
    """

    def __init__(
        self,
        plugin: Path,
        shm_of_rank: Sequence[Path],
        compute_ms: Sequence[Sequence[float]],
        transfer_ms: float = 2.0,
        job: str = JOB,
        comm_hash: int = COMM_HASH,
    ) -> None:
        from artemis.sim.nccl import NcclStandIn

        self.nranks = len(shm_of_rank)
        self.colls = len(compute_ms[0])
        assert len(compute_ms) == self.nranks and self.colls <= len(PATTERN)
        self.compute_ns = [[round(x * 1e6) for x in row] for row in compute_ms]
        self.transfer_ns = round(transfer_ms * 1e6)
        self.nccl = NcclStandIn(str(plugin), version=7)
        self.comms = []
        for r, shm in enumerate(shm_of_rank):
            shm.mkdir(parents=True, exist_ok=True)
            with _env(ARTEMIS_SHM_DIR=str(shm), ARTEMIS_JOB=job, RANK=str(r)):
                c = self.nccl.comm_init(comm_hash, r, self.nranks, nnodes=2, name="dp")
            assert c.init_rc == 0, self.nccl.log_lines
            self.comms.append(c)
        self.t = 10**12  # device ns: the end of the last collective
        self.steps = 0

    def set_compute(self, compute_ms: Sequence[Sequence[float]]) -> None:
        """New compute times from the next step on (a rebalance plan in force)."""
        self.compute_ns = [[round(x * 1e6) for x in row] for row in compute_ms]

    def write_steps(self, n: int) -> None:
        for _ in range(n):
            for k in range(self.colls):
                func, nbytes = PATTERN[k]
                arrive = [self.t + self.compute_ns[r][k] for r in range(self.nranks)]
                end = max(arrive) + self.transfer_ns
                for r, c in enumerate(self.comms):
                    c.collective(
                        func, nbytes // 4, "ncclFloat32", 1, kernel_times=[(arrive[r], end)]
                    )
                self.t = end
            self.steps += 1

    def finish(self) -> None:
        for c in self.comms:
            c.finalize()

    # -- what the coordinator should see, from the inputs alone --------------

    def gap_ms(self, r: int) -> float:
        return sum(self.compute_ns[r]) / 1e6

    def step_ms(self) -> float:
        return (
            sum(
                max(self.compute_ns[r][k] for r in range(self.nranks)) + self.transfer_ns
                for k in range(self.colls)
            )
            / 1e6
        )

    def peers_gap_ms(self, r: int) -> float:
        return float(statistics.median(self.gap_ms(q) for q in range(self.nranks) if q != r))

    def pace(self, r: int) -> float:
        return self.gap_ms(r) / self.peers_gap_ms(r)


class PacedJob(threading.Thread):
    """A legitimate job beside a test's faults: `steps` lockstep steps every `period` s."""

    def __init__(self, feeder: LockstepFeeder, steps: int, period: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.feeder, self.steps, self.period = feeder, steps, period
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.feeder.write_steps(self.steps)
            self.stop.wait(self.period)


def windows_scored(coord: Coordinator) -> float:
    """Windows the coordinator scored so far, over all jobs."""
    return sum(metric_by_label(coord.samples(), "straggler_windows_scored_total", "job").values())


@contextmanager
def scored_paced_job(
    work: Path,
    plugin: Path,
    tables: dict[str, Any],
    *,
    window_steps: int,
    agent_extra: Sequence[str] = (),
    listed_first: Sequence[str] = (),  # addresses the agent's --coordinator list names first
) -> Iterator[Coordinator]:
    """A coordinator (`tables`) scoring agent "h0" of a paced 4-rank lockstep job, its
    first windows already scored: the legitimate traffic that the attack tests keep
    watching while hostile peers hit the same listener. All three stop on the way out.
    """
    secret = write_secret(work / "secret")
    shm = work / "shm"
    feeder = LockstepFeeder(plugin, [shm] * 4, [[4.0, 2.0] for _ in range(4)])
    coord = Coordinator(work, secret, deadline_s=2.0, tables=tables).start()
    agent = start_agent(
        work,
        ",".join([*listed_first, coord.address]),
        shm,
        secret,
        "h0",
        window_steps=window_steps,
        colls_per_step=2,
        extra=agent_extra,
    )
    job = PacedJob(feeder, window_steps)
    try:
        wait_for(lambda: coord.value("straggler_agents_connected") == 1, 30, "agent connected")
        job.start()
        wait_for(lambda: windows_scored(coord) >= 3, 30, "first windows scored")
        yield coord
    finally:
        job.stop.set()
        agent.stop()
        assert coord.daemon is not None
        coord.daemon.stop()


def connect_agent(work: Path, coord: Coordinator, shm: Path, secret: Path, **kw: Any) -> Daemon:
    """Agent "h0" on `shm` (`kw`: start_agent's), once `coord` counts it connected; an
    agent that does not connect is stopped."""
    agent = start_agent(work, coord.address, shm, secret, "h0", **kw)
    try:
        wait_for(lambda: coord.value("straggler_agents_connected") == 1, 30, "agent connected")
    except BaseException:
        agent.stop()
        raise
    return agent


def run_lockstep_job(
    work: Path,
    plugin: Path,
    compute_ms: Sequence[Sequence[float]],
    config: dict[str, Any],
    windows: int,
    *,
    window_steps: int,
    colls_per_step: int,
    before_agent_stops: Callable[[Coordinator], None] | None = None,
) -> Coordinator:
    """One host ("h0") of a lockstep job scored to its end: a coordinator with `config`,
    an agent, `windows` windows written and the job finished, the last window scored.

    The agent is stopped on the way out, after `before_agent_stops` (checks that must
    see the coordinator before that); the coordinator keeps running for the caller,
    unless this failed, when it is stopped too.
    """
    secret = write_secret(work / "secret")
    shm = work / "shm" / "h0"
    job = LockstepFeeder(plugin, [shm] * len(compute_ms), compute_ms)
    coord = Coordinator(work, secret, deadline_s=2.0, config=config)
    agent: Daemon | None = None
    try:
        coord.start()
        agent = connect_agent(
            work, coord, shm, secret, window_steps=window_steps, colls_per_step=colls_per_step
        )
        job.write_steps(windows * window_steps)
        job.finish()
        wait_for(
            lambda: (coord.value("straggler_last_window", job=JOB) or -1) >= windows - 1,
            60,
            f"window {windows - 1} scored",
        )
        assert coord.daemon is not None and coord.daemon.alive()
        if before_agent_stops is not None:
            before_agent_stops(coord)
    except BaseException:
        if coord.daemon is not None:
            coord.daemon.stop()
        raise
    finally:
        if agent is not None:
            agent.stop()
    return coord
