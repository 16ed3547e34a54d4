"""Two real coordinator processes (`artemis-coordinator serve --fleet`) on one real
PostgreSQL (tests/pg.py), reached by real protocol clients over loopback TCP:

- The owner: an agent (the real `AgentLink`) sends a job's windows to A, which
  takes the job's lease (`straggler_job_owner{job}` = its epoch, on A only).
- An agent of protocol 1.3 that says hello to B with ranks of that job gets a
  `redirect` naming A's fleet id and advertised address; the connection stays.
- An agent of 1.2 gets `error{code: not_owner}` naming A, and the connection closes.
- A is SIGKILLed mid-incident: B takes the lease once it expires (lease_s, judged by
  PostgreSQL's clock), restores the job's state from the store and goes on:
  every window is scored exactly once across A and B, and the incident A opened is
  closed by B under the same id. The time from the kill to B's first scored window
  is printed (the failover figure).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from artemis.protocol.client import AgentLink
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.messages import Error, Message, RankInfo, Redirect, Windows
from artemis.protocol.session import AgentIdentity, AgentSession, Established, Send
from artemis.protocol.tcp import TcpTransport
from artemis.protocol.transport import ChannelClosed
from artemis.store import open_store
from daemon_harness import Coordinator, wait_for, write_secret
from service_records import rank_window

JOB = "pj"
LEASE_S = 2.0
RECOVERS = 8  # rank 1 is slow in windows before this one


def windows(w: int) -> Windows:
    rows = tuple(
        rank_window(
            JOB,
            r,
            w,
            gap_ms=130.0 if r == 1 and w < RECOVERS else 100.0,
            step_ms=140.0,
            collectives=40,
        )
        for r in range(4)
    )
    return Windows(host="h0", windows=rows)


def identity(agent: str) -> AgentIdentity:
    return AgentIdentity(
        agent_id=agent,
        host=agent,
        agent_version="t",
        ranks=tuple(RankInfo(JOB, "c0", r, 4) for r in range(4)),
    )


async def hello(address: str, secret: bytes, minor: int) -> tuple[list[Message], bool, str]:
    """Say hello as an agent of protocol 1.`minor` holding the job's ranks; returns what
    the coordinator sent after auth (within 3 s), whether it closed the connection and
    the coordinator id its welcome named."""
    version = (1, minor)
    ch = await TcpTransport().connect(address)
    session = AgentSession(secret, identity(f"probe-{minor}"), version=version)
    dec = FrameDecoder(version=version)
    await ch.send(encode(session.hello(), version=version))
    got: list[Message] = []
    established = False
    named = ""
    try:
        while True:
            frame = await asyncio.wait_for(ch.recv(), 3.0 if established else 10.0)
            for item in dec.feed(frame):
                if established:
                    assert isinstance(item, Message), item
                    got.append(item)
                    continue
                for eff in session.receive(item):
                    if isinstance(eff, Send):
                        await ch.send(encode(eff.msg, version=version))
                    elif isinstance(eff, Established):
                        established, named = True, eff.coordinator_id
    except ChannelClosed:
        return got, True, named
    except asyncio.TimeoutError:
        assert established, "no handshake"
        return got, False, named
    finally:
        await ch.close()


def scored_windows(c: Coordinator) -> list[int]:
    return [f["window"] for f in c.findings() if f["kind"] == "rank"]


def incidents(c: Coordinator) -> list[dict[str, Any]]:
    import json

    p = c.work / "incidents.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_two_fleet_coordinators_redirect_and_fail_over(pg_url: str, tmp_path: Path) -> None:
    secret = write_secret(tmp_path / "secret")
    key = secret.read_text().strip().encode()

    def coordinator(name: str) -> Coordinator:
        work = tmp_path / name
        work.mkdir()
        fleet = {"enabled": True, "id": name, "lease_s": LEASE_S, "renew_s": 0.2}
        return Coordinator(
            work,
            secret,
            deadline_s=30.0,
            config={"store": pg_url, "assembly_grace_s": 0.0},
            tables={"fleet": fleet},
        )

    a = coordinator("A").start()
    b = coordinator("B").start()
    try:

        async def run() -> float:
            link = AgentLink(TcpTransport(), a.address, key, identity("h0"), backoff_cap=0.3)
            link.start()
            for w in range(5):
                seq = await link.send(windows(w))
                assert await link.wait_acked(seq, 20), f"window {w} not acked by A"
            await link.close()
            assert a.value("straggler_job_owner", job=JOB) == 1.0
            assert b.value("straggler_job_owner", job=JOB) is None

            got, closed, named = await hello(b.address, key, minor=3)
            redirects = [m for m in got if isinstance(m, Redirect)]
            assert not closed and len(redirects) == 1, got
            assert named == "B"  # a fleet's welcome names the coordinator by its fleet id
            (owner,) = redirects[0].jobs
            assert (owner.job, owner.owner, owner.address, owner.epoch) == (
                JOB,
                "A",
                a.address,
                1,
            )
            got, closed, _ = await hello(b.address, key, minor=2)
            errors = [m for m in got if isinstance(m, Error)]
            assert closed and [e.code for e in errors] == ["not_owner"], got
            assert f"coordinator A at {a.address}" in errors[0].text

            a.daemon.kill()  # type: ignore[union-attr]
            killed = time.monotonic()
            link = AgentLink(TcpTransport(), b.address, key, identity("h0"), backoff_cap=0.3)
            link.start()
            seq = await link.send(windows(5))
            assert await link.wait_acked(seq, 10 * LEASE_S), "B never took the job"
            failover = time.monotonic() - killed
            for w in range(6, RECOVERS + 8):
                seq = await link.send(windows(w))
                assert await link.wait_acked(seq, 20), f"window {w} not acked by B"
            await link.close()
            return failover

        failover = asyncio.run(asyncio.wait_for(run(), 50))
        print(f"failover: {failover:.2f} s from SIGKILL to B's first acked+scored window")
        assert failover < LEASE_S + 3.0
        wait_for(lambda: b.value("straggler_job_owner", job=JOB) == 2.0, 10, "B owns at epoch 2")
        # Every window scored exactly once across the fleet (window 0 has no finding).
        sa, sb = scored_windows(a), scored_windows(b)
        assert sa == [1, 2, 3, 4]
        assert sb[: RECOVERS - 5] == list(range(5, RECOVERS)) and not set(sa) & set(sb)
        # The incident A opened is continued, and closed, by B under its id.
        ia, ib = incidents(a), incidents(b)
        assert ia and len({r["id"] for r in ia}) == 1
        assert ib and {r["id"] for r in ib} == {ia[0]["id"]} and ib[-1]["status"] == "closed"
        assert b.value("straggler_windows_scored_total", job=JOB) == RECOVERS + 8 - 5
        # The store has every window's row and the incident's latest record, written in
        # each commit of the job's state (A's too, though it was killed right after).
        with open_store(pg_url, readonly=True) as st:
            assert [r["window"] for r in st.job_windows(JOB)] == list(range(RECOVERS + 8))
            rec = st.incident(ia[0]["id"])
            assert rec is not None and rec["status"] == "closed"
    finally:
        b.daemon.stop()  # type: ignore[union-attr]
        a.daemon.kill()  # type: ignore[union-attr]
