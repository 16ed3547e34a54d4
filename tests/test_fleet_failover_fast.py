"""What a fleet takeover waits for, without processes: the heir's assembly and agents.

The failover benchmark (bench/fleet_failover.py) measures the whole path; these pin the
two rules that make it cost the lease and not the lease plus an assembly deadline.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
from artemis.agent.uplinks import Uplinks
from artemis.coordinator.config import FleetConfig
from artemis.coordinator.fleet import Fleet, FleetCoordinator
from artemis.detect.assembly import WindowAssembler
from artemis.protocol.messages import RankInfo
from artemis.protocol.records import RankWindow
from artemis.protocol.server import ProtocolServer
from artemis.protocol.session import AgentIdentity
from artemis.protocol.tcp import TcpTransport
from artemis.store.fleet import FleetStore
from daemon_harness import free_port
from service_records import file_coordinator
from window_records import window_record

JOB = "j"


def rw(rank: int, window: int) -> RankWindow:
    timing = {"gap_ms": 1.0, "coll_ms": 1.0, "step_ms": 2.0, "collectives": 10}
    return window_record(rank, window, steps=10, job="j", comm="c0", nranks=3, **timing)


def _owner_state() -> dict[str, Any]:
    """The state the dead owner committed: windows 0-5 released, ranks 0-2 known."""
    a = WindowAssembler(deadline_s=2, grace_s=0)
    a.expect("j", [0, 1, 2])
    for w in range(6):
        for r in range(3):
            a.add(rw(r, w), float(w))
    return a.snapshot(["j"])


def test_a_restored_window_is_released_once_every_known_rank_is_in() -> None:
    heir = WindowAssembler(deadline_s=2.0)  # grace = deadline: a member that just started
    heir.restore(_owner_state())
    # The journal holds ranks 0 and 1 of window 6; the agent of rank 2 resends it.
    assert heir.add(rw(0, 6), 100.0) == []
    assert heir.add(rw(1, 6), 100.0) == []
    (done,) = heir.add(rw(2, 6), 100.01)
    assert done.window == 6 and done.complete and done.missing == []
    # ...and a resend of a window the owner scored is late, not scored again.
    assert heir.add(rw(2, 5), 100.02) == [] and heir.late == 1


def test_a_job_not_restored_still_waits_the_grace_for_announcements() -> None:
    fresh = WindowAssembler(deadline_s=2.0)
    fresh.expect("j", [0, 1])
    assert fresh.add(rw(0, 6), 100.0) == []
    assert fresh.add(rw(1, 6), 100.01) == []  # within the grace
    (done,) = fresh.expire(102.0)
    assert done.complete


def test_a_restored_job_forgotten_waits_the_grace_again() -> None:
    heir = WindowAssembler(deadline_s=2.0)
    heir.restore(_owner_state())
    heir.forget_job("j")  # the job ended; a new run of it starts from nothing known
    heir.expect("j", [0])
    assert heir.add(rw(0, 0), 100.0) == []


# ---------------------------------------------------------------- the agents

SECRET = b"a fleet's shared secret, 32 bytes or so"


def test_agents_of_a_dead_owner_come_back_when_its_lease_runs_out(
    pg_url: str, tmp_path: Path
) -> None:
    """Member A is up; the job's lease is held by B, which died (nobody listens at its
    address) 1.5 s before its lease runs out. A real agent (`Uplinks` over loopback)
    says hello to A: A redirects it to B with the lease's time left; the agent cannot
    reach B and comes back when the lease runs out, and A takes the job then. Two
    moves in all (to B, back): it did not poll the fleet meanwhile (with the retries
    alone, each round trip A -> B -> A is two moves, a round every ~0.5 s)."""
    cfg = FleetConfig(enabled=True, id="a", lease_s=5.0, renew_s=0.2, advertise="")

    async def run() -> None:
        fleet = Fleet(cfg, pg_url)
        kw: dict[str, Any] = {"cls": FleetCoordinator, "restore": False, "fleet": fleet}
        coord = file_coordinator(tmp_path, lambda: 0.0, **kw)
        coord.server = server = ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, coord)
        address, dead = await server.start(), f"127.0.0.1:{free_port()}"
        fleet.start()
        b = FleetStore(pg_url, "b", dead, 1.5)
        ident = AgentIdentity(
            agent_id="h0",
            host="h0",
            agent_version="t",
            ranks=tuple(RankInfo(JOB, "c0", r, 2) for r in range(2)),
        )
        up = Uplinks(TcpTransport(), [address], SECRET, ident)
        try:
            held = b.acquire(JOB)
            assert held.mine and held.epoch == 1
            runs_out = held.expires
            b.close()  # B dies: its lease is not renewed
            up.start()
            for _ in range(400):
                link = up.link_of(JOB)
                if fleet.epoch(JOB) is not None and link is not None and link.connected:
                    break
                await asyncio.sleep(0.02)  # polled: what is awaited is the lease's end
            assert fleet.epoch(JOB) == 2, "A never took the job"
            with psycopg.connect(pg_url, autocommit=True) as db:
                row = db.execute(
                    "SELECT acquired FROM fleet_leases WHERE job = %s", (JOB,)
                ).fetchone()
            assert row is not None and float(row[0]) >= runs_out  # not before: B's lease was live
            assert up.moves == 2, up.moves  # to B (refused), back when its lease ran out
        finally:
            await up.close(timeout=0.5)
            await server.close()
            coord.flush()

    asyncio.run(asyncio.wait_for(run(), 40))


def test_a_redirect_says_how_long_the_holders_lease_runs(pg_url: str) -> None:
    cfg = FleetConfig(enabled=True, id="a", lease_s=5.0, renew_s=0.2, advertise="127.0.0.1:1")
    fleet = Fleet(cfg, pg_url)
    b = FleetStore(pg_url, "b", "127.0.0.1:2", 4.0)
    try:
        b.acquire(JOB)
        o = fleet.owner(JOB)
        assert (o.owner, o.address, o.epoch) == ("b", "127.0.0.1:2", 1)
        assert 0.0 < o.expires_s <= 4.0
    finally:
        b.close()
        fleet.stop(release=False)
