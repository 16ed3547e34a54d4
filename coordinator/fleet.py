"""The coordinator fleet's shell: routing, fenced state, incremental commits, restore.

Coordinators that share one PostgreSQL store form a fleet (docs/DESIGN.md "The
coordinator fleet"). Each job has one owner, held as a lease row in the store
(store/fleet.py); `Fleet` (coordinator/fleet_leases.py) holds this coordinator's
leases and renews them. `FleetCoordinator` is the coordinator with the fleet's rules:

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
- Incremental state (coordinator/fleet_state.py): the job's whole state is written
  every `snapshot_every` scored windows, and whenever something a replay cannot
  redo changed it; a window committed in between writes its marker only (the
  journal keeps its batches). A new owner restores the last full snapshot, then
  re-scores the windows the marker lists with their outputs suppressed
  (`_rescore`): the state it ends with is the one its predecessor committed.
- A clean stop commits each job's whole state and releases the leases (the next
  owner takes them at once); it closes no incident and scores no pending window:
  the journal keeps them for the next owner.

The single coordinator (no `--fleet`) keeps its files (service.py) unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgpack
import msgspec
import numpy as np
import structlog
from artemis.coordinator.fleet_leases import Fleet
from artemis.coordinator.fleet_state import Delta, Replay, SnapshotPolicy
from artemis.coordinator.service import Coordinator
from artemis.coordinator.sinks import Sinks, StoreOutputs
from artemis.detect.assembly import AssembledWindow
from artemis.detect.monitor import JobMonitor, MonitorOutput
from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowBatch, WindowColumns, from_wire, to_wire
from artemis.protocol.messages import Dump, Fingerprint, Heartbeat, JobOwner, Message, Windows
from artemis.protocol.server import NotTaken, PeerInfo
from artemis.store.base import StoreError
from artemis.store.fleet import LeaseLost, Outputs

__all__ = ["FencedSinks", "Fleet", "FleetCoordinator"]

log = structlog.get_logger("artemis.coordinator.fleet")

# How long a job that ended here is still exported with owner 0 (ended, released), so the
# "no owner" alert tells an end from a lost owner (deploy/prometheus/artemis-rules.yml).
ENDED_EXPORT_S = 600.0


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

    def commit(self, job: str, state: Mapping[str, Any] | None, delta: Delta | None = None) -> None:
        """The held group with the job's whole `state`, or (`delta`: a window committed
        between full snapshots) with its marker only."""
        held = self._held.pop(job, [])
        outputs = Outputs(info=self._info.pop(job, {}))
        for out, _scored in held:
            outputs.incidents += out.incidents
            outputs.rows += out.incident_rows
        store_outputs = outputs if self.inner.store.on else None
        if not self.coord.commit_state(job, state, store_outputs, delta):
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
        self.snapshots = SnapshotPolicy(fleet.cfg.snapshot_every)
        self._book_before: tuple[tuple[str, str, int], ...] = ()  # the scored window's job's
        # Jobs being restored: the windows to re-score silently, and the settings their
        # previous owner scored them under (saved with its full snapshot).
        self._replays: dict[str, tuple[Replay, Settings]] = {}
        self.state_bytes = 0  # bytes of state and marker committed (bench/fleet_capacity.py)
        self.commits = 0

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
        """A lease taken: the job's last full snapshot as its previous owner committed it,
        then the batches of the journal in the order taken. The windows the marker says
        were committed since that snapshot are re-scored with their outputs suppressed
        (`_rescore`, under the settings and wall times they were scored with), which
        rebuilds the state its owner last committed; the rest are scored as new. A
        window scored before is refused by the restored monitor and assembly: none twice."""
        t0 = time.perf_counter()
        saved = self.fleet.loop_store().load(job)
        if job in self.monitors:
            self._forget(job)  # what this coordinator knew before may be stale
        replay = Replay(saved.marker)
        settings = self.settings
        m = None
        if saved.state is not None:
            state = msgpack.unpackb(saved.state, raw=False, strict_map_key=False)
            if replay.walls and state.get("settings"):
                settings = Settings.from_mapping(state["settings"])
            self.jobs.settings = settings  # the restored monitor's, until the replay ends
            try:
                m = self.jobs.restore(state)
            finally:
                self.jobs.settings = self.settings
            self.corrections.restore(job, state.get("corrections"))
        parts = [from_wire(msgspec.msgpack.decode(b, type=WindowBatch)) for b in saved.journal]
        self.metrics.set_owner(job, epoch)
        self.snapshots.dirty(job)  # the heir's first commit is a full snapshot of its own
        self._replays[job] = (replay, settings)
        if parts:
            self.jobs.monitor(job)
            now = self.clock()
            seen = saved.marker.get("window")
            for p in parts:
                released = self.assembler.add(p, now)
                # Rows of windows the previous owner scored are not drops of this one.
                drops = self.assembler.take_drops()
                self.assembler.drops = [d for d in drops if seen is None or d.window > seen]
                self._score_all(released)
        if job in self._replays:
            self._end_replay(job)
        log.info(
            "job lease taken",
            job=job,
            epoch=epoch,
            restored_window=None if m is None else m.last_window,  # after the replay
            replayed_windows=replay.replayed,
            unreplayed_windows=len(replay.walls),
            open_findings=None if m is None else m.open_findings(),
            journal_batches=len(parts),
            restore_s=round(time.perf_counter() - t0, 3),
        )
        if replay.walls:
            # The journal lacks batches of a window its owner committed: the state is
            # its full snapshot's plus what could be replayed (never a window twice).
            log.error("fleet replay incomplete", job=job, windows=sorted(replay.walls))

    def _end_replay(self, job: str) -> None:
        """The suppressed windows are done: this coordinator's settings from now on."""
        self._replays.pop(job, None)
        m = self.monitors.get(job)
        if m is not None:
            if m.last_window >= 0:  # the last window its previous owner committed
                self.metrics.observe_restored(job, m.last_window)
            self._emit(job, m.update_settings(self.settings))

    def _score(self, aw: AssembledWindow, final: bool = False) -> None:
        """A window scored, with what its commit may be (fleet_state.py): a delta when
        it is a complete window of the current run scored from its batches alone. Its
        wall time is read once, kept in the marker, and used for all of it."""
        rp = self._replays.get(aw.job)
        if rp is not None:
            then = None if aw.late else rp[0].take(aw.run, aw.window)
            if then is not None:
                self._rescore(aw, then, rp[1])
                return
            self._end_replay(aw.job)  # a window its previous owner never committed
        m = self.monitors.get(aw.job)
        wall: float = self.wall()
        ok = (
            not final
            and aw.complete
            and not aw.late
            and m is not None
            and m.run == aw.run
            and aw.window > m.last_window
        )
        self.snapshots.scoring(aw.job, (aw.run, aw.window, wall) if ok else None)
        self._book_before = self._book(aw.job)
        # the base reads `self.wall()` for this window's outputs: pinned to `wall` while
        # it scores (swapped through the instance dict: mypy cannot type an attribute a
        # subclass reassigns)
        clock = self.__dict__["wall"]
        self.__dict__["wall"] = _fixed(wall)
        try:
            super()._score(aw, final)
        finally:
            self.__dict__["wall"] = clock
            self.snapshots.scored()

    def _rescore(self, aw: AssembledWindow, wall: float, settings: Settings) -> None:
        """A window its previous owner scored and committed as a delta, scored again for
        its state only: no line, metric, store row or control goes out (they did)."""
        m = self._monitor_of(aw)
        if m is None:
            return
        m.resize(self.assembler.nranks(aw.job))
        out = m.on_window(aw.window, aw.columns, aw.missing, wall=wall)
        if out.result is not None:
            self.corrections.on_window(aw.job, m, aw.window, aw.columns, out, settings, wall)
            self.jobs.controls(aw.job, out.controls)  # the plan control agents get again

    # ------------------------------------------------------------------ app hooks
    def on_connect(self, peer: PeerInfo) -> None:
        # Only the ranks of jobs served here join (the others were redirected).
        mine = tuple(r for r in peer.ranks if self.fleet.epoch(r.job) is not None)
        super().on_connect(_with_ranks(peer, mine))
        for r in mine:  # its ranks and hosts are announced: not in the journal
            self.snapshots.announced.setdefault(r.job, set()).add(r.rank)
        self.snapshots.dirty(*{r.job for r in mine})

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
        if not isinstance(msg, Heartbeat):
            await super().on_message(peer, msg)
            return
        # A heartbeat may announce a rank or a host (expected ranks, the monitor's
        # hosts), which the journal cannot redo: the job's next commit is then full.
        jobs = {p.job for p in msg.progress}
        hosts = {j: m.host_count() for j in jobs if (m := self.monitors.get(j)) is not None}
        new = self.snapshots.announced
        changed = {p.job for p in msg.progress if p.rank not in new.get(p.job, ())}
        for p in msg.progress:
            new.setdefault(p.job, set()).add(p.rank)
        await super().on_message(peer, msg)
        for j in jobs:
            m = self.monitors.get(j)
            if m is not None and hosts.get(j) != m.host_count():
                changed.add(j)
        self.snapshots.dirty(*changed)

    def _load_baselines(self, m: JobMonitor, now: float) -> None:
        # A baseline read (or the job's fingerprint identified for one) is not in the
        # journal: the job's next commit is full.
        b = m.baselines
        before = (b.workload, id(b.software), b.wanted())
        super()._load_baselines(m, now)
        if (b.workload, id(b.software), b.wanted()) != before:
            self.snapshots.dirty(m.job)

    def set_setting(self, key: str, value: str) -> Settings:
        """A live settings change: every job's whole state is committed now (what the
        next windows are scored under is in their full snapshot)."""
        new = super().set_setting(key, value)
        for job in list(self.monitors):
            self.snapshots.dirty(job)
            self._save(job)
        return new

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
        self.snapshots.dirty(job)  # its end (a new run) is no window's scoring
        self.snapshots.announced.pop(job, None)  # its expected ranks are cleared
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
        self.assembler.drop_job(job)  # its release marks too: the store's are the truth
        self.corrections.forget(job)
        self.metrics.forget_job(job)
        self.plan_metrics.forget(job)
        self.sinks.discard(job)
        self.snapshots.forget(job)
        self._replays.pop(job, None)

    # ------------------------------------------------------------------ state
    def _save(self, job: str, stopped: bool = False) -> None:
        """The job's group committed: with its marker only when it is a window that may be
        a delta (fleet_state.py), else with the whole state."""
        delta = self.snapshots.take(job)
        if delta is not None and self._book(job) == self._book_before:
            # A correction decided or moved in the window is not a delta: the book
            # decides by the agents connected then, and its controls went out.
            self.sinks.commit(job, None, delta)
            return
        state = self.jobs.state(job, stopped)
        if state is not None:
            state["corrections"] = self.corrections.snapshot(job)
            # The settings its next windows are scored under (a change forces a full
            # snapshot): an heir replays them under these, not its own.
            state["settings"] = self.settings.to_dict()
        self.sinks.commit(job, state)

    def _book(self, job: str) -> tuple[tuple[str, str, int], ...]:
        """Where the job's corrections stand (each one's status and history)."""
        b = self.corrections.books.get(job)
        return () if b is None else tuple((c.id, c.status, len(c.history)) for c in b.corrections)

    def commit_state(
        self,
        job: str,
        state: Mapping[str, Any] | None,
        outputs: Outputs | None = None,
        delta: Delta | None = None,
    ) -> bool:
        """The job's state and marker in one fenced transaction, with the group's rows for
        the incident store (`outputs`) and the journal rows below its oldest unscored
        window deleted; or (`delta`) the marker alone, the journal kept since the last
        full snapshot. False (the group dropped, the job to be dropped) when the lease
        is not ours or the store failed. A store that refuses the rows for good (a
        record it cannot take) gets the state alone, the refusal logged."""
        epoch = self.fleet.epoch(job)
        if job in self._refused or epoch is None:
            return False
        if state is None and delta is None and not outputs:
            return True  # nothing of the job to keep (its assembly gone: ended)
        m = self.monitors.get(job)
        window = None if m is None else m.last_window
        marker = {
            "owner": self.fleet.id,
            "epoch": epoch,
            "out_seq": None if state is None else state.get("out_seq"),
            "window": window,
            **self.snapshots.marker(job, delta, window),
        }
        floor = [w for j, _r, w in self.jobs.unscored if j == job]
        oldest = self.assembler.oldest_pending(job)
        if oldest is not None:
            floor.append(oldest)
        below = min(floor) if floor else (m.last_window + 1 if m is not None else None)
        blob = None if state is None else msgpack.packb(dict(state), use_bin_type=True)
        store = self.fleet.loop_store()

        def write(rows: Outputs | None) -> None:
            if delta is not None:
                store.write_marker(job, epoch, marker, rows)
            else:
                store.write_state(job, epoch, blob, marker, below, rows)

        try:
            try:
                write(outputs)
            except StoreError as e:
                if e.transient or not outputs:
                    raise
                log.error("incident store refused a job's rows: state kept", error=str(e))
                write(None)
        except (LeaseLost, StoreError) as e:
            log.warning("job state not committed: the job stops here", job=job, error=str(e))
            if isinstance(e, StoreError):
                self.fleet.failed(e)
            self._refused.add(job)
            return False
        if delta is not None or blob is not None:
            self.snapshots.committed(job, delta, window)
            self.commits += 1
            self.state_bytes += len(blob or b"") + len(json.dumps(marker))
        return True

    def flush(self) -> None:
        """A clean stop: each job's state committed, then the leases released. No window
        is scored now and no incident closed: the next owner continues from the store."""
        for job in list(self.monitors):
            self._save(job)
        self.fleet.stop(release=True)
        self.sinks.close()


def _fixed(t: float) -> Callable[[], float]:
    """A wall clock that reads `t`: one window's outputs all carry its scoring time."""
    return lambda: t


def _with_ranks(peer: PeerInfo, ranks: tuple[Any, ...]) -> PeerInfo:
    from dataclasses import replace

    return replace(peer, ranks=ranks)
