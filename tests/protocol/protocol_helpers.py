"""Builders and small async helpers shared by the protocol tests."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from artemis.protocol.messages import (
    Ack,
    Auth,
    Control,
    Dump,
    Error,
    Heartbeat,
    Hello,
    Message,
    RankInfo,
    Welcome,
    Windows,
)
from artemis.protocol.peers import PeerInfo
from artemis.protocol.records import RankProgress, RankWindow, Telemetry

T = TypeVar("T")

SECRET = b"correct horse battery staple"


def arun(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run one test coroutine with an overall limit, so a hang fails instead of blocking."""

    async def limited() -> T:
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            # Say where everything was stuck before giving up on it.
            for t in asyncio.all_tasks():
                if t is not asyncio.current_task():
                    t.print_stack(limit=8, file=sys.stderr)
            task.cancel()
            raise AssertionError(f"test coroutine did not finish within {timeout} s")
        return task.result()

    return asyncio.run(limited())


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll a condition on the loop (no fixed sleeps): fail with ``what`` on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for: {what or cond}")
        await asyncio.sleep(0.01)


def secret_file(tmp: Path, data: bytes = SECRET, mode: int = 0o600) -> Path:
    p = tmp / "secret"
    p.write_bytes(data + b"\n")
    os.chmod(p, mode)
    return p


def telemetry(i: int = 0) -> Telemetry:
    return Telemetry(
        vendor="nvidia",
        gpu_model="NVIDIA H100 80GB HBM3",
        gpu_index=i % 8,
        sm_mhz=1410.0 + i,
        sm_mhz_max=1980.0,
        temp_c=61.5,
        power_w=400.0,
        power_limit_w=700.0,
        throttle={"hw_thermal": False, "sw_power_cap": i % 2 == 0},
        pcie_gen=5,
        pcie_gen_max=5,
        pcie_width=16,
        pcie_width_max=16,
        cpu_pct=35.0,
        load1=12.0,
        ncpu=96,
        missing=("steal_pct", "iowait_pct"),
    )


def window(rank: int = 0, w: int = 3, host: str = "node-a") -> RankWindow:
    return RankWindow(
        job="job-1",
        comm="0123456789abcdef",
        rank=rank,
        nranks=8,
        host=host,
        window=w,
        step_lo=w * 50,
        step_hi=(w + 1) * 50,
        coll_lo=w * 200,
        coll_hi=(w + 1) * 200,
        gap_ms=81.5 + rank,
        coll_ms=18.25,
        step_ms=100.0,
        collectives=200,
        bytes=1 << 33,
        lost=0,
        clock="device",
        island="nvidia",
        hw_class="H100",
        samples=32,
        telemetry=telemetry(rank),
    )


def windows_msg(n: int = 8, seq: int = 0, host: str = "node-a") -> Windows:
    return Windows(seq=seq, host=host, windows=tuple(window(r, host=host) for r in range(n)))


def progress(rank: int = 0) -> RankProgress:
    return RankProgress(
        job="job-1",
        comm="0123456789abcdef",
        rank=rank,
        host="node-a",
        last_done=1234,
        inflight=1235 if rank % 2 else None,
        inflight_s=0.5 if rank % 2 else 0.0,
        idle_s=0.25,
        finished=False,
    )


def heartbeat(seq: int = 0) -> Heartbeat:
    return Heartbeat(
        seq=seq,
        progress=tuple(progress(r) for r in range(8)),
        buffered=3,
        dropped=1,
        plan_acks=({"plan": "p-1", "status": "applied", "step": 1900},),
    )


def every_message() -> list[Message]:
    """One fully populated instance of every message type."""
    return [
        Hello(
            seq=1,
            agent_id="agent-node-a",
            host="node-a",
            agent_version="0.1.0",
            nonce=b"n" * 32,
            ranks=(
                RankInfo("job-1", "0123456789abcdef", 0, 8, 4242, 0, "nvidia", "H100"),
                RankInfo("job-1", "0123456789abcdef", 1, 8),
            ),
            incarnation="abcd",
        ),
        Welcome(
            seq=1,
            coordinator_id="coord",
            nonce=b"c" * 32,
            proof=b"p" * 32,
            settings={"window_steps": 50, "rebalance": "off"},
        ),
        Auth(seq=2, proof=b"q" * 32),
        windows_msg(seq=7),
        heartbeat(seq=8),
        Dump(
            seq=9,
            job="job-1",
            comm="0123456789abcdef",
            rank=2,
            request_id="r-1",
            records=tuple({"coll_seq": i, "func": "AllReduce", "bytes": 4096} for i in range(256)),
        ),
        Control(seq=3, control_id="c-1", action="plan", body={"plan": {"before": [1, 2]}}),
        Ack(seq=4, upto=12),
        Ack(seq=5, control_id="c-1", ok=False, detail="job does not honour plans"),
        Error(seq=6, code="invalid", text="windows.windows[0].gap_ms: ...", fatal=False),
    ]


class RecordingApp:
    """A real app object for ProtocolServer: records what it was handed."""

    def __init__(self, on_msg: Callable[[PeerInfo, Message], Awaitable[None]] | None = None):
        self.messages: list[tuple[str, Message]] = []
        self.connects: list[str] = []
        self.disconnects: list[str] = []
        self.control_acks: list[Ack] = []
        self._on_msg = on_msg

    async def on_message(self, peer: PeerInfo, msg: Message) -> None:
        if self._on_msg is not None:
            await self._on_msg(peer, msg)
        self.messages.append((peer.agent_id, msg))

    def on_connect(self, peer: PeerInfo) -> None:
        self.connects.append(peer.agent_id)

    def on_disconnect(self, peer: PeerInfo) -> None:
        self.disconnects.append(peer.agent_id)

    def on_control_ack(self, peer: PeerInfo, ack: Ack) -> None:
        self.control_acks.append(ack)

    def seqs(self, agent_id: str) -> list[int]:
        return [m.seq for a, m in self.messages if a == agent_id]
