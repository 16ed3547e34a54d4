"""A fleet coordinator's leases: held, renewed by a thread of its own, lost, given back.

Each job of a fleet has one owner, held as a lease row in the store
(store/fleet.py). `Fleet` holds this coordinator's leases and renews them every
`renew_s` from a thread with its own connection (never on the event loop: a slow
database must not stall ingest, and a stalled event loop must not keep a lease
alive by accident). The coordinator with the fleet's rules is coordinator/fleet.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping

import structlog
from artemis.coordinator.config import FleetConfig
from artemis.protocol.messages import JobOwner
from artemis.store.base import StoreError
from artemis.store.fleet import FleetStore, Lease

__all__ = ["Fleet"]

log = structlog.get_logger("artemis.coordinator.fleet")


class Fleet:
    """This coordinator's leases: held (job -> epoch), renewed by a thread of their own,
    those it lost collected for the event loop (`take_lost`)."""

    def __init__(self, cfg: FleetConfig, url: str) -> None:
        self.cfg = cfg
        self.id = cfg.id
        self._url = url
        self.store = FleetStore(url, cfg.id, cfg.advertise, cfg.lease_s)  # the event loop's
        self._renewer = FleetStore(url, cfg.id, cfg.advertise, cfg.lease_s)  # the thread's
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._lost: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewed_at = time.monotonic()  # the last renewal the database answered
        self._renew_ok = True  # whether the last renewal reached the database
        # The event loop's connection failed: not used until the renewing thread has
        # made a new one (a connect to a database cut off waits; the loop must not).
        self._loop_broken = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleet-renew", daemon=True)
        self._thread.start()

    def reached(self) -> bool:
        """Whether the last renewal reached the database (straggler_store_connected)."""
        return self._renew_ok

    def held(self) -> dict[str, int]:
        with self._lock:
            return dict(self._held)

    def epoch(self, job: str) -> int | None:
        with self._lock:
            return self._held.get(job)

    def acquire(self, job: str) -> Lease:
        lease = self.loop_store().acquire(job)
        if lease.mine:
            with self._lock:
                self._held[job] = lease.epoch
                self._lost.discard(job)
        return lease

    def drop(self, job: str) -> None:
        with self._lock:
            self._held.pop(job, None)

    def release(self, job: str) -> None:
        """The job ended here: its lease goes back (taken again if it comes back)."""
        epoch = self.epoch(job)
        self.drop(job)
        if epoch is not None:
            try:
                self.loop_store().release({job: epoch})
            except StoreError as e:
                log.warning("fleet lease not released: it expires", job=job, error=str(e))

    def loop_store(self) -> FleetStore:
        """The event loop's connection; a StoreError (transient) while it is being made
        anew after a failure (`failed`)."""
        if self._loop_broken:
            raise StoreError(f"{self.store.url}: reconnecting", transient=True)
        return self.store

    def failed(self, e: StoreError) -> None:
        """A call on the event loop's connection failed: a lost connection is made anew by
        the renewing thread, off the loop (`_mend`)."""
        if e.transient:
            self._loop_broken = True

    def _mend(self) -> None:
        """(Renewing thread.) A new connection for the event loop, once the database
        answers again; the old one is closed (the loop no longer uses it)."""
        try:
            new = FleetStore(self._url, self.id, self.cfg.advertise, self.cfg.lease_s)
        except (StoreError, ValueError) as e:
            log.debug("fleet store not reachable yet", error=str(e))
            return
        old, self.store = self.store, new
        self._loop_broken = False
        with contextlib.suppress(Exception):
            old.close()
        log.info("fleet store reconnected", store=new.url)

    def take_lost(self) -> set[str]:
        with self._lock:
            lost, self._lost = self._lost, set()
        return lost

    def owner(self, job: str) -> JobOwner:
        """Who holds `job` now, as the wire says it (empty: nobody this coordinator sees)."""
        try:
            lease = self.loop_store().owner_of(job)
        except StoreError as e:
            self.failed(e)
            lease = None
        if lease is None or lease.mine:
            return JobOwner(job=job)
        return self.holder(lease)

    def holder(self, lease: Lease) -> JobOwner:
        """Another's `lease` as the wire says it, with how long it still runs by the
        database's clock: an agent that cannot reach the holder (it died) comes back
        when the lease is free instead of polling the fleet on its back-off."""
        try:
            left = max(0.0, lease.expires - self.loop_store().now())
        except StoreError as e:
            self.failed(e)
            left = 0.0  # not known: the agent falls back on its retries
        return JobOwner(
            job=lease.job,
            owner=lease.owner,
            address=lease.address,
            epoch=lease.epoch,
            expires_s=min(left, 86400.0),
        )

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.renew_s):
            self.renew_once()

    def renew_once(self) -> set[str]:
        """One renewal of every lease held; returns those lost. While the database does
        not answer for a whole lease, every lease is taken as lost: another coordinator
        may hold them by now, and the fenced writes would be refused anyway."""
        held = self.held()
        try:
            if held:
                lost = self._renewer.renew(held)
            else:  # nothing to renew: the database is still asked (is it there?)
                self._renewer.now()
                lost = set()
            self.renewed_at = time.monotonic()
            if not self._renew_ok:
                log.info("fleet store reached again", store=self._renewer.url)
            self._renew_ok = True
        except StoreError as e:
            if self._renew_ok:  # logged when it starts failing, not every renew_s
                log.warning("fleet lease renewal failed", store=self._renewer.url, error=str(e))
            self._renew_ok = False
            # Judged before reconnecting (which may wait on a database cut off).
            lost = set(held) if time.monotonic() - self.renewed_at >= self.cfg.lease_s else set()
            self._lose(held, lost)
            with contextlib.suppress(StoreError):
                self._renewer.reconnect()
            return lost
        if self._loop_broken:
            self._mend()
        self._lose(held, lost)
        return lost

    def _lose(self, held: Mapping[str, int], lost: set[str]) -> None:
        if lost:
            with self._lock:
                for job in lost:
                    if self._held.get(job) == held[job]:
                        del self._held[job]
                        self._lost.add(job)
            log.warning("fleet leases lost", jobs=sorted(lost))

    def stop(self, release: bool = True) -> None:
        """Stop renewing; `release`: hand every lease over now (a clean stop)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(5.0, self.cfg.renew_s * 2))
        if release:
            held = self.held()
            try:
                self.store.release(held)
                log.info("fleet leases released", jobs=sorted(held))
            except StoreError as e:
                log.warning("fleet leases not released: they expire", error=str(e))
        with self._lock:
            self._held.clear()
        self.store.close()
        self._renewer.close()
