"""``SqliteStore``: the embedded store, one SQLite file (the stdlib ``sqlite3``).

WAL journal: readers read a snapshot and never block the writer, nor the
writer them (a reader of another process sees each commit whole). Every write
call is one transaction; ``synchronous = NORMAL`` (no fsync per commit in WAL
mode: a power loss may lose the last commits, never corrupt the file; the
findings and incidents JSONL are the durable log). Schema and migrations:
store/schema.py.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

from artemis.store.base import Store, StoreError
from artemis.store.schema import CURRENT, action_rows, incident_columns, migrate, version_of

T = TypeVar("T")

BUSY_TIMEOUT_S = 5.0  # another writer (a second coordinator on the same file) holds the lock

JOB_COLS = ("time", "step_ms", "samples_per_s", "ratio_p10", "ratio_p50", "ratio_p90")
INC_COLS = ("time", "ratio", "gap_ms", "peers_gap_ms")


def _dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"))


def _guarded(what: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """sqlite3's errors become ``StoreError`` naming the file and the operation."""

    def deco(fn: Callable[..., T]) -> Callable[..., T]:
        @wraps(fn)
        def inner(self: SqliteStore, *a: Any, **kw: Any) -> T:
            try:
                return fn(self, *a, **kw)
            except sqlite3.Error as e:
                raise StoreError(f"{self.path}: {what} failed: {e}") from e

        return inner

    return deco


def _row_values(key: str, row: dict[str, Any], cols: tuple[str, ...]) -> tuple[Any, ...]:
    """A row's values for its table; a job row's ``run`` is a key column."""
    keyed = (key, "window", "run") if key == "job" else (key, "window")
    extra = {k: v for k, v in row.items() if k not in cols and k not in keyed}
    return (
        str(row[key]),
        *((str(row.get("run") or ""),) if key == "job" else ()),
        int(row["window"]),
        *(row.get(c) for c in cols),
        _dumps(extra) if extra else None,
    )


class SqliteStore(Store):
    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.readonly = readonly
        self.version = 0
        self.upgraded: list[int] = []  # versions applied by this open
        if readonly and not self.path.exists():
            raise StoreError(f"{self.path}: no store there")
        try:
            if readonly:
                self.db = sqlite3.connect(
                    f"file:{self.path}?mode=ro",
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                )
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # check_same_thread off: a writer may open it on one thread and write
                # from another (artemis.job.Detector's scorer); its calls are never
                # concurrent (one Store, one user at a time; several: one each).
                self.db = sqlite3.connect(
                    str(self.path),
                    timeout=BUSY_TIMEOUT_S,
                    isolation_level=None,
                    check_same_thread=False,
                )
        except (sqlite3.Error, OSError) as e:
            raise StoreError(f"{self.path}: cannot open the store: {e}") from e
        try:
            self._open()
        except BaseException:
            self.db.close()
            raise

    def _open(self) -> None:
        try:
            # The first read of the file: a file that is not SQLite fails here.
            v = version_of(self.db)
        except sqlite3.DatabaseError as e:
            raise StoreError(
                f"{self.path}: not an Artemis store: not a SQLite database, or a damaged one ({e})"
            ) from e
        except LookupError as e:
            raise StoreError(
                f"{self.path}: not an Artemis store: a SQLite database with {e}"
            ) from None
        if v > CURRENT:
            raise StoreError(
                f"{self.path}: store schema v{v} was written by a newer Artemis;"
                f" this one knows up to v{CURRENT}"
            )
        try:
            if self.readonly:
                if v < CURRENT:
                    raise StoreError(
                        f"{self.path}: store schema v{v}, this Artemis reads v{CURRENT}:"
                        " open it read-write once (a coordinator does) to upgrade it"
                    )
                self.db.execute("PRAGMA query_only = ON")
            else:
                mode = self.db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StoreError(f"{self.path}: cannot use WAL mode (got {mode})")
                self.db.execute("PRAGMA synchronous = NORMAL")
                self.upgraded = migrate(self.db)
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: cannot open the store: {e}") from e
        self.version = CURRENT

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only")
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # ------------------------------------------------------------------ writes
    @_guarded("write_job")
    def write_job(self, job: str, info: dict[str, Any]) -> None:
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT info FROM jobs WHERE job = ?", (job,)).fetchone()
            merged = {**(json.loads(row[0]) if row else {}), **info}
            db.execute(
                "INSERT INTO jobs (job, info, first_seen, updated) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (job) DO UPDATE SET info = excluded.info, updated = excluded.updated",
                (job, _dumps(merged), now, now),
            )

    def _upsert_incident(self, db: sqlite3.Connection, record: dict[str, Any], now: float) -> None:
        if not record.get("id") or not record.get("job"):
            raise StoreError(f"{self.path}: an incident record needs an id and a job")
        c = incident_columns(record)
        db.execute(
            "INSERT OR IGNORE INTO jobs (job, info, first_seen, updated) VALUES (?, '{}', ?, ?)",
            (record["job"], now, now),
        )
        db.execute(
            "INSERT INTO incidents (id, job, opened_window, record, updated, kind, subject,"
            " status, verdict, cause, closed_window, gpu_hours)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET job = excluded.job,"
            " opened_window = excluded.opened_window, record = excluded.record,"
            " updated = excluded.updated, kind = excluded.kind, subject = excluded.subject,"
            " status = excluded.status, verdict = excluded.verdict, cause = excluded.cause,"
            " closed_window = excluded.closed_window, gpu_hours = excluded.gpu_hours",
            (
                record["id"],
                record["job"],
                c["opened_window"],
                _dumps(record),
                now,
                c["kind"],
                c["subject"],
                c["status"],
                c["verdict"],
                c["cause"],
                c["closed_window"],
                c["gpu_hours"],
            ),
        )
        db.execute("DELETE FROM actions WHERE incident = ?", (record["id"],))
        db.executemany("INSERT INTO actions VALUES (?, ?, ?, ?, ?, ?, ?, ?)", action_rows(record))

    @_guarded("write_incident")
    def write_incident(self, record: dict[str, Any]) -> None:
        self.write_incidents([record])

    @_guarded("write_incidents")
    def write_incidents(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        now = time.time()
        with self._tx() as db:
            for r in records:
                self._upsert_incident(db, r, now)

    @_guarded("write_rows")
    def write_rows(
        self, job_rows: list[dict[str, Any]], incident_rows: list[dict[str, Any]]
    ) -> None:
        if not job_rows and not incident_rows:
            return
        with self._tx() as db:
            if job_rows:
                db.executemany(
                    "INSERT OR REPLACE INTO job_windows (job, run, win, time, step_ms,"
                    " samples_per_s, ratio_p10, ratio_p50, ratio_p90, extra)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [_row_values("job", r, JOB_COLS) for r in job_rows],
                )
            if incident_rows:
                db.executemany(
                    "INSERT OR REPLACE INTO incident_windows (incident, win, time, ratio, gap_ms,"
                    " peers_gap_ms, extra) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [_row_values("incident", r, INC_COLS) for r in incident_rows],
                )

    @_guarded("write_baselines")
    def write_baselines(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        now = time.time()
        with self._tx() as db:
            for r in records:
                sw = str(r["software_hash"])
                db.execute(
                    "INSERT INTO fingerprints (hash, software, first_seen) VALUES (?, ?, ?)"
                    " ON CONFLICT (hash) DO NOTHING",
                    (sw, _dumps(r.get("software") or {}), now),
                )
                rest = {k: v for k, v in r.items() if k not in BASELINE_KEYS}
                db.execute(
                    "INSERT INTO baselines (workload, hw_class, software, updated, windows,"
                    " step_ms, gap_q1_ms, gap_q2_ms, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (workload, hw_class, software) DO UPDATE SET"
                    " updated = excluded.updated, windows = excluded.windows,"
                    " step_ms = excluded.step_ms, gap_q1_ms = excluded.gap_q1_ms,"
                    " gap_q2_ms = excluded.gap_q2_ms, record = excluded.record",
                    (
                        str(r["workload"]),
                        str(r["hw_class"]),
                        sw,
                        float(r.get("updated") or now),
                        int(r.get("windows") or 0),
                        r.get("step_ms"),
                        r.get("gap_q1_ms"),
                        r.get("gap_q2_ms"),
                        _dumps(rest),
                    ),
                )

    # ------------------------------------------------------------------ reads
    @_guarded("baseline")
    def baseline(
        self, workload: str, hw_class: str, software_hash: str | None = None
    ) -> dict[str, Any] | None:
        q = BASELINE_SELECT + " WHERE b.workload = ? AND b.hw_class = ?"
        args: tuple[Any, ...] = (workload, hw_class)
        if software_hash is not None:
            q += " AND b.software = ?"
            args += (software_hash,)
        row = self.db.execute(q + " ORDER BY b.updated DESC, b.software LIMIT 1", args).fetchone()
        return None if row is None else _baseline_dict(row)

    @_guarded("baselines")
    def baselines(self, workload: str | None = None) -> list[dict[str, Any]]:
        q = BASELINE_SELECT + (" WHERE b.workload = ?" if workload is not None else "")
        args: tuple[Any, ...] = (workload,) if workload is not None else ()
        q += " ORDER BY b.updated DESC, b.workload, b.hw_class, b.software"
        return [_baseline_dict(r) for r in self.db.execute(q, args).fetchall()]

    @_guarded("jobs")
    def jobs(self) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT j.job, j.info, j.first_seen, j.updated,"
            " (SELECT count(*) FROM incidents i WHERE i.job = j.job)"
            " FROM jobs j ORDER BY j.first_seen, j.job"
        ).fetchall()
        return [
            {**json.loads(info), "job": job, "first_seen": fs, "updated": up, "incidents": n}
            for job, info, fs, up, n in rows
        ]

    @_guarded("incidents")
    def incidents(self, job: str | None = None) -> list[dict[str, Any]]:
        q = (
            "SELECT i.record FROM incidents i LEFT JOIN jobs j ON j.job = i.job"
            + (" WHERE i.job = ?" if job is not None else "")
            + " ORDER BY j.first_seen, i.job, i.opened_window, i.id"
        )
        args: tuple[Any, ...] = (job,) if job is not None else ()
        return [json.loads(r[0]) for r in self.db.execute(q, args)]

    @_guarded("incident")
    def incident(self, id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT record FROM incidents WHERE id = ?", (id,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    @_guarded("job_windows")
    def job_windows(
        self, job: str, lo: int | None = None, hi: int | None = None, *, run: str | None = None
    ) -> list[dict[str, Any]]:
        if run is None:
            # The job's latest run: the one of its most recently written row.
            row = self.db.execute(
                "SELECT run FROM job_windows WHERE job = ? ORDER BY time DESC, win DESC LIMIT 1",
                (job,),
            ).fetchone()
            if row is None:
                return []
            run = str(row[0])
        rows = self.db.execute(
            "SELECT job, win, time, step_ms, samples_per_s, ratio_p10, ratio_p50, ratio_p90,"
            " extra, run FROM job_windows WHERE job = ? AND run = ? AND win >= ? AND win <= ?"
            " ORDER BY win",
            (job, run, -(2**62) if lo is None else lo, 2**62 if hi is None else hi),
        ).fetchall()
        out = []
        for r in rows:
            d = _row_dict("job", r[:-1], JOB_COLS)
            if r[-1]:
                d["run"] = r[-1]
            out.append(d)
        return out

    @_guarded("incident_windows")
    def incident_windows(self, id: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT incident, win, time, ratio, gap_ms, peers_gap_ms, extra"
            " FROM incident_windows WHERE incident = ? ORDER BY win",
            (id,),
        ).fetchall()
        return [_row_dict("incident", r, INC_COLS) for r in rows]

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()


# The keys of a baseline record held in their own columns (the rest is its JSON).
BASELINE_KEYS = (
    "workload",
    "hw_class",
    "software_hash",
    "software",
    "updated",
    "windows",
    "step_ms",
    "gap_q1_ms",
    "gap_q2_ms",
)
BASELINE_SELECT = (
    "SELECT b.workload, b.hw_class, b.software, f.software, b.updated, b.windows, b.step_ms,"
    " b.gap_q1_ms, b.gap_q2_ms, b.record FROM baselines b"
    " LEFT JOIN fingerprints f ON f.hash = b.software"
)


def _baseline_dict(r: tuple[Any, ...]) -> dict[str, Any]:
    """A baseline row as the record that went in (``Baseline.to_record``)."""
    return {
        **json.loads(r[9]),
        "workload": r[0],
        "hw_class": r[1],
        "software_hash": r[2],
        "software": json.loads(r[3]) if r[3] else {},
        "updated": r[4],
        "windows": r[5],
        "step_ms": r[6],
        "gap_q1_ms": r[7],
        "gap_q2_ms": r[8],
    }


def _row_dict(key: str, r: tuple[Any, ...], cols: tuple[str, ...]) -> dict[str, Any]:
    d: dict[str, Any] = {key: r[0], "window": r[1]}
    d.update(zip(cols, r[2 : 2 + len(cols)], strict=True))
    if r[-1]:
        d.update(json.loads(r[-1]))
    return d
