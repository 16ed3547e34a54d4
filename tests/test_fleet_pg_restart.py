"""A fleet coordinator while its PostgreSQL restarts (a real server, tests/pg.py).

The owner scores windows 0-2; the database is stopped (`pg_ctl stop -m fast`: its
sessions cut). A batch that comes meanwhile is not taken (NotTaken: not acked, so
the agent keeps it); the coordinator stops serving the job until it can re-check
its lease. Once the database is back the agent's resend is taken: the coordinator
reconnects, finds its lease still its own (the restart was shorter than lease_s:
same epoch), restores the job from the store and goes on. Every window is scored
exactly once and the finding goes on (same `since`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from artemis.coordinator.config import FleetConfig
from artemis.coordinator.fleet import Fleet, FleetCoordinator
from artemis.protocol.messages import Windows
from artemis.protocol.peers import NotTaken
from pg import pg_started
from service_records import file_coordinator, host_peer, rank_window

JOB = "rs"


def part(host: str, w: int, job: str = JOB) -> Windows:
    """Host `host`'s half of window `w` of `job`, rank 1 30% slow in every window."""
    h = int(host[1:])
    rows = tuple(
        rank_window(job, r, w, gap_ms=130.0 if r == 1 else 100.0, step_ms=140.0, collectives=40)
        for r in (2 * h, 2 * h + 1)
    )
    return Windows(host=host, windows=rows)


async def deliver(c: FleetCoordinator, host: str, msg: Windows, tries: int = 200) -> int:
    """As an agent does: resend until taken (a tick between tries, as the main loop
    runs them); returns how many were refused first."""
    for refused in range(tries):
        try:
            await c.on_message(host_peer(JOB, host, minor=3), msg)
            return refused
        except NotTaken:
            await c.tick()
            await asyncio.sleep(0.05)
    raise AssertionError(f"never taken after {tries} tries")


def test_the_owner_rides_out_a_database_restart(tmp_path: Path) -> None:
    with pg_started() as srv:
        url = srv.create_db("fleet")
        cfg = FleetConfig(enabled=True, id="a", lease_s=20.0, renew_s=0.2, advertise="h:1")

        async def run() -> None:
            fleet = Fleet(cfg, url)
            c = file_coordinator(
                tmp_path, lambda: 0.0, cls=FleetCoordinator, restore=False, fleet=fleet
            )
            fleet.start()
            try:
                for host in ("h0", "h1"):
                    assert c.route(host_peer(JOB, host, minor=3)) == []
                    c.on_connect(host_peer(JOB, host, minor=3))
                for w in range(3):
                    for host in ("h0", "h1"):
                        assert await deliver(c, host, part(host, w)) == 0
                srv.stop()
                try:
                    await c.on_message(host_peer(JOB, "h0", minor=3), part("h0", 3))
                    raise AssertionError("a batch was taken with the database down")
                except NotTaken:
                    pass
                srv.start()
                assert await deliver(c, "h0", part("h0", 3)) >= 0
                assert await deliver(c, "h1", part("h1", 3)) == 0
                for w in (4, 5):
                    for host in ("h0", "h1"):
                        assert await deliver(c, host, part(host, w)) == 0
                assert fleet.epoch(JOB) == 1  # its lease survived the restart
            finally:
                c.flush()

        asyncio.run(asyncio.wait_for(run(), 50))
    lines = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    ranks = [(f["window"], f["since"]) for f in lines if f["kind"] == "rank"]
    assert ranks == [(w, 1) for w in range(1, 6)]  # each window once, the finding goes on
