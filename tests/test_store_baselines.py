"""The store's baselines (schema v3): written per (workload, class, software), the
latest of a (workload, class) read back, a v2 store upgraded in place.

`store_url` is parametrised by backend: every test here runs on SQLite and on a
real PostgreSQL server (tests/pg.py).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from artemis.detect.baselines import Baseline, WindowStats, software_hash
from artemis.store import open_store
from artemis.store.base import store_url as sqlite_url
from artemis.store.schema import CURRENT, migrate
from artemis.store.sink import StoreSink
from artemis.store.sqlite import SqliteStore

OLD = {"driver": "535.104.05", "nccl": "2.19.3", "env": {"NCCL_ALGO": "Ring"}}
NEW = {**OLD, "driver": "550.54.14"}


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "artemis.db")
    return str(request.getfixturevalue("pg_url"))  # a real server (tests/pg.py)


def record(
    software: dict[str, Any], gap: float, job: str, updated: float, cls: str = "H100"
) -> dict[str, Any]:
    b = Baseline("wl", cls, software, software_hash(software))
    b.add(
        [WindowStats(w, gap * 1.1, gap * 0.98, gap, gap * 0.95, gap * 1.05) for w in range(6, 12)],
        job,
        "r1",
    )
    b.updated = updated
    return b.to_record()


def test_write_and_read_the_latest(store_url: str) -> None:
    a = record(OLD, 50.0, "a", 100.0)
    b = record(NEW, 54.0, "b", 200.0)
    other = record(OLD, 80.0, "c", 300.0, cls="MI300X")
    with open_store(store_url) as s:
        assert s.baseline("wl", "H100") is None
        s.write_baselines([a])
        assert s.baseline("wl", "H100") == a
        s.write_baselines([b, other])
        assert s.baseline("wl", "H100") == b  # the latest, whatever its software
        assert s.baseline("wl", "H100", a["software_hash"]) == a  # or the one of a fingerprint
        assert s.baseline("wl", "MI300X") == other
        assert s.baseline("other", "H100") is None
        # one row per (workload, class, software): a second write of one replaces it
        a2 = record(OLD, 51.0, "d", 400.0)
        s.write_baselines([a2])
        assert s.baseline("wl", "H100") == a2
        assert [x["software_hash"] for x in s.baselines("wl")] == [
            a2["software_hash"],
            other["software_hash"],
            b["software_hash"],
        ]
        assert Baseline.from_record(s.baseline("wl", "H100") or {}).gap_q2_ms == pytest.approx(51.0)
    with open_store(store_url, readonly=True) as s:  # another reader (a coordinator of the fleet)
        assert s.baseline("wl", "H100") == a2


def test_the_sink_reads_and_writes(store_url: str, tmp_path: Path) -> None:
    """The sink's reads never wait on the database: queued for its writer thread
    (after the writes queued before them), "pending" until answered."""
    sink = StoreSink.open(store_url, tmp_path / "findings.jsonl")
    assert sink.read_baseline("wl", "H100") == ("pending", None)
    assert sink.flush(30)
    assert sink.read_baseline("wl", "H100") == ("done", None)
    a = record(OLD, 50.0, "a", 100.0)
    sink.write_baselines([a])
    assert sink.read_baseline("wl", "H100") == ("pending", None)  # read after the write
    assert sink.flush(30)
    assert sink.read_baseline("wl", "H100") == ("done", a)
    sink.close()
    assert sink.read_baseline("wl", "H100") == ("failed", None)  # off: not compared


def test_a_v2_store_upgrades_to_v3(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    db = sqlite3.connect(str(path), isolation_level=None)
    assert migrate(db, target=2) == [1, 2]
    db.execute("INSERT INTO jobs VALUES ('j', '{}', 1.0, 2.0)")
    db.close()
    with open_store(sqlite_url(path)) as s:
        assert isinstance(s, SqliteStore) and 3 in s.upgraded and CURRENT >= 3
        assert [j["job"] for j in s.jobs()] == ["j"]  # what v2 held is still there
        a = record(OLD, 50.0, "a", 100.0)
        s.write_baselines([a])
        assert s.baseline("wl", "H100") == a
