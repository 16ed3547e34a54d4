"""``SqliteStore``: the embedded store, one SQLite file (the stdlib ``sqlite3``).

WAL journal: readers read a snapshot and never block the writer, nor the
writer them (a reader of another process sees each commit whole). Every write
call is one transaction; ``synchronous = NORMAL`` (no fsync per commit in WAL
mode: a power loss may lose the last commits, never corrupt the file; the
findings and incidents JSONL are the durable log). The SQL is shared with the
PostgreSQL store (store/sql.py); schema and migrations: store/schema.py.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from artemis.store.base import StoreError
from artemis.store.schema import CURRENT, SQLITE, Db, migrate, version_of
from artemis.store.sql import SqlStore, check_version

BUSY_TIMEOUT_S = 5.0  # another writer (a second coordinator on the same file) holds the lock


class SqliteStore(SqlStore):
    driver_errors = (sqlite3.Error,)

    def is_transient(self, e: BaseException) -> bool:
        # Another writer held the file's lock past the busy timeout: a retry later
        # may pass (the sink reopens it with back-off); anything else is the file's.
        return isinstance(e, sqlite3.OperationalError) and "locked" in str(e)

    def __init__(
        self, path: str | Path, *, readonly: bool = False, busy_timeout_s: float = BUSY_TIMEOUT_S
    ) -> None:
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.where = str(self.path)
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
                # from another (artemis.job.Detector's scorer, the sink's writer); its
                # calls are never concurrent (one Store, one user at a time).
                self.db = sqlite3.connect(
                    str(self.path),
                    timeout=busy_timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                )
        except (sqlite3.Error, OSError) as e:
            raise StoreError(f"{self.path}: cannot open the store: {e}") from e
        self._db = Db(self.db, SQLITE)
        try:
            self._open()
        except BaseException:
            self.db.close()
            raise

    def _open(self) -> None:
        try:
            # The first read of the file: a file that is not SQLite fails here.
            v = version_of(self._db)
        except sqlite3.DatabaseError as e:
            raise StoreError(
                f"{self.path}: not an Artemis store: not a SQLite database, or a damaged one ({e})"
            ) from e
        except LookupError as e:
            raise StoreError(
                f"{self.path}: not an Artemis store: a SQLite database with {e}"
            ) from None
        check_version(self.path, v, self.readonly)
        try:
            if self.readonly:
                self.db.execute("PRAGMA query_only = ON")
            else:
                mode = self.db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StoreError(f"{self.path}: cannot use WAL mode (got {mode})")
                self.db.execute("PRAGMA synchronous = NORMAL")
                self.upgraded = migrate(self._db)
        except sqlite3.DatabaseError as e:
            raise StoreError(
                f"{self.path}: cannot open the store: {e}", transient=self.is_transient(e)
            ) from e
        self.version = CURRENT

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()
