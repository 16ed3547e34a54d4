"""``SqlStore``: the ``Store`` methods in SQL, shared by the SQLite and PostgreSQL stores.

A backend (store/sqlite.py, store/postgres.py) opens its connection, wraps it in
a ``Db`` (store/schema.py: the dialect differences live there) and says which
of its driver's exceptions are errors and which of them mean the connection is
gone (``transient``: the sink retries those, store/sink.py). Every statement
here is written once, in SQLite's spelling.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from artemis.store.base import Store, StoreError
from artemis.store.schema import (
    ACTION_COLS_V5,
    CURRENT,
    Db,
    action_rows,
    incident_columns,
    upsert,
)

T = TypeVar("T")

JOB_COLS = ("time", "step_ms", "samples_per_s", "ratio_p10", "ratio_p50", "ratio_p90")
INC_COLS = ("time", "ratio", "gap_ms", "peers_gap_ms")

INCIDENT_COLS = (
    "id",
    "job",
    "opened_window",
    "record",
    "updated",
    "kind",
    "subject",
    "status",
    "verdict",
    "cause",
    "closed_window",
    "gpu_hours",
)
UPSERT_JOB = upsert(
    "jobs", ("job", "info", "first_seen", "updated"), ("job",), keep=("first_seen",)
)
ENSURE_JOB = upsert("jobs", ("job", "info", "first_seen", "updated"), ("job",), update=False)
UPSERT_INCIDENT = upsert("incidents", INCIDENT_COLS, ("id",))
INSERT_ACTIONS = upsert("actions", ACTION_COLS_V5, ("incident", "id"))
UPSERT_LABEL = upsert("labels", ("incident", "cause", "note", "time"), ("incident",))
UPSERT_JOB_ROW = upsert(
    "job_windows", ("job", "run", "win", *JOB_COLS, "extra"), ("job", "run", "win")
)
UPSERT_INC_ROW = upsert(
    "incident_windows", ("incident", "win", *INC_COLS, "extra"), ("incident", "win")
)


# Baselines across jobs (schema v3, detect/baselines.py).
BASELINE_COLS = (
    "workload",
    "hw_class",
    "software",
    "updated",
    "windows",
    "step_ms",
    "gap_q1_ms",
    "gap_q2_ms",
    "record",
)
UPSERT_BASELINE = upsert("baselines", BASELINE_COLS, ("workload", "hw_class", "software"))
REGRESS_COLS = (
    "id",
    "node",
    "time",
    "hardware",
    "device",
    "ranks",
    "fingerprint",
    "verdict",
    "healthy",
    "record",
)
UPSERT_REGRESS = upsert("regress_runs", REGRESS_COLS, ("id",))
ENSURE_FINGERPRINT = upsert(
    "fingerprints", ("hash", "software", "first_seen"), ("hash",), update=False
)
# The keys of a baseline record held in their own columns (the rest is its JSON).
BASELINE_KEYS = (*BASELINE_COLS[:2], "software_hash", *BASELINE_COLS[2:-1])
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


def check_version(where: object, v: int, readonly: bool) -> None:
    """Refuse a store whose schema `v` this Artemis cannot use: newer than it knows, or
    (read-only, so not upgraded here) older than it reads."""
    if v > CURRENT:
        raise StoreError(
            f"{where}: store schema v{v} was written by a newer Artemis;"
            f" this one knows up to v{CURRENT}"
        )
    if readonly and v < CURRENT:
        raise StoreError(
            f"{where}: store schema v{v}, this Artemis reads v{CURRENT}:"
            " open it read-write once (a coordinator does) to upgrade it"
        )


def dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"))


def guarded(what: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """The driver's errors become ``StoreError`` naming the store and the operation."""

    def deco(fn: Callable[..., T]) -> Callable[..., T]:
        @wraps(fn)
        def inner(self: SqlStore, *a: Any, **kw: Any) -> T:
            try:
                return fn(self, *a, **kw)
            except self.driver_errors as e:
                raise StoreError(
                    f"{self.where}: {what} failed: {e}", transient=self.is_transient(e)
                ) from e

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
        dumps(extra) if extra else None,
    )


def _row_dict(key: str, r: tuple[Any, ...], cols: tuple[str, ...]) -> dict[str, Any]:
    d: dict[str, Any] = {key: r[0], "window": r[1]}
    d.update(zip(cols, r[2 : 2 + len(cols)], strict=True))
    if r[-1]:
        d.update(json.loads(r[-1]))
    return d


class SqlStore(Store):
    """The shared SQL of a ``Store``; a backend sets ``_db``, ``where`` and the errors."""

    _db: Db
    where: str = ""  # how messages name the store: a file, or a URL without its password
    driver_errors: tuple[type[BaseException], ...] = ()

    def is_transient(self, e: BaseException) -> bool:
        """Whether ``e`` means the connection is gone (worth a reconnect), not a refusal."""
        return False

    def _tx(self) -> Any:
        if self.readonly:
            raise StoreError(f"{self.where}: opened read-only")
        return self._db.transaction()

    # ------------------------------------------------------------------ writes
    @guarded("write_job")
    def write_job(self, job: str, info: dict[str, Any]) -> None:
        with self._tx() as db:
            self.merge_job(db, job, info, time.time())

    def merge_job(self, db: Db, job: str, info: dict[str, Any], now: float) -> None:
        """`write_job` inside the caller's transaction `db` (a fleet's fenced commit)."""
        # The row locked (PostgreSQL; SQLite's transaction holds the file's lock):
        # two coordinators merging into one job's info do not lose each other's keys.
        row = db.execute(
            "SELECT info FROM jobs WHERE job = ?" + db.dialect.for_update, (job,)
        ).fetchone()
        merged = {**(json.loads(row[0]) if row else {}), **info}
        db.execute(UPSERT_JOB, (job, dumps(merged), now, now))

    def _upsert_incident(self, db: Db, record: dict[str, Any], now: float) -> None:
        if not record.get("id") or not record.get("job"):
            raise StoreError(f"{self.where}: an incident record needs an id and a job")
        c = incident_columns(record)
        db.execute(ENSURE_JOB, (record["job"], "{}", now, now))
        db.execute(
            UPSERT_INCIDENT,
            (
                record["id"],
                record["job"],
                c["opened_window"],
                dumps(record),
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
        db.executemany(INSERT_ACTIONS, action_rows(record))

    @guarded("write_incident")
    def write_incident(self, record: dict[str, Any]) -> None:
        self.write_incidents([record])

    @guarded("write_incidents")
    def write_incidents(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        now = time.time()
        with self._tx() as db, db.pipeline():
            self.upsert_incidents(db, records, now)

    def upsert_incidents(self, db: Db, records: list[dict[str, Any]], now: float) -> None:
        """`write_incidents` inside the caller's transaction `db`."""
        for r in records:
            self._upsert_incident(db, r, now)

    @guarded("write_rows")
    def write_rows(
        self, job_rows: list[dict[str, Any]], incident_rows: list[dict[str, Any]]
    ) -> None:
        if not job_rows and not incident_rows:
            return
        with self._tx() as db, db.pipeline():
            self.upsert_rows(db, job_rows, incident_rows)

    def upsert_rows(
        self, db: Db, job_rows: list[dict[str, Any]], incident_rows: list[dict[str, Any]]
    ) -> None:
        """`write_rows` inside the caller's transaction `db`."""
        db.executemany(UPSERT_JOB_ROW, [_row_values("job", r, JOB_COLS) for r in job_rows])
        db.executemany(
            UPSERT_INC_ROW, [_row_values("incident", r, INC_COLS) for r in incident_rows]
        )

    @guarded("prune")
    def prune(self, before: float) -> dict[str, int]:
        """Delete what is older than `before` (unix s): per-window rows of that age,
        incidents last updated before it (their actions and rows with them), and jobs
        last updated before it that no incident still names. Returns rows deleted per
        table, in one transaction (the retention of docs/RELIABILITY.md "3. Full
        disks"). Baselines are kept: they are what later jobs are compared with."""
        # A person's label keeps its incident (and its evidence) for `export --labelled`.
        kept = "id NOT IN (SELECT incident FROM labels)"
        old = f"SELECT id FROM incidents WHERE updated < ? AND {kept}"
        with self._tx() as db:
            return {
                "job_windows": db.execute(
                    "DELETE FROM job_windows WHERE time < ?", (before,)
                ).rowcount,
                "actions": db.execute(
                    f"DELETE FROM actions WHERE incident IN ({old})", (before,)
                ).rowcount,
                "incident_windows": db.execute(
                    f"DELETE FROM incident_windows WHERE time < ? OR incident IN ({old})",
                    (before, before),
                ).rowcount,
                "incidents": db.execute(
                    f"DELETE FROM incidents WHERE updated < ? AND {kept}", (before,)
                ).rowcount,
                "jobs": db.execute(
                    "DELETE FROM jobs WHERE updated < ? AND job NOT IN (SELECT job FROM incidents)",
                    (before,),
                ).rowcount,
            }

    @guarded("write_label")
    def write_label(self, incident: str, cause: str, note: str | None, when: float) -> None:
        with self._tx() as db:
            if db.execute("SELECT 1 FROM incidents WHERE id = ?", (incident,)).fetchone() is None:
                raise KeyError(incident)
            db.execute(UPSERT_LABEL, (incident, cause, note, when))

    @guarded("labels")
    def labels(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT incident, cause, note, time FROM labels ORDER BY time, incident"
        ).fetchall()
        return [{"incident": r[0], "cause": r[1], "note": r[2], "time": r[3]} for r in rows]

    @guarded("write_baselines")
    def write_baselines(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        now = time.time()
        with self._tx() as db:
            for r in records:
                sw = str(r["software_hash"])
                db.execute(ENSURE_FINGERPRINT, (sw, dumps(r.get("software") or {}), now))
                rest = {k: v for k, v in r.items() if k not in BASELINE_KEYS}
                db.execute(
                    UPSERT_BASELINE,
                    (
                        str(r["workload"]),
                        str(r["hw_class"]),
                        sw,
                        float(r.get("updated") or now),
                        int(r.get("windows") or 0),
                        r.get("step_ms"),
                        r.get("gap_q1_ms"),
                        r.get("gap_q2_ms"),
                        dumps(rest),
                    ),
                )

    @guarded("write_regress_run")
    def write_regress_run(self, run: dict[str, Any]) -> None:
        for k in ("id", "node", "time", "hardware", "device", "ranks", "fingerprint"):
            if run.get(k) is None:
                raise StoreError(f"{self.where}: a regress run needs {k}")
        with self._tx() as db:
            db.execute(
                ENSURE_FINGERPRINT,
                (str(run["fingerprint"]), dumps(run.get("software") or {}), float(run["time"])),
            )
            db.execute(
                UPSERT_REGRESS,
                (
                    str(run["id"]),
                    str(run["node"]),
                    float(run["time"]),
                    str(run["hardware"]),
                    str(run["device"]),
                    int(run["ranks"]),
                    str(run["fingerprint"]),
                    run.get("verdict"),
                    1 if run.get("healthy") else 0,
                    dumps(run),
                ),
            )

    # ------------------------------------------------------------------ reads
    @guarded("regress_runs")
    def regress_runs(
        self, *, node: str | None = None, hardware: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        where: list[str] = []
        args: list[Any] = []
        for col, v in (("node", node), ("hardware", hardware)):
            if v is not None:
                where.append(f"{col} = ?")
                args.append(v)
        q = "SELECT record FROM regress_runs"
        if where:
            q += " WHERE " + " AND ".join(where)
        q += " ORDER BY time DESC, id COLLATE BINARY DESC"
        if limit is not None:
            q += " LIMIT ?"
            args.append(int(limit))
        return [json.loads(r[0]) for r in self._db.execute(q, args).fetchall()]

    @guarded("baseline")
    def baseline(
        self, workload: str, hw_class: str, software_hash: str | None = None
    ) -> dict[str, Any] | None:
        q = BASELINE_SELECT + " WHERE b.workload = ? AND b.hw_class = ?"
        args: tuple[Any, ...] = (workload, hw_class)
        if software_hash is not None:
            q += " AND b.software = ?"
            args += (software_hash,)
        q += " ORDER BY b.updated DESC, b.software COLLATE BINARY LIMIT 1"
        row = self._db.execute(q, args).fetchone()
        return None if row is None else _baseline_dict(tuple(row))

    @guarded("baselines")
    def baselines(self, workload: str | None = None) -> list[dict[str, Any]]:
        q = BASELINE_SELECT + (" WHERE b.workload = ?" if workload is not None else "")
        args: tuple[Any, ...] = (workload,) if workload is not None else ()
        q += (
            " ORDER BY b.updated DESC, b.workload COLLATE BINARY, b.hw_class COLLATE BINARY,"
            " b.software COLLATE BINARY"
        )
        return [_baseline_dict(tuple(r)) for r in self._db.execute(q, args).fetchall()]

    @guarded("jobs")
    def jobs(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT j.job, j.info, j.first_seen, j.updated,"
            " (SELECT count(*) FROM incidents i WHERE i.job = j.job)"
            " FROM jobs j ORDER BY j.first_seen, j.job COLLATE BINARY"
        ).fetchall()
        return [
            {**json.loads(info), "job": job, "first_seen": fs, "updated": up, "incidents": n}
            for job, info, fs, up, n in rows
        ]

    @guarded("incidents")
    def incidents(self, job: str | None = None) -> list[dict[str, Any]]:
        # NULLS FIRST: SQLite's order of NULLs, which PostgreSQL's default reverses.
        q = (
            "SELECT i.record FROM incidents i LEFT JOIN jobs j ON j.job = i.job"
            + (" WHERE i.job = ?" if job is not None else "")
            + " ORDER BY j.first_seen NULLS FIRST, i.job COLLATE BINARY,"
            " i.opened_window NULLS FIRST, i.id COLLATE BINARY"
        )
        args: tuple[Any, ...] = (job,) if job is not None else ()
        return [json.loads(r[0]) for r in self._db.execute(q, args).fetchall()]

    @guarded("incident")
    def incident(self, id: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT record FROM incidents WHERE id = ?", (id,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    @guarded("job_windows")
    def job_windows(
        self, job: str, lo: int | None = None, hi: int | None = None, *, run: str | None = None
    ) -> list[dict[str, Any]]:
        if run is None:
            # The job's latest run: the one of its most recently written row.
            row = self._db.execute(
                "SELECT run FROM job_windows WHERE job = ?"
                " ORDER BY time DESC NULLS LAST, win DESC LIMIT 1",
                (job,),
            ).fetchone()
            if row is None:
                return []
            run = str(row[0])
        rows = self._db.execute(
            "SELECT job, win, time, step_ms, samples_per_s, ratio_p10, ratio_p50, ratio_p90,"
            " extra, run FROM job_windows WHERE job = ? AND run = ? AND win >= ? AND win <= ?"
            " ORDER BY win",
            (job, run, -(2**62) if lo is None else lo, 2**62 if hi is None else hi),
        ).fetchall()
        out = []
        for r in rows:
            d = _row_dict("job", tuple(r[:-1]), JOB_COLS)
            if r[-1]:
                d["run"] = r[-1]
            out.append(d)
        return out

    @guarded("incident_windows")
    def incident_windows(self, id: str) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT incident, win, time, ratio, gap_ms, peers_gap_ms, extra"
            " FROM incident_windows WHERE incident = ? ORDER BY win",
            (id,),
        ).fetchall()
        return [_row_dict("incident", tuple(r), INC_COLS) for r in rows]
