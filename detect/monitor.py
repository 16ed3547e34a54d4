"""`JobMonitor`: the pure core of one job.

It owns the job's detector, its rebalance policy, the missing-rank rule,
hang tracking and the job's incidents (detect/incidents.py). The caller
feeds it what arrives (a window's columns, the ranks' progress, plan
acknowledgements, dump paths) and `now`, a monotonic reading, and forwards
what it returns (`MonitorOutput`): findings, plan events, incident records and
control intents for the agents. Wall times (unix s) for the incident records
come in as `wall`, read by the shell. No sockets, files or clocks, so the
coordinator daemon (one monitor per job) and the in-process detector run the
same class. Its whole state serialises (`snapshot`, `JobMonitor.restore`), so a
restarted coordinator carries on where the last one stopped: a persistent
straggler stays `ongoing` with its `since`, and an applied plan stays in force
and is still verified.

This module is also the one place the coordinator's core imports the rebalance
policy from (its file and metric outputs, rebalance/outputs.py, are the shell's).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec
import numpy as np
from artemis.detect import findings as F
from artemis.detect.baselines import BaselineBook
from artemis.detect.clockrate import correct_rates, reported
from artemis.detect.detector import Detector, LateResult, WindowResult
from artemis.detect.findings import Finding
from artemis.detect.fingerprint import JobFingerprint
from artemis.detect.hang import HangVerdict, check_hang
from artemis.detect.incident_record import no_action
from artemis.detect.incidents import IncidentBook, WindowView
from artemis.detect.settings import Settings
from artemis.detect.state import (
    FingerprintsState,
    HangState,
    MonitorState,
    VerdictState,
    plain,
    read,
)
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import RankProgress, RankWindow
from artemis.rebalance.policy import PlanEvent, PolicySettings, RebalancePolicy

__all__ = [
    "Intent",
    "JobMonitor",
    "MonitorOutput",
    "PlanEvent",
    "PolicySettings",
]

SNAPSHOT_VERSION = 1
# How long a hang restored with its dumps outstanding waits for them (at least
# dump_wait_s): the agents must reconnect first, at their back-off (under a second
# after a long healthy session, up to 30 s after short ones: protocol/client.py), and
# are asked again as they do; the report is not held for the slowest.
RESTORED_DUMP_WAIT_S = 20.0


@dataclass(frozen=True)
class Intent:
    """A control message the agents of the job must get: `plan` or `dump`."""

    action: str
    body: dict[str, Any]


@dataclass
class MonitorOutput:
    findings: list[Finding] = field(default_factory=list)
    plans: list[PlanEvent] = field(default_factory=list)
    controls: list[Intent] = field(default_factory=list)
    result: WindowResult | None = None  # the scored window, for metrics
    # Incident records that changed (docs/DESIGN.md "Incidents"), and the per-window
    # rows (job bands, subjects of open incidents) a store keeps to redraw them.
    incidents: list[dict[str, Any]] = field(default_factory=list)
    incident_rows: list[dict[str, Any]] = field(default_factory=list)
    # Device-clock anomalies of the window, by reason: the agents' counts and the
    # wrong-rate ranks corrected here (detect/clockrate.py).
    clock: dict[str, int] = field(default_factory=dict)

    def extend(self, other: MonitorOutput) -> MonitorOutput:
        self.findings += other.findings
        self.plans += other.plans
        self.controls += other.controls
        self.incidents += other.incidents
        self.incident_rows += other.incident_rows
        return self


@dataclass
class _Hang:
    verdict: HangVerdict
    window: int
    requested_at: float | None  # None: restored from a snapshot (another clock)
    expected: list[int]
    dumps: dict[int, str] = field(default_factory=dict)
    reported: bool = False
    restored: bool = False  # its dump wait is RESTORED_DUMP_WAIT_S


class JobMonitor:
    """Everything the coordinator knows and decides about one job (one run of it)."""

    def __init__(
        self,
        job: str,
        settings: Settings,
        *,
        run: str = "",
        nranks: int = 1,
        global_batch: int | None = None,
        dump_wait_s: float = 5.0,
        islands: Mapping[int, str] | None = None,
        classes: Mapping[int, str] | None = None,
        island_order: Sequence[str] | None = None,
        detector: type[Detector] = Detector,
    ) -> None:
        self.job = job
        self.run = run
        self.settings = settings
        self.global_batch = global_batch
        self.dump_wait_s = dump_wait_s
        # `detector`: the class that scores (a test may tap it: tests/test_detector_sim.py)
        self.detector = detector(
            settings,
            job,
            max(1, nranks),
            islands=islands,
            classes=classes,
            island_order=island_order,
        )
        self.policy: RebalancePolicy | None = None  # made at the first window (its steps)
        self._resized: list[PlanEvent] = []  # plan events of a resize, out with the next window
        self.window_steps = 0
        self.last_window = -1
        self.step_ms: float | None = None
        self.missing_since: int | None = None
        # To place a hang (a collective index) in windows and steps.
        self.colls_per_step: int | None = None
        self.hosts: dict[int, str] = {}  # announced (hello, heartbeats)
        self.progress: dict[int, RankProgress] = {}
        self.hang: _Hang | None = None
        self.incidents = IncidentBook(job, run=run, flag_window=settings.flag_window)
        # rank -> (software dict, workload signature): each rank's last fingerprint
        self.fingerprints: dict[int, tuple[dict[str, Any], str | None]] = {}
        self._software: dict[str, dict[str, Any]] = {}  # interned software dicts
        # The job against the stored baselines of its workload (detect/baselines.py).
        self.baselines = BaselineBook(job, settings, run=run)
        # fingerprints changed since the baselines were told (a job-wide combine
        # is a pass over every rank: only when something changed)
        self._fp_version = 0
        self._fp_told: tuple[int, int] | None = None

    @property
    def nranks(self) -> int:
        return self.detector.nranks

    # ------------------------------------------------------------------ for the shell

    def use_baselines(self, on: bool) -> None:
        self.baselines.enabled = on  # off: no store to read the workload's baselines from

    @property
    def software_hash(self) -> str | None:
        return self.baselines.software_hash  # the job's own baseline's key, once known

    def carry_over(self, previous: JobMonitor) -> None:
        """A new run on the same processes keeps their hosts and fingerprints (sent once)."""
        self.hosts.update(previous.hosts)
        self.fingerprints.update(previous.fingerprints)

    def all_finished(self, ranks: Iterable[int]) -> bool:
        ranks = list(ranks)
        return bool(ranks) and all(r in self.progress and self.progress[r].finished for r in ranks)

    def islands(self) -> dict[int, str]:
        return self.detector.islands()

    def host_count(self) -> int:
        return len(self.hosts)

    def host_names(self) -> list[str]:
        return sorted(set(self.hosts.values()))

    def open_findings(self) -> int:
        return len(self.detector.active())

    # ------------------------------------------------------------------ inputs

    def expect(self, ranks: Iterable[int], host: str | None = None) -> None:
        """Ranks announced for the job (an agent's hello); the job grows to hold them."""
        ranks = list(ranks)
        if ranks:
            self.resize(max(ranks) + 1)
        if host:
            for r in ranks:
                self.hosts[r] = host

    def resize(self, nranks: int) -> None:
        """More ranks than known: the detector grows in place, keeping tracks and
        baselines; the policy keeps its history, and a plan made for the old rank
        count ends with an event that says why (a job of another size ignores it:
        rebalance/README.md). Those events go out with the next window's output."""
        if nranks <= self.detector.nranks:
            return
        self.detector.resize(nranks)
        if self.policy is not None and self.policy.nranks < nranks:
            self._resized += self.policy.resize(nranks)

    def on_window(
        self,
        window: int,
        cols: WindowColumns | Sequence[RankWindow],
        missing: Sequence[int] = (),
        *,
        final: bool = False,
        wall: float | None = None,
    ) -> MonitorOutput:
        """Score one assembled window. `final`: the coordinator is shutting down and the
        window is partial by nature, so an absent rank there is not evidence it went
        missing. `wall`: the wall time (unix s) for the incident records. A window at
        or before the last one scored is refused (empty output)."""
        if not isinstance(cols, WindowColumns):
            cols = WindowColumns.from_records(cols)
        if window <= self.last_window:
            return MonitorOutput()
        clock = reported(cols)
        cols, rates = correct_rates(cols)
        if rates:
            clock["rate"] = len(rates)
        ranks = cols.ints("rank")
        top = max(int(ranks.max()) if ranks.size else -1, max(missing, default=-1))
        self.resize(top + 1)
        if self.policy is None and cols.n:
            self.window_steps = max(1, int(np.median(cols.ints("step_hi") - cols.ints("step_lo"))))
            self.policy = self._new_policy(self.nranks)
        res = self.detector.score_window(window, cols, missing)
        out = MonitorOutput(findings=list(res.findings), result=res, clock=clock)
        if self._resized:
            out.plans += self._resized
            out.controls += self._plan_controls(self._resized)
            self._resized = []
        if not final:
            out.findings += self._missing(res)
        self.last_window = window
        self._learn_steps(cols)
        if res.step_ms == res.step_ms:
            self.step_ms = res.step_ms
        # Against the stored baseline of the workload: the ranks a finding is about are
        # left out of their class's medians (a straggler is not the whole class).
        self.baselines.run = self.run
        slow = {
            int(f.rank)
            for f in out.findings
            if f.kind in F.RANK_KINDS and f.rank is not None and f.state != "cleared"
        }
        slow.update(self.incidents.open_ranks())
        out.findings += self.baselines.on_window(
            window, cols, res.step_ms if res.step_ms == res.step_ms else None, slow
        )
        # The incidents first: a flag confirmed in this window reaches the policy now.
        self.incidents.run = self.run
        self.incidents.on_window(self._view(window, cols, res, wall), out.findings)
        # A healthy window (no finding line of any kind, no incident open) may feed the
        # job's baseline, once confirmed (detect/baselines.py).
        self.baselines.after_window(
            window, healthy=not final and not out.findings and not self.incidents.any_open()
        )
        self.incidents.on_plans(out.plans, window=window)
        # With rebalancing off the policy is not fed: it saves its per-rank history
        # (about 190 B a rank) and its time per window; plans start a few windows after
        # a switch to recommend or apply.
        if self.policy is not None and cols.n and self.policy.mode != "off":
            planned = self._plan_window(window, cols, res)
            self.incidents.on_plans(planned.plans, window=window)
            out.extend(planned)
        return self._incidents_out(out)

    def on_late(
        self,
        window: int,
        cols: WindowColumns | Sequence[RankWindow],
        *,
        wall: float | None = None,
    ) -> tuple[MonitorOutput, LateResult]:
        """Late summaries of a window already scored (its deadline passed with these
        ranks missing): judged against that window's own peers (Detector.score_late),
        their findings carry that window. Their incidents follow; the policy and the
        missing-rank rule do not (they act on the job as it is now)."""
        if not isinstance(cols, WindowColumns):
            cols = WindowColumns.from_records(cols)
        ranks = cols.ints("rank")
        if ranks.size:
            self.resize(int(ranks.max()) + 1)
        late = self.detector.score_late(window, cols)
        res = late.result
        if res is None:
            return MonitorOutput(), late
        out = MonitorOutput(findings=list(res.findings), result=res)
        # the window as the incidents read it: the late rows (their quartiles and
        # telemetry) with the peers it kept
        assert late.union is not None
        view = self._view(window, self.detector.late_columns(window), late.union, wall)
        self.incidents.run = self.run
        for f in out.findings:
            self.incidents.on_finding(f, view)
        return self._incidents_out(out), late

    def on_progress(self, progress: Iterable[RankProgress]) -> None:
        """Where ranks stand now (heartbeats), on the communicator each is judged on."""
        for p in progress:
            self.progress[p.rank] = p
            if p.host:
                self.hosts.setdefault(p.rank, p.host)

    def on_ack(self, plan_id: str, rank: int, step: int | None) -> MonitorOutput:
        if self.policy is None:
            return MonitorOutput()
        events = self.policy.on_ack(plan_id, rank, step)
        self.incidents.on_plans(events, window=self.last_window)
        return self._incidents_out(
            MonitorOutput(plans=events, controls=self._plan_controls(events))
        )

    def on_fingerprint(self, rank: int, software: Mapping[str, Any], workload: str | None) -> bool:
        """A rank's software fingerprint and workload signature (its agent sends them once
        and again when they change); True when that changed what the monitor held."""
        # Ranks share their software: one dict per distinct fingerprint (interned), so
        # a 100k-rank job holds (and snapshots) a handful of them, not one per rank.
        key = json.dumps(software, sort_keys=True, separators=(",", ":"))
        sw = self._software.setdefault(key, dict(software))
        new = (sw, workload)
        if self.fingerprints.get(rank) == new:
            return False
        self.fingerprints[rank] = new
        self._fp_version += 1
        return True

    def fingerprint(self) -> JobFingerprint | None:
        """The job's fingerprint (detect/fingerprint.py) once every rank of the job
        has sent its own, else None."""
        n = self.nranks
        if any(r not in self.fingerprints for r in range(n)):
            return None
        fps = {r: self.fingerprints[r] for r in range(n)}
        return JobFingerprint.of(
            {r: fp[0] for r, fp in fps.items()},
            {r: fp[1] for r, fp in fps.items()},
            n,
        )

    # ------------------------------------------------------------------ baselines

    def baseline_wanted(self) -> list[tuple[str, str]]:
        """(workload, hardware class) pairs whose stored baselines the shell should read
        and hand to `on_baselines`: none until the job's fingerprint is known (every
        rank's, with its workload signature); a changed fingerprint asks again."""
        # A rank's new fingerprint, or more ranks (a late agent's hello): the job's
        # fingerprint may have changed (its workload hash has the rank count).
        seen = (self._fp_version, self.nranks)
        if self._fp_told != seen:
            fp = self.fingerprint()
            if fp is not None and fp.workload is not None:
                self.baselines.identify(fp.workload, fp.software)
                self._fp_told = seen
        return self.baselines.wanted()

    def on_baselines(
        self, hw_class: str, latest: Mapping[str, Any] | None, own: Mapping[str, Any] | None
    ) -> None:
        """The store's baselines for one class of the job (`baseline_wanted`): the latest
        of (workload, class), what the job is judged by, and the one of the job's own
        software fingerprint (None: there is none)."""
        self.baselines.settle(hw_class, latest, own)

    def baseline_records(self, wall: float | None = None) -> list[dict[str, Any]]:
        """The baselines to store (the job's end): per class, its confirmed healthy
        windows added to the stored baseline of its fingerprint."""
        return self.baselines.records(wall)

    def on_dump(self, rank: int, path: str) -> bool:
        """A rank's dump (hang evidence) was written at `path`. True when it joined a hang
        not reported yet (state the shell saves: a restart reports the hang with it)."""
        h = self.hang
        if h is None:
            return False
        h.dumps[rank] = path
        return not h.reported

    def dumps_wanted(self, ranks: Iterable[int]) -> list[int]:
        """Of `ranks`, those whose dump a hang not reported yet still waits for: asked
        again of an agent that connects (it may never have had the request, or lost it
        in a restart)."""
        h = self.hang
        if h is None or h.reported:
            return []
        return sorted(set(ranks) & (set(h.expected) - set(h.dumps)))

    def tick(self, now: float) -> MonitorOutput:
        """Periodic: look for a hang; report one once its dumps are in or overdue."""
        out = MonitorOutput()
        if self.hang is None and len(self.progress) >= 2:
            v = check_hang(list(self.progress.values()), self.step_ms, self.settings)
            if v is not None:
                ranks = sorted(self.progress)
                self.hang = _Hang(v, self._hang_window(v), now, ranks)
                out.controls.append(Intent("dump", {"job": self.job, "ranks": ranks}))
        h = self.hang
        if h is not None and not h.reported:
            if h.requested_at is None:
                h.requested_at = now  # restored: the wait starts again on this clock
            wait = max(self.dump_wait_s, RESTORED_DUMP_WAIT_S) if h.restored else self.dump_wait_s
            if set(h.dumps) >= set(h.expected) or now - h.requested_at >= wait:
                f = self._hang_finding()
                out.findings.append(f)
                self.incidents.on_finding(f)
        return self._incidents_out(out)

    def finish(self, wall: float | None = None) -> MonitorOutput:
        """The job's end (or the coordinator's): report a hang still waiting for its
        dumps, and close every open incident (`job_end`) with its verdict."""
        out = MonitorOutput()
        if self.hang is not None and not self.hang.reported:
            f = self._hang_finding()
            out.findings.append(f)
            self.incidents.on_finding(f)
        self.incidents.close_all(self.last_window, wall, no_action(self.policy))
        return self._incidents_out(out)

    def update_settings(self, settings: Settings) -> MonitorOutput:
        """Live settings: the detector's and the policy's, from the next window on."""
        self.settings = settings
        self.detector.update_settings(settings)
        self.incidents.flag_window = max(1, settings.flag_window)
        self.baselines.settings = settings
        out = MonitorOutput()
        if self.policy is not None:
            self.policy.update_settings(self._policy_settings(settings))
            if self.policy.mode != settings.rebalance:
                events = self.policy.set_mode(settings.rebalance)
                out.plans += events
                out.controls += self._plan_controls(events)
                self.incidents.on_plans(events, window=self.last_window)
        return self._incidents_out(out)

    # ------------------------------------------------------------------ incidents

    def _incidents_out(self, out: MonitorOutput) -> MonitorOutput:
        recs, rows = self.incidents.take()
        out.incidents += recs
        out.incident_rows += rows
        return out

    def _view(
        self, window: int, cols: WindowColumns, res: WindowResult, wall: float | None
    ) -> WindowView:
        step_ms = res.step_ms if res.step_ms == res.step_ms else None
        samples = cols.floats("samples")
        batch: float | None = None
        if cols.n and bool(np.isfinite(samples).all()):
            batch = float(samples.sum())
        elif self.global_batch is not None:
            batch = float(self.global_batch)
        return WindowView(
            window=window,
            time=wall,
            cols=cols,
            ranks=res.ranks,
            pace=res.pace_values,
            islands=res.island_labels,
            step_ms=step_ms,
            samples_per_s=None if batch is None or not step_ms else batch / step_ms * 1000.0,
            gpus=self.settings.gpu_count or self.nranks,
        )

    # ------------------------------------------------------------------ rules

    def _missing(self, res: WindowResult) -> list[Finding]:
        """Ranks that stopped reporting (an agent or a node gone): a `missing` finding
        when they go, `ongoing` while they stay away, `cleared` when they are back."""
        if res.missing:
            state = "flagged" if self.missing_since is None else "ongoing"
            if self.missing_since is None:
                self.missing_since = res.window
            known = {**self.detector.hosts(), **self.hosts}
            hosts = sorted({known[r] for r in res.missing if r in known})
            ranks, since = list(res.missing), self.missing_since
        elif self.missing_since is not None:
            state, ranks, hosts, since = "cleared", [], [], self.missing_since
            self.missing_since = None
        else:
            return []
        return [
            F.missing_finding(
                job=self.job,
                state=state,
                window=res.window,
                steps=res.steps,
                ranks=ranks,
                hosts=hosts,
                since=since,
            )
        ]

    def _learn_steps(self, cols: WindowColumns) -> None:
        steps = cols.ints("step_hi") - cols.ints("step_lo")
        colls = cols.ints("coll_hi") - cols.ints("coll_lo")
        ok = np.flatnonzero((steps > 0) & (colls % np.maximum(steps, 1) == 0))
        if ok.size:
            i = int(ok[0])
            self.colls_per_step = int(colls[i] // steps[i])
            self.window_steps = max(self.window_steps, int(steps[i]))

    def _hang_window(self, v: HangVerdict) -> int:
        if self.colls_per_step and self.window_steps:
            return v.collective // (self.colls_per_step * self.window_steps)
        return max(self.last_window, 0)

    def _hang_finding(self) -> Finding:
        h = self.hang
        assert h is not None
        h.reported = True
        steps = None
        if self.colls_per_step:
            step = h.verdict.collective // self.colls_per_step
            steps = [step, step + 1]
        return F.hang_finding(
            h.verdict,
            job=self.job,
            window=h.window,
            steps=steps,
            dumps=[h.dumps[r] for r in sorted(h.dumps)],
            hosts={**self.detector.hosts(), **self.hosts},
            islands=self.detector.islands(),
        )

    # ------------------------------------------------------------------ policy

    def _policy_settings(self, settings: Settings) -> PolicySettings:
        return PolicySettings.from_settings(settings, window_steps=max(1, self.window_steps))

    def _new_policy(self, nranks: int) -> RebalancePolicy:
        return RebalancePolicy(
            self._policy_settings(self.settings), nranks, self.global_batch, job=self.job
        )

    def _plan_window(self, window: int, cols: WindowColumns, res: WindowResult) -> MonitorOutput:
        assert self.policy is not None
        # Per-rank arrays (NaN: not measured), no per-rank Python objects at scale.
        n = self.policy.nranks
        r = cols.ints("rank")
        keep = (r >= 0) & (r < n)
        gap = np.full(n, np.nan)
        gap[r[keep]] = cols.floats("gap_ms")[keep]
        samples = np.full(n, np.nan)
        samples[r[keep]] = cols.floats("samples")[keep]
        # Only confirmed incidents reach the policy (docs/DESIGN.md "Incidents"); a window
        # with an unconfirmed one open is not healthy either: it never feeds the
        # policy's throughput baseline.
        allowed = [f for f in res.findings if self.incidents.allows(f)]
        events = self.policy.on_window(
            window,
            allowed,
            gap,
            res.step_ms if res.step_ms == res.step_ms else None,
            samples,
            step_lo=int(cols.ints("step_lo").min()),
            step_hi=int(cols.ints("step_hi").max()),
            held=len(allowed) < len(res.findings),
            missing=res.missing,
        )
        return MonitorOutput(plans=events, controls=self._plan_controls(events))

    def _plan_controls(self, events: Iterable[PlanEvent]) -> list[Intent]:
        return [
            Intent("plan", {"job": self.job, "plan": ev.control})
            for ev in events
            if ev.control is not None
        ]

    # ------------------------------------------------------------------ state

    def state(self) -> MonitorState:
        """The whole state (detect/state.py)."""
        h = self.hang
        return MonitorState(
            version=SNAPSHOT_VERSION,
            job=self.job,
            run=self.run,
            global_batch=self.global_batch,
            window_steps=self.window_steps,
            last_window=self.last_window,
            step_ms=self.step_ms,
            missing_since=self.missing_since,
            colls_per_step=self.colls_per_step,
            hosts=self.hosts,
            detector=self.detector.state(),
            incidents=self.incidents.state(),
            baselines=self.baselines.state(),
            policy=None if self.policy is None else self.policy.snapshot(binary=True),
            fingerprints=self._fingerprints_state(),
            # A hang from its verdict on (the dump request): one whose dumps are still
            # coming is reported by the restarted coordinator (it may never see the hang
            # again: the ranks it needs may have ended or be out of reach by then), one
            # already reported is not reported twice.
            hang=None
            if h is None
            else HangState(
                verdict=VerdictState(**asdict(h.verdict)),
                window=h.window,
                dumps=h.dumps,
                expected=h.expected,
                reported=h.reported,
            ),
        )

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data (msgpack-able)."""
        return plain(self.state())

    def _fingerprints_state(self) -> FingerprintsState:
        """The ranks' fingerprints with each distinct software dict once."""
        index: dict[int, int] = {}
        pool: list[dict[str, Any]] = []
        ranks: list[tuple[int, int, str | None]] = []
        for r, (sw, wl) in self.fingerprints.items():
            i = index.get(id(sw))
            if i is None:
                i = index[id(sw)] = len(pool)
                pool.append(sw)
            ranks.append((r, i, wl))
        return FingerprintsState(software=pool, ranks=ranks)

    @classmethod
    def restore(
        cls,
        state: Mapping[str, Any] | MonitorState,
        settings: Settings,
        *,
        dump_wait_s: float = 5.0,
        islands: Mapping[int, str] | None = None,
        classes: Mapping[int, str] | None = None,
        island_order: Sequence[str] | None = None,
    ) -> JobMonitor:
        """A monitor from `snapshot()`, under the caller's `settings` (which may have changed
        while it was down: apply `update_settings` after, to report a mode change). Raises
        ValueError on an unknown version, msgspec.ValidationError (a ValueError) naming a
        field of the wrong type."""
        version = state.version if isinstance(state, MonitorState) else state.get("version")
        if version != SNAPSHOT_VERSION:
            raise ValueError(f"job monitor snapshot version {version!r} is unknown")
        st = read(state, MonitorState)
        m = cls(
            st.job,
            settings,
            run=st.run,
            nranks=st.detector.nranks,
            global_batch=st.global_batch,
            dump_wait_s=dump_wait_s,
            islands=islands,
            classes=classes,
            island_order=island_order,
        )
        m.detector.restore_state(st.detector)
        m.window_steps = st.window_steps
        m.last_window = st.last_window
        m.step_ms = st.step_ms
        m.missing_since = st.missing_since
        m.colls_per_step = st.colls_per_step
        m.hosts = st.hosts
        if st.incidents is not None:
            m.incidents = IncidentBook.restore(st.incidents, flag_window=settings.flag_window)
        for r, i, wl in st.fingerprints.ranks if st.fingerprints else ():
            m.on_fingerprint(r, st.fingerprints.software[i], wl)
        if st.baselines is not None:
            m.baselines = BaselineBook.restore(st.baselines, settings)
        if st.policy is not None:
            m.policy = RebalancePolicy.restore(st.policy, m._policy_settings(m.settings))
        h = st.hang
        if h is not None:
            verdict = HangVerdict(**msgspec.structs.asdict(h.verdict))
            m.hang = _Hang(
                verdict,
                h.window,
                None,  # the dump wait starts again at the first tick
                sorted(verdict.last_done if h.expected is None else h.expected),
                h.dumps,
                reported=h.reported,
                restored=True,
            )
        return m
