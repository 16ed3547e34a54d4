"""``StoreSink``: how a daemon (the coordinator, ``artemis run``'s) writes its store.

The store is a second copy of what the JSONL files already hold, for reading
back (``artemis incidents``, ``artemis report``). So it must never stop a
coordinator: a store that cannot be opened (a damaged file, a file that is not
SQLite, a newer schema) is logged as an error naming the file and the sink is
off; a write that fails turns it off the same way (one error in the log, not
one per window). The findings and incidents JSONL go on either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog
from artemis.store.base import (
    Store,
    StoreError,
    default_store_path,
    open_store,
    redact,
    store_url,
)

log = structlog.get_logger("artemis.store")

OFF = ("off", "")


def resolve_url(setting: str, findings: str | Path) -> str | None:
    """The store URL a ``store`` setting means: ``auto`` = a SQLite file next to the
    findings (``artemis.db``), ``off`` (or empty) = none, else the URL itself."""
    s = setting.strip()
    if s.lower() in OFF:
        return None
    if s.lower() == "auto":
        return store_url(default_store_path(findings))
    return s


def check_setting(setting: str) -> str | None:
    """An error message for a ``store`` setting that can never work (config time), or None."""
    s = setting.strip()
    if s.lower() in (*OFF, "auto"):
        return None
    scheme = s.split(":", 1)[0].lower() if ":" in s else ""
    if scheme == "sqlite":
        if not s.startswith("sqlite:///") or s == "sqlite:///":
            return f"store: expected sqlite:///PATH, got {setting!r}"
        return None
    if scheme in ("postgresql", "postgres"):
        from psycopg import Error
        from psycopg.conninfo import conninfo_to_dict

        try:
            conninfo_to_dict(s)
        except Error as e:
            # libpq may quote the URL back: never with its password.
            msg = str(e).replace(s, redact(s))
            return f"store: not a PostgreSQL URL: {redact(s)!r}: {msg}"
        return None
    return f"store: expected auto, off, sqlite:///PATH or postgresql://..., got {redact(setting)!r}"


def split_rows(
    rows: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(job rows, incident rows) of the monitor's one list of rows, without the
    ``row`` key that told them apart."""
    jobs, subjects = [], []
    for r in rows:
        kind = r.get("row")
        rest = {k: v for k, v in r.items() if k != "row"}
        if kind == "job":
            jobs.append(rest)
        elif kind == "subject":
            subjects.append(rest)
        else:
            raise ValueError(f"a per-window row of an unknown kind {kind!r}")
    return jobs, subjects


class StoreSink:
    """A store that logs its failures instead of raising them, then stays off."""

    def __init__(self, store: Store | None, url: str | None = None) -> None:
        self.store = store
        self.url = url or (store.url if store is not None else None)
        self.failed: str | None = None  # the error that turned it off

    @classmethod
    def open(cls, setting: str, findings: str | Path) -> StoreSink:
        url = resolve_url(setting, findings)
        if url is None:
            log.info("incident store off", store=setting)
            return cls(None)
        try:
            store = open_store(url)
        except StoreError as e:
            log.error(
                "incident store unusable: not writing it (findings and incidents still go"
                " to their JSONL)",
                store=url,
                error=str(e),
            )
            sink = cls(None, url)
            sink.failed = str(e)
            return sink
        upgraded = getattr(store, "upgraded", [])
        log.info("incident store open", store=url, upgraded_to=upgraded[-1] if upgraded else None)
        return cls(store, url)

    @property
    def on(self) -> bool:
        return self.store is not None

    def _do(self, what: str, fn: Any, *args: Any) -> None:
        if self.store is None:
            return
        try:
            fn(*args)
        except (StoreError, OSError, ValueError, TypeError, KeyError) as e:
            # ValueError/TypeError/KeyError: a row or record the store cannot take
            # (a bug upstream): log it like a broken file rather than stop scoring.
            log.error(
                "incident store write failed: the store is off until restart (findings"
                " and incidents still go to their JSONL)",
                store=self.url,
                write=what,
                error=str(e),
            )
            self.failed = str(e)
            self.close()

    def write_job(self, job: str, info: dict[str, Any]) -> None:
        if self.store is not None:
            self._do("job", self.store.write_job, job, info)

    def write_incidents(self, records: list[dict[str, Any]]) -> None:
        if records and self.store is not None:
            self._do("incidents", self.store.write_incidents, records)

    def write_rows(
        self, job_rows: list[dict[str, Any]], incident_rows: list[dict[str, Any]]
    ) -> None:
        if (job_rows or incident_rows) and self.store is not None:
            self._do("rows", self.store.write_rows, job_rows, incident_rows)

    def write_baselines(self, records: list[dict[str, Any]]) -> None:
        """Baselines across jobs (the job's end: `JobMonitor.baseline_records`)."""
        if records and self.store is not None:
            self._do("baselines", self.store.write_baselines, records)

    def read_baseline(
        self, workload: str, hw_class: str, software_hash: str | None = None
    ) -> tuple[bool, dict[str, Any] | None]:
        """(read, the baseline or None). A store off, or a read that failed (logged; the
        store stays on: a reader's error is not a broken file), is (False, None): the job
        is then not compared, nor are its windows stored as a baseline."""
        if self.store is None:
            return False, None
        try:
            return True, self.store.baseline(workload, hw_class, software_hash)
        except (StoreError, OSError, ValueError, TypeError, KeyError) as e:
            log.error(
                "baseline read failed: the job is not compared with its workload's baseline",
                store=self.url,
                workload=workload,
                hw_class=hw_class,
                error=str(e),
            )
            return False, None

    def write_monitor_rows(self, rows: list[dict[str, Any]]) -> None:
        """The per-window rows as the monitor returns them (``MonitorOutput.incident_rows``):
        one list, each row's ``row`` saying ``job`` or ``subject``."""
        if rows and self.store is not None:
            store = self.store
            self._do("rows", lambda: store.write_rows(*split_rows(rows)))

    def close(self) -> None:
        if self.store is not None:
            store, self.store = self.store, None
            store.close()
