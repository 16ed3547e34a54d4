"""The store's schema: one ordered list of migrations, run on SQLite and PostgreSQL.

A store records every migration applied to it in ``schema_version`` (one row
per version); its version is the highest. Opening a store read-write applies
the migrations after its version, each in its own transaction (both engines'
DDL is transactional, so a migration that fails leaves the store at the
version before it). A version is never edited once released: a change is a
new migration appended here, with a test that a store of the previous version
opens and upgrades (tests/test_store.py, on both engines).

**One text, two engines.** A migration is written once, in SQLite's spelling,
against ``Db`` (below): ``db.script(DDL)`` and ``db.execute(SQL, args)`` with
``?`` placeholders. What differs between the engines is in ``Dialect`` alone:
placeholders (``?`` -> ``%s``), the column types (``REAL`` -> ``DOUBLE
PRECISION``, ``INTEGER`` -> ``BIGINT``, ``WITHOUT ROWID`` dropped), the
byte-order collation (``COLLATE BINARY`` -> ``COLLATE "C"``), how the tables
are listed, the row lock (``FOR UPDATE``) and the migration lock (SQLite's
``BEGIN IMMEDIATE`` write lock; PostgreSQL's ``pg_advisory_xact_lock``, so
coordinators of a fleet opening one old database at once migrate it once).
JSON is kept as TEXT on both (the readers decode it). Upserts are ``INSERT ...
ON CONFLICT (key) DO UPDATE SET c = excluded.c`` / ``DO NOTHING``, which both
engines take as written (``upsert()``).

v1, the first schema: jobs, incidents (the latest record as JSON, by id) and
per-window job rows with the peers' median gap ratio only.
v2: incidents get the columns a listing filters and sorts on (kind, subject,
status, verdict, cause, windows, GPU-hours lost), backfilled from their
records; actions get their own table (one row per plan of an incident),
backfilled too; the job rows get the p10/p90 bands; per-window rows of an
incident's subject get a table (what redraws an incident's plots).
v3: baselines across jobs (detect/baselines.py): the
software fingerprints by hash, and one baseline per (workload fingerprint,
hardware class, software fingerprint) with its reference values in columns and
its whole distribution as JSON; the latest of a (workload, class) is what a job
is judged by (index on `updated`).
v4: `artemis regress` runs (regress/README.md), one row per run
keyed by its id, with the columns a baseline is selected by (node, hardware
class, device, ranks, software fingerprint hash, healthy) and the whole run as
JSON; its software fingerprint also goes into `fingerprints`.
v5: actions keyed by (incident, id), plans and corrections alike; labels.
v6, the current one: the coordinator fleet (store/fleet.py, issue 30): one lease
row per job (owner, advertised address, epoch, expiry on the database's clock),
each job's state (the snapshot bytes, its assembly state inside, and the last
output marker) and its journal (batches taken but not scored). SQLite gets the
tables too (one schema on both engines), but fleet mode refuses SQLite: a lease
needs one clock every coordinator shares, PostgreSQL's ``clock_timestamp()``.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# The key of PostgreSQL's advisory lock that serialises migrations of a database
# (any 64-bit number no other program of that database uses: "artemis1" in ASCII).
PG_MIGRATION_LOCK = 0x617274656D697331


@dataclass(frozen=True)
class Dialect:
    """Everything that differs between the engines' SQL, in one place."""

    name: str  # "sqlite" | "postgresql"

    @property
    def postgres(self) -> bool:
        return self.name == "postgresql"

    def sql(self, q: str) -> str:
        """A statement written in SQLite's spelling, in this engine's."""
        return _pg_sql(q) if self.postgres else q

    def ddl(self, q: str) -> str:
        """DDL written in SQLite's spelling (types, WITHOUT ROWID), in this engine's."""
        return _pg_ddl(q) if self.postgres else q

    @property
    def tables(self) -> str:
        """The names of the tables of the store's schema."""
        if self.postgres:
            return (
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema()"
            )
        return "SELECT name FROM sqlite_master WHERE type = 'table'"

    @property
    def for_update(self) -> str:
        """Appended to a SELECT whose row the transaction then rewrites. SQLite's
        BEGIN IMMEDIATE already holds the whole file's write lock."""
        return " FOR UPDATE" if self.postgres else ""


SQLITE = Dialect("sqlite")
POSTGRES = Dialect("postgresql")


@lru_cache(maxsize=256)
def _pg_sql(q: str) -> str:
    # psycopg's placeholders are %s, so a literal % is %%; COLLATE BINARY (SQLite's
    # byte order, its default) is "C" there, whatever the database's locale.
    return q.replace("%", "%%").replace("?", "%s").replace("COLLATE BINARY", 'COLLATE "C"')


_PG_TYPES = (
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bBLOB\b"), "BYTEA"),
)
_WITHOUT_ROWID = re.compile(r"\)\s*WITHOUT ROWID")


def _pg_ddl(q: str) -> str:
    for pat, typ in _PG_TYPES:
        q = pat.sub(typ, q)
    return _pg_sql(_WITHOUT_ROWID.sub(")", q))


def upsert(
    table: str,
    cols: Sequence[str],
    key: Sequence[str],
    *,
    update: bool = True,
    keep: Sequence[str] = (),
) -> str:
    """``INSERT INTO table (cols) VALUES (?, ...)`` that replaces the row of the same
    ``key`` (``update``; but for the columns in ``keep``) or leaves it (not), in the
    spelling both engines take."""
    head = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    rest = [c for c in cols if c not in key and c not in keep]
    if not update or not rest:
        return f"{head} ON CONFLICT ({', '.join(key)}) DO NOTHING"
    sets = ", ".join(f"{c} = excluded.{c}" for c in rest)
    return f"{head} ON CONFLICT ({', '.join(key)}) DO UPDATE SET {sets}"


class Db:
    """A connection (``sqlite3`` in autocommit mode, or psycopg's with autocommit on)
    and its dialect: what the migrations and the stores' shared SQL run through."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        """Run one statement (SQLite's spelling); returns its cursor."""
        return self.conn.execute(self.dialect.sql(sql), tuple(args))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if not rows:
            return
        q = self.dialect.sql(sql)
        if self.dialect.postgres:
            with self.conn.cursor() as cur:
                cur.executemany(q, rows)
        else:
            self.conn.executemany(q, rows)

    def script(self, sql: str) -> None:
        """Each statement of the DDL ``sql`` in the caller's transaction (SQLite's
        ``executescript`` would commit it first)."""
        for stmt in self.dialect.ddl(sql).split(";"):
            if stmt.strip():
                self.conn.execute(stmt)

    def pipeline(self) -> Any:
        """Statements sent without waiting for each one's answer (PostgreSQL's pipeline
        mode: one round trip for many; their errors come at its end); none on SQLite,
        which has no round trips."""
        return self.conn.pipeline() if self.dialect.postgres else contextlib.nullcontext()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Db]:
        """One transaction; SQLite's takes the write lock at its start (BEGIN
        IMMEDIATE), so what it reads is not changed under it."""
        if self.dialect.postgres:
            with self.conn.transaction():
                yield self
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")


def wrap(conn: Any) -> Db:
    """A ``Db`` of a raw connection (a ``Db`` stays as it is)."""
    if isinstance(conn, Db):
        return conn
    if isinstance(conn, sqlite3.Connection):
        return Db(conn, SQLITE)
    if type(conn).__module__.startswith("psycopg"):
        return Db(conn, POSTGRES)
    raise TypeError(f"not a store connection: {type(conn).__name__}")


@dataclass(frozen=True)
class Migration:
    version: int
    what: str
    apply: Callable[[Db], None]


def _v1(db: Db) -> None:
    db.script(
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


ACTION_COLS = (
    "incident",
    "plan",
    "seq",
    "status",
    "throughput_before",
    "throughput_after",
    "gain_pct",
    "history",
)


def _action_rows_v2(record: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The actions table's rows as v2 keyed them, for its backfill (every entry then was
    a plan): (incident, plan, seq, status, throughput_before, throughput_after,
    gain_pct, history JSON): the v5 rows less type, plan, action and entry."""
    return [(r[0], r[1], *r[5:11]) for r in action_rows(record)]


def _v2(db: Db) -> None:
    for col, typ in (
        ("kind", "TEXT"),
        ("subject", "TEXT"),
        ("status", "TEXT"),
        ("verdict", "TEXT"),
        ("cause", "TEXT"),
        ("closed_window", "INTEGER"),
        ("gpu_hours", "REAL"),
    ):
        db.script(f"ALTER TABLE incidents ADD COLUMN {col} {typ}")
    db.script(
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
            upsert("actions", ACTION_COLS, ("incident", "plan")),
            _action_rows_v2({**rec, "id": id_}),
        )


def _v3(db: Db) -> None:
    db.script(
        """
        CREATE TABLE fingerprints (
            hash       TEXT PRIMARY KEY,   -- detect/baselines.py software_hash
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


def _v4(db: Db) -> None:
    db.script(
        """
        CREATE TABLE regress_runs (
            id          TEXT PRIMARY KEY,
            node        TEXT NOT NULL,
            time        REAL NOT NULL,     -- unix s, when the run ended
            hardware    TEXT NOT NULL,     -- hardware class: the GPU model, or "cpu <model>"
            device      TEXT NOT NULL,     -- cpu | cuda
            ranks       INTEGER NOT NULL,  -- local ranks of the all_reduce sweep
            fingerprint TEXT NOT NULL,     -- fingerprints.hash of its software fingerprint
            verdict     TEXT,              -- ok | no-baseline | regression | change
            healthy     INTEGER NOT NULL,  -- 1: no finding, the run may enter baselines
            record      TEXT NOT NULL      -- the whole run, JSON (regress/README.md)
        );
        CREATE INDEX regress_runs_by_node ON regress_runs (node, time);
        CREATE INDEX regress_runs_by_hardware ON regress_runs (hardware, time);
        """,
    )


# The actions table from v5: one row per entry of a record's `actions`, plans and
# corrections alike (docs/DESIGN.md "Corrections"), keyed by (incident, id).
ACTION_COLS_V5 = ("incident", "id", "type", "plan", "action", *ACTION_COLS[2:], "entry")


def action_rows(record: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The actions table's rows (v5) of a record, in ``ACTION_COLS_V5`` order. A plan
    entry (``type`` plan, or none: written before v5) is keyed by its plan id, a
    correction by its own ``id``."""
    rows = []
    for seq, a in enumerate(record.get("actions") or ()):
        kind = str(a.get("type") or "plan")
        ident = a.get("id") if kind == "correction" else a.get("plan")
        rows.append(
            (
                record["id"],
                str(ident if ident is not None else f"#{seq}"),
                kind,
                a.get("plan"),
                a.get("action"),
                seq,
                a.get("status"),
                a.get("throughput_before"),
                a.get("throughput_after"),
                a.get("gain_pct"),
                json.dumps(a.get("history") or [], separators=(",", ":")),
                json.dumps(a, separators=(",", ":")),
            )
        )
    return rows


def _v5(db: Db) -> None:
    db.script(
        """
        DROP TABLE actions;
        CREATE TABLE actions (
            incident          TEXT NOT NULL,
            id                TEXT NOT NULL,     -- the id of the plan or of the correction
            type              TEXT NOT NULL,     -- plan | correction
            plan              TEXT,              -- the plan id (the key of v2), NULL for a correction
            action            TEXT,              -- the action of a correction (reset_clocks, ...)
            seq               INTEGER NOT NULL,  -- its place in the record's actions
            status            TEXT,
            throughput_before REAL,
            throughput_after  REAL,
            gain_pct          REAL,
            history           TEXT NOT NULL,     -- JSON list of its status changes
            entry             TEXT NOT NULL,     -- JSON: the whole entry
            PRIMARY KEY (incident, id)
        ) WITHOUT ROWID;
        CREATE TABLE labels (
            incident TEXT PRIMARY KEY,         -- the id of an incident
            cause    TEXT NOT NULL,            -- the cause a person confirmed
            note     TEXT,
            time     REAL NOT NULL             -- unix s of the label
        );
        """,
    )
    # Rebuilt from the records, which hold every entry (v2 kept plans' keys only).
    for id_, text in db.execute("SELECT id, record FROM incidents").fetchall():
        db.executemany(
            upsert("actions", ACTION_COLS_V5, ("incident", "id")),
            action_rows({**json.loads(text), "id": id_}),
        )


def _v6(db: Db) -> None:
    db.script(
        """
        CREATE TABLE fleet_leases (
            job      TEXT PRIMARY KEY,
            owner    TEXT NOT NULL,     -- the holder's fleet id
            address  TEXT NOT NULL,     -- its advertised HOST:PORT
            epoch    INTEGER NOT NULL,  -- bumped by every takeover
            expires  REAL NOT NULL,     -- unix s on the database's clock
            acquired REAL NOT NULL      -- unix s on the database's clock
        );
        CREATE TABLE fleet_state (
            job     TEXT PRIMARY KEY,
            epoch   INTEGER NOT NULL,   -- the lease epoch that wrote it
            state   BLOB NOT NULL,      -- msgpack: the job's state (monitor + assembly)
            marker  TEXT NOT NULL,      -- JSON: the last group of outputs it saw through
            updated REAL NOT NULL
        );
        CREATE TABLE fleet_journal (
            job   TEXT NOT NULL,
            seq   INTEGER NOT NULL,     -- per job, in the order taken
            epoch INTEGER NOT NULL,
            hi    INTEGER NOT NULL,     -- the batch's highest window
            batch BLOB NOT NULL,        -- msgpack: the job's rows of a windows batch (columns)
            PRIMARY KEY (job, seq)
        );
        """
    )


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "jobs, incidents, job windows (median ratio)", _v1),
    Migration(2, "incident columns, actions, p10/p90 bands, incident windows", _v2),
    Migration(3, "baselines across jobs, software fingerprints", _v3),
    Migration(4, "regress runs (artemis regress)", _v4),
    Migration(5, "actions keyed by (incident, id): plans and corrections; labels", _v5),
    Migration(6, "coordinator fleet: leases, job state, journal", _v6),
)
CURRENT = MIGRATIONS[-1].version


def version_of(db: Any) -> int:
    """0 for an empty database; raises LookupError for one that has tables but no
    ``schema_version`` (some other program's database)."""
    db = wrap(db)
    names = {r[0] for r in db.execute(db.dialect.tables).fetchall()}
    if "schema_version" not in names:
        if names:
            raise LookupError(f"tables {sorted(names)[:5]} but no schema_version")
        return 0
    row = db.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate(conn: Any, target: int = CURRENT) -> list[int]:
    """Apply the migrations after the store's version up to ``target``, each in its
    own transaction; returns the versions applied. ``conn``: a ``Db``, or a raw
    connection in autocommit mode (the transactions are explicit here)."""
    db = wrap(conn)
    applied = []
    for m in MIGRATIONS:
        if m.version > target:
            break
        with db.transaction():
            # The version is read under the migration lock, so two processes opening
            # an old store do not both migrate it: SQLite's BEGIN IMMEDIATE holds the
            # file's write lock; PostgreSQL's advisory lock lasts to this commit, and
            # a waiter reads the version the winner committed.
            if db.dialect.postgres:
                db.execute("SELECT pg_advisory_xact_lock(?)", (PG_MIGRATION_LOCK,))
            if version_of(db) >= m.version:
                continue
            m.apply(db)
            db.execute(
                "INSERT INTO schema_version (version, applied, what) VALUES (?, ?, ?)",
                (m.version, time.time(), m.what),
            )
        applied.append(m.version)
    return applied
