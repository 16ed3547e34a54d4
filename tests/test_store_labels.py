"""Schema v5 (issue 29): actions keyed by (incident, id), plans and corrections alike; a
person's labels in their own table, never overwritten by the coordinator's writes; a v4
store upgraded in place; `artemis incidents label` / `export --labelled`.

`store_url` is parametrised by backend: SQLite and a real PostgreSQL server (tests/pg.py).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from artemis.store import StoreError, open_store
from artemis.store.base import store_url as sqlite_url
from artemis.store.jsonl import JsonlIncidents
from artemis.store.schema import migrate
from artemis.store.sqlite import SqliteStore


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "artemis.db")
    return str(request.getfixturevalue("pg_url"))  # a real server (tests/pg.py)


PLAN = {
    "type": "plan",
    "plan": "p1-w12-r2",
    "status": "rolled_back",
    "history": [{"status": "recommended", "window": 12, "time": 1.0}],
    "throughput_before": 300.0,
    "throughput_after": 290.0,
    "gain_pct": -3.3,
}
CORRECTION = {
    "type": "correction",
    "action": "reset_clocks",
    "id": "c-j-r2-w5-1",
    "host": "h0",
    "gpu": 2,
    "rank": 2,
    "status": "verified",
    "before": {"vendor": "nvidia", "sm_mhz": 1200},
    "after": {"sm_mhz": 1980},
    "history": [{"status": "approved", "t": 1.0, "detail": ""}],
    "gain_pct": 12.5,
}


def record(iid: str = "j-r2-w5", updated_cause: str = "clocks", **kw: Any) -> dict[str, Any]:
    return {
        "id": iid,
        "job": "j",
        "run": "r",
        "kind": "rank",
        "subject": "2",
        "rank": 2,
        "status": "open",
        "opened": {"window": 5, "time": 1.0},
        "closed": None,
        "cause": {"kind": updated_cause, "text": "clocks low"},
        "evidence": {"windows": 4, "ratio": 1.3, "telemetry": {"sm_mhz": {"rank": 1200}}},
        "cost": {"gpu_hours": 0.1},
        "actions": [PLAN, CORRECTION],
        "verdict": None,
        **kw,
    }


def test_actions_keyed_by_incident_and_id(store_url: str) -> None:
    with open_store(store_url) as s:
        s.write_incident(record())
        s.write_incident(record())  # rewritten: replaced, not doubled
        rows = s.db.execute(  # type: ignore[attr-defined]
            "SELECT id, type, plan, action, status, gain_pct FROM actions ORDER BY seq"
        ).fetchall()
        assert [tuple(r) for r in rows] == [
            ("p1-w12-r2", "plan", "p1-w12-r2", None, "rolled_back", -3.3),
            ("c-j-r2-w5-1", "correction", None, "reset_clocks", "verified", 12.5),
        ]
        rec = s.incident("j-r2-w5")
        assert rec is not None and rec["actions"][1]["before"] == {
            "vendor": "nvidia",
            "sm_mhz": 1200,
        }


def test_a_label_survives_the_coordinators_later_writes(store_url: str) -> None:
    with open_store(store_url) as s:
        s.write_incident(record())
        with pytest.raises(KeyError):
            s.write_label("nope", "power", None, 5.0)
        s.write_label("j-r2-w5", "thermal", "fan failed on h0", 5.0)
        # the coordinator writes the incident again (a later change): the label stays
        s.write_incident(record(verdict="recovered", status="closed"))
        assert s.labels() == [
            {"incident": "j-r2-w5", "cause": "thermal", "note": "fan failed on h0", "time": 5.0}
        ]
        s.write_label("j-r2-w5", "clocks", None, 6.0)  # relabelled: replaced
        assert [(x["cause"], x["note"]) for x in s.labels()] == [("clocks", None)]
        # retention keeps a labelled incident (its evidence is what the label is for)
        s.write_incident(record("j-r3-w9"))
        s.prune(before=1e12)
        assert s.incident("j-r2-w5") is not None and s.incident("j-r3-w9") is None


def test_a_v4_store_upgrades_to_v5(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    db = sqlite3.connect(str(path), isolation_level=None)
    assert migrate(db, target=4) == [1, 2, 3, 4]
    old = {**record(), "actions": [{k: v for k, v in PLAN.items() if k != "type"}]}
    db.execute(
        "INSERT INTO incidents (id, job, opened_window, record, updated) VALUES (?, ?, ?, ?, ?)",
        ("j-r2-w5", "j", 5, json.dumps(old), 2.0),
    )
    db.execute(
        "INSERT INTO actions VALUES ('j-r2-w5', 'p1-w12-r2', 0, 'rolled_back', 300, 290, -3.3, '[]')"
    )
    db.close()
    with open_store(sqlite_url(path)) as s:
        assert isinstance(s, SqliteStore) and 5 in s.upgraded
        rows = s.db.execute("SELECT incident, id, type, plan, status FROM actions").fetchall()
        assert [tuple(r) for r in rows] == [
            ("j-r2-w5", "p1-w12-r2", "plan", "p1-w12-r2", "rolled_back")
        ]
        s.write_label("j-r2-w5", "clocks", None, 3.0)
        assert s.labels()[0]["cause"] == "clocks"


def test_a_jsonl_view_keeps_no_labels(tmp_path: Path) -> None:
    (tmp_path / "incidents.jsonl").write_text(json.dumps(record()) + "\n")
    view = JsonlIncidents(tmp_path / "incidents.jsonl")
    with pytest.raises(StoreError, match="labels need an incident store"):
        view.write_label("j-r2-w5", "clocks", None, 1.0)


def _artemis(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from artemis.cli.main import app; sys.argv[0] = 'artemis'; app()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def test_label_and_export_from_the_command_line(tmp_path: Path) -> None:
    findings = tmp_path / "findings.jsonl"
    findings.write_text("")
    (tmp_path / "incidents.jsonl").write_text(json.dumps(record()) + "\n")
    # only the JSONL next to the findings: labelling says it needs a store
    r = _artemis("incidents", "label", "j-r2-w5", "--cause", "clocks", "--findings", str(findings))
    assert r.returncode != 0 and "labels need an incident store" in r.stderr, r.stderr
    assert "incidents.jsonl" in r.stderr
    with open_store(sqlite_url(tmp_path / "artemis.db")) as s:
        s.write_incident(record())
    bad = _artemis(
        "incidents", "label", "j-r2-w5", "--cause", "gremlins", "--findings", str(findings)
    )
    assert bad.returncode == 2 and "unknown cause 'gremlins'" in bad.stderr
    gone = _artemis("incidents", "label", "nope", "--cause", "power", "--findings", str(findings))
    assert gone.returncode == 1 and "no incident 'nope'" in gone.stderr
    ok = _artemis(
        "incidents", "label", "j-r2-w5", "--cause", "thermal", "--note", "fan", "--findings",
        str(findings),
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    out = _artemis("incidents", "export", "--labelled", "--findings", str(findings))
    assert out.returncode == 0, out.stderr
    (line,) = [json.loads(x) for x in out.stdout.splitlines()]
    assert line["id"] == "j-r2-w5" and line["cause"]["kind"] == "clocks"
    assert line["label"]["cause"] == "thermal" and line["label"]["note"] == "fan"
    assert line["evidence"]["telemetry"]["sm_mhz"]["rank"] == 1200
