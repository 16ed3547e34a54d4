"""One simulated host's training processes: drive the real plugin for this host's ranks.

Run as `python -m artemis.sim.hostproc ...` by the orchestrator (sim/cluster.py),
one process per simulated host. Every host process evaluates the same
deterministic lockstep model (same scenario, same seed) and emits only its own
ranks' collectives, through the NCCL stand-in, into the real plugin, whose
rings land in this host's shm dir for this host's agent to read.

Pacing, in virtual time: before window w the process waits until the
coordinator has scored window w - LAG (read from its metrics endpoint). That
keeps every host within a window or two of the coordinator, so a rebalance
plan (which names a step several windows ahead) always arrives before its
step, whatever the machine's speed; the records themselves carry only virtual
time, so a run's data is the same however long the waiting took.
In real time (the demo), each step takes step_ms x scale of wall time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from artemis.sim.gpustate import GpuStates, main_comm
from artemis.sim.model import TP_BYTES, LockstepModel
from artemis.sim.scenario import Scenario, load_scenario, nccl_code
from artemis.sim.telemetry import write_telemetry

log = structlog.get_logger("artemis.sim")

LAG = 1  # windows a host may run ahead of the coordinator's scoring
CHANNELS = 2
CHANNEL_SKEW_NS = 800  # channels of one collective start and stop a little apart


def comm_hash(job: str, name: str, run: str = "") -> int:
    """A 64-bit communicator hash, the same in every host process of one run and new
    with each run, as NCCL's (it derives from the run's unique id): the coordinator
    tells a new run of a job id from a resend by it (docs/DESIGN.md, "Runs")."""
    lo = zlib.crc32(f"{job}/{name}/{run}".encode())
    hi = zlib.crc32(f"{run}/{name}/{job}".encode())
    return (hi << 32) | lo


def metric_value(url: str, name: str, timeout: float = 1.0) -> float | None:
    """A sample from a Prometheus exposition, or None: the series of `name` over its
    labels (a simulated run has one job): summed for counters (`_total`), else the max."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return None  # not up yet, or gone mid-answer (a coordinator killed while scraped)
    values = []
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            try:
                values.append(float(line.rsplit(" ", 1)[1]))
            except ValueError:
                continue
    if not values:
        return None
    return sum(values) if name.endswith("_total") else max(values)


class Pacer:
    def __init__(self, metrics_url: str | None, speed: str, step_wall_s: float) -> None:
        self.url = metrics_url
        self.speed = speed
        self.step_wall_s = step_wall_s
        self.t0 = time.monotonic()
        self.steps_done = 0

    def before_window(self, w: int, start_free: int = 0, deadline_s: float = 120.0) -> None:
        """Wait until the coordinator scored window w - LAG - 1. The first `start_free`
        windows run unpaced: the agents infer each step's collectives from the pattern
        and need a few hundred collectives before they can close a first window."""
        if self.speed != "virtual" or self.url is None or w < start_free:
            return
        need = w - LAG - 1
        if need < 0:
            return
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            # The last window gauge alone: a restarted coordinator publishes the one its
            # restored state scored before it scores one itself (its counter starts at 0).
            v = metric_value(self.url, "straggler_last_window")
            if v is not None and v >= need:
                return
            time.sleep(0.02)
        print(
            f"hostproc: coordinator did not reach window {need} in {deadline_s}s", file=sys.stderr
        )

    def after_step(self) -> None:
        self.steps_done += 1
        if self.speed == "realtime":
            target = self.t0 + self.steps_done * self.step_wall_s
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def plan_split(
    shm: Path, job: str, sc: Scenario
) -> tuple[int | None, list[int] | None, str | None]:
    """The plan published on this host: (apply_at_step, samples per rank, id).

    Read through the file contract (``artemis.rebalance.files``); a plan that is
    malformed or for another shape counts as none, as it does for the job's client.
    """
    from artemis.rebalance.files import PlanFormatError, read_plan

    try:
        rec = read_plan(shm, job)
    except (PlanFormatError, ValueError, OSError):
        return None, None, None
    if rec is None:
        return None, None, None
    samples = list(rec["samples"])
    if len(samples) != sc.ranks or rec["global_batch"] != sc.global_batch:
        return None, None, None
    return rec["apply_at_step"], samples, rec["id"]


def run_host(
    scenario: Path,
    host: int,
    shm: Path,
    job: str,
    metrics_url: str | None,
    speed: str,
    scale: float,
    findings: Path | None,
    hang_wait_s: float,
    *,
    run: str = "",
) -> int:
    from artemis.agent.plugin_path import plugin_path
    from artemis.ring.writer import BridgeRingWriter
    from artemis.sim.nccl import RUNTIMES, NcclStandIn

    sc = load_scenario(scenario)
    model = LockstepModel(sc)
    os.environ["ARTEMIS_SHM_DIR"] = str(shm)
    os.environ["ARTEMIS_JOB"] = job
    shm.mkdir(parents=True, exist_ok=True)
    local = [r for r in range(sc.ranks) if sc.host_of(r) == host]
    # The host's software ([software], [software.hosts.N]) as a real job carries it:
    # its env in this process's environment, its NCCL version behind ncclGetVersion of
    # the stand-in NCCL the plugin is called from (docs/DESIGN.md "Scenario files").
    if local:
        sw = sc.software_of(local[0])
        os.environ.update(sw["env"])
        os.environ["ARTEMIS_STANDIN_NCCL_VERSION"] = str(nccl_code(sw["nccl"]))
    lib = plugin_path()
    runtime = "nccl" if (lib.parent / "standin" / RUNTIMES["nccl"]).exists() else None
    if runtime is None:
        log.warning("no stand-in NCCL beside the plugin (make plugin): the ranks report no nccl")
    nccl = NcclStandIn(str(lib), version=7, runtime=runtime)
    comms: dict[int, Any] = {}
    tp_comms: dict[int, Any] = {}
    for r in local:
        island = sc.islands[r]
        # its island's, or with tp > 1 its TP position's data-parallel communicator
        name, members = main_comm(sc, r)
        os.environ["RANK"] = str(r)
        comms[r] = nccl.comm_init(
            comm_hash(job, name, run),
            members.index(r),
            len(members),
            nnodes=len({sc.host_of(m) for m in members}),
            name=name,
        )
        if sc.tp > 1:
            group = sc.tp_group(r)
            tname = f"{island}/tp{r // sc.tp}"
            tp_comms[r] = nccl.comm_init(
                comm_hash(job, tname, run), group.index(r), len(group), nnodes=1, name=tname
            )
    bridges: dict[int, Any] = {}
    if model.multi:
        for i, lead in enumerate(model.leaders):
            if lead in local:
                bridges[i] = BridgeRingWriter(
                    shm,
                    job,
                    comm_hash(job, f"bridge/{lead}", run),
                    lead,
                    sc.ranks,
                    host=sc.host_name(host),
                )

    from artemis.rebalance.split import uniform_split

    uniform = uniform_split(sc.global_batch, sc.ranks)
    clients: dict[int, Any] = {}
    if sc.honours_plans:
        from artemis.job import RebalanceClient

        for r in local:
            clients[r] = RebalanceClient(
                rank=r, world_size=sc.ranks, global_batch=sc.global_batch, job=job, shm_dir=str(shm)
            )

    from artemis.sim.clockfault import DeviceClock

    # A rank with a clock_anomaly fault: its timer values pass through its DeviceClock.
    clocks = {r: c for r in local if (c := DeviceClock.for_rank(sc, r)) is not None}
    step_wall = sc.step_ms / 1000.0 * scale
    pacer = Pacer(metrics_url, speed, step_wall)
    K = model.colls_per_step
    pattern = list(model.pattern) + (
        [type(model.pattern[0])("Broadcast", 1 << 20, 0.0, 0.0)] if model.multi else []
    )
    hung: list[Any] = []
    # The GPUs' settings (sim/gpustate.py): a correction ends a clocks or power fault.
    gpus = GpuStates(sc, job, run, shm.parent)
    try:
        # Enough whole windows for step inference (the agent needs >= 3 periods
        # and 2 x its 64-collective search span) before pacing starts.
        start_free = -(-(3 * 64 + 2 * K) // (sc.window_steps * K)) + 1
        for w in range(sc.windows):
            pacer.before_window(w, start_free)
            changed = gpus.update(w)
            if changed:
                model.sc = gpus.effective()
                mine = changed & set(local)
                if mine:  # this host's ranks read their GPU: their telemetry follows
                    write_telemetry(model.sc, job, {host: shm}, ranks=mine)
                log.info("gpu settings changed", window=w, ranks=sorted(changed))
            S = sc.window_steps
            samples = np.tile(np.asarray(uniform, dtype=np.float64), (S, 1))
            if clients:
                at, split, _pid = plan_split(shm, job, sc)
                if split is not None and at is not None:
                    for s in range(S):
                        if w * S + s >= at:
                            samples[s] = split
                    for c in clients.values():
                        for s in range(S):
                            c.samples_for_step(w * S + s)  # applies and acks the plan
            wt = model.window(w, samples)
            for s in range(S):
                step = w * S + s
                if wt.hang_step is not None and step == wt.hang_step:
                    hr = wt.hang_rank
                    for r in local:
                        if r == hr:
                            continue
                        c = pattern[0]
                        hung.append(
                            comms[r].begin_collective(
                                c.func, c.bytes // 4, "ncclFloat32", nchannels=CHANNELS
                            )
                        )
                    _wait_for_hang(findings, hang_wait_s)
                    return 0
                if wt.tp_arrive is not None and wt.tp_end is not None:
                    for j, nbytes in enumerate(TP_BYTES):
                        for r in local:
                            _emit(
                                tp_comms[r],
                                "AllReduce",
                                nbytes // 4,
                                "ncclFloat32",
                                int(wt.tp_arrive[s, r, j]),
                                int(wt.tp_end[s, r, j]),
                                None if r not in clocks else (clocks[r], w, s),
                            )
                for k in range(K):
                    c = pattern[k]
                    for r in local:
                        a = int(wt.arrive[s, r, k])
                        e = int(wt.end[s, r, k])
                        kt = [
                            (a + ch * CHANNEL_SKEW_NS, e - (CHANNELS - 1 - ch) * CHANNEL_SKEW_NS)
                            for ch in range(CHANNELS)
                        ]
                        if r in clocks:
                            kt = clocks[r].kernel_times(w, s, k, kt)
                        comms[r].collective(
                            c.func,
                            c.bytes if c.func in ("AllGather", "Broadcast") else c.bytes // 4,
                            "ncclInt8" if c.func in ("AllGather", "Broadcast") else "ncclFloat32",
                            nchannels=CHANNELS,
                            kernel_times=kt,
                        )
                    if model.multi and k == K - 2:
                        assert wt.bridge_start is not None and wt.bridge_end is not None
                        for i, bw in bridges.items():
                            other = (i + 1) % len(model.islands)
                            bw.append(
                                peer=other,
                                nbytes=16 << 20,
                                start=int(wt.bridge_start[s, i]),
                                end=int(wt.bridge_end[s, i]),
                                coll_seq=step * K + k + 1,
                            )
                pacer.after_step()
        return 0
    finally:
        for c in [*comms.values(), *tp_comms.values()]:
            c.finalize()
        for b in bridges.values():
            b.close(finish=True)


def _emit(
    comm: Any,
    func: str,
    count: int,
    dtype: str,
    arrive: int,
    end: int,
    clock: tuple[Any, int, int] | None = None,
) -> None:
    """One collective of one rank, its channels a little apart as a real kernel's
    (`clock`: the rank's DeviceClock, window and step, for a clock_anomaly fault)."""
    kt = [
        (arrive + ch * CHANNEL_SKEW_NS, end - (CHANNELS - 1 - ch) * CHANNEL_SKEW_NS)
        for ch in range(CHANNELS)
    ]
    if clock is not None:
        kt = clock[0].kernel_times(clock[1], clock[2], -1, kt)
    comm.collective(func, count, dtype, nchannels=CHANNELS, kernel_times=kt)


def _wait_for_hang(findings: Path | None, wait_s: float) -> None:
    """A hung job sits in its collective until the coordinator has seen the hang."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if findings is not None and findings.exists():
            for line in findings.read_text().splitlines():
                try:
                    if json.loads(line).get("kind") == "hang":
                        return
                except json.JSONDecodeError:
                    continue
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", required=True, type=Path)
    ap.add_argument("--host", required=True, type=int)
    ap.add_argument("--shm-dir", required=True, type=Path)
    ap.add_argument("--job", required=True)
    ap.add_argument("--metrics-url")
    ap.add_argument("--speed", choices=("virtual", "realtime"), default="virtual")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--findings", type=Path)
    ap.add_argument("--hang-wait-s", type=float, default=60.0)
    ap.add_argument("--run", default="", help="this run's id (the same on every host)")
    a = ap.parse_args(argv)
    return run_host(
        a.scenario,
        a.host,
        a.shm_dir,
        a.job,
        a.metrics_url,
        a.speed,
        a.scale,
        a.findings,
        a.hang_wait_s,
        run=a.run,
    )


if __name__ == "__main__":
    sys.exit(main())
