"""The coordinator fleet's shell: leases held and renewed, routing, fenced state, restore.

Coordinators that share one PostgreSQL store form a fleet (docs/DESIGN.md "The
coordinator fleet"). Each job has one owner, held as a lease row in the store
(store/fleet.py); `Fleet` holds this coordinator's leases and renews them every
`renew_s` from a thread with its own connection (never on the event loop: a slow
database must not stall ingest, and a stalled event loop must not keep a lease
alive by accident). `FleetCoordinator` is the coordinator with the fleet's rules:

- Routing: an agent's hello (`route`, asked by the protocol server after auth)
  and every data message name jobs; a job whose lease nobody holds is taken
  (its state and journal restored from the store), one held by another
  coordinator is answered with who does (Redirect, or `not_owner` before 1.3),
  and data of it is not taken (`NotTaken`: not acked, the agent resends).
- Durability: a windows batch is acked only once the job's rows are in the
  store's journal, under the lease (fenced). A group of outputs (a scored
  window's, a plan ack's, a hang's) is held until the job's state commits in one
  fenced transaction (`FencedSinks`); only then do the findings JSONL, metrics,
  store rows and control go out. A commit refused (`LeaseLost`) or failed drops
  the group and the job (monitor, assembly, controls) and redirects its agents;
  the job is served again only after its lease is re-checked (acquired anew,
  restoring what its owner committed meanwhile).
- A clean stop commits each job's state and releases the leases (the next owner
  takes them at once); it closes no incident and scores no pending window: the
  journal keeps them for the next owner.

The single coordinator (no `--fleet`) keeps its files (service.py) unchanged.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import msgpack
import msgspec
import numpy as np
import structlog
from artemis.coordinator.config import FleetConfig
from artemis.coordinator.service import Coordinator
from artemis.coordinator.sinks import Sinks, StoreOutputs
from artemis.detect.monitor import MonitorOutput
from artemis.protocol.columns import WindowBatch, WindowColumns, from_wire, to_wire
from artemis.protocol.messages import Dump, Fingerprint, Heartbeat, JobOwner, Message, Windows
from artemis.protocol.server import NotTaken, PeerInfo
from artemis.store.base import StoreError
from artemis.store.fleet import FleetStore, Lease, LeaseLost, Outputs

__all__ = ["FencedSinks", "Fleet", "FleetCoordinator"]

log = structlog.get_logger("artemis.coordinator.fleet")

# How long a job that ended here is still exported with owner 0 (ended, released), so the
# "no owner" alert tells an end from a lost owner (deploy/prometheus/artemis-rules.yml).
ENDED_EXPORT_S = 600.0


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


class FencedSinks:
    """The sinks of a fleet coordinator: a group of outputs is held until the job's state
    commits through the fenced transaction (`FleetCoordinator.commit_state`); then, and
    only then, it goes to the record files, metrics, store rows and memory (`Sinks`).
    A refused commit drops the group: nothing of it was said."""

    def __init__(self, inner: Sinks, coord: FleetCoordinator) -> None:
        self.inner = inner
        # The store's rows go in the fenced commit itself (`outputs`), not in the sink's
        # queue: the inner sinks keep the record files, metrics and memory.
        inner.sinks = [s for s in inner.sinks if not isinstance(s, StoreOutputs)]
        self.coord = coord
        self._held: dict[str, list[tuple[MonitorOutput, float | None]]] = {}
        self._info: dict[str, dict[str, Any]] = {}  # the job rows' keys to write

    def write(self, job: str, out: MonitorOutput, scored_s: float | None = None) -> None:
        if scored_s is None and not (
            out.findings or out.plans or out.incidents or out.incident_rows or out.result
        ):
            # Nothing said (a quiet tick's output): nothing to fence, nothing to hold.
            self.inner.write(job, out, scored_s)
            return
        self._held.setdefault(job, []).append((out, scored_s))

    def write_job(self, job: str, info: Mapping[str, Any] | None) -> None:
        """The job's row in the store: with the group's next commit."""
        if info:
            self._info.setdefault(job, {}).update(info)

    def commit(self, job: str, state: Mapping[str, Any] | None) -> None:
        held = self._held.pop(job, [])
        outputs = Outputs(info=self._info.pop(job, {}))
        for out, _scored in held:
            outputs.incidents += out.incidents
            outputs.rows += out.incident_rows
        if not self.coord.commit_state(job, state, outputs if self.inner.store.on else None):
            return
        for out, scored_s in held:
            self.inner.write(job, out, scored_s)
        self.inner.commit(job, state)

    def discard(self, job: str) -> None:
        self._held.pop(job, None)
        self._info.pop(job, None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _jobs_of(msg: Message) -> set[str]:
    """The jobs a data message carries something of."""
    if isinstance(msg, Windows):
        return {str(j) for j in set(msg.columns["job"])}
    if isinstance(msg, Heartbeat):
        jobs = {p.job for p in msg.progress} | {str(a.get("job", "")) for a in msg.plan_acks}
        return jobs - {""}  # a plan ack without a job is refused by the monitor's shell
    if isinstance(msg, Fingerprint | Dump):
        return {msg.job}
    return set()


def _by_job(cols: WindowColumns) -> Iterator[tuple[str, WindowColumns]]:
    jobs = cols["job"]
    names = set(jobs)
    if len(names) == 1:
        yield str(next(iter(names))), cols  # the batch as it came (its wire bytes kept)
        return
    arr = np.asarray(jobs, dtype=object)
    for job in sorted(names):
        yield str(job), cols.take(np.flatnonzero(arr == job))


class FleetCoordinator(Coordinator):
    """The coordinator as one of a fleet (module docstring). `fleet`: its leases."""

    _outbox: list[tuple[str, str, dict[str, Any]]]  # (job, action, body): service.py's

    def __init__(self, *args: Any, fleet: Fleet, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fleet = fleet
        self.sinks: Any = FencedSinks(self.sinks, self)
        self._refused: set[str] = set()  # jobs whose commit was refused, to drop
        self.ended: dict[str, float] = {}  # jobs that ended here -> when (owner gauge at 0)

    # ------------------------------------------------------------------ routing
    def route(self, peer: PeerInfo) -> list[JobOwner]:
        """The hello's jobs another coordinator serves (the server redirects the agent)."""
        out = []
        for job in sorted({r.job for r in peer.ranks}):
            o = self.owner(job)
            if o is not None:
                out.append(o)
        return out

    def owner(self, job: str) -> JobOwner | None:
        """None when this coordinator serves `job` (holding its lease, or taking it now:
        its state restored), else who does (empty: nobody it can see)."""
        if job in self._refused:
            return self.fleet.owner(job)
        if self.fleet.epoch(job) is not None:
            return None
        try:
            lease = self.fleet.acquire(job)
        except StoreError as e:
            log.warning("fleet lease not checked", job=job, error=str(e))
            self.fleet.failed(e)
            return JobOwner(job=job)
        if not lease.mine:
            return self.fleet.holder(lease)
        self.ended.pop(job, None)
        try:
            self._adopt(job, lease.epoch)
        except StoreError as e:
            log.warning("job state not loaded: lease given back", job=job, error=str(e))
            self.fleet.failed(e)
            self.fleet.drop(job)
            return JobOwner(job=job)
        return None

    def _adopt(self, job: str, epoch: int) -> None:
        """A lease taken: the job's state as its previous owner committed it, then the
        batches it took but never scored (the journal), scored now. A window scored
        before is refused by the restored monitor and assembly: none twice."""
        saved = self.fleet.loop_store().load(job)
        if job in self.monitors:
            self._forget(job)  # what this coordinator knew before may be stale
        m = None
        if saved.state is not None:
            state = msgpack.unpackb(saved.state, raw=False, strict_map_key=False)
            m = self.jobs.restore(state)
            self.corrections.restore(job, state.get("corrections"))
            if m is not None:
                self.metrics.observe_restored(job, m.last_window)
                self._emit(job, m.update_settings(self.settings))
        parts = [from_wire(msgspec.msgpack.decode(b, type=WindowBatch)) for b in saved.journal]
        log.info(
            "job lease taken",
            job=job,
            epoch=epoch,
            restored_window=None if m is None else m.last_window,
            open_findings=None if m is None else m.open_findings(),
            journal_batches=len(parts),
        )
        self.metrics.set_owner(job, epoch)
        if parts:
            self.jobs.monitor(job)
            self._score_all(self.assembler.add(WindowColumns.concat(parts), self.clock()))

    # ------------------------------------------------------------------ app hooks
    def on_connect(self, peer: PeerInfo) -> None:
        # Only the ranks of jobs served here join (the others were redirected).
        mine = tuple(r for r in peer.ranks if self.fleet.epoch(r.job) is not None)
        super().on_connect(_with_ranks(peer, mine))

    async def on_message(self, peer: PeerInfo, msg: Message) -> None:
        for job in sorted(_jobs_of(msg)):
            o = self.owner(job)
            if o is not None:
                raise NotTaken(
                    f"job {job!r} is served by coordinator {o.owner or '(none seen)'}"
                    f" at {o.address or '?'}"
                )
        if isinstance(msg, Windows):
            self._journal(msg.columns)
            for job in _jobs_of(msg) & set(self.ended):  # an ended job runs again
                del self.ended[job]
                self.metrics.set_owner(job, self.fleet.epoch(job) or 0)
        await super().on_message(peer, msg)

    def _journal(self, cols: WindowColumns) -> None:
        """Each job's rows of the batch into the store's journal, under its lease, before
        the batch is acked; NotTaken (not acked, resent) when the store cannot take them."""
        for job, part in _by_job(cols):
            epoch = self.fleet.epoch(job)
            try:
                if epoch is None:
                    raise LeaseLost(job, 0)
                hi = int(part.ints("window").max())
                store = self.fleet.loop_store()
                store.add_batch(job, epoch, hi, msgspec.msgpack.encode(to_wire(part)))
            except (LeaseLost, StoreError) as e:
                if isinstance(e, StoreError):
                    self.fleet.failed(e)
                self.refused_batches += 1
                self._refused.add(job)
                raise NotTaken(f"job {job!r}: the fleet's store did not take the batch: {e}") from e

    async def tick(self) -> None:
        self._refused |= self.fleet.take_lost()
        now = self.clock()
        for job in [j for j, t in self.ended.items() if now - t >= ENDED_EXPORT_S]:
            del self.ended[job]
            self.metrics.forget_owner(job)
            if job not in self.monitors:  # still over: its lease goes back
                self.fleet.release(job)
        await super().tick()

    async def _flush_controls(self) -> None:
        # Jobs whose lease was lost are dropped (with the controls they queued) before
        # anything goes out; their agents are told who serves them now.
        lost, self._refused = self._refused, set()
        for job in sorted(lost):
            self._forget(job)
            self.fleet.drop(job)
            self._outbox = [o for o in self._outbox if o[0] != job]
        await super()._flush_controls()
        for job in sorted(lost):
            owner = self.fleet.owner(job)
            log.warning("job lease lost: no longer served here", job=job, owner=owner.owner)
            if self.server is not None:
                await self.server.redirect(owner)

    def _end_job(self, job: str, keep_assembly: bool = False) -> None:
        super()._end_job(job, keep_assembly)
        if not keep_assembly:  # not a new run of it: the job is over
            # Its lease is kept (its agents' last heartbeats still come here) and
            # released ENDED_EXPORT_S later; meanwhile the owner gauge says 0: ended.
            self.ended[job] = self.clock()
            self.metrics.set_owner(job, 0)

    def _forget(self, job: str) -> None:
        """The job is not served here any more: its monitor, assembly, series and held
        outputs go (its incidents stay open: their owner continues them)."""
        self.jobs.forget(job)
        self.corrections.forget(job)
        self.metrics.forget_job(job)
        self.plan_metrics.forget(job)
        self.sinks.discard(job)

    # ------------------------------------------------------------------ state
    def _save(self, job: str, stopped: bool = False) -> None:
        state = self.jobs.state(job, stopped)
        if state is not None:
            state["corrections"] = self.corrections.snapshot(job)
        self.sinks.commit(job, state)

    def commit_state(
        self, job: str, state: Mapping[str, Any] | None, outputs: Outputs | None = None
    ) -> bool:
        """The job's state and marker in one fenced transaction, with the group's rows for
        the incident store (`outputs`) and the journal rows below its oldest unscored
        window deleted; False (the group dropped, the job to be dropped) when the lease
        is not ours or the store failed. A store that refuses the rows for good (a record
        it cannot take) gets the state alone, the refusal logged."""
        epoch = self.fleet.epoch(job)
        if job in self._refused or epoch is None:
            return False
        if state is None and not outputs:
            return True  # nothing of the job to keep (its assembly gone: ended)
        m = self.monitors.get(job)
        marker = {
            "owner": self.fleet.id,
            "epoch": epoch,
            "out_seq": None if state is None else state.get("out_seq"),
            "window": None if m is None else m.last_window,
        }
        floor = [w for j, _r, w in self.jobs.unscored if j == job]
        oldest = self.assembler.oldest_pending(job)
        if oldest is not None:
            floor.append(oldest)
        below = min(floor) if floor else (m.last_window + 1 if m is not None else None)
        blob = None if state is None else msgpack.packb(dict(state), use_bin_type=True)
        try:
            try:
                self.fleet.loop_store().write_state(job, epoch, blob, marker, below, outputs)
            except StoreError as e:
                if e.transient or not outputs:
                    raise
                log.error("incident store refused a job's rows: state kept", error=str(e))
                self.fleet.loop_store().write_state(job, epoch, blob, marker, below)
        except (LeaseLost, StoreError) as e:
            log.warning("job state not committed: the job stops here", job=job, error=str(e))
            if isinstance(e, StoreError):
                self.fleet.failed(e)
            self._refused.add(job)
            return False
        return True

    def flush(self) -> None:
        """A clean stop: each job's state committed, then the leases released. No window
        is scored now and no incident closed: the next owner continues from the store."""
        for job in list(self.monitors):
            self._save(job)
        self.fleet.stop(release=True)
        self.sinks.close()


def _with_ranks(peer: PeerInfo, ranks: tuple[Any, ...]) -> PeerInfo:
    from dataclasses import replace

    return replace(peer, ranks=ranks)
