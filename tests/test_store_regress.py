"""The store's regress runs (schema v4): written by id, read back newest first by node
or hardware class, their fingerprints in `fingerprints`, a v3 store upgraded in place.

`store_url` is parametrised by backend: every test here runs on SQLite and on a real
PostgreSQL server (tests/pg.py).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from artemis.detect.baselines import software_hash
from artemis.store import StoreError, open_store
from artemis.store.base import store_url as sqlite_url
from artemis.store.schema import CURRENT, migrate
from artemis.store.sqlite import SqliteStore

SOFT = {"kernel": "6.1.0", "torch": "2.13.0", "env": {"NCCL_ALGO": "Ring"}}


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "artemis.db")
    return str(request.getfixturevalue("pg_url"))  # a real server (tests/pg.py)


def run(node: str, t: float, hw: str = "cpu X", healthy: bool = True, **kw: Any) -> dict[str, Any]:
    soft = kw.pop("software", SOFT)
    return {
        "id": f"{node}@{t}",
        "node": node,
        "time": t,
        "hardware": hw,
        "device": "cpu",
        "ranks": 2,
        "fingerprint": software_hash(soft),
        "software": soft,
        "items": {"gemm/f32x512": {"benchmark": "gemm", "median": 0.002, "p25": 0.0019}},
        "absent": {"h2d": "no GPU on this node"},
        "verdict": "ok" if healthy else "regression",
        "healthy": healthy,
        **kw,
    }


def test_write_and_read_back(store_url: str) -> None:
    a1, a2, b1 = run("a", 10.0), run("a", 20.0, healthy=False), run("b", 15.0)
    other = run("c", 30.0, hw="NVIDIA H100 80GB HBM3", device="cuda")
    with open_store(store_url) as s:
        assert s.regress_runs() == []
        for r in (a1, b1, a2, other):
            s.write_regress_run(r)
        assert s.regress_runs(node="a") == [a2, a1]  # newest first, as they went in
        assert s.regress_runs(hardware="cpu X") == [a2, b1, a1]
        assert s.regress_runs(hardware="cpu X", limit=2) == [a2, b1]
        assert s.regress_runs(node="a", hardware="NVIDIA H100 80GB HBM3") == []
        assert [r["id"] for r in s.regress_runs()] == [other["id"], a2["id"], b1["id"], a1["id"]]
        # A second write of one id replaces it.
        s.write_regress_run({**a1, "verdict": "change", "healthy": False})
        assert s.regress_runs(node="a")[1]["verdict"] == "change"
        assert len(s.regress_runs()) == 4
        with pytest.raises(StoreError, match="a regress run needs fingerprint"):
            s.write_regress_run({**a1, "fingerprint": None})
    with open_store(store_url, readonly=True) as s:  # another node's reader
        assert [r["node"] for r in s.regress_runs(hardware="cpu X")] == ["a", "b", "a"]


def test_fingerprints_are_kept_by_hash(tmp_path: Path) -> None:
    path = tmp_path / "artemis.db"
    changed = {**SOFT, "env": {"NCCL_ALGO": "Tree"}}
    with open_store(sqlite_url(path)) as s:
        s.write_regress_run(run("a", 1.0))
        s.write_regress_run(run("a", 2.0))
        s.write_regress_run(run("a", 3.0, software=changed))
    db = sqlite3.connect(str(path))
    rows = dict(db.execute("SELECT hash, software FROM fingerprints").fetchall())
    assert set(rows) == {software_hash(SOFT), software_hash(changed)}


def test_a_v3_store_upgrades_to_v4(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    db = sqlite3.connect(str(path), isolation_level=None)
    assert migrate(db, target=3) == [1, 2, 3]
    db.execute("INSERT INTO jobs VALUES ('j', '{}', 1.0, 2.0)")
    db.close()
    with open_store(sqlite_url(path)) as s:
        assert isinstance(s, SqliteStore) and 4 in s.upgraded and CURRENT >= 4
        assert [j["job"] for j in s.jobs()] == ["j"]  # what v3 held is still there
        s.write_regress_run(run("a", 1.0))
        assert [r["id"] for r in s.regress_runs()] == ["a@1.0"]


def test_a_jsonl_view_keeps_no_regress_runs(tmp_path: Path) -> None:
    from artemis.store.jsonl import JsonlIncidents

    (tmp_path / "incidents.jsonl").write_text("")
    view = JsonlIncidents(tmp_path / "incidents.jsonl")
    assert view.regress_runs() == []
    with pytest.raises(StoreError, match="keeps no regress runs"):
        view.write_regress_run(run("a", 1.0))
