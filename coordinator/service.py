"""The coordinator: a thin asyncio shell around assembly and one `JobMonitor` per job.

`Coordinator` is the protocol server's app. Window summaries go into the
assembler as columns; every window it releases (complete, or at its deadline
with the absent ranks missing) goes to its job's `JobMonitor`, the pure core
that owns the detector, the rebalance policy, the missing-rank rule and hang
tracking (coordinator/monitor.py). What the monitor returns is written here:
findings to the JSONL, plan events to the plans JSONL, both to Prometheus, and
control intents to the job's agents, incident records to `incidents.jsonl` next
to the findings (and Prometheus). Heartbeats carry progress and plan acks;
dumps are written next to the findings and their paths handed to the monitor.

After each scored window the job's monitor and assembly state are saved
atomically next to the assembly journal (`<journal>.jobs/`), and a restarted
coordinator restores them before it replays the journal: nothing about a job
is forgotten across a restart. A job whose every rank reported finished is
ended `job_linger_s` later: its series leave /metrics, its monitor is dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import structlog
from artemis.coordinator.assembly import AssembledWindow, WindowAssembler
from artemis.coordinator.detector import LATE_WINDOWS
from artemis.coordinator.findings import FindingsWriter, IncidentsWriter, incidents_path
from artemis.coordinator.journal import AssemblyJournal
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.monitor import (
    JobMonitor,
    MonitorOutput,
    PlanMetrics,
    PlansWriter,
    register_plan_metrics,
)
from artemis.coordinator.settings import Settings
from artemis.protocol.messages import Dump, Heartbeat, Message, Windows
from artemis.protocol.server import NotConnected, PeerInfo
from artemis.store.sink import StoreSink

log = structlog.get_logger("artemis.coordinator")


class Coordinator:
    def __init__(
        self,
        settings: Settings,
        findings: FindingsWriter,
        plans: PlansWriter,
        metrics: Metrics,
        *,
        deadline_s: float = 5.0,
        dump_wait_s: float = 5.0,
        global_batch: int | None = None,
        grace_s: float | None = None,
        journal: AssemblyJournal | None = None,
        job_linger_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        incidents: IncidentsWriter | None = None,
        store: StoreSink | None = None,
        report_dir: str = "",
    ) -> None:
        self.journal = journal
        self.global_batch = global_batch
        self.settings = settings
        self.findings = findings
        self.plans = plans
        self.incidents = (
            incidents if incidents is not None else IncidentsWriter(incidents_path(findings.path))
        )
        self.metrics = metrics
        self.plan_metrics: PlanMetrics = register_plan_metrics(metrics.registry)
        self.assembler = WindowAssembler(
            deadline_s=deadline_s, grace_s=grace_s, late_windows=LATE_WINDOWS
        )
        self.dump_wait_s = dump_wait_s
        self.job_linger_s = job_linger_s
        self.clock = clock
        self.wall = wall  # unix time, for the incident records only
        self.monitors: dict[str, JobMonitor] = {}
        self.agents: dict[str, set[str]] = {}  # job -> agent ids that serve it
        self._finished_at: dict[str, float] = {}  # job -> when every rank reported finished
        self.state_dir: Path | None = None  # set by restore()
        self.server: Any = None  # ProtocolServer, set by serve()
        self.dump_dir = findings.path.parent / (findings.path.stem + ".dumps")
        self._outbox: list[tuple[str, str, dict[str, Any]]] = []  # (job, action, body)
        # The incident store (off unless given): jobs, incidents, per-window rows.
        self.store = store if store is not None else StoreSink(None)
        self.report_dir = report_dir  # each job's report at its end (artemis report)
        self._stored_job: dict[str, dict[str, Any]] = {}  # the job info last written

    # ------------------------------------------------------------------ app hooks
    def on_connect(self, peer: PeerInfo) -> None:
        by_job: dict[str, list[int]] = {}
        for r in peer.ranks:
            by_job.setdefault(r.job, []).append(r.rank)
        for job, ranks in by_job.items():
            self.agents.setdefault(job, set()).add(peer.agent_id)
            self._monitor(job).expect(ranks, peer.host)
            self.assembler.expect(job, ranks)
        log.info("agent connected", agent=peer.agent_id, host=peer.host, ranks=len(peer.ranks))

    def on_disconnect(self, peer: PeerInfo) -> None:
        log.info("agent disconnected", agent=peer.agent_id, host=peer.host)

    async def on_message(self, peer: PeerInfo, msg: Message) -> None:
        now = self.clock()
        if isinstance(msg, Windows):
            if self.journal is not None:
                self.journal.added(msg.columns)  # before the ack: see journal.py
            cols = msg.columns
            for job in set(cols["job"]):
                self.agents.setdefault(job, set()).add(peer.agent_id)
            self._score_all(self.assembler.add(cols, now))
        elif isinstance(msg, Heartbeat):
            by_job: dict[str, list[Any]] = {}
            for p in msg.progress:
                by_job.setdefault(p.job, []).append(p)
            for job, progress in by_job.items():
                self.agents.setdefault(job, set()).add(peer.agent_id)
                self.assembler.expect(job, [p.rank for p in progress])
                # Progress on the communicator each rank is judged on, only.
                primary = [
                    p
                    for p in progress
                    if self.assembler.primary_comm(job, p.rank) in (None, p.comm)
                ]
                self._monitor(job).on_progress(primary)
            for a in msg.plan_acks:
                self._plan_ack(a)
            # The protocol acks this message when we return and the agent forgets its
            # plan acks then: keep them in the job's saved state first (restore).
            for job in {str(a.get("job", "")) for a in msg.plan_acks}:
                if job in self.monitors:
                    self._save(job)
            # Hangs are checked on the tick, once for all ranks, not per heartbeat.
        elif isinstance(msg, Dump):
            self._dump(msg)
        await self._flush_controls()

    # ------------------------------------------------------------------ periodic
    async def tick(self) -> None:
        now = self.clock()
        self._score_all(self.assembler.expire(now))
        for job, m in list(self.monitors.items()):
            self._emit(job, m.tick(now))
            self._check_ended(job, m, now)
        await self._flush_controls()

    def flush(self) -> None:
        """Shutdown: score whatever is still pending, close outputs."""
        # Windows still open at shutdown are partial by nature (ranks sitting in a
        # collective that never ended, agents not done): score what they hold,
        # but an absent rank there is not evidence that it went missing.
        self._score_all(self.assembler.flush(), final=True)
        for job, m in self.monitors.items():
            self._emit(job, m.finish(self.wall()))
            self._store_job(job, m, ended=True)
            self._write_report(job)
        self.store.close()
        self.findings.close()
        self.plans.close()
        self.incidents.close()
        if self.journal is not None:
            self.journal.close()

    # ------------------------------------------------------------------ settings
    def set_setting(self, key: str, value: str) -> Settings:
        new = self.settings.set(key, value)
        self.settings = new
        for job, m in self.monitors.items():
            self._emit(job, m.update_settings(new))
        log.info("setting changed", key=key, value=getattr(new, key))
        return new

    # ------------------------------------------------------------------ jobs
    def _monitor(self, job: str, run: str = "") -> JobMonitor:
        m = self.monitors.get(job)
        if m is None:
            m = self.monitors[job] = JobMonitor(
                job,
                self.settings,
                run=run,
                global_batch=self.global_batch,
                dump_wait_s=self.dump_wait_s,
            )
        return m

    def _monitor_of(self, aw: AssembledWindow) -> JobMonitor | None:
        """The monitor of the window's run: a new run of a job gets a fresh one."""
        m = self._monitor(aw.job, aw.run)
        if m.run == aw.run:
            return m
        if not m.run:
            m.run = aw.run  # made at the job's first hello, before any window
            return m
        if aw.run != self.assembler.run(aw.job):
            return None  # a window of a run that a newer one replaced
        log.info("new run of a job: scoring it afresh", job=aw.job, run=aw.run, previous=m.run)
        self._end_job(aw.job, keep_assembly=True)
        fresh = self._monitor(aw.job, aw.run)
        fresh.hosts.update(m.hosts)
        fresh.expect(self.assembler.expected(aw.job))
        return fresh

    def _check_ended(self, job: str, m: JobMonitor, now: float) -> None:
        """Every announced rank reported its ring finished and no window of the job is
        still being assembled: end the job after the linger."""
        # The cheap tests first: this runs every tick, and a job's ranks are many.
        done = m.last_window >= 0 and not self.assembler.pending_of(job)
        if done:
            expected = self.assembler.expected(job)
            done = bool(expected) and all(
                r in m.progress and m.progress[r].finished for r in expected
            )
        if not done:
            self._finished_at.pop(job, None)
            return
        since = self._finished_at.setdefault(job, now)
        if now - since >= self.job_linger_s:
            log.info("job ended: its series are removed", job=job, last_window=m.last_window)
            self._end_job(job)

    def _end_job(self, job: str, keep_assembly: bool = False) -> None:
        """The one thing that clears a job: its monitor, its series, its pending windows.
        Its open incidents close first (`job_end`), then its report is written."""
        m = self.monitors.get(job)
        if m is not None:
            self._emit(job, m.finish(self.wall()))
            self._store_job(job, m, ended=True)
            self._write_report(job)
        self._stored_job.pop(job, None)
        self.monitors.pop(job, None)
        self._finished_at.pop(job, None)
        self.metrics.forget_job(job)
        self.plan_metrics.forget(job)
        if not keep_assembly:
            self.assembler.forget_job(job)
            self.agents.pop(job, None)
        self._save(job)

    # ------------------------------------------------------------------ scoring
    def _score_all(self, released: list[AssembledWindow], final: bool = False) -> None:
        for aw in released:
            self._score(aw, final)
        for d in self.assembler.take_drops():
            self.metrics.observe_dropped(d.job, d.reason, d.rows)
            log.info(
                "window summaries dropped",
                job=d.job,
                window=d.window,
                comm=d.comm,
                summaries=d.rows,
                reason=d.reason,
            )

    def _score(self, aw: AssembledWindow, final: bool = False) -> None:
        if aw.late:
            self._score_late(aw)
            return
        m = self._monitor_of(aw)
        if m is None:
            self._dropped(aw, "old_run")
            return
        m.resize(self.assembler.nranks(aw.job))
        t0 = time.perf_counter()
        out = m.on_window(aw.window, aw.columns, aw.missing, final=final, wall=self.wall())
        dt = time.perf_counter() - t0
        if out.result is None:
            self._dropped(aw, "already_scored")
        else:
            self.findings.write(out.findings)
            self.metrics.observe_window(out.result, dt)
            extra = out.findings[len(out.result.findings) :]
            if extra:
                self.metrics.observe_findings(extra)
            self.metrics.set_active(True)
            self._store_job(aw.job, m)
            self._incidents(out)
            self._emit(aw.job, MonitorOutput(plans=out.plans, controls=out.controls))
        # Marked scored only once its findings are written; then the job's state.
        comms = self.assembler.comms_of(aw.job, aw.run)
        if self.journal is not None and self.journal.released(
            aw.job, aw.window, comms, self.assembler.still_missing(aw.job, aw.run, aw.window)
        ):
            self.journal.open(self.assembler.pending_windows(), self.assembler.released_marks())
        self._save(aw.job)

    def _score_late(self, aw: AssembledWindow) -> None:
        """A late part of a window (ranks missing at its deadline, a partitioned node's
        backlog): scored against that window's own peers (JobMonitor.on_late), marked
        in the journal with the ranks the window still misses, then the job's state."""
        m = self._monitor_of(aw)
        if m is None:
            self._dropped(aw, "old_run")
            return
        m.resize(self.assembler.nranks(aw.job))
        out, late = m.on_late(aw.window, aw.columns, wall=self.wall())
        if late.scored:
            self.metrics.observe_late_scored(aw.job, late.scored)
        if late.duplicate or late.expired:
            self.metrics.observe_dropped(aw.job, "late", late.duplicate + late.expired)
        ranks = aw.columns.ints("rank")
        log.info(
            "late summaries scored",
            job=aw.job,
            window=aw.window,
            scored=late.scored,
            duplicate=late.duplicate,
            expired=late.expired,
            # the ranks themselves while few (a node's worth), else their count only
            ranks=ranks.tolist() if ranks.size <= 256 else None,
            still_missing=len(aw.missing),
        )
        if out.findings:
            self.findings.write(out.findings)
            self.metrics.observe_findings(out.findings)
        self._incidents(out)
        comms = self.assembler.comms_of(aw.job, aw.run)
        if self.journal is not None and self.journal.released(aw.job, aw.window, comms, aw.missing):
            self.journal.open(self.assembler.pending_windows(), self.assembler.released_marks())
        self._save(aw.job)

    def _store_job(self, job: str, m: JobMonitor, ended: bool = False) -> None:
        """The job's row in the store: what a report's summary needs. Only the keys that
        changed are written (the store merges them): per window that is its last
        window and time, not its list of hosts."""
        if not self.store.on or m.last_window < 0:
            return
        now = time.time()
        last = self._stored_job.setdefault(job, {})
        info: dict[str, Any] = {
            "run": m.run,
            "ranks": m.nranks,
            "window_steps": m.window_steps,
            "gpu_count": self.settings.gpu_count or m.nranks,
            "last_window": m.last_window,
            "last_time": now,
            "ended": now if ended else None,  # None again for a new run of it
        }
        if ended:
            # Ranks per island for the report's summary: once, at the end (a pass
            # over every rank, kept off the per-window path).
            info["islands"] = dict(Counter(m.detector.islands().values()))
        # The hosts (a rank's, as announced) only when they may have changed: a
        # sort of a big job's hosts is not for every window.
        hosts_key = (m.run, len(m.hosts))
        if last.get("_hosts_key") != hosts_key:
            info["hosts"] = sorted(set(m.hosts.values()))
            last["_hosts_key"] = hosts_key
        changed = {k: v for k, v in info.items() if last.get(k, ...) != v}
        last.update(changed)
        self.store.write_job(job, changed)

    def _write_report(self, job: str) -> None:
        """The job's incident report into report_dir at its end (report/README.md);
        a failure is logged, never fatal."""
        m = self.monitors.get(job)
        if not self.report_dir or m is None or m.last_window < 0:
            return
        if self.store.store is None:
            log.warning("report_dir set but the incident store is off: no report", job=job)
            return
        from artemis.report.load import ReportError, write_job_report

        try:
            path = write_job_report(self.store.store, job, self.report_dir)
        except (ReportError, OSError) as e:
            log.error("incident report not written", job=job, error=str(e))
            return
        log.info("incident report written", job=job, path=str(path))

    def _dropped(self, aw: AssembledWindow, reason: str) -> None:
        self.metrics.observe_dropped(aw.job, reason, aw.columns.n)
        log.info("window dropped", job=aw.job, run=aw.run, window=aw.window, reason=reason)

    def _incidents(self, out: MonitorOutput) -> None:
        """Incident records to incidents.jsonl, Prometheus and the store; the per-window
        rows (`out.incident_rows`) to Prometheus and the store. The JSONL first: a
        store that fails (logged, then off) never costs a line of it."""
        if out.incidents:
            self.incidents.write(out.incidents)
            self.metrics.observe_incidents(out.incidents)
            self.store.write_incidents(out.incidents)
        if out.incident_rows:
            self.metrics.observe_incident_rows(out.incident_rows)
            self.store.write_monitor_rows(out.incident_rows)

    def _emit(self, job: str, out: MonitorOutput) -> None:
        """Write what a monitor returned outside a window's scoring (or its plans)."""
        if out.findings:
            self.findings.write(out.findings)
            self.metrics.observe_findings(out.findings)
        self._incidents(out)
        for ev in out.plans:
            self.plans.write({**ev.to_dict(), "job": job})
            self.plan_metrics.observe(ev)
            if ev.escalate:
                log.warning(
                    "rebalance plan failed: escalating",
                    job=job,
                    plan=ev.id,
                    rank=ev.rank,
                    status=ev.status,
                    reason=ev.reason,
                )
            else:
                log.info("rebalance plan", job=job, plan=ev.id, status=ev.status, reason=ev.reason)
        for c in out.controls:
            if c.action == "dump":
                log.warning("hang suspected: requesting dumps", job=job, ranks=c.body["ranks"])
            self._outbox.append((job, c.action, c.body))
        if out.findings or out.plans or out.incidents:
            # A plan acknowledged, a hang reported, a mode changed: state that must
            # survive a crash as much as a scored window's does.
            self._save(job)

    def _plan_ack(self, a: dict[str, Any]) -> None:
        job = str(a.get("job", ""))
        m = self.monitors.get(job)
        if m is None:
            return
        try:
            out = m.on_ack(str(a["plan_id"]), int(a["rank"]), a.get("step"))
        except (KeyError, TypeError, ValueError):
            log.warning("bad plan ack", ack=a)
            return
        self._emit(job, out)

    def _dump(self, d: Dump) -> None:
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        path = self.dump_dir / f"{d.job}-r{d.rank}-{d.comm}.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for rec in d.records:
                fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        m = self.monitors.get(d.job)
        if m is not None:
            m.on_dump(d.rank, str(path))
        log.info("dump written", job=d.job, rank=d.rank, records=len(d.records), path=str(path))

    # ------------------------------------------------------------------ state
    def restore(self, journal: AssemblyJournal) -> int:
        """Take back what an earlier life of this coordinator knew: every job's monitor and
        assembly state (saved after each scored window), then the summaries it took but
        never scored (the journal). Returns how many summaries were replayed."""
        self.state_dir = journal.path.with_name(journal.path.name + ".jobs")
        for path in sorted(self.state_dir.glob("*.state")) if self.state_dir.exists() else ():
            try:
                state = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
                self.assembler.restore({state["job"]: state["assembly"]})
                if state["monitor"] is not None:
                    m = JobMonitor.restore(
                        state["monitor"], self.settings, dump_wait_s=self.dump_wait_s
                    )
                    self.monitors[m.job] = m
                    self._emit(m.job, m.update_settings(self.settings))
                    log.info(
                        "job state restored",
                        job=m.job,
                        last_window=m.last_window,
                        open_findings=len(m.detector.active()),
                    )
            except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException) as e:
                log.warning("job state unreadable: skipped", path=str(path), error=str(e))
        pending, released = journal.load_columns()
        self.assembler.mark_released(released, journal.open_marks)
        now = self.clock()
        for job in set(pending["job"]):
            self._monitor(job)
        if pending.n:
            self._score_all(self.assembler.add(pending, now))
        journal.open(self.assembler.pending_windows(), self.assembler.released_marks())
        self.journal = journal
        if pending.n:
            log.info("assembly journal replayed", summaries=pending.n)
        return pending.n

    def _save(self, job: str) -> None:
        """The job's state, atomically replaced (write, fsync-free rename): see restore."""
        if self.state_dir is None:
            return
        m = self.monitors.get(job)
        state = {
            "job": job,
            "monitor": None if m is None else m.snapshot(),
            "assembly": self.assembler.snapshot([job]).get(job),
        }
        if state["assembly"] is None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / (hashlib.sha1(job.encode()).hexdigest()[:16] + ".state")
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(msgpack.packb(state, use_bin_type=True))
        os.replace(tmp, path)

    # ------------------------------------------------------------------ control out
    async def _flush_controls(self) -> None:
        if not self._outbox or self.server is None:
            return
        out, self._outbox = self._outbox, []
        for job, action, body in out:
            for agent in sorted(self.agents.get(job, ())):
                try:
                    await self.server.send_control(agent, action, body)
                except NotConnected:
                    log.warning(
                        "control not delivered: agent not connected", agent=agent, action=action
                    )
