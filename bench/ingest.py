"""Coordinator ingest: rank-window summaries scored per second on one core, over loopback.

``python -m bench ingest``. A real ``ProtocolServer`` (TCP, uvloop where present)
with the real ``Coordinator`` app (window assembly, detector, ``FindingsWriter``
and ``PlansWriter`` to temporary files, Prometheus ``Metrics``) runs in a process
pinned to one core. N real ``AgentLink`` clients (one host of 8 ranks each, all
ranks of one job) run in another process on the other cores; each sends W
``Windows`` messages (its 8 ranks' summaries of one window, with full telemetry,
one rank slow so every window writes a finding). The figure is end to end:
from the first data frame the server read to the moment the last window was
scored, summaries / s. Baseline in the same run: the same server whose app's
``on_message`` does nothing (transport, framing, auth, codec, dedup, acks only).

The clients queue every message before they connect (AgentLink encodes on
enqueue), so the client process only sends frames and reads acks while the
server is timed. Each row is the median of RUNS runs.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

RANKS_PER_AGENT = 8
TOTAL = 65536  # summaries per run
AGENTS = (8, 32, 64)
RUNS = 3
JOB = "bench-job"
COMM = "00000000bench001"
SECRET = b"bench ingest secret, 32 bytes.."
SLOW = 5


def _window(rank: int, nranks: int, w: int, host: str) -> Any:
    from artemis.protocol.records import RankWindow, Telemetry

    gap = 80.0 * (1.3 if rank == SLOW else 1.0 + 0.002 * (rank % 7))
    return RankWindow(
        job=JOB, comm=COMM, rank=rank, nranks=nranks, host=host, window=w,
        step_lo=w * 50, step_hi=(w + 1) * 50, coll_lo=w * 200, coll_hi=(w + 1) * 200,
        gap_ms=gap, coll_ms=18.25, step_ms=120.0, collectives=200, bytes=1 << 33, lost=0,
        clock="device", island="nvidia", hw_class="H100",
        telemetry=Telemetry(
            vendor="nvidia", gpu_model="NVIDIA H100 80GB HBM3", gpu_index=rank % 8,
            sm_mhz=1410.0, sm_mhz_max=1980.0, mem_mhz=2619.0, temp_c=61.0, power_w=400.0,
            power_limit_w=700.0, throttle={"hw_thermal": False, "sw_power_cap": False},
            pcie_gen=5, pcie_gen_max=5, pcie_width=16, pcie_width_max=16, cpu_pct=35.0,
            steal_pct=0.0, iowait_pct=0.1, psi_cpu_some=0.5, load1=12.0, ncpu=96,
            proc_cpu_pct=101.0,
        ),
    )  # fmt: skip


class _NullApp:
    async def on_message(self, peer: Any, msg: Any) -> None:
        return None

    def on_disconnect(self, peer: Any) -> None:
        return None


class _Counting:
    """Counts summaries handed to the app; done when every window was handed over and,
    for the coordinator, scored."""

    def __init__(self, inner: Any, total: int, windows: int, coord: Any) -> None:
        self.inner, self.total, self.windows, self.coord = inner, total, windows, coord
        self.seen = 0
        self.t_first: float | None = None
        self.t_done: float | None = None
        self.done = asyncio.Event()

    def on_connect(self, peer: Any) -> None:
        cb = getattr(self.inner, "on_connect", None)
        if cb is not None:
            cb(peer)

    def on_disconnect(self, peer: Any) -> None:
        self.inner.on_disconnect(peer)

    async def on_message(self, peer: Any, msg: Any) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()
        await self.inner.on_message(peer, msg)
        self.seen += len(getattr(msg, "windows", ()))
        if self.seen >= self.total and not self.done.is_set():
            if self.coord is not None:
                js = self.coord.monitors.get(JOB)
                if js is None or js.last_window < self.windows - 1 or self.coord.assembler.pending:
                    return
            self.t_done = time.perf_counter()
            self.done.set()


def _quiet() -> None:
    """The daemons' log lines (connects, flags) would flood the table."""
    import logging

    import structlog

    level = logging.ERROR if os.environ.get("BENCH_INGEST_ERRORS") else logging.CRITICAL
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
    logging.getLogger("straggler").setLevel(logging.CRITICAL)


def _server(mode: str, agents: int, windows: int, port_out: Connection, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    _quiet()
    from artemis.protocol.aio import run

    run(_serve(mode, agents, windows, port_out))


async def _serve(mode: str, agents: int, windows: int, out: Connection) -> None:
    from artemis.coordinator.findings import FindingsWriter
    from artemis.coordinator.metrics import Metrics
    from artemis.coordinator.plans import PlansWriter
    from artemis.coordinator.service import Coordinator
    from artemis.coordinator.settings import Settings
    from artemis.protocol.server import ProtocolServer
    from artemis.protocol.tcp import TcpTransport

    nranks = agents * RANKS_PER_AGENT
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        coord = None
        inner: Any = _NullApp()
        if mode == "coordinator":
            coord = Coordinator(
                Settings.from_mapping({}),
                FindingsWriter(Path(tmp) / "findings.jsonl"),
                PlansWriter(Path(tmp) / "plans.jsonl"),
                Metrics(),
                deadline_s=60.0,
                # No grace after start: every rank is announced below, before any window.
                grace_s=0.0,
            )
            # Every agent of the job announced its ranks (as their hellos do) before
            # the first window: windows are released complete, never by deadline.
            coord.assembler.expect(JOB, range(nranks))
            inner = coord
        app = _Counting(inner, nranks * windows, windows, coord)
        server = ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, app)
        if coord is not None:
            coord.server = server
        address = await server.start()
        out.send(address)
        try:
            await asyncio.wait_for(
                app.done.wait(), float(os.environ.get("BENCH_INGEST_TIMEOUT", 600))
            )
        except asyncio.TimeoutError:
            js = coord.jobs.get(JOB) if coord is not None else None
            print(
                f"bench server stuck: {app.seen}/{app.total} summaries,"
                f" last window {js.last_window if js else None},"
                f" pending {coord.assembler.pending if coord else None},"
                f" stats {server.stats.snapshot()}",
                file=sys.stderr,
                flush=True,
            )
            raise
        assert app.t_first is not None and app.t_done is not None
        out.send(app.t_done - app.t_first)
        await server.close()
        if coord is not None:
            coord.flush()


def _clients(address: str, agents: int, windows: int, cpus: set[int], out: Connection) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    _quiet()
    from artemis.protocol.aio import run

    run(_drive(address, agents, windows, out))


async def _drive(address: str, agents: int, windows: int, out: Connection) -> None:
    from artemis.protocol.client import AgentIdentity, AgentLink
    from artemis.protocol.messages import RankInfo, Windows
    from artemis.protocol.tcp import TcpTransport

    nranks = agents * RANKS_PER_AGENT
    links = []
    for a in range(agents):
        host = f"node-{a:03d}"
        ranks = range(a * RANKS_PER_AGENT, (a + 1) * RANKS_PER_AGENT)
        ident = AgentIdentity(
            agent_id=host,
            host=host,
            agent_version="bench",
            ranks=tuple(RankInfo(JOB, COMM, r, nranks) for r in ranks),
        )
        link = AgentLink(
            TcpTransport(), address, SECRET, ident, outbox_capacity=windows + 16,
            outbox_max_bytes=1 << 30,
        )  # fmt: skip
        for w in range(windows):
            link.enqueue(
                Windows(host=host, windows=tuple(_window(r, nranks, w, host) for r in ranks))
            )
        links.append(link)
    for link in links:
        link.start()
    for link in links:
        while link.stats.buffered:
            await asyncio.sleep(0.01)
    await asyncio.gather(*(link.close(timeout=1.0) for link in links))
    out.send("ok")


def measure(mode: str, agents: int) -> float:
    """Summaries/s of one run."""
    windows = max(1, TOTAL // (agents * RANKS_PER_AGENT))
    ctx = mp.get_context("spawn")
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[0]
    client_cpus = set(cpus[1:]) or {server_cpu}
    s_parent, s_child = ctx.Pipe()
    c_parent, c_child = ctx.Pipe()
    srv = ctx.Process(target=_server, args=(mode, agents, windows, s_child, server_cpu))
    srv.start()
    try:
        if not s_parent.poll(60):
            raise RuntimeError("bench server did not start")
        address = s_parent.recv()
        cli = ctx.Process(target=_clients, args=(address, agents, windows, client_cpus, c_child))
        cli.start()
        try:
            if not s_parent.poll(600):
                raise RuntimeError("bench server did not finish")
            elapsed = float(s_parent.recv())
            c_parent.poll(60)
        finally:
            cli.join(30)
            if cli.is_alive():
                cli.kill()
                cli.join()
    finally:
        srv.join(30)
        if srv.is_alive():
            srv.kill()
            srv.join()
    return agents * RANKS_PER_AGENT * windows / elapsed


def main() -> int:
    cpus = sorted(os.sched_getaffinity(0))
    print(
        f"coordinator ingest over loopback TCP: server pinned to cpu {cpus[0]}, "
        f"clients on {cpus[1:] or cpus[:1]}; {RANKS_PER_AGENT} ranks per agent, "
        f"~{TOTAL} summaries per run, median of {RUNS} runs"
    )
    hdr = (
        f"{'agents':>6} {'ranks':>6} {'windows':>7} {'null app /s':>12} "
        f"{'coordinator /s':>15} {'ratio':>6} {'goal 50k':>8}"
    )
    print(hdr)
    print("-" * len(hdr))
    for n in AGENTS:
        null = statistics.median(measure("null", n) for _ in range(RUNS))
        full = statistics.median(measure("coordinator", n) for _ in range(RUNS))
        ok = "yes" if full >= 50_000 else "no"
        print(
            f"{n:>6} {n * RANKS_PER_AGENT:>6} {TOTAL // (n * RANKS_PER_AGENT):>7} "
            f"{null:>12,.0f} {full:>15,.0f} {full / null:>6.2f} {ok:>8}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
