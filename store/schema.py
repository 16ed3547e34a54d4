"""The SQLite store's schema: an ordered list of migrations, one per version.

A store records every migration applied to it in ``schema_version`` (one row
per version); its version is the highest. Opening a store read-write applies
the migrations after its version, each in its own transaction (SQLite's DDL is
transactional, so a migration that fails leaves the store at the version
before it). A version is never edited once released: a change is a new
migration appended here, with a test that a store of the previous version
opens and upgrades (tests/test_store.py).

v1, the first schema: jobs, incidents (the latest record as JSON, by id) and
per-window job rows with the peers' median gap ratio only.
v2: incidents get the columns a listing filters and sorts on
(kind, subject, status, verdict, cause, windows, GPU-hours lost), backfilled
from their records; actions get their own table (one row per plan of an
incident), backfilled too; the job rows get the p10/p90 bands; per-window rows
of an incident's subject get a table (what redraws an incident's plots).
v3, the current one: baselines across jobs (coordinator/baselines.py): the
software fingerprints by hash, and one baseline per (workload fingerprint,
hardware class, software fingerprint) with its reference values in columns and
its whole distribution as JSON; the latest of a (workload, class) is what a job
is judged by (index on `updated`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Migration:
    version: int
    what: str
    apply: Callable[[sqlite3.Connection], None]


def _script(db: sqlite3.Connection, sql: str) -> None:
    """Each statement of ``sql`` in the caller's transaction (``executescript`` would
    commit it first)."""
    for stmt in sql.split(";"):
        if stmt.strip():
            db.execute(stmt)


def _v1(db: sqlite3.Connection) -> None:
    _script(
        db,
        """
        CREATE TABLE schema_version (
            version INTEGER PRIMARY KEY,
            applied REAL NOT NULL,
            what    TEXT NOT NULL
        );
        CREATE TABLE jobs (
            job        TEXT PRIMARY KEY,
            info       TEXT NOT NULL,      -- JSON object
            first_seen REAL NOT NULL,      -- unix s
            updated    REAL NOT NULL
        );
        CREATE TABLE incidents (
            id            TEXT PRIMARY KEY,
            job           TEXT NOT NULL,
            opened_window INTEGER,
            record        TEXT NOT NULL,   -- the latest record, JSON (docs/DESIGN.md)
            updated       REAL NOT NULL
        );
        CREATE TABLE job_windows (
            job           TEXT NOT NULL,
            win           INTEGER NOT NULL,
            time          REAL,
            step_ms       REAL,
            samples_per_s REAL,
            ratio_p50     REAL,
            PRIMARY KEY (job, win)
        ) WITHOUT ROWID;
        """,
    )


def incident_columns(record: dict[str, Any]) -> dict[str, Any]:
    """The columns of the incidents table (v2) taken from a record."""
    opened = record.get("opened") or {}
    closed = record.get("closed") or {}
    cause = record.get("cause") or {}
    cost = record.get("cost") or {}
    return {
        "kind": record.get("kind"),
        "subject": None if record.get("subject") is None else str(record.get("subject")),
        "status": record.get("status"),
        "verdict": record.get("verdict"),
        "cause": cause.get("kind") if isinstance(cause, dict) else None,
        "opened_window": opened.get("window"),
        "closed_window": closed.get("window"),
        "gpu_hours": cost.get("gpu_hours"),
    }


def action_rows(record: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The actions table's rows (v2) of a record: (incident, plan, seq, status,
    throughput_before, throughput_after, gain_pct, history JSON)."""
    rows = []
    for seq, a in enumerate(record.get("actions") or ()):
        rows.append(
            (
                record["id"],
                str(a.get("plan", f"#{seq}")),
                seq,
                a.get("status"),
                a.get("throughput_before"),
                a.get("throughput_after"),
                a.get("gain_pct"),
                json.dumps(a.get("history") or [], separators=(",", ":")),
            )
        )
    return rows


def _v2(db: sqlite3.Connection) -> None:
    for col, typ in (
        ("kind", "TEXT"),
        ("subject", "TEXT"),
        ("status", "TEXT"),
        ("verdict", "TEXT"),
        ("cause", "TEXT"),
        ("closed_window", "INTEGER"),
        ("gpu_hours", "REAL"),
    ):
        db.execute(f"ALTER TABLE incidents ADD COLUMN {col} {typ}")
    _script(
        db,
        """
        CREATE INDEX incidents_by_job ON incidents (job, opened_window);
        CREATE TABLE actions (
            incident          TEXT NOT NULL,
            plan              TEXT NOT NULL,
            seq               INTEGER NOT NULL,  -- its place in the record's actions
            status            TEXT,
            throughput_before REAL,
            throughput_after  REAL,
            gain_pct          REAL,
            history           TEXT NOT NULL,     -- JSON list of {status, window, time}
            PRIMARY KEY (incident, plan)
        ) WITHOUT ROWID;
        CREATE TABLE job_windows_v2 (
            job           TEXT NOT NULL,
            run           TEXT NOT NULL,    -- '' for rows v1 wrote (it kept no run)
            win           INTEGER NOT NULL,
            time          REAL,
            step_ms       REAL,
            samples_per_s REAL,
            ratio_p10     REAL,
            ratio_p50     REAL,
            ratio_p90     REAL,
            extra         TEXT,             -- JSON of keys not in a column
            PRIMARY KEY (job, run, win)
        ) WITHOUT ROWID;
        INSERT INTO job_windows_v2 (job, run, win, time, step_ms, samples_per_s, ratio_p50)
            SELECT job, '', win, time, step_ms, samples_per_s, ratio_p50 FROM job_windows;
        DROP TABLE job_windows;
        ALTER TABLE job_windows_v2 RENAME TO job_windows;
        CREATE TABLE incident_windows (
            incident     TEXT NOT NULL,
            win          INTEGER NOT NULL,
            time         REAL,
            ratio        REAL,
            gap_ms       REAL,
            peers_gap_ms REAL,
            extra        TEXT,
            PRIMARY KEY (incident, win)
        ) WITHOUT ROWID;
        """,
    )
    # Backfill what v1 kept only inside the records.
    for id_, text in db.execute("SELECT id, record FROM incidents").fetchall():
        rec = json.loads(text)
        cols = incident_columns(rec)
        db.execute(
            "UPDATE incidents SET kind=?, subject=?, status=?, verdict=?, cause=?,"
            " closed_window=?, gpu_hours=? WHERE id=?",
            (
                cols["kind"],
                cols["subject"],
                cols["status"],
                cols["verdict"],
                cols["cause"],
                cols["closed_window"],
                cols["gpu_hours"],
                id_,
            ),
        )
        db.executemany(
            "INSERT OR REPLACE INTO actions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            action_rows({**rec, "id": id_}),
        )


def _v3(db: sqlite3.Connection) -> None:
    _script(
        db,
        """
        CREATE TABLE fingerprints (
            hash       TEXT PRIMARY KEY,   -- coordinator/baselines.py software_hash
            software   TEXT NOT NULL,      -- JSON: the job's software fingerprint
            first_seen REAL NOT NULL       -- unix s
        );
        CREATE TABLE baselines (
            workload  TEXT NOT NULL,       -- the job's workload fingerprint
            hw_class  TEXT NOT NULL,
            software  TEXT NOT NULL,       -- fingerprints.hash
            updated   REAL NOT NULL,       -- unix s of the last write
            windows   INTEGER NOT NULL,    -- healthy windows that ever fed it
            step_ms   REAL,                -- reference values: medians over its windows
            gap_q1_ms REAL,
            gap_q2_ms REAL,
            record    TEXT NOT NULL,       -- JSON: distribution and jobs (docs/DESIGN.md)
            PRIMARY KEY (workload, hw_class, software)
        );
        CREATE INDEX baselines_latest ON baselines (workload, hw_class, updated);
        """,
    )


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "jobs, incidents, job windows (median ratio)", _v1),
    Migration(2, "incident columns, actions, p10/p90 bands, incident windows", _v2),
    Migration(3, "baselines across jobs, software fingerprints", _v3),
)
CURRENT = MIGRATIONS[-1].version


def version_of(db: sqlite3.Connection) -> int:
    """0 for an empty database; raises LookupError for one that has tables but no
    ``schema_version`` (some other program's database)."""
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "schema_version" not in names:
        if names:
            raise LookupError(f"tables {sorted(names)[:5]} but no schema_version")
        return 0
    row = db.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate(db: sqlite3.Connection, target: int = CURRENT) -> list[int]:
    """Apply the migrations after the store's version up to ``target``, each in its
    own transaction; returns the versions applied. ``db`` is in autocommit mode
    (isolation_level None): the transactions are explicit here."""
    applied = []
    for m in MIGRATIONS:
        if m.version > target:
            break
        # BEGIN IMMEDIATE: the version is read under the write lock, so two
        # processes opening an old store do not both migrate it.
        db.execute("BEGIN IMMEDIATE")
        try:
            if version_of(db) >= m.version:
                db.execute("ROLLBACK")
                continue
            m.apply(db)
            db.execute(
                "INSERT INTO schema_version (version, applied, what) VALUES (?, ?, ?)",
                (m.version, time.time(), m.what),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        applied.append(m.version)
    return applied
