"""`JobTable`: the jobs one shell serves, and the rules that are not any one job's.

The pure core of the shell (coordinator/service.py, and coordinator/local.py
for the in-process detector in job/detector.py and sim/inproc.py): it owns the window assembler and one `JobMonitor` per job, and
says when a window starts a new run of its job, when a job has ended, which
heartbeats count (the communicator each rank is judged on), what an agent that
(re)connects must be sent again (the job's last plan control, the dumps a hang
still waits for), when a failed baseline read is tried again, and what a job's
saved state holds (the crash-consistency intents: which group of output lines
the state has seen through). No clocks, files or sockets: `now` comes in, and
what must be written or sent goes back to the shell.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from artemis.detect.assembly import AssembledWindow, WindowAssembler
from artemis.detect.detector import Detector
from artemis.detect.monitor import Intent, JobMonitor, MonitorOutput
from artemis.detect.settings import Settings
from artemis.detect.state import JobState, plain, read
from artemis.protocol.records import RankProgress

BASELINE_RETRY_S = 30.0  # a baseline read that failed is tried again this much later

Direct = tuple[str, str, dict[str, Any]]  # (agent, action, body): a control for one agent
RunVerdict = Literal["current", "stale", "new"]


class JobTable:
    """Every job of one shell: its monitor, its agents and the rules across windows."""

    def __init__(
        self,
        settings: Settings,
        assembler: WindowAssembler,
        *,
        global_batch: int | None = None,
        dump_wait_s: float = 5.0,
        job_linger_s: float = 300.0,
        baselines: bool = False,
        detector: type[Detector] = Detector,
    ) -> None:
        self.settings = settings
        self.detector = detector  # the class each job's monitor scores with
        self.assembler = assembler
        self.global_batch = global_batch
        self.dump_wait_s = dump_wait_s
        self.job_linger_s = job_linger_s
        self.baselines = baselines  # a store to read them from: off, no baselines to judge by
        self.monitors: dict[str, JobMonitor] = {}
        self.agents: dict[str, set[str]] = {}  # job -> agent ids that serve it
        self.plan_control: dict[str, dict[str, Any]] = {}  # job -> its last plan control
        self.out_seq = 0  # groups of output lines begun (coordinator/journal.py: intents)
        self.unscored: set[tuple[str, str, int]] = set()  # released, not scored yet
        self._finished_at: dict[str, float] = {}  # job -> when every rank reported finished
        self._baseline_retry: dict[str, float] = {}  # job -> when to read its baselines again
        self._stored_job: dict[str, dict[str, Any]] = {}  # the job row last written

    # ------------------------------------------------------------------ jobs

    def monitor(self, job: str, run: str = "") -> JobMonitor:
        """The job's monitor, made at its first sight (a hello, a window, a fingerprint)."""
        m = self.monitors.get(job)
        if m is None:
            m = self.monitors[job] = JobMonitor(
                job,
                self.settings,
                run=run,
                global_batch=self.global_batch,
                dump_wait_s=self.dump_wait_s,
                detector=self.detector,
            )
            m.use_baselines(self.baselines)
        return m

    def adopt(self, m: JobMonitor) -> None:
        """A monitor restored from a saved state."""
        m.use_baselines(self.baselines)
        self.monitors[m.job] = m

    def serve(self, job: str, agent: str) -> None:
        self.agents.setdefault(job, set()).add(agent)

    def connect(self, agent: str, host: str, ranks: Iterable[tuple[str, int]]) -> list[Direct]:
        """An agent's hello with its (job, rank) pairs: the jobs grow to hold them, and
        what the agent must be sent again comes back."""
        by_job: dict[str, list[int]] = {}
        for job, rank in ranks:
            by_job.setdefault(job, []).append(rank)
        out: list[Direct] = []
        for job, rs in by_job.items():
            self.serve(job, agent)
            m = self.monitor(job)
            m.expect(rs, host)
            self.assembler.expect(job, rs)
            # An agent back (restarted, reconnected) gets the job's latest plan control
            # again: a withdrawal or rollback sent while it was away would otherwise
            # leave its ranks on a split the others left (rebalance/README.md "Limits").
            body = self.plan_control.get(job)
            if body is not None:
                out.append((agent, "plan", body))
            # A hang waiting for its dumps asks an agent that comes back for those of
            # its ranks not in yet: the request may have died with an earlier life of
            # this coordinator, or with the agent's.
            want = m.dumps_wanted(rs)
            if want:
                out.append((agent, "dump", {"job": job, "ranks": want}))
        return out

    def on_progress(self, agent: str, progress: Iterable[RankProgress]) -> None:
        """A heartbeat's progress: only that on the communicator each rank is judged on
        counts (its primary one, once the assembler knows it)."""
        by_job: dict[str, list[RankProgress]] = {}
        for p in progress:
            by_job.setdefault(p.job, []).append(p)
        for job, ps in by_job.items():
            self.serve(job, agent)
            self.assembler.expect(job, [p.rank for p in ps])
            primary = [p for p in ps if self.assembler.primary_comm(job, p.rank) in (None, p.comm)]
            self.monitor(job).on_progress(primary)

    def run_of(self, aw: AssembledWindow) -> RunVerdict:
        """Whether a released window belongs to its job's current run, to a run a newer one
        replaced (`stale`: dropped), or starts a new run (`new`: the job is ended and
        scored afresh, `new_run`)."""
        m = self.monitor(aw.job, aw.run)
        if m.run == aw.run:
            return "current"
        if not m.run:
            m.run = aw.run  # made at the job's first hello, before any window
            return "current"
        if aw.run != self.assembler.run(aw.job):
            return "stale"
        return "new"

    def new_run(self, job: str, run: str, previous: JobMonitor) -> JobMonitor:
        """The fresh monitor of a job's new run (the old one already ended, `forget`)."""
        fresh = self.monitor(job, run)
        fresh.carry_over(previous)
        fresh.expect(self.assembler.expected(job))
        return fresh

    def ended(self, job: str, now: float) -> bool:
        """Every announced rank reported its ring finished and no window of the job is
        still being assembled, for `job_linger_s`: the job is over."""
        m = self.monitors[job]
        # The cheap tests first: this runs every tick, and a job's ranks are many.
        done = m.last_window >= 0 and not self.assembler.pending_of(job)
        if done:
            done = m.all_finished(self.assembler.expected(job))
        if not done:
            self._finished_at.pop(job, None)
            return False
        since = self._finished_at.setdefault(job, now)
        return now - since >= self.job_linger_s

    def forget(self, job: str, keep_assembly: bool = False) -> None:
        """Drop everything about a job (its end has been written)."""
        self._stored_job.pop(job, None)
        self._baseline_retry.pop(job, None)
        self.plan_control.pop(job, None)
        self.monitors.pop(job, None)
        self._finished_at.pop(job, None)
        if not keep_assembly:
            self.assembler.forget_job(job)
            self.agents.pop(job, None)

    def controls(self, job: str, controls: Sequence[Intent]) -> None:
        """Controls going out to the job's agents: its last plan control is kept for
        agents that come back (`connect`)."""
        for c in controls:
            if c.action == "plan":
                self.plan_control[job] = c.body

    def update_settings(self, settings: Settings) -> list[tuple[str, MonitorOutput]]:
        self.settings = settings
        return [(job, m.update_settings(settings)) for job, m in self.monitors.items()]

    # ------------------------------------------------------------------ baselines

    def baseline_due(self, job: str, now: float) -> bool:
        """Whether the job's baselines may be read now (a failed read waits)."""
        return self.baselines and now >= self._baseline_retry.get(job, 0.0)

    def baseline_failed(self, job: str, now: float) -> None:
        self._baseline_retry[job] = now + BASELINE_RETRY_S  # not compared meanwhile

    def baseline_read(self, job: str) -> None:
        self._baseline_retry.pop(job, None)

    # ------------------------------------------------------------------ store row

    def job_row(self, job: str, now: float, ended: bool = False) -> dict[str, Any] | None:
        """The keys of the job's store row that changed since the last one (the store
        merges them): per window its last window and time, not its hosts. None: no
        window scored yet."""
        m = self.monitors.get(job)
        if m is None or m.last_window < 0:
            return None
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
            info["islands"] = dict(Counter(m.islands().values()))
            fp = m.fingerprint()
            if fp is not None:
                info["fingerprint"] = fp.to_dict()
        # The hosts (a rank's, as announced) only when they may have changed: a
        # sort of a big job's hosts is not for every window.
        hosts_key = (m.run, m.host_count())
        if last.get("_hosts_key") != hosts_key:
            info["hosts"] = m.host_names()
            last["_hosts_key"] = hosts_key
        changed = {k: v for k, v in info.items() if last.get(k, ...) != v}
        last.update(changed)
        return changed

    # ------------------------------------------------------------------ state

    def begin(self) -> int:
        """A group of output lines starts: its sequence number (the intent's)."""
        self.out_seq += 1
        return self.out_seq

    def interrupted(self, job: str, seq: int, states: Iterable[Any]) -> bool:
        """At a restart, with the journal's last intent (`job`, `seq`): whether the saved
        states never saw that group through (a crash cut it short: its lines are cut
        back and written again). Takes the newest group number seen either way."""
        seen = {
            str(st.get("job")): int(st.get("out_seq", 0)) for st in states if isinstance(st, dict)
        }
        self.out_seq = max([0, *seen.values(), seq])
        return seen.get(job, 0) < seq

    def state(self, job: str, stopped: bool = False) -> dict[str, Any] | None:
        """The job's state to save (plain data), or None when the job has no assembly
        state. `stopped`: a clean shutdown's, not one after a window."""
        m = self.monitors.get(job)
        asm = self.assembler.snapshot([job]).get(job)
        if asm is None:
            return None
        gone = {(r, w) for j, r, w in self.unscored if j == job}
        if gone:
            # Released but not scored yet: the state must not say so, or a crash in
            # between would take their journaled summaries for resends.
            # (an item is [run, window] or [run, window, ranks still missing])
            kept = [it for it in asm["released"] if (it[0], it[1]) not in gone]
            front = max([it[1] for it in kept if it[0] == asm["run"]], default=-1)
            asm = {**asm, "released": kept, "front": front}
        st = JobState(
            job=job,
            monitor=None if m is None else m.state(),
            assembly=asm,
            # The last group of output lines this state has seen through (an intent
            # newer than it was cut short by a crash: `interrupted`).
            out_seq=self.out_seq,
            plan_control=self.plan_control.get(job),
            stopped=stopped,
        )
        return plain(st)

    def restore(self, state: Mapping[str, Any]) -> JobMonitor | None:
        """One job's saved state back (`state`); its monitor, if it had one. Raises
        (KeyError, ValueError, TypeError) on a state it cannot read: a field of the wrong
        type is named (msgspec.ValidationError, a ValueError). The monitor is read after
        the assembly is taken back (detect/state.py JobState)."""
        st = read(state, JobState)
        self.assembler.restore({st.job: st.assembly})
        if st.plan_control is not None:
            self.plan_control[st.job] = st.plan_control
        if st.monitor is None:
            return None
        m = JobMonitor.restore(st.monitor, self.settings, dump_wait_s=self.dump_wait_s)
        self.adopt(m)
        return m
