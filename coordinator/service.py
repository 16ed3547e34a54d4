"""The coordinator: the asyncio shell around the job table and its sinks.

`Coordinator` is the protocol server's app. Window summaries go into the
assembler as columns; every window it releases (complete, or at its deadline
with the absent ranks missing) goes to its job's `JobMonitor`, the pure core
that owns the detector, the rebalance policy, the missing-rank rule and hang
tracking (detect/monitor.py). The rules across windows and jobs (a new run, a
job's end, which heartbeats count, what a reconnecting agent is sent again, the
baseline retry, what a saved state holds) are the `JobTable`'s
(detect/jobs.py). What a monitor returns goes through the sinks
(coordinator/sinks.py: findings, incidents and plans JSONL, metrics, store, in
that one order), its control intents to the job's agents. Once a job's
fingerprint is known the stored baselines of its workload are read (on the
tick) and handed to its monitor; at its end the baselines it confirmed are
written (detect/baselines.py). Heartbeats carry progress and plan acks; dumps
are written next to the findings and their paths handed to the monitor.

After each scored window the job's monitor and assembly state are committed
with its outputs (the state file, atomically replaced next to the assembly
journal, `<journal>.jobs/`), and a restarted coordinator restores them before it
replays the journal: nothing about a job is forgotten across a restart. A job
whose every rank reported finished is ended `job_linger_s` later: its series
leave /metrics, its monitor is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import structlog
from artemis.common.diskio import FileHealth
from artemis.coordinator.config import RetentionConfig
from artemis.coordinator.corrections import CorrectionShell, control_id
from artemis.coordinator.dumps import DumpFiles
from artemis.coordinator.journal import (
    AssemblyJournal,
    JournalUnavailable,
    cut_back,
    output_marks,
)
from artemis.coordinator.metrics import Metrics, PlanMetrics, register_plan_metrics
from artemis.coordinator.sinks import (
    FindingsWriter,
    IncidentsWriter,
    Sinks,
    StateFiles,
    incidents_path,
)
from artemis.detect.assembly import AssembledWindow, WindowAssembler
from artemis.detect.detector import LATE_WINDOWS
from artemis.detect.jobs import BASELINE_RETRY_S, JobTable
from artemis.detect.monitor import JobMonitor, MonitorOutput
from artemis.detect.settings import Settings
from artemis.protocol.messages import Ack, Dump, Fingerprint, Heartbeat, Message, Windows
from artemis.protocol.peers import rank_pairs
from artemis.protocol.server import NotConnected, NotTaken, PeerInfo
from artemis.rebalance.corrections import Output
from artemis.rebalance.outputs import PlansWriter
from artemis.store.sink import StoreSink

__all__ = ["BASELINE_RETRY_S", "REPORT_FLUSH_S", "Coordinator"]

log = structlog.get_logger("artemis.coordinator")

# How long a job's end waits for its queued store writes before its report reads the store.
REPORT_FLUSH_S = 5.0


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
        # The incident store (off unless given): jobs, incidents, per-window rows.
        self.store = store if store is not None else StoreSink(None)
        self.jobs = JobTable(
            settings,
            self.assembler,
            global_batch=global_batch,
            dump_wait_s=dump_wait_s,
            job_linger_s=job_linger_s,
            baselines=self.store.on,  # no store: no baselines to judge by
        )
        self.state_files = StateFiles()  # its folder is set by restore()
        self.sinks = Sinks(
            findings=self.findings,
            incidents=self.incidents,
            plans=self.plans,
            metrics=metrics,
            plan_metrics=self.plan_metrics,
            store=self.store,
            state=self.state_files,
        )
        self.clock = clock
        self.wall: Callable[[], float] = wall  # unix time, for the incident records only
        self.server: Any = None  # ProtocolServer, set by serve()
        self.dumps = DumpFiles(
            Path(dumps_dir) if dumps_dir else findings.path.parent / (findings.path.stem + ".dumps")
        )
        self.refused_batches = 0  # windows messages not taken: the journal could not keep them
        self.retention = retention  # None: nothing pruned (tests, tools)
        self._pruned_at: float | None = None
        self._outbox: list[tuple[str, str, dict[str, Any]]] = []  # (job, action, body)
        self._direct: list[tuple[str, str, dict[str, Any]]] = []  # (agent, action, body)
        self.report_dir = report_dir  # each job's report at its end (artemis report)
        # Corrections (coordinator/corrections.py): decided per job, sent to rank agents.
        self.corrections = CorrectionShell(clock)

    @property
    def monitors(self) -> dict[str, JobMonitor]:
        return self.jobs.monitors

    @property
    def agents(self) -> dict[str, set[str]]:
        return self.jobs.agents

    @property
    def dump_dir(self) -> Path:
        return self.dumps.dir

    @property
    def dumps_health(self) -> FileHealth:
        return self.dumps.health

    @property
    def state_dir(self) -> Path | None:
        return self.state_files.dir

    @property
    def state_health(self) -> FileHealth:
        return self.state_files.health

    # ------------------------------------------------------------------ app hooks
    def on_connect(self, peer: PeerInfo) -> None:
        self._direct += self.jobs.connect(peer.agent_id, peer.host, list(rank_pairs(peer.ranks)))
        self.corrections.on_connect(peer)
        log.info("agent connected", agent=peer.agent_id, host=peer.host, ranks=len(peer.ranks))

    def on_disconnect(self, peer: PeerInfo) -> None:
        log.info("agent disconnected", agent=peer.agent_id, host=peer.host)
        self.corrections.on_disconnect(peer)

    async def on_control_ack(self, peer: PeerInfo, ack: Ack) -> None:
        """An agent acknowledged a control: a correction's result goes to its book."""
        got = self.corrections.on_ack(peer, ack, self.wall())
        if got is not None:
            self._corrected(*got)
            await self._flush_controls()

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
                self.jobs.serve(job, peer.agent_id)
            self._score_all(self.assembler.add(cols, now))
        elif isinstance(msg, Heartbeat):
            self.jobs.on_progress(peer.agent_id, msg.progress)
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
        for job, res in self.corrections.tick(self.wall(), now):
            self._corrected(job, res)
        for job, m in list(self.monitors.items()):
            self._emit(job, m.tick(now))
            self._load_baselines(m, now)
            if self.jobs.ended(job, now):
                log.info("job ended: its series are removed", job=job, last_window=m.last_window)
                self._end_job(job)
        await self._flush_controls()

    def retry_writes(self) -> None:
        """Lines held in memory by a full disk go out as soon as there is space."""
        self.sinks.retry()

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
        n = self.dumps.prune(int(r.dumps_max_mb * (1 << 20)), age_s, wall)
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
        for job in list(self.monitors):
            self._close_job(job)
            self._save(job, stopped=True)
        self.sinks.close()
        if self.journal is not None:
            self.journal.close()

    # ------------------------------------------------------------------ settings
    def set_setting(self, key: str, value: str) -> Settings:
        new = self.settings.set(key, value)
        self.settings = new
        for job, out in self.jobs.update_settings(new):
            self._emit(job, out)
        log.info("setting changed", key=key, value=getattr(new, key))
        return new

    # ------------------------------------------------------------------ jobs
    def _monitor_of(self, aw: AssembledWindow) -> JobMonitor | None:
        """The monitor of the window's run: a new run of a job gets a fresh one."""
        verdict = self.jobs.run_of(aw)
        m = self.monitors[aw.job]
        if verdict == "current":
            return m
        if verdict == "stale":
            return None  # a window of a run that a newer one replaced
        log.info("new run of a job: scoring it afresh", job=aw.job, run=aw.run, previous=m.run)
        self._end_job(aw.job, keep_assembly=True)
        return self.jobs.new_run(aw.job, aw.run, m)

    def _close_job(self, job: str) -> None:
        """A job's end written: its open incidents close (`job_end`), its store row and
        confirmed baselines, then its report."""
        m = self.monitors[job]
        self._emit(job, m.finish(self.wall()))
        self.sinks.write_job(job, self.jobs.job_row(job, time.time(), ended=True))
        self.store.write_baselines(m.baseline_records(self.wall()))
        self._write_report(job)

    def _end_job(self, job: str, keep_assembly: bool = False) -> None:
        """The one thing that clears a job: its monitor, its series, its pending windows.
        Its open incidents close first (`job_end`), then its report is written."""
        if job in self.monitors:
            self._close_job(job)
        self.jobs.forget(job, keep_assembly)
        self.corrections.forget(job)
        self.metrics.forget_job(job)
        self.plan_metrics.forget(job)
        self._save(job)

    # ------------------------------------------------------------------ scoring
    def _score_all(self, released: list[AssembledWindow], final: bool = False) -> None:
        # The assembler marked all of them released at once; until each is scored, the
        # job's saved state must not say so (JobTable.state), or a crash in between
        # would lose the rest: a restart would take their journaled summaries for resends.
        self.jobs.unscored = {(aw.job, aw.run, aw.window) for aw in released}
        for aw in released:
            self.jobs.unscored.discard((aw.job, aw.run, aw.window))
            self._score(aw, final)
        self.jobs.unscored = set()
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
            self.corrections.on_window(
                aw.job, m, aw.window, aw.columns, out, self.settings, self.wall()
            )
            self._begin(aw.job)
            self.sinks.write_job(aw.job, self.jobs.job_row(aw.job, time.time()))
            self.sinks.write(aw.job, out, scored_s=dt)
            self._send(aw.job, out)
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
                # present, but with no usable time (NaN or negative): scored as missing
                # (the result's missing are the absent ones and these)
                unusable=len(out.result.missing) - len(aw.missing),
            )
        # The job's state (which holds the window) once its outputs are written, then
        # the release mark: a crash before the state is saved cuts the outputs back and
        # scores the window again (restore), one after it finds the window taken in.
        self._save(aw.job)
        self._released(aw, self.assembler.still_missing(aw.job, aw.run, aw.window))

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
        self.sinks.write(aw.job, out)
        self._save(aw.job)
        self._released(aw, list(aw.missing))

    def _released(self, aw: AssembledWindow, missing: list[int]) -> None:
        """The window's release mark in the journal (after its state is saved)."""
        comms = self.assembler.comms_of(aw.job, aw.run)
        if self.journal is not None and self.journal.released(aw.job, aw.window, comms, missing):
            self.journal.open(self.assembler.pending_windows(), self.assembler.released_marks())

    def _begin(self, job: str) -> None:
        """A group of output lines of `job` starts: where the files end now, in the
        journal (journal.py: an intent); the job's next save says it was seen through."""
        seq = self.jobs.begin()
        if self.journal is not None:
            self.journal.begin(job, seq, output_marks(self.sinks.files()))

    def _load_baselines(self, m: JobMonitor, now: float) -> None:
        """The stored baselines of the job's workload, read once its fingerprint is known
        (on the tick, never while scoring; detect/baselines.py): per hardware class,
        the latest one (what the job is judged by) and the one of its own software. The
        reads never wait on the database: the store's writer thread runs them (after the
        writes queued before them) and a later tick takes the answer ("pending" until
        then). A read that fails is tried again BASELINE_RETRY_S later (JobTable); until
        then the job is not compared and none of its windows can become a baseline."""
        if not self.jobs.baseline_due(m.job, now):
            return
        wanted = m.baseline_wanted()
        if not wanted or not self.store.on:
            return
        own_hash = m.software_hash
        for workload, cls in wanted:
            state, latest = self.store.read_baseline(workload, cls)
            own = latest
            if state == "done" and latest is not None and latest.get("software_hash") != own_hash:
                state, own = self.store.read_baseline(workload, cls, own_hash)
            if state == "failed":
                self.jobs.baseline_failed(m.job, now)  # not compared (logged)
            if state != "done":
                return  # asked again on a later tick
            m.on_baselines(cls, latest, own)
            self.jobs.baseline_read(m.job)
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

    def _emit(self, job: str, out: MonitorOutput) -> None:
        """Write what a monitor returned outside a window's scoring, as a group of its own
        (an intent before it, the job's state after it)."""
        if out.findings or out.plans or out.incidents:
            self._begin(job)
        self.sinks.write(job, out)
        dump = self._send(job, out)
        if out.findings or out.plans or out.incidents or dump:
            # A plan acknowledged, a hang reported, a mode changed: state that must
            # survive a crash as much as a scored window's does. A hang suspected too
            # (saved before its dump request goes out): a restart reports it even if it
            # can no longer see it (docs/RELIABILITY.md "2. Kills at random moments").
            self._save(job)

    def _send(self, job: str, out: MonitorOutput) -> bool:
        """The control intents to the job's agents (sent at the next flush); True when a
        dump was asked for."""
        dump = False
        for c in out.controls:
            if c.action == "dump":
                dump = True
                log.warning("hang suspected: requesting dumps", job=job, ranks=c.body["ranks"])
            self._outbox.append((job, c.action, c.body))
        self.jobs.controls(job, out.controls)
        return dump

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
        self.jobs.serve(fp.job, peer.agent_id)
        m = self.jobs.monitor(fp.job)
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
        path = self.dumps.write(d)
        if path is None:
            return
        m = self.monitors.get(d.job)
        if m is not None and m.on_dump(d.rank, str(path)):
            self._save(d.job)  # the hang's evidence so far, for a restart that reports it
        log.info("dump written", job=d.job, rank=d.rank, records=len(d.records), path=str(path))

    # ------------------------------------------------------------------ state
    def restore(self, journal: AssemblyJournal) -> int:
        """Take back what an earlier life of this coordinator knew: every job's monitor and
        assembly state (saved after each scored window), then the summaries it took but
        never scored (the journal). Returns how many summaries were replayed."""
        self.state_files.open(journal.path.with_name(journal.path.name + ".jobs"))
        pending, released = journal.load_columns()
        states = self.state_files.load()
        self._finish_intent(journal, [st for _path, st in states])
        for path, state in states:
            try:
                m = self.jobs.restore(state)
                self.corrections.restore(str(state["job"]), state.get("corrections"))
                if m is not None:
                    # After a crash, not after a clean stop (a job's next run starts
                    # its windows afresh: a stale last window would say it is done).
                    if m.last_window >= 0 and not state.get("stopped"):
                        self.metrics.observe_restored(m.job, m.last_window)
                    self._emit(m.job, m.update_settings(self.settings))
                    log.info(
                        "job state restored",
                        job=m.job,
                        last_window=m.last_window,
                        open_findings=m.open_findings(),
                    )
            except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException) as e:
                log.warning("job state unreadable: skipped", path=str(path), error=str(e))
        self.assembler.mark_released(released, journal.open_marks)
        now = self.clock()
        for job in set(pending["job"]):
            self.jobs.monitor(job)
        if pending.n:
            self._score_all(self.assembler.add(pending, now))
        journal.open(self.assembler.pending_windows(), self.assembler.released_marks())
        self.journal = journal
        if pending.n:
            log.info("assembly journal replayed", summaries=pending.n)
        return pending.n

    def _finish_intent(self, journal: AssemblyJournal, states: list[Any]) -> None:
        """Output lines an earlier life was writing when it died: if its job's saved state
        never saw their group through, they (maybe partial) are cut from the outputs,
        before anything else is written; the replayed window (or the resent ack) writes
        them once more."""
        it = journal.intent
        if not self.jobs.interrupted(it.job if it else "", it.seq if it else 0, states):
            return  # the job's state was saved after the group: its outputs are whole
        assert it is not None
        cut = cut_back(it.outputs)
        log.warning(
            "outputs interrupted by a crash removed: they are written again",
            job=it.job,
            group=it.seq,
            removed_bytes=cut,
        )

    def _save(self, job: str, stopped: bool = False) -> None:
        """Commit the job's group of outputs with its state (JobTable.state; the state file
        atomically replaced: see restore). `stopped`: saved by a clean shutdown (flush),
        not after a window."""
        # No state folder (no journal: tests, tools): nothing to keep, and no snapshot
        # taken (a big job's is not free).
        state = None if self.state_dir is None else self.jobs.state(job, stopped)
        if state is not None:
            state["corrections"] = self.corrections.snapshot(job)
        self.sinks.commit(job, state)

    # ------------------------------------------------------------------ corrections
    def _corrected(self, job: str, res: Output) -> None:
        """The book's output outside a window: its records written as a group, saved."""
        out = MonitorOutput()
        self.corrections.into(job, self.monitors.get(job), res, out)
        self._emit(job, out)
        if not out.incidents and job in self.monitors:
            self._save(job)  # an ack changes what must not be resent after a restart

    def correction_command(self, req: dict[str, Any]) -> dict[str, Any]:
        """The control socket's pending / approve / deny / correct (coordinator/cli.py)."""
        return self.corrections.command(req, self.wall(), self._corrected)

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
        for agent, body in self.corrections.take_sends() if self.server is not None else ():
            try:
                ctl = await self.server.send_control(
                    agent, "correction", body, control_id=control_id(body)
                )
                self.corrections.sent_as(ctl, body)
            except NotConnected:
                self.corrections.unsent(agent, body)
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
