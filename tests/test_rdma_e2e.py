"""Agent and coordinator end to end over the RDMA transport (loopback adapter for the NIC).

Everything is the real thing except the queue pair: the compiled profiler
plugin driven through the NCCL ABI (sim/nccl.py) writes the rings, the real
agent (``AgentDaemon``) reads and summarises them and ships windows through its
``AgentLink`` over ``RdmaTransport``; the coordinator app (``Coordinator`` with
real findings/plans writers and metrics) sits behind a ``ProtocolServer`` on
an ``RdmaTransport`` too. Both ends share one event loop because the loopback
adapter pairs endpoints only within one process; the side channel is real TCP
on 127.0.0.1 with the real HMAC handshake.

The job: 4 ranks in lockstep, 2 all-reduces per step, rank 2 computes 20%
longer before each collective than its peers. 8 windows of 10 steps.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from artemis.agent.config import AgentConfig
from artemis.agent.daemon import AgentDaemon
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.service import Coordinator
from artemis.coordinator.sinks import FindingsWriter
from artemis.detect.settings import Settings
from artemis.protocol.client import AgentLink
from artemis.protocol.messages import RankInfo
from artemis.protocol.rdma import loopback
from artemis.protocol.rdma.loopback import LoopbackAdapter
from artemis.protocol.rdma.transport import RdmaTransport
from artemis.protocol.server import ProtocolServer
from artemis.protocol.session import AgentIdentity
from artemis.rebalance.outputs import PlansWriter
from artemis.sim.nccl import NcclStandIn, StandInComm

SECRET = b"rdma end-to-end shared secret"
JOB = "testjob"  # the shm_dir fixture exports ARTEMIS_JOB=testjob
HOST = "node-a"
NRANKS = 4
SLOW = 2
K = 2  # collectives per step
WINDOW_STEPS = 10
WINDOWS = 8
GAP_NS = 4_000_000  # compute before each collective
SLOW_GAP_NS = GAP_NS * 12 // 10  # 20% longer
XFER_NS = 1_000_000  # the collective's transfer once every rank has arrived
PATTERN = ((1 << 20), (1 << 18))  # element counts of the step's two all-reduces
COMM_HASH = 0xA27E_0001
# The loopback buffers are small, so bigger messages (the dump) travel fragmented.
BUFFER_SIZE = 4096
BUFFERS = 8

pytestmark = pytest.mark.timeout(90)


class Factory:
    """Makes loopback adapters and remembers them: which side opened a queue pair."""

    def __init__(self) -> None:
        self.made: list[LoopbackAdapter] = []

    def __call__(self, device: str | None, port: int, gid_index: int) -> LoopbackAdapter:
        a = LoopbackAdapter(device, port, gid_index)
        self.made.append(a)
        return a


def rdma(factory: Factory, secret: bytes | None) -> RdmaTransport:
    return RdmaTransport(factory, buffer_size=BUFFER_SIZE, buffers=BUFFERS, secret=secret)


async def until(
    what: str,
    cond: Callable[[], bool],
    timeout: float = 20.0,
    alive: asyncio.Task[None] | None = None,
) -> None:
    """Wait on the loop until ``cond`` holds; fail naming ``what`` after ``timeout``.

    With ``alive``, a task that ended meanwhile ends the wait at once: its
    exception is raised (a crashed agent must not read as a slow one).
    """
    end = time.monotonic() + timeout
    while not cond():
        if alive is not None and alive.done():
            alive.result()
            raise AssertionError(f"the agent stopped while waiting for: {what}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.01)


class Job:
    """The lockstep job: every rank's collectives through the real plugin.

    Device clocks differ per rank by an offset (no shared clock); a collective
    ends ``XFER_NS`` after the last rank arrived, so the fast ranks wait in it
    and only the slow rank's compute gap is longer.
    """

    def __init__(self, plugin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.nccl = NcclStandIn(plugin, 7)
        self.comms: list[StandInComm] = []
        for r in range(NRANKS):
            monkeypatch.setenv("RANK", str(r))  # the plugin's global rank
            c = self.nccl.comm_init(COMM_HASH, r, NRANKS, nnodes=1, name="dp")
            assert c.init_rc == 0 and c.context
            self.comms.append(c)
        self.t_end = 1_000_000_000  # shared virtual time of the last collective's end
        self.step = 0

    def run_windows(self, n: int) -> None:
        for _ in range(n * WINDOW_STEPS):
            for count in PATTERN:
                arrive = [
                    self.t_end + (SLOW_GAP_NS if r == SLOW else GAP_NS) for r in range(NRANKS)
                ]
                end = max(arrive) + XFER_NS
                for r, c in enumerate(self.comms):
                    off = r * 7_000_000_000
                    a, e = arrive[r] + off, end + off
                    c.collective(
                        "AllReduce",
                        count,
                        "ncclFloat32",
                        nchannels=2,
                        kernel_times=[(a, e - 300), (a + 200, e)],
                    )
                self.t_end = end
            self.step += 1

    def finish(self) -> None:
        self.nccl.finalize()


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 75))


@pytest.mark.parametrize(
    "remove_finished",
    [
        pytest.param(False, id="keep-rings"),
        pytest.param(True, id="remove-finished-rings"),
    ],
)
def test_agent_to_coordinator_over_rdma(
    plugin_lib: Path,
    shm_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    remove_finished: bool,
) -> None:
    findings_path = tmp_path / "out" / "findings.jsonl"
    plans_path = tmp_path / "out" / "plans.jsonl"
    metrics = Metrics()
    coord = Coordinator(
        Settings(),
        FindingsWriter(findings_path),
        PlansWriter(plans_path),
        metrics,
        deadline_s=30.0,
        grace_s=0.5,
    )
    coord_f, agent_f = Factory(), Factory()
    server = ProtocolServer(rdma(coord_f, SECRET), "127.0.0.1:0", SECRET, coord)
    coord.server = server

    def scored() -> float:
        return (
            metrics.registry.get_sample_value("straggler_windows_scored_total", {"job": JOB}) or 0.0
        )

    def findings() -> list[dict[str, Any]]:
        if not findings_path.exists():
            return []
        return [json.loads(x) for x in findings_path.read_text().splitlines()]

    job = Job(plugin_lib, monkeypatch)
    # Half the job runs before the agent starts (it announces the ranks it finds),
    # the rest while it is connected.
    job.run_windows(WINDOWS // 2)

    async def main() -> None:
        address = await server.start()
        cfg = AgentConfig(
            coordinator=address,
            shm_dir=str(shm_dir),
            host=HOST,
            transport="rdma",
            poll_interval_s=0.02,
            heartbeat_s=0.1,
            scan_interval_s=0.05,
            window_steps=WINDOW_STEPS,
            colls_per_step=K,
            telemetry=[],
            remove_finished=remove_finished,
        ).validated()
        stop = asyncio.Event()

        async def ticker() -> None:  # as coordinator/server_main.py drives it
            while not stop.is_set():
                await coord.tick()
                await asyncio.sleep(0.05)

        ticks = asyncio.create_task(ticker())
        daemon = AgentDaemon(cfg, rdma(agent_f, SECRET), SECRET, [])
        agent = asyncio.create_task(daemon.serve())
        try:
            await exercise(address, agent)
        finally:
            stop.set()
            daemon.should_exit = True
            await ticks
            try:
                await asyncio.wait_for(agent, 15)  # the agent ends cleanly (or raises)
            finally:
                await server.close()

    async def exercise(address: str, agent: asyncio.Task[None]) -> None:
        async def wait(what: str, cond: Callable[[], bool]) -> None:
            await until(what, cond, alive=agent)

        # ---- windows flow over RDMA and are scored
        # A window is cut once a step past it has arrived: windows 0..2 of the first 4.
        await wait("3 windows scored", lambda: scored() >= WINDOWS // 2 - 1)
        assert set(server.peers()) == {HOST}
        peer = server.peers()[HOST]
        assert sorted(r.rank for r in peer.ranks) == list(range(NRANKS))
        # One queue pair each side, and it is what carried the frames.
        assert len(coord_f.made) == len(agent_f.made) == 1
        assert coord_f.made[0].local_info()["gid"].startswith(loopback.GID_PREFIX)
        job.run_windows(WINDOWS - WINDOWS // 2)
        await wait("7 windows scored", lambda: scored() >= WINDOWS - 1)

        # ---- the slow rank is flagged, and only it
        fs = findings()
        flagged = [f for f in fs if f["state"] == "flagged"]
        assert [(f["kind"], f["rank"]) for f in flagged] == [("rank", SLOW)], fs
        assert flagged[0]["window"] == 3  # judged from window 1, flagged after 3 bad windows
        assert 1.15 <= flagged[0]["ratio"] <= 1.25, flagged[0]
        assert {f["rank"] for f in fs if f["kind"] in ("rank", "degraded")} == {SLOW}
        assert not [f for f in fs if f["kind"] == "missing"]
        flag = metrics.registry.get_sample_value(
            "straggler_flagged", {"job": JOB, "kind": "rank", "subject": str(SLOW)}
        )
        assert flag == 1.0
        step_ms = metrics.registry.get_sample_value("straggler_step_ms", {"job": JOB})
        want_step_ms = K * (SLOW_GAP_NS + XFER_NS) / 1e6  # the slow rank sets the pace
        assert step_ms is not None and abs(step_ms - want_step_ms) < 0.01

        # ---- control: coordinator -> agent over RDMA, acked, dump comes back
        cid = await server.send_control(HOST, "dump", {"job": JOB, "ranks": [SLOW]})
        ack = await server.control_result(cid, timeout=10)
        assert ack.ok and ack.detail == "1 dumps", ack
        assert server.stats.control_acks_total == 1
        dumps = coord.dump_dir
        await wait("dump written", lambda: any(dumps.glob(f"{JOB}-r{SLOW}-*.jsonl")))
        (dump,) = dumps.glob(f"{JOB}-r{SLOW}-*.jsonl")
        rows = [json.loads(x) for x in dump.read_text().splitlines()]
        n_colls = WINDOWS * WINDOW_STEPS * K
        assert [r["seq"] for r in rows] == list(range(n_colls))  # all of them, in order
        assert all(r["func"] == "AllReduce" and r["state"] == "done" for r in rows)
        # A refused control is acked too, with the agent's reason.
        cid = await server.send_control(HOST, "settings", {"window_steps": 5})
        ack = await server.control_result(cid, timeout=10)
        assert not ack.ok and "not changeable" in ack.detail

        # ---- wrong secrets are refused
        await refusals(address)

        # ---- the job ends: the last (partial-settle) window and ring clean-up
        job.finish()
        await wait("every window scored", lambda: scored() >= WINDOWS)
        if remove_finished:
            # Shipped and acked: the agent removes the finished job's rings.
            await wait("finished rings removed", lambda: not list(shm_dir.glob("*.ring")))
        else:
            assert len(list(shm_dir.glob("*.ring"))) == NRANKS
        assert scored() == WINDOWS
        assert server.stats.bad_frames_total == {}
        assert server.stats.duplicates_total == 0
        # Credits kept every SEND within posted buffers on the agent's queue pair.
        qa, qc = agent_f.made[0], coord_f.made[0]
        assert qa.rnr_waits == 0 and qc.rnr_waits == 0
        assert qa.sends_posted > WINDOWS and qc.sends_posted > WINDOWS

    async def refusals(address: str) -> None:
        made_before = len(coord_f.made)
        conns_before = server.stats.connections_total

        def link(transport: RdmaTransport, secret: bytes, name: str) -> AgentLink:
            ident = AgentIdentity(
                agent_id=name,
                host=name,
                agent_version="test",
                ranks=(RankInfo(job=JOB, comm="x", rank=99, nranks=100),),
            )
            return AgentLink(transport, address, secret, ident, backoff_base=0.05, backoff_cap=0.2)

        # Wrong secret on the side channel: the agent rejects the coordinator's proof
        # and neither side opens a queue pair.
        wrong_f = Factory()
        bad = link(rdma(wrong_f, b"wrong secret"), b"wrong secret", "impostor")
        bad.start()
        await until("wrong secret refused", lambda: bad.stats.connect_attempts >= 2)
        await bad.close(timeout=0)
        assert "failed authentication" in (bad.stats.last_error or ""), bad.stats
        assert not bad.stats.refusals  # never got as far as the protocol session
        # No secret on the side channel: the coordinator refuses before any queue pair.
        none_f = Factory()
        anon = link(rdma(none_f, None), SECRET, "anonymous")
        anon.start()
        await until("missing secret refused", lambda: anon.stats.connect_attempts >= 2)
        await anon.close(timeout=0)
        assert "authentication required" in (anon.stats.last_error or ""), anon.stats
        assert wrong_f.made == [] and none_f.made == []
        assert len(coord_f.made) == made_before
        # The side channel refused them before the protocol server saw a channel.
        assert server.stats.connections_total == conns_before
        # Right side-channel secret, wrong session secret: the QP is made, then the
        # protocol's own Hello/Welcome over RDMA refuses the agent.
        sess_f = Factory()
        sess = link(rdma(sess_f, SECRET), b"other session secret", "half-right")
        sess.start()
        await until("session refusal", lambda: bool(sess.stats.refusals))
        await sess.close(timeout=0)
        assert len(sess_f.made) >= 1 and len(coord_f.made) > made_before
        assert server.stats.refused_peers_total, server.stats
        assert not sess.stats.connected
        assert set(server.peers()) == {HOST}  # the real agent is undisturbed
        # The refused connections' queue pairs were torn down.
        for a in sess_f.made + coord_f.made[made_before:]:
            assert a not in loopback._ENDPOINTS.values()

    try:
        run(main())
    finally:
        coord.flush()
    # Every queue pair is gone once both ends closed.
    for a in coord_f.made + agent_f.made:
        assert a not in loopback._ENDPOINTS.values()
    assert plans_path.exists()
