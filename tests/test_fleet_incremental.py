"""Incremental job state in a fleet (coordinator/fleet_state.py) on a real PostgreSQL.

Owner A commits its job's whole state every `snapshot_every` scored windows and
only the marker in between (the store's journal being the delta). A dies right
after a window that is not a snapshot window (its renewals stop, nothing flushed
or released: as after SIGKILL); B takes the lease, restores the last full snapshot
and replays the journal. Exactness is the point: B's state is A's last committed
state (compared whole), every window is scored once across the two, the open
incident keeps its id, and the straggler's finding goes on (not flagged afresh).
Something a replay cannot redo (a plan ack, a settings change) forces a full
snapshot at once.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from artemis.common.tomlfile import ConfigError
from artemis.coordinator.config import CoordinatorConfig, FleetConfig
from artemis.coordinator.fleet import FleetCoordinator
from artemis.coordinator.fleet_state import Replay, SnapshotPolicy
from artemis.protocol.messages import Heartbeat
from artemis.store.fleet import FleetStore
from test_fleet_coordinator import (
    JOB,
    LEASE_S,
    both_hosts,
    fleet_coordinator,
    lines,
    part,
    peer,
    scored,
    until,
    windows_scored,
)
from test_fleet_pg_restart import part as slow_part


def state_of(c: FleetCoordinator, job: str = JOB) -> dict[str, Any]:
    """The job's state as the coordinator would commit it whole, less the shell's own
    counter of output groups (out_seq: this process's, not the job's)."""
    st = c.jobs.state(job)
    assert st is not None
    st["corrections"] = c.corrections.snapshot(job)
    st.pop("out_seq")
    # msgpack's round trip: what the store holds (tuples as lists)
    out: dict[str, Any] = msgpack.unpackb(
        msgpack.packb(st, use_bin_type=True), raw=False, strict_map_key=False
    )
    return out


def die(c: FleetCoordinator) -> None:
    """As after SIGKILL: renewals stop; nothing is flushed, committed or released."""
    c.fleet._stop.set()


def take_over(b: FleetCoordinator) -> None:
    t0 = time.monotonic()
    until(lambda: b.route(peer("h1")) == [], 10 * LEASE_S, "B to take the lease")
    assert time.monotonic() - t0 <= LEASE_S + 1.0


def flags(tmp: Path) -> list[dict[str, Any]]:
    return [f for f in lines(tmp / "f.jsonl") if f["kind"] == "rank"]


def take_job(c: FleetCoordinator) -> None:
    """`c` takes the job (no one holds it) and its two agents connect."""
    assert c.route(peer("h0")) == []
    c.on_connect(peer("h0"))
    c.on_connect(peer("h1"))


async def a_and_b(
    tmp: Path, url: str, now: list[float], windows: range
) -> tuple[FleetCoordinator, FleetCoordinator]:
    """Owner A (snapshot_every 5), which took the job and scored `windows`, and B."""
    a = fleet_coordinator(tmp / "a", url, "a", now, snapshot_every=5)
    b = fleet_coordinator(tmp / "b", url, "b", now, snapshot_every=5)
    take_job(a)
    await both_hosts(a, windows)
    return a, b


def test_an_heir_replays_the_windows_since_the_full_snapshot_exactly(
    pg_url: str, tmp_path: Path
) -> None:
    now = [0.0]

    async def run() -> None:
        a, b = await a_and_b(tmp_path, pg_url, now, range(9))
        try:
            # Full snapshots at 0 (the first commit; the hellos) and 5; 6-8 deltas.
            saved = a.fleet.store.load(JOB)
            assert saved.marker["full"] == 5 and saved.marker["window"] == 8
            assert [d[1] for d in saved.marker["delta"]] == [6, 7, 8]
            full = msgpack.unpackb(saved.state, raw=False, strict_map_key=False)
            assert full["monitor"]["last_window"] == 5  # the state row is window 5's
            await a.on_message(peer("h0"), part("h0", 9))  # half of 9, journaled
            want = state_of(a)  # A's state as of its last commit (window 8)
            opened = lines(tmp_path / "a" / "incidents.jsonl")
            assert opened and len({r["id"] for r in opened}) == 1
            a_flags = flags(tmp_path / "a")
            assert [f["window"] for f in a_flags] == list(range(1, 9))
            states = [f["state"] for f in a_flags]
            assert states.count("flagged") == 1 and states[-1] == "ongoing"
            die(a)

            take_over(b)
            # B restored window 5's snapshot and re-scored 6-8 silently: A's state exactly.
            assert state_of(b) == want
            assert b.monitors[JOB].last_window == 8 and b.assembler.pending == 1
            assert scored(b) == 0 and not (tmp_path / "b" / "f.jsonl").exists()
            assert not lines(tmp_path / "b" / "incidents.jsonl")
            # B's first commit is a full snapshot of its own.
            b.on_connect(peer("h0"))
            b.on_connect(peer("h1"))
            await b.on_message(peer("h1"), part("h1", 9))
            await both_hosts(b, range(10, 12))
            assert scored(a) == 9 and scored(b) == 3  # 0-8 by A, 9-11 by B: each once
            assert windows_scored(tmp_path / "b") == [9]
            after = b.fleet.store.load(JOB)
            assert after.marker["owner"] == "b" and after.marker["full"] == 9
            assert [d[1] for d in after.marker["delta"]] == [10, 11]
            # The finding goes on (flagged since window 1, not afresh) until it clears.
            fb = flags(tmp_path / "b")
            assert {(f["rank"], f["since"], f["state"]) for f in fb} == {(1, 1, "cleared")}
            # Rank 1 recovers: B closes the incident A opened, under its id.
            await both_hosts(b, range(12, 22))
            later = lines(tmp_path / "b" / "incidents.jsonl")
            assert later and {r["id"] for r in later} == {opened[0]["id"]}
            assert later[-1]["status"] == "closed" and later[-1]["opened"] == opened[0]["opened"]
        finally:
            b.flush()
            a.fleet.stop(release=False)

    asyncio.run(run())


def test_a_long_replay_from_an_older_snapshot_is_exact(pg_url: str, tmp_path: Path) -> None:
    """Nine windows replayed on a snapshot ten windows old, while an incident stays open
    (its correction book's bounded histories roll over during the replay)."""
    now = [0.0]

    async def run() -> None:
        a = fleet_coordinator(tmp_path / "a", pg_url, "a", now, snapshot_every=10)
        b = fleet_coordinator(tmp_path / "b", pg_url, "b", now, snapshot_every=10)
        try:
            take_job(a)
            for w in range(30):
                for h in ("h0", "h1"):
                    await a.on_message(peer(h), slow_part(h, w, JOB))
            saved = a.fleet.store.load(JOB)
            assert saved.marker["full"] == 20 and len(saved.marker["delta"]) == 9
            want = state_of(a)
            assert want["corrections"]  # the open incident's book, with its pace history
            die(a)
            take_over(b)
            assert state_of(b) == want
            assert scored(a) == 30 and scored(b) == 0
        finally:
            b.flush()
            a.fleet.stop(release=False)

    asyncio.run(run())


def plan_ack(job: str) -> Heartbeat:
    return Heartbeat(plan_acks=({"job": job, "plan_id": "p-none", "rank": 0, "step": 1},))


def test_events_a_replay_cannot_redo_force_a_full_snapshot(pg_url: str, tmp_path: Path) -> None:
    now = [0.0]

    async def run() -> None:
        a, b = await a_and_b(tmp_path, pg_url, now, range(3))
        try:
            assert a.fleet.store.load(JOB).marker["full"] == 0
            # A plan ack (a heartbeat's): the whole state, at once.
            await a.on_message(peer("h0"), plan_ack(JOB))
            saved = a.fleet.store.load(JOB)
            assert saved.marker["full"] == 2 and saved.marker["delta"] == []
            await both_hosts(a, range(3, 5))
            # A live settings change: the whole state again, under the new settings.
            a.set_setting("suspect_ratio", "1.5")
            saved = a.fleet.store.load(JOB)
            assert saved.marker["full"] == 4 and saved.marker["delta"] == []
            full = msgpack.unpackb(saved.state, raw=False, strict_map_key=False)
            assert full["settings"]["suspect_ratio"] == 1.5
            await both_hosts(a, range(5, 7))
            # A heartbeat that says nothing new forces nothing: 5 and 6 stay deltas.
            await a.on_message(peer("h0"), Heartbeat())
            assert [d[1] for d in a.fleet.store.load(JOB).marker["delta"]] == [5, 6]
            want = state_of(a)
            die(a)

            # B's own settings are the defaults: the replay is under A's (suspect_ratio 1.5).
            take_over(b)
            assert state_of(b) == want
            assert b.monitors[JOB].settings.suspect_ratio == 1.10  # then B's
            assert windows_scored(tmp_path / "b") == []
        finally:
            b.flush()
            a.fleet.stop(release=False)

    asyncio.run(run())


def test_snapshot_every_1_writes_the_whole_state_each_window(pg_url: str, tmp_path: Path) -> None:
    now = [0.0]

    async def run() -> None:
        full = fleet_coordinator(tmp_path / "a", pg_url, "a", now, snapshot_every=1)
        try:
            take_job(full)
            await both_hosts(full, range(10))
            saved = full.fleet.store.load(JOB)
            assert saved.marker["full"] == 9 and saved.marker["delta"] == []
            per_window_full = full.state_bytes / full.commits
        finally:
            full.flush()  # a clean stop: the lease goes back at once
        inc = fleet_coordinator(tmp_path / "b", pg_url, "b", now, snapshot_every=5)
        try:
            take_job(inc)
            await both_hosts(inc, range(10, 20))
            per_window_inc = inc.state_bytes / inc.commits
            # Two full snapshots in ten commits (the heir's first, then every fifth).
            assert per_window_inc < 0.5 * per_window_full
        finally:
            inc.flush()
        # A clean stop writes the whole state: the marker lists no delta.
        reader = FleetStore(pg_url, "reader", "", LEASE_S)
        saved = reader.load(JOB)
        reader.close()
        assert saved.marker["full"] == 19 and saved.marker["delta"] == []

    asyncio.run(run())


def test_snapshot_every_is_checked_and_named() -> None:
    assert FleetConfig().snapshot_every == 10
    with pytest.raises(ConfigError, match=r"fleet\.snapshot_every: expected"):
        CoordinatorConfig(fleet=FleetConfig(snapshot_every=0)).validated()


def test_a_marker_that_cannot_be_read_is_named() -> None:
    assert Replay({"window": 3}).walls == {}  # an older coordinator's: no deltas
    r = Replay({"delta": [["c0", 4, 1.5], ["c0", 5, 2.5]]})
    assert r.upto == 5 and r.take("c0", 5) == 2.5 and r.take("c0", 5) is None
    with pytest.raises(ValueError, match=r"fleet marker: a delta entry must be \[run, window"):
        Replay({"delta": [[4, 1.5]]})
    with pytest.raises(ValueError, match="snapshot_every must be >= 1"):
        SnapshotPolicy(0)


def test_a_correction_decided_in_a_window_forces_a_full_snapshot(
    pg_url: str, tmp_path: Path
) -> None:
    """A rank's clocks locked low: its incident gets a correction (recommended: the book
    decides by the agents connected then, which an heir cannot replay). That window's
    commit is a full snapshot; the windows after are deltas, replayed exactly."""
    from test_corrections_service import JOB as CJ
    from test_corrections_service import peer as cpeer
    from test_corrections_service import windows as locked

    wall = [1000.0]

    async def run() -> None:
        a = fleet_coordinator(tmp_path / "a", pg_url, "a", wall, wall=lambda: wall[0])
        b = fleet_coordinator(tmp_path / "b", pg_url, "b", wall, wall=lambda: wall[0])
        try:
            assert a.route(cpeer(0)) == []
            for h in (0, 1):
                a.on_connect(cpeer(h))
            decided = None
            for w in range(20):
                await locked(a, w, w + 1, True, wall)
                book = a.corrections.books.get(CJ)
                if decided is None and book is not None and book.corrections:
                    decided = w
                    assert a.fleet.store.load(CJ).marker["full"] == w  # at once, whole
            assert decided is not None and decided < 17
            saved = a.fleet.store.load(CJ)
            assert saved.marker["delta"] and saved.marker["full"] >= decided
            want = state_of(a, CJ)
            assert want["corrections"]["corrections"]  # the recommended correction
            die(a)
            until(lambda: b.route(cpeer(1)) == [], 10 * LEASE_S, "B to take the lease")
            assert state_of(b, CJ) == want
        finally:
            b.flush()
            a.fleet.stop(release=False)

    asyncio.run(run())
