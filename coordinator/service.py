"""The coordinator: a thin asyncio shell around assembly, the detector and the policy.

`Coordinator` is the protocol server's app. Window summaries go into the
assembler; every window it releases (complete, or at its deadline with the
absent ranks missing) is scored once by the job's `Detector`, written to the
findings JSONL, mirrored in Prometheus, and handed to the rebalance policy,
whose plan events go to the plans JSONL and, in `apply` mode, to the agents as
control messages. Heartbeats carry each rank's progress for hang detection; a
hang triggers dump requests, and the hang finding names the dump files.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from artemis.coordinator.assembly import AssembledWindow, WindowAssembler
from artemis.coordinator.detector import Detector, WindowResult
from artemis.coordinator.findings import Finding, FindingsWriter
from artemis.coordinator.hang import HangVerdict, check_hang, hang_finding
from artemis.coordinator.journal import AssemblyJournal
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.settings import Settings
from artemis.protocol.messages import Dump, Heartbeat, Message, Windows
from artemis.protocol.records import RankProgress
from artemis.protocol.server import NotConnected, PeerInfo
from artemis.rebalance.outputs import PlanMetrics, PlansWriter, register_plan_metrics
from artemis.rebalance.policy import PlanEvent, PolicySettings, RebalancePolicy

log = structlog.get_logger("artemis.coordinator")


@dataclass
class HangCase:
    verdict: HangVerdict
    window: int
    requested_at: float
    expected: set[int]
    dumps: dict[int, str] = field(default_factory=dict)
    reported: bool = False


@dataclass
class JobState:
    job: str
    detector: Detector | None = None
    policy: RebalancePolicy | None = None
    agents: set[str] = field(default_factory=set)
    hosts: dict[int, str] = field(default_factory=dict)
    progress: dict[int, RankProgress] = field(default_factory=dict)
    step_ms: float | None = None
    last_window: int = -1
    hang: HangCase | None = None
    missing_since: int | None = None
    # From whole windows, to place a hang (a collective index) in windows and steps.
    colls_per_step: int | None = None
    steps_per_window: int = 0


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.journal = journal
        self.global_batch = global_batch
        self.settings = settings
        self.findings = findings
        self.plans = plans
        self.metrics = metrics
        self.plan_metrics: PlanMetrics = register_plan_metrics(metrics.registry)
        self.assembler = WindowAssembler(deadline_s=deadline_s, grace_s=grace_s)
        self.dump_wait_s = dump_wait_s
        self.clock = clock
        self.jobs: dict[str, JobState] = {}
        self.server: Any = None  # ProtocolServer, set by serve()
        self.dump_dir = findings.path.parent / (findings.path.stem + ".dumps")
        self._outbox: list[tuple[str, str, dict[str, Any]]] = []  # (job, action, body)

    # ------------------------------------------------------------------ app hooks
    def on_connect(self, peer: PeerInfo) -> None:
        for r in peer.ranks:
            js = self._job(r.job)
            js.agents.add(peer.agent_id)
            js.hosts[r.rank] = peer.host
            self.assembler.expect(r.job, [r.rank])
        log.info("agent connected", agent=peer.agent_id, host=peer.host, ranks=len(peer.ranks))

    def on_disconnect(self, peer: PeerInfo) -> None:
        log.info("agent disconnected", agent=peer.agent_id, host=peer.host)

    async def on_message(self, peer: PeerInfo, msg: Message) -> None:
        now = self.clock()
        if isinstance(msg, Windows):
            if self.journal is not None:
                self.journal.added(msg.columns)  # before the ack: see journal.py
            released: list[AssembledWindow] = []
            for w in msg.windows:
                js = self._job(w.job)
                js.agents.add(peer.agent_id)
                js.hosts[w.rank] = peer.host
                released.extend(self.assembler.add(w, now))
            for aw in released:
                self._score(aw)
        elif isinstance(msg, Heartbeat):
            for p in msg.progress:
                js = self._job(p.job)
                js.agents.add(peer.agent_id)
                js.hosts.setdefault(p.rank, peer.host)
                self.assembler.expect(p.job, [p.rank])
                if self._primary(p):
                    js.progress[p.rank] = p
            for a in msg.plan_acks:
                self._plan_ack(a)
            # Hangs are checked on the tick, once for all ranks, not per heartbeat.
        elif isinstance(msg, Dump):
            self._dump(msg)
        await self._flush_controls()

    # ------------------------------------------------------------------ periodic
    async def tick(self) -> None:
        now = self.clock()
        for aw in self.assembler.expire(now):
            self._score(aw)
        self._check_hangs(now)
        await self._flush_controls()

    def flush(self) -> None:
        """Shutdown: score whatever is still pending, close outputs."""
        # Windows still open at shutdown are partial by nature (ranks sitting in a
        # collective that never ended, agents not done): score what they hold,
        # but an absent rank there is not evidence that it went missing.
        for aw in self.assembler.flush():
            self._score(aw, final=True)
        for js in self.jobs.values():
            if js.hang is not None and not js.hang.reported:
                self._report_hang(js)
        self.findings.close()
        self.plans.close()
        if self.journal is not None:
            self.journal.close()

    # ------------------------------------------------------------------ settings
    def set_setting(self, key: str, value: str) -> Settings:
        new = self.settings.set(key, value)
        self.settings = new
        for js in self.jobs.values():
            if js.detector is not None:
                js.detector.update_settings(new)
            if js.policy is not None and js.policy.mode != new.rebalance:
                self._plan_events(js, js.policy.set_mode(new.rebalance))
        log.info("setting changed", key=key, value=getattr(new, key))
        return new

    # ------------------------------------------------------------------ scoring
    def _job(self, job: str) -> JobState:
        js = self.jobs.get(job)
        if js is None:
            js = self.jobs[job] = JobState(job)
        return js

    def _primary(self, p: RankProgress) -> bool:
        cur = self.assembler.primary_comm(p.job, p.rank)
        return cur is None or cur == p.comm

    def restore(self, journal: AssemblyJournal) -> int:
        """Take back what an earlier life of this coordinator took but never scored."""
        pending, released = journal.load()
        self.assembler.mark_released(released)
        now = self.clock()
        for w in pending:
            js = self._job(w.job)
            js.hosts[w.rank] = w.host
            for aw in self.assembler.add(w, now):
                self._score(aw)
        journal.open(self.assembler.pending_windows(), self.assembler.released_keys())
        self.journal = journal
        if pending:
            log.info("assembly journal replayed", summaries=len(pending))
        return len(pending)

    def _score(self, aw: AssembledWindow, final: bool = False) -> None:
        self._score_window(aw, final)
        # Marked scored only once its findings are written.
        if self.journal is not None and self.journal.released(aw.job, aw.window):
            self.journal.open(self.assembler.pending_windows(), self.assembler.released_keys())

    def _score_window(self, aw: AssembledWindow, final: bool) -> None:
        js = self._job(aw.job)
        expected = self.assembler.expected(aw.job)
        nranks = max([*expected, *(r.rank for r in aw.ranks)], default=-1) + 1
        if js.detector is None or js.detector.nranks < nranks:
            js.detector = Detector(self.settings, aw.job, nranks, hosts=js.hosts)
            ws = (aw.ranks[0].step_hi - aw.ranks[0].step_lo) if aw.ranks else 50
            js.policy = RebalancePolicy(
                PolicySettings.from_settings(self.settings, window_steps=max(1, ws)),
                nranks,
                self.global_batch,
            )
        t0 = time.perf_counter()
        res = js.detector.score_window(aw.window, aw.ranks, aw.missing)
        dt = time.perf_counter() - t0
        if not final:
            res.findings.extend(self._missing_findings(js, res))
        self.findings.write(res.findings)
        self.metrics.observe_window(res, dt)
        self.metrics.set_active(True)
        js.last_window = max(js.last_window, aw.window)
        for r in aw.ranks:
            steps = r.step_hi - r.step_lo
            if steps > 0 and (r.coll_hi - r.coll_lo) % steps == 0:
                js.colls_per_step = (r.coll_hi - r.coll_lo) // steps
                js.steps_per_window = max(steps, js.steps_per_window)
                break
        if res.step_ms == res.step_ms:
            js.step_ms = res.step_ms
        if js.policy is not None:
            gap = {r.rank: r.gap_ms for r in aw.ranks if math.isfinite(r.gap_ms)}
            samples = {r.rank: r.samples for r in aw.ranks}
            lo = min((r.step_lo for r in aw.ranks), default=None)
            hi = max((r.step_hi for r in aw.ranks), default=None)
            events = js.policy.on_window(
                aw.window,
                res.findings,
                gap,
                res.step_ms if res.step_ms == res.step_ms else None,
                samples,
                step_lo=lo,
                step_hi=hi,
            )
            self._plan_events(js, events)

    def _missing_findings(self, js: JobState, res: WindowResult) -> list[Finding]:
        """Ranks that stopped reporting (an agent or a node gone): a `missing` finding."""
        steps = res.steps or []
        if res.missing:
            state = "flagged" if js.missing_since is None else "ongoing"
            if js.missing_since is None:
                js.missing_since = res.window
            hosts = sorted({js.hosts[r] for r in res.missing if r in js.hosts})
            return [
                Finding(
                    kind="missing",
                    state=state,
                    window=res.window,
                    steps=list(steps),
                    island=None,
                    rank=res.missing[0] if len(res.missing) == 1 else None,
                    ranks=list(res.missing),
                    hosts=hosts,
                    since=js.missing_since,
                    ratio=None,
                    z=None,
                    history=None,
                    drift=None,
                    excess_ms=None,
                    loss_pct=None,
                    confidence="progress",
                    signal="progress",
                    basis="progress",
                    missing=[f"rank {r}" for r in res.missing],
                    evidence={"reason": "no window summary within the assembly deadline"},
                    cause=None,
                )
            ]
        if js.missing_since is not None:
            since, js.missing_since = js.missing_since, None
            return [
                Finding(
                    kind="missing",
                    state="cleared",
                    window=res.window,
                    steps=list(steps),
                    island=None,
                    rank=None,
                    ranks=[],
                    hosts=[],
                    since=since,
                    ratio=None,
                    z=None,
                    history=None,
                    drift=None,
                    excess_ms=None,
                    loss_pct=None,
                    confidence="progress",
                    signal="progress",
                    basis="progress",
                    missing=[],
                    evidence=None,
                    cause=None,
                )
            ]
        return []

    # ------------------------------------------------------------------ plans
    def _plan_events(self, js: JobState, events: list[PlanEvent]) -> None:
        for ev in events:
            self.plans.write(ev)
            self.plan_metrics.observe(ev)
            if ev.escalate:
                log.warning(
                    "rebalance plan failed: escalating",
                    plan=ev.id,
                    rank=ev.rank,
                    status=ev.status,
                    reason=ev.reason,
                )
            else:
                log.info("rebalance plan", plan=ev.id, status=ev.status, reason=ev.reason)
            if ev.control is not None:
                self._outbox.append((js.job, "plan", {"job": js.job, "plan": ev.control}))

    def _plan_ack(self, a: dict[str, Any]) -> None:
        js = self.jobs.get(str(a.get("job", "")))
        if js is None or js.policy is None:
            return
        try:
            events = js.policy.on_ack(str(a["plan_id"]), int(a["rank"]), a.get("step"))
        except (KeyError, TypeError, ValueError):
            log.warning("bad plan ack", ack=a)
            return
        self._plan_events(js, events)

    # ------------------------------------------------------------------ hangs
    def _check_hangs(self, now: float) -> None:
        for js in self.jobs.values():
            if js.hang is None and len(js.progress) >= 2:
                v = check_hang(list(js.progress.values()), js.step_ms, self.settings)
                if v is not None:
                    window = max(js.last_window, 0)
                    if js.colls_per_step and js.steps_per_window:
                        window = v.collective // (js.colls_per_step * js.steps_per_window)
                    js.hang = HangCase(v, window, now, set(js.progress))
                    log.warning(
                        "hang suspected: requesting dumps",
                        job=js.job,
                        ranks=v.ranks,
                        waiting_s=round(v.waiting_s, 1),
                    )
                    self._outbox.append(
                        (js.job, "dump", {"job": js.job, "ranks": sorted(js.progress)})
                    )
            h = js.hang
            if (
                h is not None
                and not h.reported
                and (set(h.dumps) >= h.expected or now - h.requested_at >= self.dump_wait_s)
            ):
                self._report_hang(js)

    def _report_hang(self, js: JobState) -> None:
        h = js.hang
        assert h is not None
        h.reported = True
        islands: dict[int, str] = {}
        steps = None
        if js.colls_per_step:
            step = h.verdict.collective // js.colls_per_step
            steps = [step, step + 1]
        f = hang_finding(
            h.verdict,
            window=h.window,
            steps=steps,
            dumps=[h.dumps[r] for r in sorted(h.dumps)],
            hosts=js.hosts,
            islands=islands,
        )
        self.findings.write([f])
        self.metrics.observe_findings([f])

    def _dump(self, d: Dump) -> None:
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        path = self.dump_dir / f"{d.job}-r{d.rank}-{d.comm}.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for rec in d.records:
                fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        js = self._job(d.job)
        if js.hang is not None:
            js.hang.dumps[d.rank] = str(path)
        log.info("dump written", job=d.job, rank=d.rank, records=len(d.records), path=str(path))

    # ------------------------------------------------------------------ control out
    async def _flush_controls(self) -> None:
        if not self._outbox or self.server is None:
            return
        out, self._outbox = self._outbox, []
        for job, action, body in out:
            js = self.jobs.get(job)
            for agent in sorted(js.agents if js else ()):
                try:
                    await self.server.send_control(agent, action, body)
                except NotConnected:
                    log.warning(
                        "control not delivered: agent not connected", agent=agent, action=action
                    )
