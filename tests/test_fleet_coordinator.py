"""The coordinator fleet's shell (coordinator/fleet.py) on a real PostgreSQL (tests/pg.py).

In-process coordinators driven as the protocol server drives them (`route` after
auth, `on_connect`, `on_message`, `tick`), two of them on one database:

- Failover: owner A scores windows 0-3 (rank 1 flagged, an incident open), takes
  half of window 4 (journaled in the store, acked) and dies (no flush, no release,
  its renewals stop: as after SIGKILL). B is told A owns the job until A's lease
  runs out on the database's clock, then takes it: A's state and journal are
  restored, window 4 is completed and scored by B, and so on. Every window is
  scored exactly once across the two (their findings files), the finding goes on
  (flagged since window 1, not a fresh suspect) and the incident keeps its id.
- A stale owner (A again, paused past its lease) cannot write: its next batch is
  not taken (NotTaken: not acked), a window it scores commits nothing (no line in
  its findings, the store's state still B's), and it stops serving the job.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from artemis.coordinator.config import FleetConfig
from artemis.coordinator.fleet import ENDED_EXPORT_S, Fleet, FleetCoordinator
from artemis.protocol.messages import Heartbeat, Windows
from artemis.protocol.peers import NotTaken, PeerInfo
from artemis.protocol.records import RankProgress, RankWindow
from service_records import file_coordinator, host_peer, rank_window

JOB = "fj"
LEASE_S = 1.0
RECOVERS = 7  # rank 1 is slow until this window


def rw(rank: int, window: int) -> RankWindow:
    gap = 130.0 if rank == 1 and window < RECOVERS else 100.0  # rank 1 is 30% slow
    return rank_window(JOB, rank, window, gap_ms=gap, step_ms=140.0, collectives=40)


def peer(host: str) -> PeerInfo:
    return host_peer(JOB, host, minor=3)


def part(host: str, w: int) -> Windows:
    h = int(host[1:])
    return Windows(host=host, windows=(rw(2 * h, w), rw(2 * h + 1, w)))


async def both_hosts(c: FleetCoordinator, windows: range) -> None:
    """Each window's two halves (hosts h0 and h1), as their agents send them."""
    for w in windows:
        await c.on_message(peer("h0"), part("h0", w))
        await c.on_message(peer("h1"), part("h1", w))


def fleet_coordinator(
    tmp: Path, url: str, fid: str, now: list[float], snapshot_every: int = 10, **kw: Any
) -> FleetCoordinator:
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = FleetConfig(
        enabled=True,
        id=fid,
        lease_s=LEASE_S,
        renew_s=0.1,
        advertise=f"127.0.0.1:{fid}",
        snapshot_every=snapshot_every,
    )
    fleet = Fleet(cfg, url)
    c = file_coordinator(
        tmp, lambda: now[0], cls=FleetCoordinator, restore=False, fleet=fleet, **kw
    )
    fleet.start()
    return c


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def windows_scored(tmp: Path) -> list[int]:
    """The windows a coordinator wrote rank 1's finding for (one per scored window)."""
    return [f["window"] for f in lines(tmp / "f.jsonl") if f["kind"] == "rank"]


def scored(c: FleetCoordinator) -> float:
    return c.metrics.registry.get_sample_value("straggler_windows_scored_total", {"job": JOB}) or 0


def until(cond: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while not (v := cond()):
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)
    return v


def test_failover_restores_and_a_stale_owner_cannot_write(pg_url: str, tmp_path: Path) -> None:
    now = [0.0]

    async def run() -> None:
        a = fleet_coordinator(tmp_path / "a", pg_url, "a", now)
        b = fleet_coordinator(tmp_path / "b", pg_url, "b", now)
        try:
            assert a.route(peer("h0")) == [] and a.route(peer("h1")) == []  # A takes the job
            a.on_connect(peer("h0"))
            a.on_connect(peer("h1"))
            await both_hosts(a, range(4))
            await a.on_message(peer("h0"), part("h0", 4))  # acked: in the store's journal
            assert windows_scored(tmp_path / "a") == [1, 2, 3] and scored(a) == 4  # 0: no finding
            opened = [r for r in lines(tmp_path / "a" / "incidents.jsonl")]
            assert opened and len({r["id"] for r in opened}) == 1
            incident = opened[0]["id"]
            # B, asked for the job while A holds it, names A.
            moved = b.route(peer("h1"))
            assert [(o.job, o.owner, o.address, o.epoch) for o in moved] == [
                (JOB, "a", "127.0.0.1:a", 1)
            ]
            with pytest.raises(NotTaken, match="served by coordinator a"):
                await b.on_message(peer("h1"), part("h1", 4))
            # A dies: its renewals stop, nothing flushed or released.
            a.fleet._stop.set()
            t0 = time.monotonic()
            until(lambda: b.route(peer("h1")) == [], 10 * LEASE_S, "B to take the lease")
            assert time.monotonic() - t0 <= LEASE_S + 1.0
            assert b.fleet.epoch(JOB) == 2
            b.on_connect(peer("h0"))
            b.on_connect(peer("h1"))
            assert b.assembler.pending == 1  # window 4 with h0's part, from the journal
            await b.on_message(peer("h1"), part("h1", 4))
            await both_hosts(b, range(5, 7))
            # Every window scored once across the fleet; the finding continues.
            assert windows_scored(tmp_path / "b") == [4, 5, 6] and scored(b) == 3
            fb = [f for f in lines(tmp_path / "b" / "f.jsonl") if f["kind"] == "rank"]
            assert {(f["rank"], f["since"]) for f in fb} == {(1, 1)}
            assert fb[0]["state"] != "suspect"
            # Rank 1 recovers: B closes the incident A opened, under its id.
            await both_hosts(b, range(RECOVERS, RECOVERS + 8))
            later = lines(tmp_path / "b" / "incidents.jsonl")
            assert later and {r["id"] for r in later} == {incident}, later
            assert later[-1]["status"] == "closed" and later[-1]["opened"] == opened[0]["opened"]

            # A comes back (it was only paused) and writes with its old epoch: refused.
            with pytest.raises(NotTaken):
                await a.on_message(peer("h1"), part("h1", 4))
            before = b.fleet.store.load(JOB)
            a._score_all(a.assembler.flush(), final=True)  # window 4 (h0's half) scored...
            await a.tick()
            assert windows_scored(tmp_path / "a") == [1, 2, 3]  # ...and nothing written
            assert JOB not in a.monitors  # A stopped serving the job
            after = b.fleet.store.load(JOB)
            assert after.marker["owner"] == "b" and after.state == before.state
        finally:
            b.flush()
            a.fleet._stop.set()
            a.fleet.stop(release=False)

    asyncio.run(run())


def test_a_clean_stop_hands_the_job_over_at_once(pg_url: str, tmp_path: Path) -> None:
    now = [0.0]

    async def run() -> None:
        a = fleet_coordinator(tmp_path / "a", pg_url, "a", now)
        b = fleet_coordinator(tmp_path / "b", pg_url, "b", now)
        try:
            assert a.route(peer("h0")) == []
            a.on_connect(peer("h0"))
            a.on_connect(peer("h1"))
            await both_hosts(a, range(4))
            inc = lines(tmp_path / "a" / "incidents.jsonl")
            a.flush()  # releases the lease; the incident stays open
            assert all(r.get("status") != "closed" for r in inc)
            assert all(
                r.get("status") != "closed" for r in lines(tmp_path / "a" / "incidents.jsonl")
            )
            assert b.route(peer("h0")) == []  # no wait for the lease to run out
            b.on_connect(peer("h0"))
            b.on_connect(peer("h1"))
            await both_hosts(b, range(4, 5))
            assert windows_scored(tmp_path / "b") == [4]
        finally:
            b.flush()

    asyncio.run(run())


def finished(host: str) -> Heartbeat:
    h = int(host[1:])
    return Heartbeat(
        progress=tuple(
            RankProgress(JOB, "c0", r, host, 399, None, 0.0, 5.0, finished=True)
            for r in (2 * h, 2 * h + 1)
        )
    )


def owner_gauge(c: FleetCoordinator) -> float | None:
    return c.metrics.registry.get_sample_value("straggler_job_owner", {"job": JOB})


def test_an_ended_job_says_owner_0_then_gives_its_lease_back(pg_url: str, tmp_path: Path) -> None:
    now = [0.0]

    async def run() -> None:
        a = fleet_coordinator(tmp_path / "a", pg_url, "a", now, job_linger_s=1.0)
        b = fleet_coordinator(tmp_path / "b", pg_url, "b", now)
        try:
            assert a.route(peer("h0")) == []
            a.on_connect(peer("h0"))
            a.on_connect(peer("h1"))
            await both_hosts(a, range(3))
            assert owner_gauge(a) == 1.0
            await a.on_message(peer("h0"), finished("h0"))
            await a.on_message(peer("h1"), finished("h1"))
            await a.tick()
            now[0] = 2.0
            await a.tick()  # every rank finished, job_linger_s passed: the job ends
            assert JOB not in a.monitors and owner_gauge(a) == 0.0
            assert a.fleet.epoch(JOB) == 1 and b.route(peer("h0"))[0].owner == "a"
            now[0] = 2.0 + ENDED_EXPORT_S
            await a.tick()
            assert owner_gauge(a) is None and a.fleet.epoch(JOB) is None
            assert b.route(peer("h0")) == [] and b.fleet.epoch(JOB) == 2  # at once
        finally:
            a.flush()
            b.flush()

    asyncio.run(run())
