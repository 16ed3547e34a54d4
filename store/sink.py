"""``StoreSink``: how a daemon (the coordinator, ``artemis run``'s) writes its store.

The store is a second copy of what the JSONL files already hold, for reading
back (``artemis incidents``, ``artemis report``). So it must never stop a
coordinator, nor slow its scoring:

- **Scoring never waits on the database.** A write call puts the write on a
  bounded in-memory queue and returns; one writer thread takes them in order
  and runs them against the store (each one transaction, as before).
- **Connection loss is retried with back-off.** A write that fails because the
  connection is gone (``StoreError.transient``: a PostgreSQL server restarting,
  a network cut, a SQLite file locked past its busy timeout) closes the store;
  the writer reopens it after ``retry_min_s``, doubling to ``retry_max_s``
  (with jitter, so a fleet's coordinators do not reconnect in step), then
  writes the queue in order, the failed write first. A PostgreSQL store that
  is unreachable at start is reached the same way (the coordinator starts).
- **Above the bound, writes are dropped and counted.** ``queue_max`` writes wait
  at most (a write: one call, e.g. a window's rows); one more is dropped,
  counted in ``dropped`` (``straggler_store_writes_dropped_total``), the queue's
  depth is ``depth`` (``straggler_store_queue_depth``), and a warning names the
  store (the first drop of an outage, then one per ``DROP_LOG_EVERY_S``).
- **A refusal turns it off.** A store that cannot be opened for good (a damaged
  file, a file that is not SQLite, a newer schema) or a write it refuses (a
  record the store cannot take: a bug upstream) is logged once as an error
  naming the store, and the sink is off until restart.

A full disk (SQLite on a full filesystem) is not a refusal: the store stays on,
the write that failed is given up and counted (``FileHealth``,
common/diskio.py: ``straggler_write_errors_total{file="store"}`` and the rows
given up in ``straggler_write_lost_total``), and the next write tries again
(docs/RELIABILITY.md "3. Full disks").

The findings and incidents JSONL go on either way: they are the durable log.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import structlog
from artemis.common.diskio import FileHealth, reason_of
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

QUEUE_MAX = 10_000  # writes waiting at most (about 3 per job per window)
RETRY_MIN_S = 0.5  # the first reconnect's wait
RETRY_MAX_S = 30.0  # the longest wait between reconnects
CLOSE_TIMEOUT_S = 10.0  # how long close() waits for the queue to be written
DROP_LOG_EVERY_S = 60.0  # one drop warning per this while drops go on


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
        from artemis.store.postgres import check_url

        try:
            check_url(s)
        except StoreError as e:
            return f"store: {e}"
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


def _snapshot(record: dict[str, Any]) -> dict[str, Any]:
    """A record as it is now, for a write run later. The incident tracker builds
    each record fresh (docs/DESIGN.md: each change is the whole record) but for
    its plans' ``history`` lists, which it goes on appending to
    (detect/incidents.py): those are copied, the rest is shared. A deep copy
    would cost more than the store's write itself at 10k ranks (bench/README.md)."""
    acts = record.get("actions")
    if not acts:
        return dict(record)
    return {
        **record,
        "actions": [
            {**a, "history": list(a["history"])}
            if isinstance(a, dict) and isinstance(a.get("history"), list)
            else a
            for a in acts
        ],
    }


# A queued write: (what, the call on a store).
_Write = tuple[str, Callable[[Store], None]]


class StoreSink:
    """A store written from a bounded queue by one thread; failures logged, never raised.

    ``store``: an open store (or None: off). ``opener``: how to (re)open it, for
    reconnects (default: ``open_store(url)``); with ``store`` None and an opener
    the writer opens it itself (a server unreachable at start)."""

    def __init__(
        self,
        store: Store | None,
        url: str | None = None,
        *,
        opener: Callable[[], Store] | None = None,
        queue_max: int = QUEUE_MAX,
        retry_min_s: float = RETRY_MIN_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self.store = store
        self.url = redact(url) if url else (store.url if store is not None else None)
        self.failed: str | None = None  # the error that turned it off
        self.health = FileHealth("store", self.url or "")
        self.queue_max = max(1, queue_max)
        self.retry_min_s = retry_min_s
        self.retry_max_s = max(retry_min_s, retry_max_s)
        self.dropped = 0  # writes dropped: the queue was full (or left at close)
        self.written = 0  # writes done
        self.reconnects = 0  # times the store was reopened after a loss
        self._opener = opener
        if opener is None and url is not None:
            self._opener = lambda: open_store(url)
        self._q: deque[_Write] = deque()
        self._reads: dict[Hashable, tuple[str, Any]] = {}  # read() key -> (state, answer)
        self._cv = threading.Condition()
        self._closing = False
        self._on = store is not None or self._opener is not None
        self._last_drop_log = -1e18
        self._thread: threading.Thread | None = None
        if self._on:
            self._thread = threading.Thread(target=self._writer, name="store-writer", daemon=True)
            self._thread.start()

    @classmethod
    def open(
        cls,
        setting: str,
        findings: str | Path,
        *,
        queue_max: int = QUEUE_MAX,
        retry_min_s: float = RETRY_MIN_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> StoreSink:
        url = resolve_url(setting, findings)
        if url is None:
            log.info("incident store off", store=setting)
            return cls(None)
        kw: dict[str, Any] = {
            "queue_max": queue_max,
            "retry_min_s": retry_min_s,
            "retry_max_s": retry_max_s,
        }
        if not url.lower().startswith("sqlite:"):
            # A database server: opened (and reopened) by the writer thread, so a
            # server that is down or slow at start delays nothing.
            log.info("incident store connecting", store=redact(url))
            return cls(None, url, opener=lambda: open_store(url), **kw)
        try:
            store = open_store(url)
        except StoreError as e:
            log.error(
                "incident store unusable: not writing it (findings and incidents still go"
                " to their JSONL)",
                store=redact(url),
                error=str(e),
            )
            sink = cls(None)
            sink.url, sink.failed = redact(url), str(e)
            return sink
        upgraded = getattr(store, "upgraded", [])
        log.info("incident store open", store=url, upgraded_to=upgraded[-1] if upgraded else None)
        return cls(store, url, **kw)

    # ------------------------------------------------------------------ state
    @property
    def on(self) -> bool:
        """Writes are taken (the store is open, or being reached): not off, not failed."""
        return self._on

    @property
    def connected(self) -> bool:
        return self.store is not None

    @property
    def depth(self) -> int:
        """Writes queued, not yet done (the one being written included: a write
        leaves the queue once it is done)."""
        return len(self._q)

    # ------------------------------------------------------------------ writes
    def _put(self, what: str, fn: Callable[[Store], None]) -> None:
        with self._cv:
            if not self._on or self._closing:
                return
            if len(self._q) >= self.queue_max:
                self.dropped += 1
                now = time.monotonic()
                if now - self._last_drop_log >= DROP_LOG_EVERY_S:
                    self._last_drop_log = now
                    log.warning(
                        "incident store queue full: writes dropped (findings and incidents"
                        " still go to their JSONL)",
                        store=self.url,
                        queued=len(self._q),
                        dropped_total=self.dropped,
                        connected=self.connected,
                    )
                return
            self._q.append((what, fn))
            self._cv.notify_all()

    def write_job(self, job: str, info: dict[str, Any]) -> None:
        if self._on:
            info = dict(info)
            self._put("job", lambda s: s.write_job(job, info))

    def write_incidents(self, records: list[dict[str, Any]]) -> None:
        if records and self._on:
            recs = [_snapshot(r) for r in records]
            self._put("incidents", lambda s: s.write_incidents(recs))

    def write_rows(
        self, job_rows: list[dict[str, Any]], incident_rows: list[dict[str, Any]]
    ) -> None:
        if (job_rows or incident_rows) and self._on:
            jr, ir = list(job_rows), list(incident_rows)
            self._put("rows", lambda s: s.write_rows(jr, ir))

    def write_baselines(self, records: list[dict[str, Any]]) -> None:
        """Baselines across jobs (the job's end: `JobMonitor.baseline_records`)."""
        if records and self._on:
            recs = [dict(r) for r in records]
            self._put("baselines", lambda s: s.write_baselines(recs))

    def read_baseline(
        self, workload: str, hw_class: str, software_hash: str | None = None
    ) -> tuple[str, dict[str, Any] | None]:
        """(state, the baseline or None), never waiting on the database (``read``):
        ``pending`` until the writer thread has read it, then ``done`` once with its
        answer; ``failed`` for a store off or a read that failed (logged; the store
        stays on: a reader's error is not a broken file): the job is then not
        compared, nor are its windows stored as a baseline."""
        return self.read(
            ("baseline", workload, hw_class, software_hash),
            lambda s: s.baseline(workload, hw_class, software_hash),
            what=f"baseline {workload} {hw_class}",
        )

    def read(
        self, key: Hashable, fn: Callable[[Store], Any], what: str = "read"
    ) -> tuple[str, Any]:
        """A read through the writer thread, so the caller (the event loop) never waits
        on the database: the first call queues it (after the writes queued before it,
        so it sees them) and returns ``("pending", None)``, as do the calls until it is
        answered; then one call returns ``("done", value)`` and forgets it. A store off,
        a full queue or a read that failed: ``("failed", None)``. A lost connection
        keeps it pending: it is run again after the reconnect, like a write."""
        with self._cv:
            if not self._on or self._closing:
                return "failed", None
            got = self._reads.get(key)
            if got is not None and got[0] != "pending":
                del self._reads[key]
                return got
            if got is None:
                if len(self._q) >= self.queue_max:
                    return "failed", None
                self._reads[key] = ("pending", None)
                self._q.append(("read", lambda s: self._answer(key, fn, s, what)))
                self._cv.notify_all()
            return "pending", None

    def _answer(self, key: Hashable, fn: Callable[[Store], Any], store: Store, what: str) -> None:
        """Run a queued read on the writer thread; a transient error is raised (the
        writer reconnects and runs it again), any other is the read's alone."""
        try:
            got: tuple[str, Any] = ("done", fn(store))
        except StoreError as e:
            if e.transient:
                raise
            got = self._read_failed(what, e)
        except (OSError, ValueError, TypeError, KeyError) as e:
            got = self._read_failed(what, e)
        with self._cv:
            self._reads[key] = got

    def _read_failed(self, what: str, e: BaseException) -> tuple[str, Any]:
        log.error("incident store read failed", store=self.url, read=what, error=str(e))
        return "failed", None

    def write_monitor_rows(self, rows: list[dict[str, Any]]) -> None:
        """The per-window rows as the monitor returns them (``MonitorOutput.incident_rows``):
        one list, each row's ``row`` saying ``job`` or ``subject``."""
        if rows and self._on:
            rs = list(rows)
            self._put("rows", lambda s: s.write_rows(*split_rows(rs)))

    def prune(self, before: float) -> None:
        """Retention: rows older than `before` (unix s) leave the store (queued like
        every write)."""
        if not self._on:
            return
        url = self.url

        def run(s: Store) -> None:
            out = s.prune(before)
            if any(out.values()):
                log.info("incident store pruned", store=url, before=before, deleted=out)

        self._put("prune", run)

    def flush(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait until every queued write is done (or the sink is off); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._on and self._q:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is queued (waiting up to ``timeout``), then close the store. What
        is still queued then (the store unreachable) is counted as dropped."""
        if not self.flush(timeout):
            log.warning(
                "incident store: closing with writes not done (the store was unreachable);"
                " they are dropped (findings and incidents are in their JSONL)",
                store=self.url,
                queued=self.depth,
            )
        with self._cv:
            self._closing = True
            self.dropped += len(self._q)
            self._q.clear()
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with self._cv:
            self._on = False
            store, self.store = self.store, None
        if store is not None:
            store.close()

    # ------------------------------------------------------------------ the writer
    def _off(self, what: str, e: BaseException) -> None:
        """A refusal: logged once, the sink off, the queue discarded."""
        log.error(
            "incident store write failed: the store is off until restart (findings"
            " and incidents still go to their JSONL)",
            store=self.url,
            write=what,
            error=str(e),
        )
        with self._cv:
            self.failed = str(e)
            self._on = False
            self._q.clear()
            store, self.store = self.store, None
            self._cv.notify_all()
        if store is not None:
            store.close()

    def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless closing; True if closing."""
        with self._cv:
            self._cv.wait_for(lambda: self._closing, seconds)
            return self._closing

    def _backoff(self, attempt: int) -> float:
        base = min(self.retry_max_s, self.retry_min_s * 2.0 ** min(attempt, 30))
        return base * random.uniform(0.8, 1.2)

    def _connect(self) -> bool:
        """Open the store (a first connect or a reconnect), with back-off; False if
        the sink closed or turned off meanwhile."""
        assert self._opener is not None
        attempt = 0
        while True:
            with self._cv:
                if self._closing or not self._on:
                    return False
            try:
                store = self._opener()
            except StoreError as e:
                if not e.transient:
                    self._off("open", e)
                    return False
                wait = self._backoff(attempt)
                # The first failure of an outage as a warning, then quieter.
                (log.warning if attempt == 0 else log.info)(
                    "incident store unreachable: retrying (scoring goes on; writes are queued)",
                    store=self.url,
                    error=str(e),
                    retry_in_s=round(wait, 2),
                    queued=self.depth,
                )
                attempt += 1
                if self._wait(wait):
                    return False
                continue
            except Exception as e:  # an opener's bug: off, never a dead writer
                self._off("open", e)
                return False
            with self._cv:
                self.store = store
            upgraded = getattr(store, "upgraded", [])
            log.info(
                "incident store open",
                store=self.url,
                upgraded_to=upgraded[-1] if upgraded else None,
                queued=self.depth,
            )
            return True

    def _writer(self) -> None:
        first = self.store is None
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._q or self._closing or not self._on)
                if self._closing or not self._on:
                    return
                what, fn = self._q[0]  # taken off only once written
            try:
                if self.store is None:
                    if not self._connect():
                        return
                    if not first:
                        self.reconnects += 1
                    first = False
                store = self.store
                assert store is not None
                try:
                    fn(store)
                except (StoreError, OSError) as e:
                    if reason_of(e) in ("no_space", "quota"):
                        # Disk full: this write is given up (the JSONL keeps the
                        # records), the store stays on and the next write tries again.
                        self.health.failed(e, what)
                        self.health.give_up(1, f"{what}_not_written")
                        with self._cv:
                            if self._q:
                                self._q.popleft()
                        continue
                    if not isinstance(e, StoreError) or not e.transient or self._opener is None:
                        self._off(what, e)
                        return
                    log.warning(
                        "incident store connection lost: reconnecting (scoring goes on;"
                        " writes are queued)",
                        store=self.url,
                        write=what,
                        error=str(e),
                        queued=self.depth,
                    )
                    with self._cv:
                        self.store = None
                    store.close()
                    if self._wait(self._backoff(0)):
                        return
                    continue  # the same write again, after the reconnect
                except Exception as e:
                    # A write the store cannot take (a bug upstream: a bad record):
                    # logged like a refused store; the writer never dies silently.
                    self._off(what, e)
                    return
                with self._cv:
                    if self._q:
                        self._q.popleft()
                    self.written += 1
                self.health.ok()
            finally:
                with self._cv:
                    self._cv.notify_all()
