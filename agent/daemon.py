"""The node agent: rings in, window summaries out. A thin shell of I/O.

Every `poll_interval_s` it reads each ring incrementally, feeds the pure
summariser, attaches telemetry to the windows that completed, and hands them to
the uplink, which keeps them until the coordinator acknowledges them. It
answers control messages (dump a rank's last 256 collectives, publish a
rebalance plan, change local settings, apply a GPU correction: agent/corrections/)
as far as the node's policy allows, and removes a finished job's rings once everything in them has been
shipped and acknowledged. While it serves its ring folder it holds the folder's
agent lock and marks each ring it reads (``artemis.ring.lifetime``), so no writer
removes a ring it will read; a ring whose writer died unfinished is reclaimed
``reclaim_after_s`` after the writer's lock went.

Restart safety: a restarted agent reads every ring from its start again. It is
a new incarnation (so the coordinator resets its sequence dedup), and the
coordinator's window assembly is idempotent on (job, rank, window), so nothing
is counted twice.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from artemis.agent.config import AgentConfig
from artemis.agent.corrections import node_handler
from artemis.agent.fingerprint import host_software, ring_software, software_of, workload_signature
from artemis.agent.plans import plan_control, read_ack_records
from artemis.agent.progress import ProgressTracker
from artemis.agent.summary import WindowSummarizer
from artemis.agent.telemetry.base import (
    RankTarget,
    TelemetryAccumulator,
    TelemetrySource,
    collect,
    merge,
)
from artemis.common.lifecycle import Daemon
from artemis.common.ports import cannot_listen
from artemis.common.tomlfile import ConfigError
from artemis.protocol.messages import Control, Dump, Fingerprint, Heartbeat, RankInfo, Windows
from artemis.protocol.records import RankProgress, RankWindow, Software
from artemis.protocol.transport import Transport
from artemis.rebalance.files import UNIFORM_PLAN_ID
from artemis.ring import lifetime
from artemis.ring.reader import RingError, RingHeader, RingReader, records_to_dicts

if TYPE_CHECKING:
    from artemis.agent.uplinks import Uplinks

log = structlog.get_logger("artemis.agent")

DUMP_RECORDS = 256
BRIDGE_COMM_NAME = "bridge"
# How long a ring whose writer is gone (its lock free, not finished) stays before the
# agent reclaims it (lifetime.RECLAIM_AFTER_S).
RECLAIM_AFTER_S = lifetime.RECLAIM_AFTER_S


@dataclass
class Tracked:
    """One ring the agent follows."""

    path: Path
    reader: RingReader
    header: RingHeader
    grank: int  # the rank's global rank (header.global_rank, else the communicator rank)
    summarizer: WindowSummarizer | None  # None for bridge rings (routed to the rank's ring)
    progress: ProgressTracker
    is_bridge: bool
    shipped_seq: int = -1  # uplink seq of the last message carrying this ring's windows
    drained: bool = False
    # Telemetry sampled during the window being summarised, averaged when it closes.
    telemetry: TelemetryAccumulator = field(default_factory=TelemetryAccumulator)
    # The rank's software fingerprint, put together once (its process's env and
    # libraries are fixed for the life of the ring).
    software: Software | None = None
    step_signature: tuple[tuple[int, int], ...] | None = None  # the one `workload` hashes
    workload: str | None = None
    warned_patternless: bool = False  # logged once that its collectives have no period


@dataclass(frozen=True)
class AckResult:
    """A control's outcome map that goes back on its Ack (``Ack.result``), not as a message."""

    result: dict[str, Any]


def _global_rank(h: RingHeader) -> int:
    return h.global_rank if h.global_rank >= 0 else h.rank


class Agent:
    """The agent's state and its per-tick work; ``AgentDaemon`` drives it with an uplink."""

    def __init__(
        self,
        cfg: AgentConfig,
        sources: list[TelemetrySource],
        send: Callable[[Any], int],
        acked_upto: Callable[[], int],
    ) -> None:
        self.cfg = cfg
        self.host = cfg.hostname
        self.shm = Path(cfg.shm_dir)
        self.sources = sources
        self._send = send  # enqueue a data message, returns its seq
        self._acked_upto = acked_upto
        self.rings: dict[Path, Tracked] = {}
        self.bad_rings: dict[Path, str] = {}
        self.plan_acks_sent: set[tuple[str, str, int]] = set()
        # The job's ack files, read at most once per tick (windows and heartbeats both use them).
        self._acks: dict[str, dict[int, dict[str, Any]]] = {}
        self.windows_sent = 0
        self.secondary_windows = 0  # windows of rings that are not their rank's main (not sent)
        self.removed = 0
        self.reclaimed = 0  # of those, rings whose writer died unfinished
        self.reclaim_after_s = RECLAIM_AFTER_S
        self._gone_since: dict[Path, float] = {}  # ring -> when its writer was seen gone
        self._folder = lifetime.FolderLock(self.shm)
        # (job, rank) -> (main ring, software, workload) of the last fingerprint sent
        self._fp_sent: dict[tuple[str, int], tuple[Path, Software, str | None]] = {}
        self.corrections = node_handler(lambda: self.cfg, sources, self._rank_rings)

    # ----------------------------------------------------------------- discovery
    def scan(self) -> list[Tracked]:
        """Open rings that appeared since the last scan."""
        new: list[Tracked] = []
        self._folder.hold()  # before the glob: a ring made after it is left for us
        try:
            paths = sorted(self.shm.glob("*.ring"))
        except OSError as e:
            log.warning("shm dir unreadable", shm_dir=str(self.shm), error=str(e))
            return new
        for p in paths:
            if p in self.rings or p in self.bad_rings:
                continue
            try:
                reader = RingReader(p)
                h = reader.header()
            except (RingError, OSError) as e:
                # A corrupt ring is reported once and skipped; the others keep flowing.
                self.bad_rings[p] = str(e)
                log.error("ring rejected", path=str(p), error=str(e))
                continue
            lifetime.mark_read(p)  # we read it to its end: its writer leaves it to us
            grank = _global_rank(h)
            is_bridge = h.comm_name == BRIDGE_COMM_NAME
            summ = None
            if not is_bridge:
                summ = WindowSummarizer(
                    job=h.job,
                    comm=h.comm,
                    rank=grank,
                    nranks=h.nranks,
                    host=self.host,
                    window_steps=self.cfg.window_steps,
                    colls_per_step=self.cfg.colls_per_step or None,
                    clock_kind=h.clock_kind,
                    tick_hz=h.tick_hz or None,
                )
            t = Tracked(
                path=p,
                reader=reader,
                header=h,
                grank=grank,
                summarizer=summ,
                progress=ProgressTracker(h.job, h.comm, grank, self.host),
                is_bridge=is_bridge,
            )
            self.rings[p] = t
            new.append(t)
            log.info(
                "ring found",
                path=p.name,
                job=h.job,
                comm=h.comm,
                rank=grank,
                minor=h.minor,  # 0: a plugin older than the versioned fields (still read)
                slot_minor=h.slot_minor,
            )
        return new

    def rank_infos(self) -> list[RankInfo]:
        return [
            RankInfo(
                job=t.header.job,
                comm=t.header.comm,
                rank=t.grank,
                nranks=t.header.nranks,
                pid=t.header.pid,
            )
            for t in self.rings.values()
            if not t.is_bridge
        ]

    def _main_ring(self, job: str, grank: int) -> Tracked | None:
        return self._mains().get((job, grank))

    def _mains(self) -> dict[tuple[str, int], Tracked]:
        """Each rank's main ring: its largest communicator, ties to the lowest hash, the
        same choice as the coordinator's (detect/assembly.py)."""
        best: dict[tuple[str, int], Tracked] = {}
        for t in self.rings.values():
            if t.is_bridge:
                continue
            key = (t.header.job, t.grank)
            b = best.get(key)
            if b is None or (-t.header.nranks, t.header.comm) < (-b.header.nranks, b.header.comm):
                best[key] = t
        return best

    # ----------------------------------------------------------------- reading
    def tick(self, now: float) -> list[RankWindow]:
        """Read every ring once; return the windows that completed."""
        self._acks.clear()
        out: list[RankWindow] = []
        mains = self._mains()
        main_set = {id(t) for t in mains.values()}
        # Main rings first: a rank writes a collective of another communicator before
        # the main-ring record that follows it, so reading the others afterwards has
        # every one a window's gaps contain when that window is cut (below).
        order = sorted(self.rings.values(), key=lambda t: id(t) not in main_set)
        for t in order:
            # The header as the last tick read it, after its poll: before this one.
            was_finished = t.header.finished
            try:
                batch = t.reader.poll()
                t.header = t.reader.header()
            except (RingError, OSError, ValueError) as e:
                log.error("ring read failed", path=t.path.name, error=str(e))
                self._drop(t)
                continue
            done = batch.done
            target = t.summarizer
            main = mains.get((t.header.job, t.grank))
            if t.is_bridge:
                target = main.summarizer if main else None
            elif main is not None and main is not t and main.summarizer is not None:
                # another communicator of the rank (tensor parallel): its time is not compute
                main.summarizer.feed_nested(done)
            if target is not None:
                if batch.lost:
                    target.add_lost(int(batch.lost))
                if len(done):
                    target.feed(done)
            inflight = batch.in_flight
            if not t.is_bridge:
                t.progress.update(
                    now, done, inflight, finished=t.header.finished, ring_index=batch.write_index
                )
            # Finished only now: a completion may have landed between the poll and the
            # header read, so a record still in flight gets one more tick. Finished
            # before this poll: nothing is written after that, so what is still in
            # flight was abandoned (a job that left while hung) and the last windows are
            # cut; held back, a rank's last whole window never went out and the
            # coordinator called the rank missing at its deadline.
            t.drained = t.header.finished and (was_finished or not len(inflight))
        # Windows are taken after every ring was read, so a rank's bridge records
        # (another ring) are in before its window closes.
        live = self._largest_live()
        for t in list(self.rings.values()):
            if t.summarizer is not None:
                ws = t.summarizer.take_windows(final=t.drained)
                if not ws:
                    if not t.warned_patternless and t.summarizer.patternless:
                        t.warned_patternless = True
                        log.warning(
                            "no repeating step in the ring's collectives: it gets no window "
                            "(colls_per_step sets the collectives a step)",
                            ring=t.path.name,
                            collectives=t.summarizer.seen,
                        )
                    continue
                if t.header.nranks < live.get((t.header.job, t.grank), 0):
                    # A rank's larger communicator's windows are shipped, not these
                    # (docs/DESIGN.md "Window summaries"): a smaller one's are numbered by its
                    # own collectives (a TP pair's two all-reduces per step number its
                    # windows twice as fast), so its window w covers other steps than
                    # the main ring's; shipped, such rows fill the coordinator's windows
                    # ahead of the main rows, which then come late and are dropped. Its
                    # collectives are in the main ring's gaps already (feed_nested).
                    self.secondary_windows += len(ws)
                    t.telemetry.reset()
                    continue
                out.extend(self._with_telemetry(t, ws, now))
        return out

    def _largest_live(self) -> dict[tuple[str, int], int]:
        """Per rank, the size of its largest communicator whose ring is still being
        written (not drained): a smaller ring's windows are held back. Only a strictly
        larger one holds back: rings of the same size are another run of the job (a job
        id reused, the old run's rings still here), whose windows go out as before; and
        a drained larger ring (the job ending, or an old run's) holds nothing back."""
        largest: dict[tuple[str, int], int] = {}
        for o in self.rings.values():
            if o.is_bridge or o.drained:
                continue
            key = (o.header.job, o.grank)
            largest[key] = max(largest.get(key, 0), o.header.nranks)
        return largest

    def sample_telemetry(self, now: float) -> None:
        """Sample the live sources (GPU, host) for every rank; averaged per window. A
        rank sampled in the last half interval (at a window's close) waits for the next."""
        live = [s for s in self.sources if s.name != "simulated"]
        half = self.cfg.telemetry_interval_s / 2
        # per rank, into its main ring's window (the only one shipped)
        for t in self._mains().values() if live else ():
            if t.summarizer is None or t.telemetry.sampled_within(now, half):
                continue
            target = RankTarget(rank=t.grank, pid=t.header.pid, job=t.header.job)
            t.telemetry.add(collect(live, target), at=now)

    def _with_telemetry(self, t: Tracked, ws: list[RankWindow], now: float) -> list[RankWindow]:
        # The simulator's source is keyed by window; live sources were averaged
        # over the window by sample_telemetry (or are sampled now if they never were).
        sim = [s for s in self.sources if s.name == "simulated"]
        live = [s for s in self.sources if s.name != "simulated"]
        averaged = t.telemetry.result() if t.telemetry.count else None
        t.telemetry.reset()
        res = []
        for w in ws:
            target = RankTarget(rank=w.rank, pid=t.header.pid, window=w.window, job=w.job)
            # what the summariser measured from the ring itself (gap_busy_pct)
            parts = [
                {k: v for k, v in w.telemetry.to_dict().items() if v is not None and k != "missing"}
            ]
            if sim:
                parts.append(collect(sim, target).to_dict())
            if averaged is not None:
                parts.append(averaged.to_dict())
            elif live:
                # Through the ring's accumulator: error counts are running totals
                # until it turns them into the window's increase (telemetry/base.py).
                t.telemetry.add(collect(live, target), at=now)
                parts.append(t.telemetry.result().to_dict())
                t.telemetry.reset()
            tel = merge(parts)
            island = self.cfg.island or w.island or tel.vendor
            hw = w.hw_class or tel.gpu_model
            samples = self._samples_for(w)
            res.append(
                dataclasses.replace(w, telemetry=tel, island=island, hw_class=hw, samples=samples)
            )
        return res

    def fingerprints(self) -> list[Fingerprint]:
        """A fingerprint for each rank whose software or workload signature is new or
        changed since the last one sent (docs/DESIGN.md "Fingerprints"): once per rank,
        again on a change (the signature found, a new run's ring)."""
        out: list[Fingerprint] = []
        for (job, grank), t in self._mains().items():
            if t.software is None:
                target = RankTarget(rank=grank, pid=t.header.pid, job=job)
                t.software = software_of(
                    host_software(self.sources, target), ring_software(t.header)
                )
            sig = t.summarizer.step_signature if t.summarizer is not None else None
            if sig != t.step_signature:
                t.step_signature, t.workload = sig, workload_signature(sig) if sig else None
            wl = t.workload
            cur = (t.path, t.software, wl)
            if self._fp_sent.get((job, grank)) == cur:
                continue
            self._fp_sent[(job, grank)] = cur
            out.append(Fingerprint(job=job, rank=grank, software=t.software, workload=wl))
        return out

    def _samples_for(self, w: RankWindow) -> int | None:
        """Samples per step the rank ran in this window, when the job said so (its
        latest ack names the split it switched to and from which step)."""
        rec = self._ack_records(w.job).get(w.rank)
        if rec is None:
            return None
        step, samples = rec.get("step"), rec.get("samples")
        if not isinstance(step, int) or not isinstance(samples, int) or step > w.step_lo:
            return None
        return samples

    def progress(self) -> list[RankProgress]:
        return [t.progress.current() for t in self.rings.values() if not t.is_bridge]

    def _ack_records(self, job: str) -> dict[int, dict[str, Any]]:
        recs = self._acks.get(job)
        if recs is None:
            recs = self._acks[job] = read_ack_records(self.shm, job)
        return recs

    def plan_acks(self) -> list[dict[str, Any]]:
        out = []
        jobs = {t.header.job for t in self.rings.values()}
        for job in jobs:
            for rank, rec in self._ack_records(job).items():
                plan_id, step = rec.get("id"), rec.get("step")
                if not isinstance(plan_id, str) or not isinstance(step, int):
                    continue
                key = (job, plan_id, rank)
                if plan_id == UNIFORM_PLAN_ID or key in self.plan_acks_sent:
                    continue
                self.plan_acks_sent.add(key)
                out.append({"job": job, "plan_id": plan_id, "rank": rank, "step": step})
        return out

    # ----------------------------------------------------------------- control
    def on_control(self, msg: Control) -> tuple[bool, str, list[Any]]:
        """Carry out a control message if local policy allows: (ok, detail, replies)."""
        pol = self.cfg.policy
        if msg.action == "dump":
            if not pol.allow_dumps:
                return False, "dumps are not allowed by this node's policy", []
            return self._dump(msg)
        if msg.action == "plan":
            if not pol.allow_plans:
                return False, "plans are not allowed by this node's policy", []
            return (*plan_control(self.shm, msg.body), [])
        if msg.action == "settings":
            if not pol.allow_settings:
                return False, "settings changes are not allowed by this node's policy", []
            return self._settings(msg.body)
        if msg.action == "correction":
            # consent, at-most-once by id, the result: agent/corrections/handler.py
            ok, detail, result = self.corrections.handle(dict(msg.body))
            return ok, detail, [AckResult(result)]
        return False, f"unknown action {msg.action!r}", []

    def _rank_rings(self, rank: int) -> list[tuple[Path, int]]:
        """The rank's rings and their writer's pid, its main ring (the largest
        communicator) first."""
        rings = [t for t in self.rings.values() if t.grank == rank and not t.is_bridge]
        return [(t.path, t.header.pid) for t in sorted(rings, key=lambda t: -t.header.nranks)]

    def _dump(self, msg: Control) -> tuple[bool, str, list[Any]]:
        job = str(msg.body.get("job", ""))
        ranks = {int(r) for r in msg.body.get("ranks", [])}
        replies: list[Any] = []
        for t in self.rings.values():
            if t.is_bridge or t.header.job != job or (ranks and t.grank not in ranks):
                continue
            recs = t.reader.last(DUMP_RECORDS)
            rows = records_to_dicts(recs, t.header)
            replies.append(
                Dump(
                    job=job,
                    comm=t.header.comm,
                    rank=t.grank,
                    request_id=msg.control_id,
                    records=tuple(rows),
                )
            )
        if not replies:
            return False, f"no ring of job {job!r} for ranks {sorted(ranks)} on {self.host}", []
        return True, f"{len(replies)} dumps", replies

    def _settings(self, body: dict[str, Any]) -> tuple[bool, str, list[Any]]:
        allowed = {"poll_interval_s": float, "heartbeat_s": float}
        changes = {}
        for k, v in body.items():
            if k not in allowed:
                return False, f"setting {k!r} is not changeable on the agent", []
            try:
                val = allowed[k](v)
            except (TypeError, ValueError):
                return False, f"setting {k!r}: bad value {v!r}", []
            if val <= 0:
                return False, f"setting {k!r} must be > 0", []
            changes[k] = val
        self.cfg = dataclasses.replace(self.cfg, **changes)
        return True, "settings applied: " + ", ".join(f"{k}={v}" for k, v in changes.items()), []

    # ----------------------------------------------------------------- cleanup
    def cleanup(self, now: float | None = None) -> None:
        """Remove rings of finished jobs once all their windows are acknowledged, and
        reclaim those whose writer died unfinished (``_writer_gone``) the same way."""
        if not self.cfg.remove_finished:
            return
        now = time.monotonic() if now is None else now
        acked = self._acked_upto()
        for t in list(self.rings.values()):
            gone = self._writer_gone(t, now)
            if not gone and (not t.header.finished or t.reader.pending):
                continue
            if t.shipped_seq > acked:
                continue
            self._drop(t)
            self._gone_since.pop(t.path, None)
            try:
                if lifetime.remove(t.path):  # the ring and its sidecars
                    self.removed += 1
                    self.reclaimed += gone
                    log.info(
                        "dead writer's ring reclaimed" if gone else "finished ring removed",
                        path=t.path.name,
                    )
            except OSError as e:
                log.warning("cannot remove finished ring", path=t.path.name, error=str(e))

    def _writer_gone(self, t: Tracked, now: float) -> bool:
        """The ring's writer died without finishing it at least ``reclaim_after_s`` ago:
        its lock (``LIFE_FLOCK``) is free. A ring without that bit (an older writer) is
        never reclaimed: only the lock tells a dead writer from a reused pid."""
        h = t.header
        if h.finished or not h.writer_locked:
            return False
        if not lifetime.writer_gone(t.path):
            self._gone_since.pop(t.path, None)
            return False
        return now - self._gone_since.setdefault(t.path, now) >= self.reclaim_after_s

    def _drop(self, t: Tracked) -> None:
        self.rings.pop(t.path, None)
        t.reader.close()
        key = (t.header.job, t.grank)
        sent = self._fp_sent.get(key)
        if sent is not None and sent[0] == t.path:
            del self._fp_sent[key]

    def ship(self, windows: list[RankWindow]) -> None:
        if not windows:
            return
        seq = self._send(Windows(host=self.host, windows=tuple(windows)))
        self.windows_sent += len(windows)
        keys = {(w.job, w.comm, w.rank) for w in windows}
        for t in self.rings.values():
            if (t.header.job, t.header.comm, t.grank) in keys:
                t.shipped_seq = seq

    def close(self) -> None:
        for t in list(self.rings.values()):
            t.reader.close()
        self.rings.clear()
        self._folder.release()


def incarnation() -> str:
    """A new one per agent process: the coordinator resets its seq dedup for it."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


class AgentDaemon(Daemon):
    """The agent process: ``serve()`` = ``startup()``, ``main_loop()``, ``shutdown()``.

    startup opens the rings present and starts the uplinks (agent/uplinks.py: one per
    job owner of a coordinator fleet; their hellos name the ranks); each tick (``on_tick``) rescans, reads every ring, ships completed
    windows, samples telemetry and sends heartbeats and plan acks; shutdown
    ships what the rings still hold and gives the uplink up to 5 s to deliver
    it (none with ``force_exit``). The shell (``artemis.agent.run_main``) owns
    the signals and the transport.
    """

    def __init__(
        self,
        cfg: AgentConfig,
        transport: Transport,
        secret: bytes,
        sources: list[TelemetrySource],
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.transport = transport
        self.secret = secret
        self.sources = sources
        self.agent: Agent | None = None
        self.uplinks: Uplinks | None = None
        self._last_scan = self._last_hb = self._last_tel = 0.0
        self._metrics: tuple[Any, Any] | None = None  # (server, thread) when served

    async def startup(self) -> None:
        from artemis.agent.uplinks import Uplinks
        from artemis.protocol.client import AgentIdentity

        agent = self.agent = Agent(self.cfg, self.sources, self._send, self._acked)
        agent.scan()
        identity = AgentIdentity(
            agent_id=agent.host,
            host=agent.host,
            agent_version=AGENT_VERSION,
            ranks=tuple(agent.rank_infos()),
            incarnation=incarnation(),
        )
        uplinks = self.uplinks = Uplinks(
            self.transport,
            self.cfg.coordinators,
            self.secret,
            identity,
            self._on_control,
            outbox_capacity=self.cfg.buffer_max,
            backoff_cap=self.cfg.reconnect_max_s,
            stall_s=self.cfg.uplink_stall_s or None,
        )
        uplinks.start()
        if self.cfg.metrics_port:
            from artemis.agent.metrics import serve_metrics

            try:
                self._metrics = serve_metrics(
                    agent.host,
                    lambda: uplinks.stats,
                    lambda: agent.windows_sent,
                    self.cfg.metrics_port,
                    self.cfg.metrics_addr,
                )
            except OSError as e:  # one line naming the port, not a traceback
                where = f"{self.cfg.metrics_addr}:{self.cfg.metrics_port}"
                raise ConfigError(cannot_listen("metrics_port", where, e)) from None
            log.info("agent metrics served", addr=self.cfg.metrics_addr, port=self.cfg.metrics_port)
        self._last_scan = self._last_hb = self._last_tel = time.monotonic()

    async def main_loop(self) -> None:
        assert self.agent is not None and self.uplinks is not None
        while not self.should_exit:
            self.on_tick(time.monotonic())
            failed = self.uplinks.failed()
            if failed is not None:
                failed.result()  # an uplink gave up: its error ends the agent
                return
            await self.wait_tick(self.agent.cfg.poll_interval_s)

    def on_tick(self, now: float) -> None:
        agent, link = self.agent, self.uplinks
        assert agent is not None and link is not None
        cfg = agent.cfg  # settings controls replace it
        if now - self._last_scan >= cfg.scan_interval_s:
            agent.scan()
            self._last_scan = now
            link.jobs_seen(agent.rank_infos())
        agent.ship(agent.tick(now))
        for fp in agent.fingerprints():
            link.enqueue(fp)
        if now - self._last_tel >= cfg.telemetry_interval_s:
            agent.sample_telemetry(now)
            self._last_tel = now
        # A job's plan acks go out at once: the coordinator waits a bounded
        # number of windows for them before it withdraws the plan.
        acks = agent.plan_acks()
        if acks or now - self._last_hb >= cfg.heartbeat_s:
            st = link.stats
            link.enqueue(
                Heartbeat(
                    progress=tuple(agent.progress()),
                    buffered=st.buffered,
                    dropped=st.dropped,
                    plan_acks=tuple(acks),
                )
            )
            self._last_hb = now
            agent.cleanup()

    async def shutdown(self) -> None:
        agent, link = self.agent, self.uplinks
        if agent is None:
            return
        try:
            if link is not None:
                # Ship what the rings still hold, then give the uplink a moment to flush.
                agent.ship(agent.tick(time.monotonic()))
                await link.close(timeout=0.0 if self.force_exit else 5.0)
        finally:
            agent.close()
            self.agent = None
            if self._metrics is not None:
                server, thread = self._metrics
                server.shutdown()
                server.server_close()
                thread.join(timeout=5)
                self._metrics = None

    # -- uplink callbacks ---------------------------------------------------

    def _send(self, msg: Any) -> int:
        assert self.uplinks is not None
        return self.uplinks.enqueue(msg)

    def _acked(self) -> int:
        assert self.uplinks is not None
        return self.uplinks.acked_upto()

    async def _on_control(self, msg: Control) -> tuple[bool, str, dict[str, Any] | None]:
        assert self.agent is not None and self.uplinks is not None
        ok, detail, replies = self.agent.on_control(msg)
        result = None
        for r in replies:
            if isinstance(r, AckResult):
                result = r.result  # rides on the Ack itself (protocol 1.2)
            else:
                self.uplinks.enqueue(r)
        (log.info if ok else log.warning)("control", action=msg.action, ok=ok, detail=detail)
        return ok, detail, result


AGENT_VERSION = "0.1.0"
