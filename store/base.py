"""The ``Store`` interface, its error, and the URLs that pick a backend.

One interface, several backends: ``SqliteStore`` (store/sqlite.py, embedded,
the default), ``PostgresStore`` (store/postgres.py, a database shared by a
fleet's coordinators; both share their SQL, store/sql.py) and
``JsonlIncidents`` (store/jsonl.py, a read-only view of an ``incidents.jsonl``
for stores that were off). Nothing that reads or writes a store names a backend.

The records are plain dicts in the shapes of docs/DESIGN.md "Incidents
(coordinator -> world)": the incident record, the per-window job rows and the
per-window incident rows. A store keeps the latest record of every incident id
(the JSONL keeps every change) and its action rows.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

DEFAULT_STORE_NAME = "artemis.db"  # next to the findings file
INCIDENTS_JSONL_NAME = "incidents.jsonl"  # next to the findings file (docs/DESIGN.md)


class StoreError(Exception):
    """A store cannot be opened, read or written; the message names the store.

    ``transient``: the connection to the store was lost or could not be made (a
    database server restarting, a network cut): worth a reconnect later, unlike a
    refusal (a damaged file, a newer schema, a record the store cannot take)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class Store(abc.ABC):
    """Jobs, incidents (latest record per id), actions and per-window rows."""

    url: str = ""  # where it is, for messages
    readonly: bool = False

    # ------------------------------------------------------------------ writes
    @abc.abstractmethod
    def write_job(self, job: str, info: dict[str, Any]) -> None:
        """Create or update a job: ``info``'s keys replace the ones stored (a shallow
        merge, so a writer adds what it learns: hosts, ranks, end time)."""

    @abc.abstractmethod
    def write_incident(self, record: dict[str, Any]) -> None:
        """Upsert an incident record by its ``id`` (the latest record wins) and its
        ``actions`` rows (one per plan, replaced with the record)."""

    def write_incidents(self, records: list[dict[str, Any]]) -> None:
        """Several records in one transaction where the backend has them."""
        for r in records:
            self.write_incident(r)

    @abc.abstractmethod
    def write_rows(
        self, job_rows: list[dict[str, Any]], incident_rows: list[dict[str, Any]]
    ) -> None:
        """Per-window rows: ``{job, window, time, step_ms, samples_per_s, ratio_p10,
        ratio_p50, ratio_p90}`` (and ``run``) and ``{incident, window, time, ratio,
        gap_ms, peers_gap_ms}``; a row already there for the same (job, run, window)
        or (incident, window) is replaced."""

    def write_baselines(self, records: list[dict[str, Any]]) -> None:
        """Upsert baselines (detect/baselines.py ``Baseline.to_record``), one per
        (workload, hw_class, software_hash), with their software fingerprints, in one
        transaction. A store that keeps none (a JSONL view) raises ``StoreError``."""
        raise StoreError(f"{self.url}: this store keeps no baselines")

    def write_regress_run(self, run: dict[str, Any]) -> None:
        """Upsert an `artemis regress` run by its ``id`` (regress/README.md "The run
        record": ``node``, ``time``, ``hardware``, ``device``, ``ranks``,
        ``fingerprint`` and ``software``, ``verdict``, ``healthy``, ``items``, ...),
        and its software fingerprint by hash. A store that keeps none raises."""
        raise StoreError(f"{self.url}: this store keeps no regress runs")

    def write_label(self, incident: str, cause: str, note: str | None, when: float) -> None:
        """A person's confirmed cause of an incident, in its own table (the incident's
        later writes never touch it); a label again replaces it. Raises KeyError for an
        incident the store does not hold; a store that keeps none raises StoreError."""
        raise StoreError(
            f"{self.url}: labels need an incident store (artemis.db or PostgreSQL), "
            "not an incidents.jsonl"
        )

    def labels(self) -> list[dict[str, Any]]:
        """Every label: ``{incident, cause, note, time}``, oldest first."""
        return []

    # ------------------------------------------------------------------ reads
    def regress_runs(
        self, *, node: str | None = None, hardware: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """`artemis regress` runs (of ``node``, of a ``hardware`` class) as they went
        in, newest first, at most ``limit``."""
        return []

    def baseline(
        self, workload: str, hw_class: str, software_hash: str | None = None
    ) -> dict[str, Any] | None:
        """The latest baseline written for (workload, hw_class), or the one of that
        software fingerprint; None when there is none."""
        return None

    def baselines(self, workload: str | None = None) -> list[dict[str, Any]]:
        """Every baseline (of ``workload``), latest first."""
        return []

    @abc.abstractmethod
    def jobs(self) -> list[dict[str, Any]]:
        """Every job: its info plus ``job``, ``first_seen``, ``updated`` (unix s) and
        ``incidents`` (how many), oldest first."""

    @abc.abstractmethod
    def incidents(self, job: str | None = None) -> list[dict[str, Any]]:
        """The latest record of every incident (of ``job``), by opening window."""

    @abc.abstractmethod
    def incident(self, id: str) -> dict[str, Any] | None:
        """The latest record of one incident, or None."""

    @abc.abstractmethod
    def job_windows(
        self, job: str, lo: int | None = None, hi: int | None = None, *, run: str | None = None
    ) -> list[dict[str, Any]]:
        """The job's per-window rows of one run with ``lo <= window <= hi``, by window:
        ``run`` (an incident's ``run``), or by default the job's latest run. A row's
        ``run`` comes back as it went in (absent if it had none)."""

    @abc.abstractmethod
    def incident_windows(self, id: str) -> list[dict[str, Any]]:
        """The incident subject's per-window rows, by window."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def prune(self, before: float) -> dict[str, int]:
        """Delete rows older than `before` (unix s); per table, how many. A store that
        cannot (read-only ones) says so."""
        raise StoreError(f"{self.url}: this store cannot prune")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def store_url(path: str | Path) -> str:
    """The URL of a SQLite store file (absolute or relative, as given)."""
    return f"sqlite:///{path}"


def default_store_path(findings: str | Path) -> Path:
    """Where the store of a findings file lives by default: next to it."""
    return Path(findings).parent / DEFAULT_STORE_NAME


def incidents_jsonl_path(findings: str | Path) -> Path:
    return Path(findings).parent / INCIDENTS_JSONL_NAME


def sqlite_path(url: str) -> Path:
    """``sqlite:///PATH`` -> PATH, SQLAlchemy's spelling: ``sqlite:///rel/x.db`` is
    relative to the working directory, ``sqlite:////abs/x.db`` absolute."""
    rest = url[len("sqlite://") :]
    if not rest.startswith("/") or rest == "/":
        raise StoreError(f"store {url!r}: expected sqlite:///PATH")
    return Path(rest[1:])


_SECRET_PARAMS = ("password", "sslpassword")


def redact(url: str) -> str:
    """A store URL without its password (in the user part or as a query parameter):
    how every message and log line names a store."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.rpartition("@")[2]
    user, at, hosts = parts.netloc.rpartition("@")
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in query if k.lower() not in _SECRET_PARAMS]
    if ":" not in user and len(kept) == len(query):
        return url  # nothing secret in it (and a sqlite:////abs path stays as written)
    netloc = f"{user.partition(':')[0]}@{hosts}" if at else hosts
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(kept), parts.fragment))


def open_store(url: str, *, readonly: bool = False) -> Store:
    """Open (and, read-write, create or upgrade) the store at ``url``.

    ``sqlite:///PATH``: an embedded SQLite file. ``postgresql://...`` (or
    ``postgres://``): a PostgreSQL database, libpq's URL (psycopg 3). Raises
    ``StoreError`` naming the store (a URL without its password) for anything
    else, for a database that is not an Artemis store, or one written by a newer
    Artemis; ``transient`` set when the server could not be reached."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        from artemis.store.sqlite import SqliteStore

        return SqliteStore(sqlite_path(url), readonly=readonly)
    if scheme in ("postgresql", "postgres"):
        from artemis.store.postgres import PostgresStore

        return PostgresStore(url, readonly=readonly)
    raise StoreError(f"store {redact(url)!r}: expected sqlite:///PATH or postgresql://...")


def open_for_findings(findings: str | Path) -> Store:
    """What sits next to a findings file, read-only: its store when there is one,
    else its ``incidents.jsonl`` (the latest line per id; no per-window rows).
    Raises ``StoreError`` when there is neither."""
    db = default_store_path(findings)
    if db.exists():
        return open_store(store_url(db), readonly=True)
    jl = incidents_jsonl_path(findings)
    if jl.exists():
        from artemis.store.jsonl import JsonlIncidents

        return JsonlIncidents(jl)
    raise StoreError(
        f"no incident store next to {findings}: neither {db} nor {jl} exists "
        '(was the coordinator that wrote it run with store = "off"?)'
    )
