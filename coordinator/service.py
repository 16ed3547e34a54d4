"""The coordinator: a thin asyncio shell around assembly and one `JobMonitor` per job.

`Coordinator` is the protocol server's app. Window summaries go into the
assembler as columns; every window it releases (complete, or at its deadline
with the absent ranks missing) goes to its job's `JobMonitor`, the pure core
that owns the detector, the rebalance policy, the missing-rank rule and hang
tracking (detect/monitor.py). What the monitor returns is written here:
findings to the JSONL, plan events to the plans JSONL, both to Prometheus, and
control intents to the job's agents, incident records to `incidents.jsonl` next
to the findings (and Prometheus). Once a job's fingerprint is known the stored
baselines of its workload are read (on the tick) and handed to its monitor; at
its end the baselines it confirmed are written (detect/baselines.py).
Heartbeats carry progress and plan acks;
dumps are written next to the findings and their paths handed to the monitor.

After each scored window the job's monitor and assembly state are saved
atomically next to the assembly journal (`<journal>.jobs/`), and a restarted
coordinator restores them before it replays the journal: nothing about a job
is forgotten across a restart. A job whose every rank reported finished is
ended `job_linger_s` later: its series leave /metrics, its monitor is dropped.
"""

from __future__ import annotations

import contextlib
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
from artemis.common.diskio import FileHealth, prune_dir
from artemis.coordinator.config import RetentionConfig
from artemis.coordinator.journal import (
    AssemblyJournal,
    JournalUnavailable,
    cut_back,
    output_marks,
)
from artemis.coordinator.metrics import Metrics, PlanMetrics, register_plan_metrics
from artemis.detect.assembly import AssembledWindow, WindowAssembler
from artemis.detect.detector import LATE_WINDOWS
from artemis.detect.findings import FindingsWriter, IncidentsWriter, incidents_path
from artemis.detect.monitor import JobMonitor, MonitorOutput, PlansWriter
from artemis.detect.settings import Settings
from artemis.protocol.messages import Dump, Fingerprint, Heartbeat, Message, Windows
from artemis.protocol.server import NotConnected, NotTaken, PeerInfo
from artemis.store.sink import StoreSink

log = structlog.get_logger("artemis.coordinator")

# How long a job's end waits for its queued store writes before its report reads the store.
REPORT_FLUSH_S = 5.0
BASELINE_RETRY_S = 30.0  # a baseline read that failed is tried again this much later


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
        dumps_dir: str | Path | None = None,
        retention: RetentionConfig | None = None,
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
        self.dump_dir = (
            Path(dumps_dir) if dumps_dir else findings.path.parent / (findings.path.stem + ".dumps")
        )
        # Write health of the outputs not written through a JsonlAppender.
        self.state_health = FileHealth("state")
        self.dumps_health = FileHealth("dumps", str(self.dump_dir))
        self.refused_batches = 0  # windows messages not taken: the journal could not keep them
        self.retention = retention  # None: nothing pruned (tests, tools)
        self._pruned_at: float | None = None
        self._outbox: list[tuple[str, str, dict[str, Any]]] = []  # (job, action, body)
        # The incident store (off unless given): jobs, incidents, per-window rows.
        self.store = store if store is not None else StoreSink(None)
        self.report_dir = report_dir  # each job's report at its end (artemis report)
        self._stored_job: dict[str, dict[str, Any]] = {}  # the job info last written
        self._baseline_retry: dict[str, float] = {}  # job -> when to read its baselines again
        self._out_seq = 0  # groups of output lines begun (journal.py: intents)
        self._unscored: set[tuple[str, str, int]] = set()  # released, not scored yet
        self._plan_control: dict[str, dict[str, Any]] = {}  # job -> its last plan control
        self._direct: list[tuple[str, str, dict[str, Any]]] = []  # (agent, action, body)

    # ------------------------------------------------------------------ app hooks
    def on_connect(self, peer: PeerInfo) -> None:
        by_job: dict[str, list[int]] = {}
        for r in peer.ranks:
            by_job.setdefault(r.job, []).append(r.rank)
        for job, ranks in by_job.items():
            self.agents.setdefault(job, set()).add(peer.agent_id)
            m = self._monitor(job)
            m.expect(ranks, peer.host)
            self.assembler.expect(job, ranks)
            # An agent back (restarted, reconnected) gets the job's latest plan control
            # again: a withdrawal or rollback sent while it was away would otherwise
            # leave its ranks on a split the others left (rebalance/README.md "Limits").
            body = self._plan_control.get(job)
            if body is not None:
                self._direct.append((peer.agent_id, "plan", body))
            # A hang waiting for its dumps asks an agent that comes back for those of
            # its ranks not in yet: the request may have died with an earlier life of
            # this coordinator, or with the agent's.
            want = m.dumps_wanted(ranks)
            if want:
                self._direct.append((peer.agent_id, "dump", {"job": job, "ranks": want}))
        log.info("agent connected", agent=peer.agent_id, host=peer.host, ranks=len(peer.ranks))

    def on_disconnect(self, peer: PeerInfo) -> None:
        log.info("agent disconnected", agent=peer.agent_id, host=peer.host)

    async def on_message(self, peer: PeerInfo, msg: Message) -> None:
        now = self.clock()
        if isinstance(msg, Windows):
            if self.journal is not None:
                try:
                    self.journal.added(msg.columns)  # before the ack: see journal.py
                except JournalUnavailable as e:
                    # Not taken, not acked: the agent keeps the batch and resends it.
                    self.refused_batches += 1
                    raise NotTaken(str(e)) from e
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
        elif isinstance(msg, Fingerprint):
            self._fingerprint(peer, msg)
        await self._flush_controls()

    # ------------------------------------------------------------------ periodic
    async def tick(self) -> None:
        now = self.clock()
        self.retry_writes()
        self._prune(now)
        self._score_all(self.assembler.expire(now))
        for job, m in list(self.monitors.items()):
            self._emit(job, m.tick(now))
            self._load_baselines(m, now)
            self._check_ended(job, m, now)
        await self._flush_controls()

    def retry_writes(self) -> None:
        """Lines held in memory by a full disk go out as soon as there is space."""
        self.findings.retry()
        self.incidents.retry()
        self.plans.retry()

    def _prune(self, now: float) -> None:
        """Retention ([retention]): old rotated JSONL files, old or surplus dumps and old
        store rows are deleted, every prune_every_s (and once at the first tick)."""
        r = self.retention
        if r is None or (self._pruned_at is not None and now - self._pruned_at < r.prune_every_s):
            return
        self._pruned_at = now
        wall = self.wall()
        age_s = r.max_age_days * 86400.0
        for out in (self.findings.out, self.incidents.out, self.plans.out):
            if out is not None:
                out.prune()
        n = prune_dir(
            self.dump_dir, max_bytes=int(r.dumps_max_mb * (1 << 20)), max_age_s=age_s, now=wall
        )
        if n:
            log.info("hang dumps pruned", path=str(self.dump_dir), deleted=n)
        if age_s > 0:
            self.store.prune(wall - age_s)

    def write_health(self) -> list[FileHealth]:
        """Every output's write state, for the metrics (straggler_write_*)."""
        out = [self.findings.health, self.incidents.health, self.plans.health]
        if self.journal is not None:
            out.append(self.journal.health)
        out += [self.state_health, self.dumps_health, self.store.health]
        return out

    def flush(self) -> None:
        """Shutdown: score whatever is still pending, close outputs."""
        # Windows still open at shutdown are partial by nature (ranks sitting in a
        # collective that never ended, agents not done): score what they hold,
        # but an absent rank there is not evidence that it went missing.
        self._score_all(self.assembler.flush(), final=True)
        for job, m in self.monitors.items():
            self._emit(job, m.finish(self.wall()))
            self._store_job(job, m, ended=True)
            self.store.write_baselines(m.baseline_records(self.wall()))
            self._write_report(job)
            self._save(job, stopped=True)
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
            m.baselines.enabled = self.store.on  # no store: no baselines to judge by
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
        # Sent once per rank: a new run on the same processes' rings keeps them.
        fresh.fingerprints.update(m.fingerprints)
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
            self.store.write_baselines(m.baseline_records(self.wall()))
            self._write_report(job)
        self._stored_job.pop(job, None)
        self._baseline_retry.pop(job, None)
        self._plan_control.pop(job, None)
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
        # The assembler marked all of them released at once; until each is scored, the
        # job's saved state must not say so (_save), or a crash in between would lose
        # the rest: a restart would take their journaled summaries for resends.
        self._unscored = {(aw.job, aw.run, aw.window) for aw in released}
        for aw in released:
            self._unscored.discard((aw.job, aw.run, aw.window))
            self._score(aw, final)
        self._unscored = set()
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
        if out.clock:
            self.metrics.observe_clock(aw.job, out.clock)
            log.info("device-clock anomalies handled", job=aw.job, window=aw.window, **out.clock)
        if out.result is None:
            self._dropped(aw, "already_scored")
        else:
            self._begin(aw.job)
            self.findings.write(out.findings)
            self.metrics.observe_window(out.result, dt)
            extra = out.findings[len(out.result.findings) :]
            if extra:
                self.metrics.observe_findings(extra)
            self.metrics.set_active(True)
            self._store_job(aw.job, m)
            self._incidents(out)
            self._emit(aw.job, MonitorOutput(plans=out.plans, controls=out.controls), begun=True)
            # One line per scored window: the per-window record of docs/RELIABILITY.md,
            # before the state that says the window was scored (the store's row is
            # queued: a crash just after the save could leave neither); a crash before
            # the save scores the window again, and a second life logs it again.
            log.info(
                "window scored",
                job=aw.job,
                run=aw.run,
                window=aw.window,
                ranks=aw.columns.n,
                missing=len(aw.missing),
            )
        # The job's state (which holds the window) once its outputs are written, then
        # the release mark: a crash before the state is saved cuts the outputs back and
        # scores the window again (restore), one after it finds the window taken in.
        self._save(aw.job)
        comms = self.assembler.comms_of(aw.job, aw.run)
        if self.journal is not None and self.journal.released(
            aw.job, aw.window, comms, self.assembler.still_missing(aw.job, aw.run, aw.window)
        ):
            self.journal.open(self.assembler.pending_windows(), self.assembler.released_marks())

    def _score_late(self, aw: AssembledWindow) -> None:
        """A late part of a window (ranks missing at its deadline, a partitioned node's
        backlog): scored against that window's own peers (JobMonitor.on_late), its
        state saved, then marked in the journal with the ranks the window still misses."""
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
        # As a window's outputs (_score): an intent before the lines, the job's state
        # once they are written, then the release mark.
        self._begin(aw.job)
        if out.findings:
            self.findings.write(out.findings)
            self.metrics.observe_findings(out.findings)
        self._incidents(out)
        self._save(aw.job)
        comms = self.assembler.comms_of(aw.job, aw.run)
        if self.journal is not None and self.journal.released(aw.job, aw.window, comms, aw.missing):
            self.journal.open(self.assembler.pending_windows(), self.assembler.released_marks())

    def _begin(self, job: str) -> None:
        """A group of output lines of `job` starts: where the files end now, in the
        journal (journal.py: an intent); the job's next save says it was seen through."""
        self._out_seq += 1
        if self.journal is not None:
            paths = [self.findings.path, self.plans.path, self.incidents.path]
            self.journal.begin(job, self._out_seq, output_marks(paths))

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
            fp = m.fingerprint()
            if fp is not None:
                info["fingerprint"] = fp.to_dict()
        # The hosts (a rank's, as announced) only when they may have changed: a
        # sort of a big job's hosts is not for every window.
        hosts_key = (m.run, len(m.hosts))
        if last.get("_hosts_key") != hosts_key:
            info["hosts"] = sorted(set(m.hosts.values()))
            last["_hosts_key"] = hosts_key
        changed = {k: v for k, v in info.items() if last.get(k, ...) != v}
        last.update(changed)
        self.store.write_job(job, changed)

    def _load_baselines(self, m: JobMonitor, now: float) -> None:
        """The stored baselines of the job's workload, read once its fingerprint is known
        (on the tick, never while scoring; detect/baselines.py): per hardware class,
        the latest one (what the job is judged by) and the one of its own software. The
        reads never wait on the database: the store's writer thread runs them (after the
        writes queued before them) and a later tick takes the answer ("pending" until
        then). A read that fails is tried again BASELINE_RETRY_S later; until then the
        job is not compared and none of its windows can become a baseline."""
        if now < self._baseline_retry.get(m.job, 0.0):
            return
        wanted = m.baseline_wanted()
        if not wanted or not self.store.on:
            return
        own_hash = m.baselines.software_hash
        for workload, cls in wanted:
            state, latest = self.store.read_baseline(workload, cls)
            own = latest
            if state == "done" and latest is not None and latest.get("software_hash") != own_hash:
                state, own = self.store.read_baseline(workload, cls, own_hash)
            if state == "failed":
                self._baseline_retry[m.job] = now + BASELINE_RETRY_S  # not compared (logged)
            if state != "done":
                return  # asked again on a later tick
            m.on_baselines(cls, latest, own)
            self._baseline_retry.pop(m.job, None)
            log.info(
                "baseline of the workload read",
                job=m.job,
                workload=workload,
                hw_class=cls,
                baseline=None if latest is None else latest.get("software_hash"),
                windows=None if latest is None else latest.get("windows"),
            )

    def _write_report(self, job: str) -> None:
        """The job's incident report into report_dir at its end (report/README.md);
        a failure is logged, never fatal."""
        m = self.monitors.get(job)
        if not self.report_dir or m is None or m.last_window < 0:
            return
        if not self.store.on:
            log.warning("report_dir set but the incident store is off: no report", job=job)
            return
        # The report reads the store: what is queued for it first. Never a wait on a
        # store that is down (the report is then skipped; `artemis report` later).
        if not self.store.connected or not self.store.flush(REPORT_FLUSH_S):
            log.warning("incident store not reachable: no report", job=job, store=self.store.url)
            return
        assert self.store.store is not None
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

    def _emit(self, job: str, out: MonitorOutput, begun: bool = False) -> None:
        """Write what a monitor returned outside a window's scoring (or its plans: `begun`,
        inside the window's group of outputs)."""
        if not begun and (out.findings or out.plans or out.incidents):
            self._begin(job)
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
        dump = False
        for c in out.controls:
            if c.action == "dump":
                dump = True
                log.warning("hang suspected: requesting dumps", job=job, ranks=c.body["ranks"])
            self._outbox.append((job, c.action, c.body))
            if c.action == "plan":
                self._plan_control[job] = c.body
        if not begun and (out.findings or out.plans or out.incidents or dump):
            # (Inside a window's outputs, `begun`, the window's own save follows them:
            # saving here would mark the window scored before its per-window line.)
            # A plan acknowledged, a hang reported, a mode changed: state that must
            # survive a crash as much as a scored window's does. A hang suspected too
            # (saved before its dump request goes out): a restart reports it even if it
            # can no longer see it (docs/RELIABILITY.md "2. Kills at random moments").
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

    def _fingerprint(self, peer: PeerInfo, fp: Fingerprint) -> None:
        """A rank's software fingerprint and workload signature, into its job's monitor
        (its state saved: the agent forgets the message once it is acked)."""
        self.agents.setdefault(fp.job, set()).add(peer.agent_id)
        m = self._monitor(fp.job)
        if m.on_fingerprint(fp.rank, fp.software.to_dict(), fp.workload):
            log.debug(
                "fingerprint",
                job=fp.job,
                rank=fp.rank,
                workload=fp.workload,
                **{k: v for k, v in fp.software.to_dict().items() if k != "env"},
            )
            self._save(fp.job)

    def _dump(self, d: Dump) -> None:
        path = self.dump_dir / f"{d.job}-r{d.rank}-{d.comm}.jsonl"
        data = "".join(json.dumps(rec, separators=(",", ":")) + "\n" for rec in d.records)
        try:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(data)
        except OSError as e:
            # The hang finding goes out without this dump (named lost in the metrics).
            self.dumps_health.failed(e)
            self.dumps_health.give_up(1, "dump_not_written")
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return
        self.dumps_health.ok()
        m = self.monitors.get(d.job)
        if m is not None and m.on_dump(d.rank, str(path)):
            self._save(d.job)  # the hang's evidence so far, for a restart that reports it
        log.info("dump written", job=d.job, rank=d.rank, records=len(d.records), path=str(path))

    # ------------------------------------------------------------------ state
    def restore(self, journal: AssemblyJournal) -> int:
        """Take back what an earlier life of this coordinator knew: every job's monitor and
        assembly state (saved after each scored window), then the summaries it took but
        never scored (the journal). Returns how many summaries were replayed."""
        self.state_dir = journal.path.with_name(journal.path.name + ".jobs")
        self.state_health.path = str(self.state_dir)
        pending, released = journal.load_columns()
        states: list[tuple[Path, Any]] = []
        for path in sorted(self.state_dir.glob("*.state")) if self.state_dir.exists() else ():
            try:
                states.append(
                    (path, msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False))
                )
            except (OSError, ValueError, msgpack.UnpackException) as e:
                log.warning("job state unreadable: skipped", path=str(path), error=str(e))
        self._finish_intent(journal, states)
        for path, state in states:
            try:
                self.assembler.restore({state["job"]: state["assembly"]})
                if state.get("plan_control") is not None:
                    self._plan_control[str(state["job"])] = state["plan_control"]
                if state["monitor"] is not None:
                    m = JobMonitor.restore(
                        state["monitor"], self.settings, dump_wait_s=self.dump_wait_s
                    )
                    m.baselines.enabled = self.store.on
                    self.monitors[m.job] = m
                    # After a crash, not after a clean stop (a job's next run starts
                    # its windows afresh: a stale last window would say it is done).
                    if m.last_window >= 0 and not state.get("stopped"):
                        self.metrics.observe_restored(m.job, m.last_window)
                    self._emit(m.job, m.update_settings(self.settings))
                    log.info(
                        "job state restored",
                        job=m.job,
                        last_window=m.last_window,
                        open_findings=len(m.detector.active()),
                    )
            except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException) as e:
                log.warning("job state unreadable: skipped", path=str(path), error=str(e))
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

    def _finish_intent(self, journal: AssemblyJournal, states: list[tuple[Path, Any]]) -> None:
        """Output lines an earlier life was writing when it died: if its job's saved state
        never saw their group through, they (maybe partial) are cut from the outputs,
        before anything else is written; the replayed window (or the resent ack) writes
        them once more."""
        it = journal.intent
        seen = {
            str(st.get("job")): int(st.get("out_seq", 0))
            for _path, st in states
            if isinstance(st, dict)
        }
        self._out_seq = max([0, *seen.values()] + ([it.seq] if it is not None else []))
        if it is None or seen.get(it.job, 0) >= it.seq:
            return  # the job's state was saved after the group: its outputs are whole
        cut = cut_back(it.outputs)
        log.warning(
            "outputs interrupted by a crash removed: they are written again",
            job=it.job,
            group=it.seq,
            removed_bytes=cut,
        )

    def _save(self, job: str, stopped: bool = False) -> None:
        """The job's state, atomically replaced (write, fsync-free rename): see restore.
        `stopped`: saved by a clean shutdown (flush), not after a window."""
        if self.state_dir is None:
            return
        m = self.monitors.get(job)
        asm = self.assembler.snapshot([job]).get(job)
        gone = {(r, w) for j, r, w in self._unscored if j == job}
        if asm is not None and gone:
            # an item is [run, window] or [run, window, ranks still missing]
            kept = [it for it in asm["released"] if (it[0], it[1]) not in gone]
            front = max([it[1] for it in kept if it[0] == asm["run"]], default=-1)
            asm = {**asm, "released": kept, "front": front}
        state = {
            "job": job,
            "monitor": None if m is None else m.snapshot(),
            "assembly": asm,
            # The last group of output lines this state has seen through (an intent
            # newer than it was cut short by a crash: _finish_intent).
            "out_seq": self._out_seq,
            "plan_control": self._plan_control.get(job),
            "stopped": stopped,
        }
        if state["assembly"] is None:
            return
        path = self.state_dir / (hashlib.sha1(job.encode()).hexdigest()[:16] + ".state")
        tmp = path.with_suffix(".tmp")
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(msgpack.packb(state, use_bin_type=True))
            os.replace(tmp, path)
        except OSError as e:
            # The previous state file stays whole; this one is saved again after the
            # job's next window (the journal still holds what was not scored).
            self.state_health.failed(e)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return
        self.state_health.ok()

    # ------------------------------------------------------------------ control out
    async def _flush_controls(self) -> None:
        if self._direct and self.server is not None:
            direct, self._direct = self._direct, []
            for agent, action, body in direct:
                try:
                    await self.server.send_control(agent, action, body)
                except NotConnected:
                    log.warning(
                        "control not delivered: agent not connected", agent=agent, action=action
                    )
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
