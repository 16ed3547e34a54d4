"""`artemis run -- COMMAND`: watch one job on this node with nothing installed.

Starts a real coordinator and a real node agent on loopback (each in its own
session, so a Ctrl-C at the terminal reaches the job, not them), with a fresh
secret in a private (0700) folder. COMMAND runs with ``NCCL_PROFILER_PLUGIN``
(the built plugin, when there is one), ``ARTEMIS_SHM_DIR`` and ``ARTEMIS_JOB``
set: NCCL jobs need no change, other jobs use the ``artemis`` backend. New flags
are printed one line each as the coordinator writes them; when COMMAND exits the
run waits for the coordinator to score the job's last window (it ends a job once
every rank's ring is finished and nothing is pending) unless the job never filled
a window, prints the summary (cli/run_summary.py) and exits with COMMAND's exit
code.

What is kept goes under ``./artemis-out/<job>/``: the findings and incidents (unless
``--jsonl`` puts them elsewhere), the plans, the HTML report when there was an
incident, and ``state/`` (the coordinator's journal, hang dumps and store), so that
nothing but ``incidents.jsonl`` lands beside a user's ``--jsonl`` file.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
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

from artemis.cli.run_summary import (
    RingCensus,
    census,
    full_window_possible,
    incident_lines,
    latest_incidents,
    metric_value,
    no_collective_lines,
    no_window_line,
    one_line,
    short_job_line,
    summary_json,
    summary_lines,
    watched_line,
)
from artemis.common.ports import PortTaken, error_line, on_free_ports, port_taken
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
    corrections: str | None = None  # [detector] corrections: off | recommend | apply
    window_steps: int = 50
    colls_per_step: int = 0
    config: Path | None = None
    job: str | None = None
    settle_timeout_s: float = 30.0
    keep_workdir: bool = False
    summary_json: Path | None = None
    out_root: Path = Path("artemis-out")  # the kept outputs: <out_root>/<job>/


def _toml_value(v: Any) -> str:
    try:
        return toml_value(v)
    except TypeError as e:
        raise RunError(f"--config: {e}") from None


def _coordinator_toml(
    user: dict[str, Any],
    work: Path,
    rebalance: str | None,
    state: Path,
    corrections: str | None = None,
) -> str:
    """The user's coordinator TOML with what a one-node run needs layered on."""
    top = {k: v for k, v in user.items() if not isinstance(v, dict)}
    tables = {k: dict(v) for k, v in user.items() if isinstance(v, dict)}
    top["control_socket"] = str(work / "coordinator.sock")
    # The coordinator's own files default to beside the findings; a run keeps them in
    # its state folder instead, so a user's --jsonl folder gets no artemis.db,
    # <stem>.assembly or <stem>.assembly.jobs/ (incidents.jsonl stays with the findings).
    top.setdefault("journal", str(state / "journal.assembly"))
    top.setdefault("dumps_dir", str(state / "dumps"))
    top.setdefault("store", f"sqlite:///{state / 'artemis.db'}")
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
    if corrections is not None:
        tables.setdefault("detector", {})["corrections"] = corrections
    lines = [f"{k} = {_toml_value(v)}" for k, v in top.items()]
    for name, tab in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in tab.items() if not isinstance(v, dict)]
    return "\n".join(lines) + "\n"


def _cli(name: str, module: str) -> list[str]:
    exe = _BIN / name
    return [str(exe)] if exe.exists() else [sys.executable, "-m", module]


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


def _start_error(log: Path, rc: int | None, since: int) -> Exception:
    """Why the coordinator exited at start: its own `error:` line from ``log`` (written
    after byte ``since``: this life's)."""
    why = error_line(log, since)
    msg = f"the coordinator exited with code {rc} at start" + (f": {why}" if why else "")
    return port_taken(why) or RunError(msg if why else f"{msg} (its log: {log})")


def _serving(metrics: bytes) -> bool:
    """Whether a coordinator's metrics say it serves: `straggler_detector_active` is 0
    until the agents' port is bound as well (coordinator/server_main.py). An endpoint
    that merely answers could still exit on a taken port (stop 41's CI)."""
    return metric_value(metrics.decode(errors="replace"), "straggler_detector_active") == 1


def _wait_metrics(
    url: str, proc: subprocess.Popen[bytes], timeout: float, log: Path, since: int
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise _start_error(log, proc.returncode, since)
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                if _serving(r.read()):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RunError(f"the coordinator's metrics did not come up within {timeout:.0f} s")


def _job_ended(log: Path, job: str) -> dict[str, Any] | None:
    """The coordinator's log record of ending ``job`` (every rank finished, nothing
    pending), or None."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if "job ended" in line and job in line:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("job") == job and str(rec.get("event", "")).startswith("job ended"):
                return dict(rec)
    return None


def _windows_scored(store: str, job: str, metrics: str, ended: dict[str, Any] | None) -> int:
    """How many of the job's windows the coordinator scored. Its metric series go when
    the job ends (job_linger_s), so the store's per-window rows count first; without a
    store, the live metric, else the last window the end's log record names."""
    from artemis.store import StoreError, open_store

    if store.startswith(("sqlite:", "postgresql:")):
        try:
            db = open_store(store, readonly=True)
            try:
                return len(db.job_windows(job))
            finally:
                db.close()
        except (StoreError, OSError):
            pass
    live = metric_value(metrics, "straggler_windows_scored_total", job)
    if live is not None:
        return int(live)
    last = (ended or {}).get("last_window")
    return int(last) + 1 if isinstance(last, int) and last >= 0 else 0


def _metrics_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5.0) as r:
            return str(r.read().decode("utf-8", "replace"))
    except OSError:
        return ""


def _report(store: str, findings: Path, plans: Path, job: str, out_dir: Path) -> Path | None:
    """The job's HTML incident report (as `artemis report` writes it) into ``out_dir``."""
    from artemis.report.load import (
        ReportError,
        bundles_from_findings,
        bundles_from_store,
        write_bundle,
    )

    if store.startswith(("sqlite:", "postgresql:")):
        bundles = bundles_from_store(store, job=job, generated=time.time())
    else:  # no store of ours: the incident records and the findings' own lines
        plans_arg = plans if plans.is_file() else None
        bundles = bundles_from_findings(findings, plans_arg, job=job, generated=time.time())
    try:
        (bundle,) = bundles
    except ValueError:
        raise ReportError(f"no report data for job {job}") from None
    return write_bundle(bundle, out_dir, job=job)


def run(opts: RunOptions, out: TextIO = sys.stdout) -> int:
    """Run COMMAND under a one-node Artemis; returns COMMAND's exit code."""
    if not opts.command:
        raise RunError("no COMMAND given: artemis run [OPTIONS] -- COMMAND ...")
    exe = opts.command[0]
    if shutil.which(exe) is None and not (os.sep in exe and os.access(exe, os.X_OK)):
        raise RunError(f"COMMAND not found: {exe!r}")
    if opts.rebalance is not None and opts.rebalance not in REBALANCE_MODES:
        raise RunError(f"--rebalance: expected one of {', '.join(REBALANCE_MODES)}")
    if opts.corrections is not None and opts.corrections not in REBALANCE_MODES:
        raise RunError(f"--corrections: expected one of {', '.join(REBALANCE_MODES)}")
    if opts.window_steps < 2:
        raise RunError("--window-steps: expected an integer >= 2")
    user_cfg: dict[str, Any] = {}
    if opts.config is not None:
        from artemis.common.tomlfile import read_toml

        try:
            user_cfg = read_toml(opts.config)
        except (OSError, ConfigError, ValueError) as e:
            raise RunError(f"--config {opts.config}: {e}") from None

    job = opts.job or f"run-{os.getpid()}-{secrets.token_hex(3)}"
    # a job id is the user's text (ARTEMIS_JOB): one safe folder name, never a path
    out_dir = (
        opts.out_root / (re.sub(r"[^A-Za-z0-9_.-]+", "_", job).strip(".") or "job")
    ).absolute()
    state = out_dir / "state"
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"cannot make {state}: {e.strerror}") from None
    work = Path(tempfile.mkdtemp(prefix="artemis-run-"))  # mkdtemp makes it 0700
    shm = work / "shm"
    shm.mkdir()
    secret = work / "secret"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (secrets.token_hex(32) + "\n").encode())
    os.close(fd)
    jsonl = (opts.jsonl or out_dir / "findings.jsonl").absolute()
    incidents = jsonl.parent / "incidents.jsonl"  # the coordinator writes it there
    plans = (opts.plans_jsonl or out_dir / "plans.jsonl").absolute()
    store = str(user_cfg.get("store", f"sqlite:///{state / 'artemis.db'}"))
    (work / "coordinator.toml").write_text(
        _coordinator_toml(user_cfg, work, opts.rebalance, state, opts.corrections)
    )
    (work / "agent.toml").write_text(
        "\n".join(
            [
                # simulated: the per-rank file where ARTEMIS_ISLANDS publishes each
                # rank's island (job/islands.py); absent files read as nothing
                'telemetry = ["nvml", "amdsmi", "host", "simulated"]',
                "poll_interval_s = 0.05",
                "heartbeat_s = 0.3",
                "scan_interval_s = 0.1",
                f"window_steps = {opts.window_steps}",
                f"colls_per_step = {opts.colls_per_step}",
                "remove_finished = false",  # the folder goes as a whole at the end
                # --corrections apply: the user asks this node to apply them too
                f"state_dir = {toml_value(str(state / 'agent'))}",
                f"policy.allow_corrections = {toml_value(opts.corrections == 'apply')}",
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

        def coordinator(port: int, mport: int) -> tuple[subprocess.Popen[bytes], int, str]:
            url = f"http://127.0.0.1:{mport}/metrics"
            log = work / "coordinator.log"
            since = log.stat().st_size if log.exists() else 0  # earlier tries' lines
            proc = start(
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
            try:
                _wait_metrics(url, proc, 30.0, log, since)
            except PortTaken:
                daemons.remove(proc)  # it exited
                raise
            return proc, port, url

        try:
            coord, port, metrics_url = on_free_ports(coordinator, opts.metrics_port)
        except PortTaken as e:
            raise RunError(f"the coordinator could not start: {e}") from None
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
            f"{metrics_url}, findings {jsonl}, incidents {incidents}, state {state}",
            file=out,
            flush=True,
        )

        def live(f: dict[str, Any]) -> None:
            if f.get("job") == job and f["state"] in ("flagged", "cleared"):
                print(one_line(f), file=out, flush=True)

        follower = _Follower(jsonl, live)
        # The job shares our foreground process group, so the terminal's Ctrl-C
        # reaches it directly; we ignore SIGINT while it runs and let it decide.
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            job_proc = subprocess.Popen(list(opts.command), env=env)
            code = job_proc.wait()
        finally:
            signal.signal(signal.SIGINT, old)
        code = code if code >= 0 else 128 - code
        end = time.monotonic() + opts.settle_timeout_s
        seen = census(shm, job)
        # The coordinator ends a job once it has scored its last window; a job that
        # never filled one (or ran no collective) sends it nothing to score or end, and
        # waiting for that end was a 30 s wait for nothing.
        pending = seen.collectives_seen and not (
            seen.done and not full_window_possible(seen, opts.window_steps, opts.colls_per_step)
        )
        quiet_at = time.monotonic() + 5.0
        while pending and not _job_ended(work / "coordinator.log", job):
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
            # A job whose rings are all done and of which nothing was scored after a
            # few seconds never filled a window the agent could send (its collectives
            # per step were more than one): nothing will end it.
            if seen.done and time.monotonic() > quiet_at:
                scored = _metrics_text(metrics_url)
                if not metric_value(scored, "straggler_windows_scored_total", job):
                    break
                quiet_at = time.monotonic() + 1.0
            time.sleep(0.1)
        follower.stop()
        metrics = _metrics_text(metrics_url)
        _stop(daemons)  # the store flushed and closed before it is read
        ended = _job_ended(work / "coordinator.log", job)
        windows = _windows_scored(store, job, metrics, ended)
        seen = census(shm, job)  # again: the rings are all finished by now
        mine = [f for f in follower.findings if f.get("job") == job]
        lines = [watched_line(seen, windows)]
        if not seen.collectives_seen:
            lines += no_collective_lines(seen, "NCCL_PROFILER_PLUGIN" in env)
        elif windows == 0 and not full_window_possible(
            seen, opts.window_steps, opts.colls_per_step
        ):
            lines.append(short_job_line(seen, opts.window_steps, opts.colls_per_step))
        elif windows == 0:
            lines.append(no_window_line(seen, opts.window_steps))
        lines += summary_lines(mine)
        # the coordinator writes incidents.jsonl next to the findings (DESIGN "Incidents")
        lines += incident_lines(incidents, job)
        for line in lines:
            print(line, file=out, flush=True)
        _end_of_run(opts, out, job, seen, windows, code, mine, store, jsonl, plans, out_dir)
        return code
    finally:
        if follower is not None:
            follower.stop()
        _stop(daemons)
        if not opts.keep_workdir:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"[artemis] logs and rings kept in {work}", file=out, flush=True)


def _stop(daemons: list[subprocess.Popen[bytes]]) -> None:
    for p in reversed(daemons):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in daemons:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _end_of_run(
    opts: RunOptions,
    out: TextIO,
    job: str,
    seen: RingCensus,
    windows: int,
    code: int,
    findings: list[dict[str, Any]],
    store: str,
    jsonl: Path,
    plans: Path,
    out_dir: Path,
) -> None:
    """The report (when there was an incident), --summary-json, and where it all is."""
    from artemis.report.load import ReportError
    from artemis.store import StoreError

    incidents = jsonl.parent / "incidents.jsonl"
    latest = latest_incidents(incidents, job)
    if latest:
        try:
            path = _report(store, jsonl, plans, job, out_dir)
            print(f"[artemis] report {path}", file=out, flush=True)
        except (ReportError, StoreError, OSError) as e:
            print(f"[artemis] no report: {e}", file=out, flush=True)
    if opts.summary_json is not None:
        obj = summary_json(job, seen, windows, code, findings, latest)
        try:
            opts.summary_json.write_text(json.dumps(obj, indent=1) + "\n")
        except OSError as e:
            print(f"[artemis] --summary-json {opts.summary_json}: {e.strerror}", file=out)
    print(
        f"[artemis] findings {jsonl}, incidents {incidents}, state {out_dir / 'state'}",
        file=out,
        flush=True,
    )
