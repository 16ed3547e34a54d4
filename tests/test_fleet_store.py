"""The fleet's leases and fenced writes (store/fleet.py) on a real PostgreSQL (tests/pg.py).

- Expiry is judged by the database's clock: this process's clock moved a day
  ahead (time.time patched) changes nothing; the lease runs out only once the
  server's clock_timestamp() passes it.
- A takeover bumps the epoch; the previous holder's renewal reports the lease lost.
- A write with a stale epoch raises LeaseLost and writes nothing (state, marker,
  journal all as the new owner left them).
- Two connections racing to acquire one job (many times, from threads): exactly one owner.
- A clean release hands the lease over at once, state kept for the next owner.
- SQLite is refused for fleet mode, naming the store.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from artemis.store import open_store
from artemis.store.base import StoreError
from artemis.store.fleet import FleetStore, LeaseLost, check_fleet_url

LEASE_S = 0.6


@pytest.fixture
def pair(pg_url: str):  # type: ignore[no-untyped-def]
    a = FleetStore(pg_url, "a", "127.0.0.1:7001", LEASE_S)
    b = FleetStore(pg_url, "b", "127.0.0.1:7002", LEASE_S)
    yield a, b
    a.close()
    b.close()


def _wait_expired(fs: FleetStore, job: str, timeout: float = 10.0) -> None:
    """Until the server's clock says nobody holds `job` (polled on the server's clock)."""
    end = time.monotonic() + timeout
    while fs.owner_of(job) is not None:
        assert time.monotonic() < end, "lease never expired"
        time.sleep(0.05)


def test_expiry_is_judged_by_the_database_clock(
    pair: tuple[FleetStore, FleetStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    la = a.acquire("j")
    assert la.mine and la.epoch == 1 and la.owner == "a"
    t0 = a.now()
    assert la.expires == pytest.approx(t0 + LEASE_S, abs=0.5)
    # Our clock a day ahead: b must still see a's lease as live (the server decides).
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 86400.0)
    lb = b.acquire("j")
    assert not lb.mine and lb.owner == "a" and lb.address == "127.0.0.1:7001" and lb.epoch == 1
    monkeypatch.undo()
    _wait_expired(b, "j")
    assert b.now() >= la.expires  # expired exactly when the server's clock passed it
    lb = b.acquire("j")
    assert lb.mine and lb.epoch == 2 and lb.owner == "b"


def test_takeover_bumps_the_epoch_and_the_old_owner_learns_it(
    pair: tuple[FleetStore, FleetStore],
) -> None:
    a, b = pair
    assert a.acquire("j").epoch == 1
    assert a.renew({"j": 1}) == set()  # still ours
    assert a.acquire("j").epoch == 1  # extending keeps the epoch
    _wait_expired(b, "j")
    lb = b.acquire("j")
    assert lb.mine and lb.epoch == 2
    assert a.renew({"j": 1}) == {"j"}  # lost: taken over
    seen = a.owner_of("j")
    assert seen is not None and not seen.mine and seen.owner == "b" and seen.epoch == 2


def test_a_stale_epoch_cannot_write(pair: tuple[FleetStore, FleetStore]) -> None:
    a, b = pair
    a.acquire("j")
    a.add_batch("j", 1, 3, b"batch-of-a")
    a.write_state("j", 1, b"state-of-a", {"seq": 1})
    _wait_expired(b, "j")
    assert b.acquire("j").epoch == 2
    b.write_state("j", 2, b"state-of-b", {"seq": 7}, journal_below=4)
    b.add_batch("j", 2, 5, b"batch-of-b")
    # a, paused past its lease, comes back and writes with its old epoch: refused.
    with pytest.raises(LeaseLost, match="epoch 1"):
        a.write_state("j", 1, b"stale", {"seq": 2})
    with pytest.raises(LeaseLost):
        a.add_batch("j", 1, 6, b"stale-batch")
    saved = b.load("j")
    assert saved.state == b"state-of-b" and saved.marker == {"seq": 7} and saved.epoch == 2
    assert saved.journal == [b"batch-of-b"]  # a's batch pruned by b's state, a's stale one absent
    # An expired lease refuses writes too, even to its holder (until it re-acquires).
    _wait_expired(b, "j")
    with pytest.raises(LeaseLost):
        b.write_state("j", 2, b"late", {"seq": 8})
    assert b.load("j").state == b"state-of-b"


def _grab(fs: FleetStore, job: str, barrier: threading.Barrier, got: dict[str, bool]) -> None:
    barrier.wait()
    got[fs.owner] = fs.acquire(job).mine


def test_racing_acquirers_get_exactly_one_owner(pg_url: str) -> None:
    stores = [FleetStore(pg_url, f"c{i}", f"127.0.0.1:{7000 + i}", 30.0) for i in range(4)]
    try:
        for n in range(20):
            job = f"race-{n}"
            barrier = threading.Barrier(len(stores))
            got: dict[str, bool] = {}
            threads = [
                threading.Thread(target=_grab, args=(fs, job, barrier, got)) for fs in stores
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert sum(got.values()) == 1, got
            lease = stores[0].owner_of(job)
            assert lease is not None and lease.epoch == 1 and got[lease.owner]
    finally:
        for fs in stores:
            fs.close()


def test_release_hands_over_at_once_and_keeps_the_state(
    pair: tuple[FleetStore, FleetStore],
) -> None:
    a, b = pair
    a.acquire("j")
    a.write_state("j", 1, b"s1", {"seq": 3})
    assert not b.acquire("j").mine
    a.release({"j": 1})
    lb = b.acquire("j")
    assert lb.mine and lb.epoch == 2
    assert b.load("j").state == b"s1"


def test_sqlite_is_refused_for_fleet_mode(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/a.db"
    with pytest.raises(StoreError, match=r"fleet mode needs a PostgreSQL store.*a\.db"):
        check_fleet_url(url)
    # ... though SQLite has the tables (one schema on both engines).
    with open_store(url) as s:
        names = {r[0] for r in s.db.execute("SELECT name FROM sqlite_master").fetchall()}  # type: ignore[attr-defined]
    assert {"fleet_leases", "fleet_state", "fleet_journal"} <= names


def test_fleet_connections_get_socket_timeouts_of_a_third_of_a_lease() -> None:
    from urllib.parse import parse_qs, urlsplit

    from artemis.store.fleet import with_timeouts

    got = parse_qs(urlsplit(with_timeouts("postgresql://u:p@h:5432/db", 9.0)).query)
    assert got["tcp_user_timeout"] == ["3000"] and got["keepalives"] == ["1"]
    assert got["connect_timeout"] == ["4"]
    # What the URL says stays; the rest is added after its own parameters.
    url = with_timeouts("postgresql://u:p@h/db?sslmode=require&tcp_user_timeout=500", 9.0)
    got = parse_qs(urlsplit(url).query)
    assert got["tcp_user_timeout"] == ["500"] and got["sslmode"] == ["require"]
    assert got["keepalives_count"] == ["2"]
