"""The simulated cluster: real coordinator, real agents, real plugin, simulated GPUs.

One `artemis-coordinator serve` process, one `artemis-agent run` process per
simulated host (each with its own shm dir, as on separate machines), and one
job process per host (sim/hostproc.py) driving the real compiled plugin through
the NCCL stand-in. Everything talks over loopback TCP with a real shared
secret. The orchestrator only starts, watches and stops processes; it injects
`agent_down` faults by killing an agent when the job reaches the fault's
window, or with `on_plan` by starting it with the agent's failpoint, which makes
it exit right after it publishes a rebalance plan (and starting it again, without
the failpoint, at its end_window, if it has one).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from artemis.agent.plans import FAILPOINT_ENV, FAILPOINT_EXIT
from artemis.common.ports import error_line, on_free_ports, port_taken
from artemis.common.tomlfile import toml_value
from artemis.sim.gpustate import write_initial
from artemis.sim.hostproc import metric_value
from artemis.sim.scenario import Scenario, load_scenario
from artemis.sim.telemetry import write_telemetry

log = structlog.get_logger("artemis.sim")

# Sim defaults for the coordinator, overridable by the scenario's [detector]:
# in virtual time the run is much shorter than the job it simulates, so hangs
# are judged with a short floor.
SIM_DETECTOR_DEFAULTS: dict[str, Any] = {"hang_floor_s": 2.0}


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found next to {sys.executable} or on PATH")
    return found


@dataclass
class SimResult:
    ok: bool
    findings: Path
    plans: Path | None
    windows_scored: int
    elapsed_s: float
    reason: str = ""
    workdir: Path | None = None


@dataclass
class SimOptions:
    jsonl: Path
    plans_jsonl: Path | None = None
    metrics_port: int | None = None
    speed: str = "virtual"  # virtual | realtime
    window_s: float | None = None  # realtime: wall seconds per window (None = true step_ms)
    rebalance: str | None = None  # override of [detector].rebalance
    corrections: str | None = None  # override of [detector].corrections (issue 29)
    workdir: Path | None = None
    keep_workdir: bool = False
    timeout_s: float = 300.0
    log_dir: Path | None = None
    report_dir: Path | None = None  # the coordinator writes the job's report here at its end
    # The coordinator's store URL (None: its default, a file next to the findings). Runs
    # that share one compare each job with the stored baselines of its workload.
    store: str | None = None
    on_tick: Callable[[SimContext], None] | None = None
    on_end: Callable[[SimContext], None] | None = None  # after the last window, before the stop
    # after the agents started, before the job does (given the metrics URL): e.g. wait
    # until every agent is connected
    before_job: Callable[[str], None] | None = None
    # Where the processes run (the partition tests, docs/RELIABILITY.md): the address the
    # coordinator listens on, a rewrite of an agent's command line (its host index,
    # argv: e.g. run it in another network namespace, point it at another address) and
    # extra keys of an agent's TOML, per host.
    listen: str = "127.0.0.1"
    agent_argv: Callable[[int, list[str]], list[str]] | None = None
    agent_toml: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass
class SimContext:
    scenario: Scenario
    metrics_url: str
    findings: Path
    plans: Path | None
    started: float
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    killed_agents: set[int] = field(default_factory=set)
    revived_agents: set[int] = field(default_factory=set)
    # SIGKILL processes of `procs` and start them again as they were started, their logs
    # appended to (tests/kills.py); under `lock`, which the watch holds while it checks
    # the processes, so a kill is never taken for a crash.
    kill_restart: Callable[[list[str]], None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class SimCluster:
    def __init__(self, scenario_path: str | Path, opts: SimOptions) -> None:
        self.path = Path(scenario_path)
        self.sc = load_scenario(self.path)
        self.opts = opts
        self.job = f"{self.path.stem}-sim"
        self._argv: dict[str, tuple[list[str], Path]] = {}  # name -> how it was started
        # hosts of on_plan agent_down faults: their agents exit after the first plan
        self._failpoint_hosts = {
            self.sc.host_of(r) for f in self.sc.faults if f.on_plan for r in f.ranks
        }

    def run(self) -> SimResult:
        opts, sc = self.opts, self.sc
        own_tmp = opts.workdir is None
        work = Path(opts.workdir or tempfile.mkdtemp(prefix="artemis-sim-"))
        work.mkdir(parents=True, exist_ok=True)
        logs = opts.log_dir or work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            secret = work / "secret"
            secret.write_text(secrets.token_hex(32))
            os.chmod(secret, 0o600)
            shm = {h: work / "shm" / sc.host_name(h) for h in range(sc.hosts)}
            for d in shm.values():
                d.mkdir(parents=True, exist_ok=True)
            plan = write_telemetry(sc, self.job, shm)

            det = {**SIM_DETECTOR_DEFAULTS, **sc.detector}
            if opts.rebalance is not None:
                det["rebalance"] = opts.rebalance
            if opts.corrections is not None:
                det["corrections"] = opts.corrections
            ccfg = work / "coordinator.toml"
            lines = [
                f"assembly_deadline_s = {2.0 if opts.speed == 'virtual' else 3.0}",
                "tick_s = 0.1",
                'metrics_addr = "127.0.0.1"',
                f"global_batch = {sc.global_batch}",
                f"control_socket = {json.dumps(str(work / 'coordinator.sock'))}",
                *(
                    [f"report_dir = {toml_value(str(opts.report_dir.resolve()))}"]
                    if opts.report_dir is not None
                    else []
                ),
                *([f"store = {toml_value(opts.store)}"] if opts.store is not None else []),
                "[detector]",
                *(f"{k} = {toml_value(v)}" for k, v in det.items()),
            ]
            ccfg.write_text("\n".join(lines) + "\n")
            opts.jsonl.parent.mkdir(parents=True, exist_ok=True)
            for p in (opts.jsonl, opts.plans_jsonl):
                if p is not None and p.exists():
                    p.unlink()
            plans = opts.plans_jsonl or work / "plans.jsonl"

            def coordinator(port: int, mport: int) -> tuple[int, str]:
                procs["coordinator"] = self._spawn(
                    "coordinator",
                    [
                        _bin("artemis-coordinator"),
                        "serve",
                        "--listen",
                        f"{opts.listen}:{port}",
                        "--metrics-port",
                        str(mport),
                        "--jsonl",
                        str(opts.jsonl),
                        "--plans-jsonl",
                        str(plans),
                        "--secret-file",
                        str(secret),
                        "--config",
                        str(ccfg),
                        "--log-json",
                    ],
                    logs / "coordinator.log",
                )
                murl = f"http://127.0.0.1:{mport}/metrics"
                self._wait_metrics(murl, procs["coordinator"], logs / "coordinator.log")
                return port, murl

            # ports picked free can be taken before the coordinator binds them
            # (common/ports.py): it is started again on others
            port, murl = on_free_ports(coordinator, opts.metrics_port)

            agent_keys: dict[str, Any] = {
                "telemetry": ["simulated"],
                "poll_interval_s": 0.05,
                "heartbeat_s": 0.5,
                "scan_interval_s": 0.2,
                "window_steps": sc.window_steps,
                "remove_finished": False,
                # The simulated GPUs are the sim's own: its nodes consent to corrections
                # (a test turns it off with agent_toml {"policy.allow_corrections": False}).
                "policy.allow_corrections": True,
            }
            for h in range(sc.hosts):
                acfg = work / ("agent.toml" if h not in opts.agent_toml else f"agent-{h}.toml")
                keys = {
                    **agent_keys,
                    "state_dir": str(work / "agent-state" / sc.host_name(h)),
                    **opts.agent_toml.get(h, {}),
                }
                acfg.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items()))
                argv = [
                    _bin("artemis-agent"),
                    "run",
                    "--coordinator",
                    f"127.0.0.1:{port}",
                    "--shm-dir",
                    str(shm[h]),
                    "--secret-file",
                    str(secret),
                    "--host",
                    sc.host_name(h),
                    "--config",
                    str(acfg),
                    "--log-json",
                ]
                if opts.agent_argv is not None:
                    argv = opts.agent_argv(h, argv)
                # on_plan agent_down: the first start only (a restart has no failpoint)
                fp = {FAILPOINT_ENV: "exit_after_plan"} if h in self._failpoint_hosts else {}
                procs[f"agent-{h}"] = self._spawn(
                    f"agent-{h}", argv, logs / f"agent-{h}.log", extra_env=fp
                )
            if opts.before_job is not None:
                opts.before_job(murl)
            scale = 1.0
            if opts.speed == "realtime" and opts.window_s:
                scale = opts.window_s / (sc.window_steps * sc.step_ms / 1000.0)
            hang = any(f.kind == "hang" for f in sc.faults)
            # One id for every host of this run, new each run (as NCCL's unique id):
            # the communicator hashes follow from it.
            run = secrets.token_hex(8)
            # the GPUs' settings, beside each rank's ring-to-be (sim/gpustate.py)
            write_initial(sc, self.job, run, work / "shm", plan)
            for h in range(sc.hosts):
                procs[f"host-{h}"] = self._spawn(
                    f"host-{h}",
                    [
                        sys.executable,
                        "-m",
                        "artemis.sim.hostproc",
                        "--scenario",
                        str(self.path),
                        "--host",
                        str(h),
                        "--shm-dir",
                        str(shm[h]),
                        "--job",
                        self.job,
                        "--metrics-url",
                        murl,
                        "--speed",
                        opts.speed,
                        "--scale",
                        str(scale),
                        "--findings",
                        str(opts.jsonl),
                        "--hang-wait-s",
                        "60",
                        "--run",
                        run,
                    ],
                    logs / f"host-{h}.log",
                )
            ctx = SimContext(sc, murl, opts.jsonl, plans, t0, procs)
            ctx.kill_restart = lambda names: self._kill_restart(ctx, names)
            reason = self._watch(ctx, hang)
            ok = reason == ""
            if opts.on_end is not None:
                opts.on_end(ctx)
            scored = int(metric_value(murl, "straggler_windows_scored_total") or 0)
            self._stop_all(procs)
            return SimResult(
                ok=ok,
                findings=opts.jsonl,
                plans=plans,
                windows_scored=scored,
                elapsed_s=time.monotonic() - t0,
                reason=reason,
                workdir=work,
            )
        finally:
            self._stop_all(procs)
            if own_tmp and not opts.keep_workdir:
                shutil.rmtree(work, ignore_errors=True)

    # ------------------------------------------------------------------ helpers
    def _spawn(
        self,
        name: str,
        argv: list[str] | None = None,
        logfile: Path | None = None,
        *,
        append: bool = False,
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        if argv is None or logfile is None:
            argv, logfile = self._argv[name]
        self._argv[name] = (argv, logfile)
        f = open(logfile, "ab" if append else "wb")  # noqa: SIM115 - owned by the child
        env = {**os.environ, **(extra_env or {})}
        env.setdefault("PYTHONUNBUFFERED", "1")
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)

    def _kill_restart(self, ctx: SimContext, names: list[str]) -> None:
        with ctx.lock:
            for n in names:
                p = ctx.procs[n]
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                p.wait()
            for n in names:
                ctx.procs[n] = self._spawn(n, append=True)

    def _wait_metrics(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if proc.poll() is not None:
                why = error_line(log)
                raise port_taken(why) or RuntimeError(
                    f"coordinator exited early with code {proc.returncode}"
                    + (f": {why}" if why else f" (its log: {log})")
                )
            # 0 until the agents' port is bound too (coordinator/server_main.py)
            if metric_value(url, "straggler_detector_active") == 1:
                return
            time.sleep(0.05)
        raise RuntimeError("coordinator metrics did not come up within 30 s")

    def _watch(self, ctx: SimContext, hang: bool) -> str:
        sc, opts = self.sc, self.opts
        last_window = sc.windows - 1
        downs = {f.start_window: f for f in sc.faults if f.kind == "agent_down"}
        end = time.monotonic() + opts.timeout_s
        hosts_done_at: float | None = None
        while time.monotonic() < end:
            if opts.on_tick is not None:
                opts.on_tick(ctx)
            lw = metric_value(ctx.metrics_url, "straggler_last_window")
            cur = int(lw) if lw is not None else -1
            for start, f in downs.items():
                for r in f.ranks:
                    h = sc.host_of(r)
                    down = h in ctx.killed_agents or h in ctx.revived_agents
                    # on_plan: the agent exits by itself (its failpoint), seen below
                    if cur >= start - 1 and not down and not f.on_plan:
                        p = ctx.procs[f"agent-{h}"]
                        p.send_signal(signal.SIGKILL)
                        p.wait()
                        ctx.killed_agents.add(h)
                        log.info("agent killed (agent_down fault)", host=sc.host_name(h))
                    # An end_window brings the agent back (a supervisor restarting it).
                    back = f.end_window is not None and cur >= f.end_window - 1
                    if back and h in ctx.killed_agents and h not in ctx.revived_agents:
                        with ctx.lock:
                            ctx.procs[f"agent-{h}"] = self._spawn(f"agent-{h}", append=True)
                        ctx.revived_agents.add(h)
                        ctx.killed_agents.discard(h)
                        log.info("agent restarted (agent_down fault ended)", host=sc.host_name(h))
            with ctx.lock:
                for name, p in ctx.procs.items():
                    rc = p.poll()
                    if rc is not None and rc != 0 and not name.startswith("agent-"):
                        return f"{name} exited with code {rc}"
                    if rc is not None and name.startswith("agent-"):
                        h = int(name.split("-")[1])
                        down = h in ctx.killed_agents or h in ctx.revived_agents
                        if rc == FAILPOINT_EXIT and h in self._failpoint_hosts and not down:
                            # it published the plan its ranks act on and exited before
                            # forwarding any of their acknowledgements (on_plan)
                            ctx.killed_agents.add(h)
                            log.info("agent exited after the plan (agent_down fault, on_plan)")
                        elif h not in ctx.killed_agents:
                            return f"{name} exited with code {rc}"
            hosts_alive = [
                p for n, p in ctx.procs.items() if n.startswith("host-") and p.poll() is None
            ]
            if hang:
                if _has_kind(ctx.findings, "hang") and not hosts_alive:
                    return ""
            elif cur >= last_window:
                return ""
            if not hosts_alive:
                # Every job process finished: give the pipeline time to drain.
                hosts_done_at = hosts_done_at or time.monotonic()
                if time.monotonic() - hosts_done_at > 30:
                    return f"pipeline did not score the last window (reached {cur})"
            time.sleep(0.1)
        return f"timed out after {opts.timeout_s:.0f} s"

    def _stop_all(self, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        # Job processes first, then agents, the coordinator last (it flushes).
        order = [n for n in procs if n.startswith("host-")]
        order += [n for n in procs if n.startswith("agent-")]
        order += [n for n in procs if n == "coordinator"]
        for n in order:
            stop_process(procs[n])


def stop_process(p: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM (a daemon flushes its outputs on it), then SIGKILL past ``timeout_s``."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _has_kind(path: Path, kind: str) -> bool:
    if not path.exists():
        return False
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("kind") == kind:
                return True
        except json.JSONDecodeError:
            continue
    return False
