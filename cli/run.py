"""`artemis run -- COMMAND`: watch one job on this node with nothing installed.

Starts a real coordinator and a real node agent on loopback (each in its own
session, so a Ctrl-C at the terminal reaches the job, not them), with a fresh
secret in a private (0700) folder. COMMAND runs with ``NCCL_PROFILER_PLUGIN``
(the built plugin, when there is one), ``ARTEMIS_SHM_DIR`` and ``ARTEMIS_JOB``
set: NCCL jobs need no change, other jobs use the ``artemis`` backend. New flags
are printed one line each as the coordinator writes them; when COMMAND exits the
run waits for the coordinator to score the job's last window (it ends a job once
every rank's ring is finished and nothing is pending), prints the summary and
exits with COMMAND's exit code.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from artemis.common.tomlfile import ConfigError, toml_value

REBALANCE_MODES = ("off", "recommend", "apply")
_BIN = Path(sys.executable).parent


class RunError(Exception):
    """A bad flag, a missing command, or a daemon that did not come up."""


@dataclass(frozen=True)
class RunOptions:
    command: Sequence[str]
    jsonl: Path | None = None
    plans_jsonl: Path | None = None
    metrics_port: int | None = None
    rebalance: str | None = None
    window_steps: int = 50
    colls_per_step: int = 0
    config: Path | None = None
    job: str | None = None
    settle_timeout_s: float = 30.0
    keep_workdir: bool = False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml_value(v: Any) -> str:
    try:
        return toml_value(v)
    except TypeError as e:
        raise RunError(f"--config: {e}") from None


def _coordinator_toml(user: dict[str, Any], work: Path, rebalance: str | None) -> str:
    """The user's coordinator TOML with what a one-node run needs layered on."""
    top = {k: v for k, v in user.items() if not isinstance(v, dict)}
    tables = {k: dict(v) for k, v in user.items() if isinstance(v, dict)}
    top["control_socket"] = str(work / "coordinator.sock")
    top["metrics_addr"] = "127.0.0.1"
    top.setdefault("tick_s", 0.1)
    # the ranks of a job on one busy node may finish seconds apart
    top.setdefault("assembly_deadline_s", 10.0)
    # The grace (no window complete until then; by default the deadline) is for a
    # restarted coordinator waiting for agents to reconnect. This one is new and its
    # one agent finds the job's rings, made at init_process_group, within a scan or
    # two; ten seconds of grace held every early window back and then released them
    # at once, so a rebalance plan reached the job after its step and timed out.
    top.setdefault("assembly_grace_s", 2.0)
    top["job_linger_s"] = 0.5  # the job's end is what `artemis run` waits for
    if rebalance is not None:
        tables.setdefault("detector", {})["rebalance"] = rebalance
    lines = [f"{k} = {_toml_value(v)}" for k, v in top.items()]
    for name, tab in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in tab.items() if not isinstance(v, dict)]
    return "\n".join(lines) + "\n"


def _cli(name: str, module: str) -> list[str]:
    exe = _BIN / name
    return [str(exe)] if exe.exists() else [sys.executable, "-m", module]


def _who(f: dict[str, Any]) -> str:
    if f.get("rank") is not None:
        return f"rank {f['rank']}" if f["kind"] == "rank" else f"{f['kind']} rank {f['rank']}"
    return f"{f['kind']} {f.get('island') or ''}".strip()


def _one_line(f: dict[str, Any]) -> str:
    who = _who(f)
    cost = f" loss {f['loss_pct']:.1f}%" if f.get("loss_pct") is not None else ""
    cause = f.get("cause") or {}
    why = f" cause {cause.get('kind')}: {cause.get('text')}" if cause else ""
    return f"[artemis] {f['state']} {who} window {f['window']}{cost}{why}"


class _Follower:
    """Reads the findings JSONL as it grows (a thread); calls ``on_line`` for each finding."""

    def __init__(self, path: Path, on_finding: Callable[[dict[str, Any]], None]) -> None:
        self.path, self.on_finding = path, on_finding
        self.findings: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._pos = 0
        self._t = threading.Thread(target=self._run, name="artemis-run-follow", daemon=True)
        self._t.start()

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._pos)
                data = fh.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._pos += end
        for line in data[:end].splitlines():
            if line.strip():
                f = json.loads(line)
                self.findings.append(f)
                self.on_finding(f)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._read()

    def stop(self) -> None:
        self._stop.set()
        self._t.join()
        self._read()


def _wait_metrics(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RunError(f"the coordinator exited with code {proc.returncode} at start")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                if b"straggler_detector_active" in r.read():
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RunError(f"the coordinator's metrics did not come up within {timeout:.0f} s")


def _job_ended(log: Path, job: str) -> bool:
    """The coordinator logged that it ended ``job`` (every rank finished, nothing pending)."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return False
    for line in text.splitlines():
        if "job ended" in line and job in line:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("job") == job and str(rec.get("event", "")).startswith("job ended"):
                return True
    return False


def summary_lines(findings: list[dict[str, Any]]) -> list[str]:
    """One line per subject ever flagged: when, its worst cost, its last state and cause."""
    by: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        by.setdefault(_who(f), []).append(f)
    flagged = {w: fs for w, fs in by.items() if any(f["state"] == "flagged" for f in fs)}
    if not flagged:
        return ["[artemis] summary: nothing flagged"]
    out = [f"[artemis] summary: {len(flagged)} flagged"]
    for who, fs in flagged.items():
        first = next(f for f in fs if f["state"] == "flagged")
        last = fs[-1]
        costs = [f["loss_pct"] for f in fs if f.get("loss_pct") is not None]
        cost = f"up to {max(costs):.1f}% of the step time" if costs else "n/a"
        cause = next((f["cause"] for f in reversed(fs) if f.get("cause")), None) or {}
        out.append(
            f"  {who}: flagged in window {first['window']}, {last['state']} in window "
            f"{last['window']}; cost {cost}; cause {cause.get('kind', 'none')}"
            + (f": {cause.get('text')}" if cause.get("text") else "")
        )
    return out


def incident_lines(path: Path, job: str) -> list[str]:
    """One line per incident of ``job`` in ``incidents.jsonl`` (its last record): the
    verdict, why, and the recommended check."""
    last: dict[str, dict[str, Any]] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    if rec.get("job") == job:
                        last[rec["id"]] = rec
    except FileNotFoundError:
        return []
    out = []
    for rec in last.values():
        out.append(
            f"  incident {rec['id']}: {rec.get('verdict') or rec.get('status')}"
            + (f" ({rec['reason']})" if rec.get("reason") else "")
        )
        esc = rec.get("escalation") or {}
        if esc.get("check"):
            out.append(f"    check: {esc['check']}")
    return out


def run(opts: RunOptions, out: TextIO = sys.stdout) -> int:
    """Run COMMAND under a one-node Artemis; returns COMMAND's exit code."""
    if not opts.command:
        raise RunError("no COMMAND given: artemis run [OPTIONS] -- COMMAND ...")
    exe = opts.command[0]
    if shutil.which(exe) is None and not (os.sep in exe and os.access(exe, os.X_OK)):
        raise RunError(f"COMMAND not found: {exe!r}")
    if opts.rebalance is not None and opts.rebalance not in REBALANCE_MODES:
        raise RunError(f"--rebalance: expected one of {', '.join(REBALANCE_MODES)}")
    if opts.window_steps < 2:
        raise RunError("--window-steps: expected an integer >= 2")
    user_cfg: dict[str, Any] = {}
    if opts.config is not None:
        from artemis.common.tomlfile import read_toml

        try:
            user_cfg = read_toml(opts.config)
        except (OSError, ConfigError, ValueError) as e:
            raise RunError(f"--config {opts.config}: {e}") from None

    work = Path(tempfile.mkdtemp(prefix="artemis-run-"))  # mkdtemp makes it 0700
    job = opts.job or f"run-{os.getpid()}-{secrets.token_hex(3)}"
    shm = work / "shm"
    shm.mkdir()
    secret = work / "secret"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (secrets.token_hex(32) + "\n").encode())
    os.close(fd)
    jsonl = opts.jsonl or work / "findings.jsonl"
    plans = opts.plans_jsonl or work / "plans.jsonl"
    port, mport = _free_port(), opts.metrics_port or _free_port()
    (work / "coordinator.toml").write_text(_coordinator_toml(user_cfg, work, opts.rebalance))
    (work / "agent.toml").write_text(
        "\n".join(
            [
                # simulated: the per-rank file where ARTEMIS_ISLANDS publishes each
                # rank's island (job/backend.py); absent files read as nothing
                'telemetry = ["nvml", "amdsmi", "host", "simulated"]',
                "poll_interval_s = 0.05",
                "heartbeat_s = 0.3",
                "scan_interval_s = 0.1",
                f"window_steps = {opts.window_steps}",
                f"colls_per_step = {opts.colls_per_step}",
                "remove_finished = false",  # the folder goes as a whole at the end
            ]
        )
        + "\n"
    )
    daemons: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(work / log, "ab") as fh:
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            p = subprocess.Popen(
                argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        daemons.append(p)
        return p

    code = 1
    follower: _Follower | None = None
    try:
        coord = start(
            [
                *_cli("artemis-coordinator", "artemis.coordinator.cli"),
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--metrics-port",
                str(mport),
                "--jsonl",
                str(jsonl),
                "--plans-jsonl",
                str(plans),
                "--secret-file",
                str(secret),
                "--config",
                str(work / "coordinator.toml"),
                "--log-json",
            ],
            "coordinator.log",
        )
        _wait_metrics(f"http://127.0.0.1:{mport}/metrics", coord, 30.0)
        start(
            [
                *_cli("artemis-agent", "artemis.agent.cli"),
                "run",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--shm-dir",
                str(shm),
                "--secret-file",
                str(secret),
                "--config",
                str(work / "agent.toml"),
                "--log-json",
            ],
            "agent.log",
        )
        env = dict(os.environ, ARTEMIS_SHM_DIR=str(shm), ARTEMIS_JOB=job)
        try:
            from artemis.agent.plugin_path import plugin_path

            env["NCCL_PROFILER_PLUGIN"] = str(plugin_path())
        except FileNotFoundError:
            pass  # no plugin built: gloo jobs through the artemis backend still work
        print(
            f"[artemis] job {job}: coordinator 127.0.0.1:{port}, metrics "
            f"http://127.0.0.1:{mport}/metrics, findings {jsonl}, incidents "
            f"{jsonl.parent / 'incidents.jsonl'}",
            file=out,
            flush=True,
        )

        def live(f: dict[str, Any]) -> None:
            if f.get("job") == job and f["state"] in ("flagged", "cleared"):
                print(_one_line(f), file=out, flush=True)

        follower = _Follower(jsonl, live)
        # The job shares our foreground process group, so the terminal's Ctrl-C
        # reaches it directly; we ignore SIGINT while it runs and let it decide.
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            job_proc = subprocess.Popen(list(opts.command), env=env)
            code = job_proc.wait()
        finally:
            signal.signal(signal.SIGINT, old)
        end = time.monotonic() + opts.settle_timeout_s
        # a job that wrote no ring (no collective ran) has nothing to flush
        has_rings = any(shm.glob(f"{job}.*.ring"))
        while has_rings and not _job_ended(work / "coordinator.log", job):
            if time.monotonic() > end:
                print(
                    f"[artemis] the coordinator did not finish the job within "
                    f"{opts.settle_timeout_s:.0f} s: the summary may miss the last windows "
                    f"(logs in {work})",
                    file=out,
                    flush=True,
                )
                break
            if coord.poll() is not None:
                break
            time.sleep(0.1)
        follower.stop()
        for line in summary_lines([f for f in follower.findings if f.get("job") == job]):
            print(line, file=out, flush=True)
        # the coordinator writes incidents.jsonl next to the findings (DESIGN "Incidents")
        for line in incident_lines(jsonl.parent / "incidents.jsonl", job):
            print(line, file=out, flush=True)
        return code if code >= 0 else 128 - code
    finally:
        if follower is not None:
            follower.stop()
        for p in reversed(daemons):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in daemons:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if not opts.keep_workdir:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"[artemis] logs and rings kept in {work}", file=out, flush=True)
