"""The daemons' lifecycle objects and the one transport factory, in process on loopback.

``CoordinatorServer`` and ``AgentDaemon`` run for real (TLS over TCP from
``build_transport``, rings of three format flavours: a minor-0 ring as an old
plugin wrote it, minor-1 base slots and CPU slots from the job-side writer; the
coordinator's outputs on disk) and are stopped through ``handle_exit``, the path a signal
takes. The RDMA fallback to TCP is tested where RDMA cannot run (no pyverbs
or no device): it must keep the configured TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from artemis.agent.config import AgentConfig
from artemis.agent.daemon import AgentDaemon
from artemis.common.lifecycle import Lifecycle
from artemis.coordinator.config import CoordinatorConfig
from artemis.coordinator.server_main import CoordinatorServer
from artemis.protocol.auth import load_secret
from artemis.protocol.rdma.transport import RdmaUnavailable
from artemis.protocol.rdma.verbs import probe
from artemis.protocol.tcp import TcpTransport
from artemis.protocol.transport import (
    ChannelClosed,
    FrameChannel,
    RdmaConfig,
    TlsConfig,
    build_transport,
)
from artemis.ring import format as rf
from artemis.ring.writer import REC_HOST, RingWriter
from ring_minor0 import OldRecord, write_minor0_ring
from tls_certs import localhost_cert as _cert

JOB = "lifejob"
NRANKS = 4
SLOW = 1
STEPS = 40  # one collective per step


def run(coro: Coroutine[Any, Any, None], timeout: float = 60.0) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout))


def _secret(tmp: Path) -> Path:
    p = tmp / "secret"
    p.write_text("lifecycle-test-secret-0123456789abcdef\n")
    p.chmod(0o600)
    return p


def _configs(
    tmp: Path, transport: str, secret: Path, cert: Path, key: Path
) -> tuple[CoordinatorConfig, AgentConfig]:
    coord = CoordinatorConfig(
        listen="127.0.0.1:0",
        metrics_port=0,
        jsonl=str(tmp / "out" / "findings.jsonl"),
        plans_jsonl=str(tmp / "out" / "plans.jsonl"),
        secret_file=str(secret),
        control_socket=str(tmp / "c.sock"),
        transport=transport,
        tls=TlsConfig(cert=str(cert), key=str(key)),
        rdma=RdmaConfig(fallback_tcp=True),
        assembly_deadline_s=30.0,
        assembly_grace_s=0.0,
        tick_s=0.05,
    ).validated()
    agent = AgentConfig(
        coordinator="127.0.0.1:1",  # replaced once the coordinator is bound
        shm_dir=str(tmp / "shm"),
        secret_file=str(secret),
        host="node-life",
        transport=transport,
        tls=TlsConfig(ca=str(cert)),
        rdma=RdmaConfig(fallback_tcp=True),
        poll_interval_s=0.02,
        heartbeat_s=0.1,
        scan_interval_s=0.05,
        window_steps=10,
        colls_per_step=1,
        telemetry=[],
    ).validated()
    return coord, agent


def _fallback_configs(tmp: Path, transport: str) -> tuple[CoordinatorConfig, AgentConfig]:
    """Both daemons' configs with TLS; skips the test where RDMA would really run,
    since the "rdma" cases are there for the fallback to TCP."""
    if transport == "rdma" and probe()[0]:
        pytest.skip("RDMA can run here: this case covers the fallback to TCP")
    cert, key = _cert(tmp)
    return _configs(tmp, transport, _secret(tmp), cert, key)


def _write_job(shm: Path) -> list[Path]:
    """A finished 4-rank job: rank SLOW computes 30% longer before every collective.

    A rolling upgrade in progress: rank SLOW still holds an old plugin (a
    minor-0 ring), rank 3 a writer with CPU slots, the others minor-1 base slots.
    """
    shm.mkdir(parents=True, exist_ok=True)
    paths = []
    ends = [0] * STEPS
    t = 1_000_000
    for i in range(STEPS):
        t += int(10e6 * 1.3) + 2_000_000  # slowest arrival + transfer
        ends[i] = t
    for r in range(NRANKS):
        starts, prev = [], 1_000_000
        for i in range(STEPS):
            starts.append(prev + int(10e6 * (1.3 if r == SLOW else 1.0)))
            prev = ends[i]
        if r == SLOW:
            path = shm / rf.ring_filename(JOB, 0xABC, r)
            old = [OldRecord(i, 1 << 20, starts[i], ends[i], clock=REC_HOST) for i in range(STEPS)]
            write_minor0_ring(
                path,
                256,
                old,
                job=JOB,
                comm_hash=0xABC,
                rank=r,
                nranks=NRANKS,
                clock_kind=rf.CLOCK_HOST,
                comm_name="world",
                finished=True,
            )
            paths.append(path)
            continue
        w = RingWriter(
            shm, JOB, 0xABC, r, NRANKS, 256, clock_kind="host", comm_name="world", cpu_times=r == 3
        )
        for i in range(STEPS):
            w.record(
                kind=rf.KIND_COLL,
                func=rf.FUNC_CODES["AllReduce"],
                dtype=rf.DTYPE_CODES["ncclFloat32"],
                coll_seq=i,
                nbytes=1 << 20,
                start=starts[i],
                end=ends[i],
                clock=REC_HOST,
                cpu_start_ns=starts[i] // 2,
                cpu_end_ns=ends[i] // 2,
            )
        w.close()  # marks it finished
        paths.append(w.path)
    return paths


async def _until(what: str, cond: Any, *tasks: asyncio.Task[None], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        for t in tasks:
            if t.done():
                t.result()  # a daemon that died says why
                raise AssertionError(f"a daemon stopped while waiting for: {what}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("transport", ["tcp", "rdma"])
def test_coordinator_and_agent_serve_and_stop(tmp_path: Path, transport: str) -> None:
    ccfg, acfg = _fallback_configs(tmp_path, transport)
    rings = _write_job(Path(acfg.shm_dir))

    async def main() -> None:
        server = CoordinatorServer(ccfg)
        stask = asyncio.create_task(server.serve())
        await asyncio.wait_for(server.started.wait(), 15)
        assert server.address is not None and server.coord is not None
        assert server.metrics is not None
        # The configured TLS is on the listener, over TCP or RDMA's fallback.
        lst = server.server.transport if server.server is not None else None
        assert isinstance(lst, TcpTransport) and lst.server_ssl is not None
        cfg = dataclasses.replace(acfg, coordinator=server.address)
        agent = AgentDaemon(cfg, build_transport(cfg, "agent"), load_secret(cfg.secret_file), [])
        atask = asyncio.create_task(agent.serve())
        reg = server.metrics.registry

        def scored() -> float:
            # Summed over whatever labels the series carries (a job label, or none).
            return sum(
                smp.value
                for fam in reg.collect()
                for smp in fam.samples
                if smp.name == "straggler_windows_scored_total"
            )

        await _until("4 windows scored", lambda: scored() >= STEPS // 10, stask, atask)
        # Everything shipped was acknowledged: the finished rings are removed.
        await _until("rings removed", lambda: not any(p.exists() for p in rings), stask, atask)
        # A signal's path: handle_exit. The loops wake at once, not at their next tick.
        t0 = time.monotonic()
        agent.handle_exit(signal.SIGTERM)
        await asyncio.wait_for(atask, 10)
        server.handle_exit(signal.SIGTERM)
        await asyncio.wait_for(stask, 10)
        assert time.monotonic() - t0 < 10
        assert not server.force_exit and not agent.force_exit
        assert agent.agent is None and server.coord is None

    run(main())
    assert not Path(ccfg.control_socket).exists()
    findings = [json.loads(x) for x in Path(ccfg.jsonl).read_text().splitlines()]
    # The old plugin's rank was read and judged like the others.
    flagged = {f["rank"] for f in findings if f.get("state") == "flagged"}
    assert flagged == {SLOW}, findings
    assert not [f for f in findings if f["kind"] == "missing"], findings


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("transport", ["tcp", "rdma"])
def test_build_transport_keeps_tls(tmp_path: Path, transport: str) -> None:
    ccfg, acfg = _fallback_configs(tmp_path, transport)
    st = build_transport(ccfg, "coordinator")
    ct = build_transport(acfg, "agent")
    assert isinstance(st, TcpTransport) and st.server_ssl is not None
    assert isinstance(ct, TcpTransport) and ct.client_ssl is not None
    got: list[bytes] = []

    async def echo(ch: FrameChannel) -> None:
        with contextlib.suppress(ChannelClosed):
            while True:
                f = await ch.recv()
                got.append(f)
                await ch.send(f)

    async def main() -> None:
        lst = await st.listen("127.0.0.1:0", echo)
        try:
            ch = await ct.connect(lst.address)
            await ch.send(_frame(b"over tls"))
            assert await asyncio.wait_for(ch.recv(), 10) == _frame(b"over tls")
            await ch.close()
            # A plaintext client gets nothing through the TLS listener.
            plain = await TcpTransport().connect(lst.address)
            await plain.send(_frame(b"plain"))
            with contextlib.suppress(ChannelClosed, asyncio.TimeoutError):
                reply = await asyncio.wait_for(plain.recv(), 5)
                assert reply != _frame(b"plain")
            await plain.close()
        finally:
            await lst.close()
        assert got == [_frame(b"over tls")]

    run(main())


def test_rdma_without_fallback_refuses(tmp_path: Path) -> None:
    ok, why = probe()
    if ok:
        pytest.skip("RDMA can run here")
    cfg = AgentConfig(
        transport="rdma", secret_file=str(_secret(tmp_path)), rdma=RdmaConfig(fallback_tcp=False)
    )
    with pytest.raises(RdmaUnavailable, match="fallback_tcp") as e:
        build_transport(cfg, "agent")
    assert why in str(e.value)


def test_tls_files_named_when_unloadable(tmp_path: Path) -> None:
    cfg = CoordinatorConfig(tls=TlsConfig(cert=str(tmp_path / "no.pem"), key="k.pem"))
    with pytest.raises(ValueError, match=r"\[tls\] cert = '.*no\.pem', key = 'k\.pem'"):
        build_transport(cfg, "coordinator")
    assert isinstance(build_transport(CoordinatorConfig(), "coordinator"), TcpTransport)
    with pytest.raises(ValueError, match="carrier-pigeon"):
        build_transport(AgentConfig(transport="carrier-pigeon"), "agent")


def test_exit_wakes_the_loop_and_a_second_request_forces() -> None:
    async def main() -> None:
        life = Lifecycle()
        waiting = asyncio.create_task(life.wait_tick(60.0))
        await asyncio.sleep(0)  # let it start waiting
        assert not waiting.done()
        life.handle_exit(signal.SIGTERM)
        await asyncio.wait_for(waiting, 5)  # woken, not after 60 s
        assert life.should_exit and not life.force_exit
        life.handle_exit(signal.SIGINT)
        assert life.force_exit
        await asyncio.wait_for(life.wait_tick(60.0), 1)  # returns at once once exiting

    run(main())


def test_coordinator_refusing_its_config_opens_nothing(tmp_path: Path) -> None:
    # A coordinator that refuses the config opens nothing and leaves nothing behind.
    secret = _secret(tmp_path)
    cfg = CoordinatorConfig(
        listen="127.0.0.1:0",
        metrics_port=0,
        jsonl=str(tmp_path / "f.jsonl"),
        plans_jsonl=str(tmp_path / "p.jsonl"),
        secret_file=str(secret),
        control_socket=str(tmp_path / "c.sock"),
        detector={"suspect_ratio": 0.5},
    )
    from artemis.common.tomlfile import ConfigError

    server = CoordinatorServer(cfg)
    with pytest.raises(ConfigError, match="suspect_ratio"):
        run(server.serve())
    assert not server.started.is_set() and server.server is None
    assert not (tmp_path / "f.jsonl").exists() and not (tmp_path / "c.sock").exists()
