"""The coordinator fleet's tables (schema v6): job leases, each job's state, its journal.

A fleet is the coordinators that share one PostgreSQL store (docs/DESIGN.md "The
coordinator fleet"). Each job has one owner at a time, held as a lease row
(`fleet_leases`: owner id, advertised address, epoch, expiry). There is no
home-made consensus: every decision is one transaction that locks the job's
lease row (`FOR UPDATE`) and judges expiry by the database's own clock,
``clock_timestamp()``, never a coordinator's, so two coordinators whose clocks
disagree (or one paused for a minute) still agree on who holds a job.

- `acquire(job)`: take the lease when nobody holds it (no row, or expired;
  the epoch goes up by one: a takeover), extend it when we already hold it, or
  say who does.
- `renew(leases)`: extend the ones we still hold; returns those we lost.
- `release(leases)`: a clean stop; the lease expires now, its epoch and the
  job's state stay for the next owner.
- `fenced(job, epoch)`: a transaction that first checks, under the row lock,
  that the lease is still ours at that epoch and unexpired; otherwise
  `LeaseLost` and nothing is written. Every write of a job's state and journal
  goes through it (`write_state`, `write_marker`, `add_batch`), so an owner that lost its lease
  (paused, cut off from the database) cannot write over its successor.
- `load(job)`: what a new owner restores: the last full snapshot of the state, its
  marker (which also lists the windows committed since, coordinator/fleet_state.py)
  and the journal (the batches since that snapshot, in the order taken).

PostgreSQL only: SQLite has the tables (one schema, store/schema.py) but fleet
mode refuses it (`open_fleet`). One `FleetStore` is one connection; the
coordinator keeps two (its event loop's, and its renewing thread's).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from artemis.store.base import StoreError, redact
from artemis.store.schema import Db
from artemis.store.sink import split_rows
from artemis.store.sql import SqlStore

__all__ = ["FleetStore", "Lease", "LeaseLost", "Outputs", "Saved", "check_fleet_url"]

# The database's clock in unix seconds: what every expiry is judged by.
NOW = "extract(epoch FROM clock_timestamp())"


class LeaseLost(Exception):
    """The job's lease is not ours at that epoch any more (taken over, or expired):
    nothing was written. The coordinator stops serving the job until it re-checks."""

    def __init__(self, job: str, epoch: int, text: str = "") -> None:
        super().__init__(text or f"lease of job {job!r} at epoch {epoch} is no longer held")
        self.job = job
        self.epoch = epoch


@dataclass(frozen=True)
class Lease:
    """A job's lease as read under its row lock. `mine`: held by the asking coordinator."""

    job: str
    owner: str
    address: str
    epoch: int
    expires: float  # unix s, the database's clock
    mine: bool


@dataclass
class Saved:
    """What a job's previous owner left in the store."""

    state: bytes | None = None  # msgpack of the job's state (None: never saved)
    marker: dict[str, Any] = field(default_factory=dict)
    epoch: int = 0  # the epoch that wrote the state
    journal: list[bytes] = field(default_factory=list)  # batches, in the order taken


@dataclass
class Outputs:
    """A group's rows for the incident store, written inside the fenced commit (in a fleet
    they never go through the sink's queue, which drops when full)."""

    info: dict[str, Any] = field(default_factory=dict)  # the job row's changed keys
    incidents: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)  # MonitorOutput.incident_rows

    def __bool__(self) -> bool:
        return bool(self.info or self.incidents or self.rows)

    def write(self, sql: SqlStore, db: Db, job: str) -> None:
        now = time.time()
        if self.info:
            sql.merge_job(db, job, self.info, now)
        sql.upsert_incidents(db, self.incidents, now)
        if self.rows:
            sql.upsert_rows(db, *split_rows(self.rows))


def check_fleet_url(url: str) -> None:
    """Fleet mode needs a PostgreSQL store: a clear error naming the store otherwise."""
    if not url.startswith(("postgresql://", "postgres://")):
        shown = redact(url) if url else "(none)"
        raise StoreError(
            f"fleet mode needs a PostgreSQL store (store = postgresql://...), got {shown}:"
            " a lease needs one clock every coordinator shares"
        )


def with_timeouts(url: str, lease_s: float) -> str:
    """`url` with libpq's socket time-outs for a lease of `lease_s`, unless it sets them:
    a database cut off the network (packets dropped, no reset) must fail a call within
    a fraction of a lease, not after the kernel's TCP retries (minutes), so the lease's
    holder knows it has lost it before another takes it."""
    ms = max(1000, int(lease_s * 1000 / 3))
    want = {
        "tcp_user_timeout": str(ms),  # unacknowledged data this long: the call fails
        "keepalives": "1",
        "keepalives_idle": str(max(1, ms // 1000)),
        "keepalives_interval": "1",
        "keepalives_count": "2",
        "connect_timeout": str(max(2, int(lease_s / 2))),
    }
    have = {k for k, _ in parse_qsl(urlsplit(url).query)}
    extra = "&".join(f"{k}={v}" for k, v in want.items() if k not in have)
    if not extra:
        return url
    return url + ("&" if urlsplit(url).query else "?") + extra


class FleetStore:
    """One connection to the fleet's tables, as coordinator `owner` (advertised at
    `address`) with leases of `lease_s` seconds."""

    def __init__(self, url: str, owner: str, address: str, lease_s: float) -> None:
        check_fleet_url(url)
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s}")
        if not owner:
            raise ValueError("a fleet coordinator needs an id (owner)")
        from artemis.store.postgres import PostgresStore

        self.url = redact(url)
        self._url = with_timeouts(url, lease_s)
        self.owner = owner
        self.address = address
        self.lease_s = float(lease_s)
        self._pg = PostgresStore(self._url)  # connects and migrates (v6: the fleet's tables)
        self.db: Db = self._pg._db

    # ------------------------------------------------------------------ plumbing
    def close(self) -> None:
        self._pg.close()

    def reconnect(self) -> None:
        """A new connection after a lost one (a server restart, a network cut)."""
        from artemis.store.postgres import PostgresStore

        with contextlib.suppress(Exception):
            self._pg.close()
        self._pg = PostgresStore(self._url)
        self.db = self._pg._db

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        import psycopg

        try:
            yield
        except psycopg.Error as e:
            transient = isinstance(e, psycopg.OperationalError | psycopg.InterfaceError)
            raise StoreError(f"{self.url}: fleet {what} failed: {e}", transient=transient) from e

    def now(self) -> float:
        """The database's clock (unix s)."""
        with self._guard("clock read"):
            return float(self.db.execute(f"SELECT {NOW}").fetchone()[0])

    # ------------------------------------------------------------------ leases
    def acquire(self, job: str) -> Lease:
        """Take `job`'s lease if nobody holds it (a takeover bumps the epoch), extend it if
        we do, else return the holder's (mine False). Two coordinators racing get one
        owner: the row is created first (a conflicting insert waits for the other's
        commit, then does nothing) and then read under its lock."""
        with self._guard("acquire"), self.db.transaction() as db:
            db.execute(
                "INSERT INTO fleet_leases (job, owner, address, epoch, expires, acquired)"
                " VALUES (?, '', '', 0, 0, 0) ON CONFLICT (job) DO NOTHING",
                (job,),
            )
            owner, address, epoch, expires, now = db.execute(
                f"SELECT owner, address, epoch, expires, {NOW} FROM fleet_leases"
                " WHERE job = ? FOR UPDATE",
                (job,),
            ).fetchone()
            live = float(expires) > float(now)
            if live and owner != self.owner:
                return Lease(job, owner, address, int(epoch), float(expires), mine=False)
            # Ours and live: extended at the same epoch. Expired (or never held): taken,
            # at a new epoch, even by its previous holder (what it held may be stale).
            new_epoch = int(epoch) if live else int(epoch) + 1
            row = db.execute(
                f"UPDATE fleet_leases SET owner = ?, address = ?, epoch = ?, expires = {NOW} + ?,"
                f" acquired = CASE WHEN ? THEN acquired ELSE {NOW} END"
                " WHERE job = ? RETURNING expires",
                (self.owner, self.address, new_epoch, self.lease_s, live, job),
            ).fetchone()
            return Lease(job, self.owner, self.address, new_epoch, float(row[0]), mine=True)

    def renew(self, leases: Mapping[str, int]) -> set[str]:
        """Extend each lease (job -> epoch) still ours and unexpired; returns the jobs
        whose lease was lost (taken over, or expired before this renewal)."""
        if not leases:
            return set()
        kept: set[str] = set()
        with self._guard("renew"), self.db.transaction() as db:
            for job, epoch in leases.items():
                row = db.execute(
                    f"UPDATE fleet_leases SET expires = {NOW} + ?"
                    f" WHERE job = ? AND owner = ? AND epoch = ? AND expires > {NOW}"
                    " RETURNING job",
                    (self.lease_s, job, self.owner, epoch),
                ).fetchone()
                if row is not None:
                    kept.add(job)
        return set(leases) - kept

    def release(self, leases: Mapping[str, int]) -> None:
        """A clean stop: each lease still ours expires now (epoch and state stay; the next
        owner takes it at once, and continues the job's incidents)."""
        if not leases:
            return
        with self._guard("release"), self.db.transaction() as db:
            for job, epoch in leases.items():
                db.execute(
                    f"UPDATE fleet_leases SET expires = {NOW}"
                    " WHERE job = ? AND owner = ? AND epoch = ?",
                    (job, self.owner, epoch),
                )

    def owners(self, jobs: Iterable[str]) -> dict[str, Lease]:
        """The live leases of `jobs` (a job nobody holds is absent)."""
        out: dict[str, Lease] = {}
        with self._guard("owner read"):
            for job in sorted(set(jobs)):
                row = self.db.execute(
                    "SELECT owner, address, epoch, expires FROM fleet_leases"
                    f" WHERE job = ? AND expires > {NOW}",
                    (job,),
                ).fetchone()
                if row is not None:
                    owner, address, epoch, expires = row
                    out[job] = Lease(
                        job, owner, address, int(epoch), float(expires), owner == self.owner
                    )
        return out

    def owner_of(self, job: str) -> Lease | None:
        return self.owners([job]).get(job)

    # ------------------------------------------------------------------ fenced writes
    @contextlib.contextmanager
    def fenced(self, job: str, epoch: int) -> Iterator[Db]:
        """One transaction whose first statement checks, under the lease row's lock and by
        the database's clock, that `job`'s lease is ours at `epoch` and unexpired; raises
        `LeaseLost` (nothing written) otherwise. The caller's writes follow inside it."""
        with self._guard("write"), self.db.transaction() as db:
            row = db.execute(
                f"SELECT expires > {NOW} FROM fleet_leases"
                " WHERE job = ? AND owner = ? AND epoch = ? FOR UPDATE",
                (job, self.owner, epoch),
            ).fetchone()
            if row is None or not row[0]:
                raise LeaseLost(job, epoch)
            yield db

    def write_state(
        self,
        job: str,
        epoch: int,
        state: bytes | None,
        marker: Mapping[str, Any],
        journal_below: int | None = None,
        outputs: Outputs | None = None,
    ) -> None:
        """The job's state and its marker, fenced; the journal's batches whose highest
        window is below `journal_below` (scored and in the state) are deleted with it, and
        the group's `outputs` for the incident store (job info, incident records, window
        rows) are written with it: all of it, or nothing. `state` None: the outputs only."""
        with self.fenced(job, epoch) as db:
            if outputs is not None:
                outputs.write(self._pg, db, job)
            if state is None:
                return  # outputs only (the job has no state to keep)
            db.execute(
                "INSERT INTO fleet_state (job, epoch, state, marker, updated)"
                f" VALUES (?, ?, ?, ?, {NOW}) ON CONFLICT (job) DO UPDATE SET"
                " epoch = excluded.epoch, state = excluded.state, marker = excluded.marker,"
                " updated = excluded.updated",
                (job, epoch, state, json.dumps(dict(marker), separators=(",", ":"))),
            )
            if journal_below is not None:
                db.execute(
                    "DELETE FROM fleet_journal WHERE job = ? AND hi < ?", (job, journal_below)
                )

    def write_marker(
        self, job: str, epoch: int, marker: Mapping[str, Any], outputs: Outputs | None = None
    ) -> None:
        """A commit between full snapshots: the marker alone (the state row keeps the last
        full snapshot, the journal the batches since), with the group's `outputs`,
        fenced: all of it, or nothing. The state row must be this epoch's (its owner
        wrote a full snapshot first); otherwise `LeaseLost` and nothing is written."""
        with self.fenced(job, epoch) as db:
            if outputs is not None:
                outputs.write(self._pg, db, job)
            row = db.execute(
                f"UPDATE fleet_state SET marker = ?, updated = {NOW}"
                " WHERE job = ? AND epoch = ? RETURNING job",
                (json.dumps(dict(marker), separators=(",", ":")), job, epoch),
            ).fetchone()
            if row is None:
                raise LeaseLost(job, epoch, f"job {job!r}: no full snapshot at epoch {epoch}")

    def add_batch(self, job: str, epoch: int, hi: int, batch: bytes) -> int:
        """A batch of the job's summaries taken (before its ack), fenced; its sequence."""
        with self.fenced(job, epoch) as db:
            seq = db.execute(
                "SELECT coalesce(max(seq), 0) + 1 FROM fleet_journal WHERE job = ?", (job,)
            ).fetchone()[0]
            db.execute(
                "INSERT INTO fleet_journal (job, seq, epoch, hi, batch) VALUES (?, ?, ?, ?, ?)",
                (job, seq, epoch, hi, batch),
            )
            return int(seq)

    def load(self, job: str) -> Saved:
        """The job's state, marker and journal as its previous owner left them."""
        out = Saved()
        with self._guard("load"), self.db.transaction() as db:
            row = db.execute(
                "SELECT state, marker, epoch FROM fleet_state WHERE job = ?", (job,)
            ).fetchone()
            if row is not None:
                out.state = bytes(row[0])
                out.marker = json.loads(row[1])
                out.epoch = int(row[2])
            out.journal = [
                bytes(b)
                for (b,) in db.execute(
                    "SELECT batch FROM fleet_journal WHERE job = ? ORDER BY seq", (job,)
                ).fetchall()
            ]
        return out
