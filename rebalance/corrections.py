"""Corrections within policy: which incident gets which correction, and its life to a verdict.

Pure, like the rebalance policy beside it (same room: both decide how Artemis acts on
a confirmed incident, and a correction that fails hands the incident back to
rebalancing): no clock, file or socket. The coordinator's shell
(coordinator/corrections.py) feeds a job's ``CorrectionBook`` the records of its
open incidents each scored window, the window's rows (the job's throughput, each
incident's pace), what it knows of each rank (``RankFacts``: host, GPU, power
limits, the agent's protocol version) and a wall time; it forwards what comes back:
incident entries (docs/DESIGN.md "Corrections", the entry format) and controls for
the rank's agent (action ``correction``, body ``{"op": "apply" | "rollback", ...}``).

Life of a correction (one at a time per incident)::

    recommended                       (mode recommend, not allowed, rate-limited, old agent)
    awaiting_approval -> approved | denied | expired
    approved -> applied -> verified | rolled_back
             -> failed                (the agent's library error, or its consent off,
                                       or no answer within ack_timeout_s)

What fits, and whether one helped: rebalance/correction_fit.py.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from artemis.protocol.messages import CORRECTION_MINOR

from .correction_fit import RankFacts, fit, verdict_of
from .settings import CORRECTION_ACTIONS

STATUSES = (
    "recommended",
    "awaiting_approval",
    "approved",
    "denied",
    "expired",
    "applied",
    "failed",
    "verified",
    "rolled_back",
)
# Nothing more happens to a correction in these states.
FINAL = frozenset(("recommended", "denied", "expired", "failed", "verified", "rolled_back"))
KEEP_ENDED = 256  # ended corrections of closed incidents kept per job
SNAPSHOT_VERSION = 1


class CorrectionError(ValueError):
    """An operator's command names what does not exist or may not happen now."""


@dataclass(frozen=True)
class CorrectionPolicy:
    """The ``[detector]`` corrections keys (artemis.detect.settings), as the book reads them."""

    mode: str = "recommend"
    allow: tuple[str, ...] = CORRECTION_ACTIONS
    approve: tuple[str, ...] = ()
    min_interval_s: float = 3600.0
    max_gpus_per_job: int = 2
    approval_expiry_s: float = 3600.0
    ack_timeout_s: float = 300.0  # a control unanswered this long fails its correction
    verify_windows: int = 3  # whole windows after the apply ack that verification measures
    before_windows: int = 3  # windows before it that the pace and throughput are taken from

    @classmethod
    def from_settings(cls, s: Any) -> CorrectionPolicy:
        return cls(
            mode=s.corrections,
            allow=tuple(s.corrections_allow),
            approve=tuple(s.corrections_approve),
            min_interval_s=s.corrections_min_interval_s,
            max_gpus_per_job=s.corrections_max_gpus_per_job,
            approval_expiry_s=s.approval_expiry_s,
            ack_timeout_s=s.correction_ack_timeout_s,
        )


class Correction(msgspec.Struct, kw_only=True):
    """One correction and everything its entry says (saved as it is: its own Struct)."""

    id: str
    incident: str
    action: str
    rank: int
    host: str | None
    gpu: int | None
    status: str
    history: list[dict[str, Any]] = msgspec.field(default_factory=list)
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    gain_pct: float | None = None
    reason: str = ""
    forced: bool = False
    expires: float | None = None  # awaiting_approval: when it expires (wall, unix s)
    pending: str | None = None  # the op sent and not acknowledged yet: apply | rollback
    sent_at: float | None = None  # wall when ``pending`` first went out (ack_timeout_s)
    timed_out: bool = False  # failed for want of an answer: later acks never revive it
    applied_window: int | None = None  # the latest window when its apply ack came in
    pace_before: float | None = None
    thr_before: float | None = None
    # The last record of its incident, when that closed while the correction was on
    # its way (sent, not acknowledged): rewritten with the entry when the ack comes.
    closed: dict[str, Any] | None = None

    def move(self, status: str, t: float, detail: str = "") -> None:
        self.status = status
        self.history.append({"status": status, "t": t, "detail": detail})
        if detail:
            self.reason = detail

    def entry(self) -> dict[str, Any]:
        """The incident's `actions` entry (docs/DESIGN.md "Corrections")."""
        return {
            "type": "correction",
            "action": self.action,
            "id": self.id,
            "host": self.host,
            "gpu": self.gpu,
            "rank": self.rank,
            "status": self.status,
            "before": self.before,
            "after": self.after,
            "history": [dict(h) for h in self.history],
            "gain_pct": self.gain_pct,
            "reason": self.reason,
            "forced": self.forced,
        }

    def control(self, op: str) -> dict[str, Any]:
        """The body of the control for the rank's agent (action ``correction``)."""
        body: dict[str, Any] = {
            "op": op,
            "id": self.id,
            "action": self.action,
            "rank": self.rank,
            "gpu": self.gpu,
            "incident": self.incident,
        }
        if op == "rollback":
            body["before"] = dict(self.before or {})
        return body


@dataclass
class Output:
    """What a call returns: entries per incident id, controls per rank."""

    entries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    controls: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    # whole records of incidents that closed before a correction's ack (written as is)
    records: list[dict[str, Any]] = field(default_factory=list)

    def touch(self, c: Correction) -> None:
        self.entries = [(i, e) for i, e in self.entries if e["id"] != c.id]
        self.entries.append((c.incident, c.entry()))


class CorrectionBook:
    """One job's corrections: the decisions, the rate limits and the approvals."""

    def __init__(self, job: str) -> None:
        self.job = job
        self._all: dict[str, Correction] = {}  # by id; final ones stay (approve/deny say so)
        self._seq = 0
        self._last_at: dict[str, float] = {}  # GPU key -> wall of its latest correction
        self._pace: dict[str, deque[tuple[int, float]]] = {}  # incident -> (window, pace)
        self._thr: deque[tuple[int, float]] = deque(maxlen=64)  # (window, samples/s)
        self._open: dict[str, int] = {}  # open incident id -> its rank
        self._restored = False  # restored from a saved state, no window seen since
        self._window = -1

    # ------------------------------------------------------------------ queries

    @property
    def corrections(self) -> list[Correction]:
        return list(self._all.values())

    def get(self, cid: str) -> Correction:
        c = self._all.get(cid)
        if c is None:
            raise CorrectionError(f"unknown correction id {cid!r} in job {self.job}")
        return c

    def pending(self) -> list[dict[str, Any]]:
        """What waits for a person (awaiting_approval), as entries with their incident."""
        return [
            {**c.entry(), "incident": c.incident, "job": self.job, "expires": c.expires}
            for c in self._all.values()
            if c.status == "awaiting_approval"
        ]

    def unacked(self) -> list[tuple[int, dict[str, Any]]]:
        """Controls sent and not acknowledged (resent until they are: at least once)."""
        return [(c.rank, c.control(c.pending)) for c in self._all.values() if c.pending]

    @property
    def busy(self) -> bool:
        """Whether a correction is still on its way (waiting, sent, being verified)."""
        return any(c.status not in FINAL for c in self._all.values())

    def in_flight(self) -> str | None:
        """Why the job's rebalancing waits (RebalancePolicy.hold): a correction sent
        and not yet verified or rolled back, whose verification a new split would
        confound; None when there is none."""
        for c in self._all.values():
            live = c.incident in self._open or c.closed is not None
            if c.status in ("approved", "applied") and live:
                return f"correction {c.id} ({c.action}) {c.status}: rebalancing waits for it"
        return None

    def knows_incident(self, incident: str) -> bool:
        return incident in self._open

    def rank_of(self, incident: str) -> int:
        rank = self._open.get(incident)
        if rank is None:
            raise CorrectionError(f"no open incident {incident!r} in job {self.job}")
        return rank

    # ------------------------------------------------------------------ inputs

    def on_window(
        self,
        window: int,
        records: Iterable[Mapping[str, Any]],
        rows: Iterable[Mapping[str, Any]],
        facts: Mapping[int, RankFacts],
        policy: CorrectionPolicy,
        wall: float,
        plan: str | None = None,
    ) -> Output:
        """One scored window: ``records`` are the job's incident records (every open one,
        and those that closed in it), ``rows`` the window's rows; ``plan``: a rebalance
        plan of the job on its way (sent, or applied and not verified), whose
        verification a correction would confound: none is sent until it is done."""
        self._window = window
        out = Output()
        for r in rows:
            if r.get("row") == "job" and r.get("samples_per_s") is not None:
                self._thr.append((window, float(r["samples_per_s"])))
            elif r.get("row") == "subject" and r.get("ratio") is not None:
                keep = policy.before_windows + policy.verify_windows + 8
                d = self._pace.get(str(r["incident"]))
                if d is None or d.maxlen != keep:
                    # (a restored book's deques come back unbounded: bounded as its
                    # owner's were, or an heir's history would outgrow its owner's)
                    d = self._pace[str(r["incident"])] = deque(d or (), maxlen=keep)
                d.append((window, float(r["ratio"])))
        self.expire(wall, out, policy)
        self._carry_over(records, out)
        for rec in records:
            iid = str(rec["id"])
            if rec.get("status") == "closed":
                self._closed(iid, rec, wall, out)
                continue
            if rec.get("rank") is not None:
                self._open[iid] = int(rec["rank"])
            mine = [c for c in self._all.values() if c.incident == iid]
            live = [c for c in mine if c.status not in FINAL]
            if live:
                self._follow(live[-1], policy, wall, out)
            elif not mine and policy.mode != "off":
                rank_facts = facts.get(int(rec.get("rank") or 0))
                self._decide(rec, rank_facts, policy, wall, out, plan)
        return out

    def has(self, cid: str) -> bool:
        return cid in self._all

    def _carry_over(self, records: Iterable[Mapping[str, Any]], out: Output) -> None:
        """An incident gone without a closed record leaves the open set. Only a restart
        misses a close: a coordinator stopped gracefully closed it (job_end) and, back,
        reopened the episode under a new id. At the first window after a restore, a
        correction still on its way goes on with the new incident of the same rank
        (verified or rolled back there, once); with none, it can no longer be verified,
        and it does not hold rebalancing back (``in_flight``)."""
        now = {str(r["id"]): r.get("rank") for r in records if r.get("status") != "closed"}
        restored, self._restored = self._restored, False  # only a restart misses a close
        for iid in [i for i in self._open if i not in now]:
            rank = self._open.pop(iid)
            heirs = (i for i, r in now.items() if r == rank and i not in self._open)
            heir = next(heirs, None) if restored else None
            for c in self._all.values():
                if heir is not None and c.incident == iid and c.status not in FINAL:
                    c.incident = heir
                    c.reason = f"carried over from incident {iid} (the coordinator restarted)"
                    out.touch(c)

    def on_ack(self, result: Mapping[str, Any], wall: float, op: str | None = None) -> Output:
        """The agent's ``Ack.result`` for a correction control; ``op``: the one its
        control id names (None: unknown, the pending one). An ack of an op not on its
        way (resent, or an apply's that comes after the rollback went out) is ignored."""
        out = Output()
        c = self._all.get(str(result.get("id", "")))
        if c is not None and c.timed_out:
            return self._late(c, result, wall, op)
        if c is None or c.pending is None or (op is not None and op != c.pending):
            return out
        status = str(result.get("status", ""))
        error = str(result.get("error") or "")
        op, c.pending = c.pending, None
        if op == "apply":
            c.before = dict(result.get("before") or {}) or c.before
            c.after = dict(result.get("after") or {}) or c.after
            if status == "applied":
                c.applied_window = self._window
                self._measure_before(c)  # (a correction sent by a book saved before this)
                c.move("applied", wall)
            else:
                why = f"{status}: {error}" if error else status
                c.move("failed", wall, f"not applied ({why}); left to rebalancing, then escalation")
        else:
            if status == "rolled_back":
                c.after = dict(result.get("after") or {}) or c.after
                c.move("rolled_back", wall, c.reason)
            else:
                c.move("failed", wall, f"rollback failed ({error or status}): {c.reason}")
        out.touch(c)
        if c.closed is not None:
            self._after_close(c, c.closed, wall, out)
        return out

    def _after_close(self, c: Correction, rec: dict[str, Any], wall: float, out: Output) -> None:
        """An ack that came after its incident closed (the incident book has let it go):
        a finding that cleared meanwhile verifies an applied correction, and the
        incident's last record is written again with the entry."""
        if (
            c.status == "applied"
            and c.pending is None
            and (rec.get("closed") or {}).get("why") == "cleared"
        ):
            c.move("verified", wall, "helped: the finding cleared while it was on its way")
        acts = [a for a in rec.get("actions") or () if a.get("id") != c.id] + [c.entry()]
        new = {**rec, "actions": acts, "change": "action", "changes": ["action"]}
        if c.status == "verified" and rec.get("verdict") == "recovered":
            new["reason"] = f"{rec.get('reason', '')}, after correction {c.action} ({c.id})"
        out.records.append(new)
        c.closed = None if c.status in FINAL else new

    def expire(
        self, wall: float, out: Output | None = None, policy: CorrectionPolicy | None = None
    ) -> Output:
        """Approvals unanswered past approval_expiry_s expire (the shell's clock); with
        ``policy``, so do controls unacknowledged past its ack_timeout_s (``_time_out``)."""
        out = out if out is not None else Output()
        for c in self._all.values():
            if c.status == "awaiting_approval" and c.expires is not None and wall >= c.expires:
                c.move("expired", wall, "no approval within approval_expiry_s")
                out.touch(c)
            elif policy is not None and policy.ack_timeout_s > 0 and c.pending and not c.timed_out:
                if c.sent_at is None:  # sent by a book saved before ack timeouts: from now
                    c.sent_at = wall
                elif wall - c.sent_at >= policy.ack_timeout_s:
                    self._time_out(c, policy.ack_timeout_s, wall, out)
        return out

    def _time_out(self, c: Correction, limit: float, wall: float, out: Output) -> None:
        """A control its agent never answered: the correction fails, so it holds the
        job's rebalancing no longer (``in_flight``) and the incident goes on to
        rebalancing, then escalation. An unanswered apply may still have been applied
        (its ack lost): a rollback goes out instead, resent until answered, which the
        agent runs from its journal's state before, or refuses when it never applied."""
        why = f"no answer from the agent on {c.host or f'rank {c.rank} host'} within {limit:g} s"
        c.timed_out = True
        if c.pending == "apply":
            c.pending, c.sent_at = "rollback", wall
            out.controls.append((c.rank, c.control("rollback")))
            why += f" ({c.action} never acknowledged; a rollback goes out in case it ran)"
            c.move("failed", wall, f"{why}; left to rebalancing, then escalation")
        else:
            c.move("failed", wall, f"rollback: {why}, resent until it answers: {c.reason}")
        out.touch(c)

    def _late(
        self, c: Correction, result: Mapping[str, Any], wall: float, op: str | None
    ) -> Output:
        """An ack after its correction timed out: kept in its history, never reviving it.
        An apply that did run is rolled back with the state before it reports: not
        verified, it must not stay. A rollback's answer ends the resends."""
        out = Output()
        status, error = str(result.get("status", "")), str(result.get("error") or "")
        if op is None:  # a control id this life does not know: told by its status
            op = "apply" if status in ("applied", "refused") else c.pending
        words = f"{status}: {error}" if error else status
        if op == "apply":
            if c.applied_window is not None or any(h.get("late") == op for h in c.history):
                return out  # its apply was answered already (a resent control's echo)
            detail = f"late answer to apply: {words}"
            if status == "applied":
                c.before = dict(result.get("before") or {}) or c.before
                c.after = dict(result.get("after") or {}) or c.after
                c.pending, c.sent_at = "rollback", wall
                out.controls.append((c.rank, c.control("rollback")))
                detail = "late answer: applied after the timeout; not verified, so rolled back"
        elif c.pending == "rollback":
            c.pending = None
            if status == "rolled_back":
                c.after = dict(result.get("after") or {}) or c.after
            detail = f"late answer to rollback: {words}"
        else:
            return out
        c.history.append({"status": c.status, "t": wall, "detail": detail, "late": op})
        out.touch(c)
        if c.closed is not None:
            self._after_close(c, c.closed, wall, out)
        return out

    # ------------------------------------------------------------------ commands

    def approve(self, cid: str, wall: float) -> Output:
        c = self._waiting(cid, wall)
        out = Output()
        c.move("approved", wall, "approved by an operator")
        self._send(c, wall, out)
        return out

    def deny(self, cid: str, wall: float) -> Output:
        c = self._waiting(cid, wall)
        out = Output()
        c.move("denied", wall, "denied by an operator")
        out.touch(c)
        return out

    def force(
        self, incident: str, action: str, facts: RankFacts | None, wall: float
    ) -> tuple[Correction, Output]:
        """An operator's correction: no fit, approval or rate limit asked (their call);
        verified and rolled back as any other."""
        if action not in CORRECTION_ACTIONS:
            raise CorrectionError(
                f"unknown correction action {action!r}: one of {', '.join(CORRECTION_ACTIONS)}"
            )
        rank = self._open.get(incident)
        if rank is None:
            raise CorrectionError(f"no open incident {incident!r} in job {self.job}")
        live = [c for c in self._all.values() if c.incident == incident and c.status not in FINAL]
        if live:
            raise CorrectionError(
                f"incident {incident} has correction {live[-1].id} {live[-1].status}: "
                "one at a time per incident"
            )
        why = _old_agent(facts)
        if why:
            raise CorrectionError(f"rank {rank}: {why}")
        c = self._new(incident, action, rank, facts)
        c.forced = True
        out = Output()
        c.move("approved", wall, "forced by an operator (artemis-coordinator correct)")
        self._send(c, wall, out)
        return c, out

    # ------------------------------------------------------------------ rules

    def _waiting(self, cid: str, wall: float) -> Correction:
        c = self.get(cid)
        if c.status == "awaiting_approval" and c.expires is not None and wall >= c.expires:
            c.move("expired", wall, "no approval within approval_expiry_s")
        if c.status == "expired":
            raise CorrectionError(f"correction {cid} expired: approvals last approval_expiry_s")
        if c.status != "awaiting_approval":
            raise CorrectionError(f"correction {cid} is {c.status}, not awaiting approval")
        return c

    def _new(self, incident: str, action: str, rank: int, facts: RankFacts | None) -> Correction:
        self._seq += 1
        c = Correction(
            id=f"c-{incident}-{self._seq}",
            incident=incident,
            action=action,
            rank=rank,
            host=facts.host if facts else None,
            gpu=facts.gpu if facts else None,
            status="recommended",
        )
        self._all[c.id] = c
        return c

    def _decide(
        self,
        rec: Mapping[str, Any],
        facts: RankFacts | None,
        policy: CorrectionPolicy,
        wall: float,
        out: Output,
        plan: str | None = None,
    ) -> None:
        action, why = fit(rec, facts)
        if action is None:
            return
        if policy.mode == "apply" and action in policy.allow:
            if facts is None or not facts.version:
                return  # its agent is not connected now: decided when it is
            if plan is not None:
                return  # a plan is being verified: decided once it is done
        c = self._new(str(rec["id"]), action, int(rec["rank"]), facts)
        hold = self._hold(c, facts, policy, wall)
        if hold:
            c.move("recommended", wall, f"{why}; {hold}")
            out.touch(c)
        elif action in policy.approve:
            c.expires = wall + policy.approval_expiry_s
            c.move("awaiting_approval", wall, f"{why}; waits for a person (corrections_approve)")
            out.touch(c)
        else:
            c.move("approved", wall, why)
            self._send(c, wall, out)

    def _hold(
        self, c: Correction, facts: RankFacts | None, policy: CorrectionPolicy, wall: float
    ) -> str:
        """Why the correction is only recommended ("" when it may go ahead)."""
        if policy.mode != "apply":
            return f"corrections = {policy.mode}: nothing runs"
        if c.action not in policy.allow:
            return f"{c.action} is not in corrections_allow"
        old = _old_agent(facts)
        if old:
            return old
        key = _gpu_key(c)
        last = self._last_at.get(key)
        if last is not None and wall - last < policy.min_interval_s:
            return (
                f"rate limit: this GPU was corrected {wall - last:.0f} s ago "
                f"(corrections_min_interval_s {policy.min_interval_s:g})"
            )
        if key not in self._last_at and len(self._last_at) >= policy.max_gpus_per_job:
            return (
                f"rate limit: {len(self._last_at)} GPUs of this job corrected already "
                f"(corrections_max_gpus_per_job {policy.max_gpus_per_job})"
            )
        return ""

    def _measure_before(self, c: Correction) -> None:
        """The rank's pace and the job's throughput before the correction: the windows
        up to the one it is sent in. Not at its ack: the GPU changes when the agent
        applies it, and an ack that comes late (an agent restarting) would otherwise
        measure "before" on windows already corrected."""
        if c.pace_before is None:
            c.pace_before = self._median(self._pace.get(c.incident, ()), before=True)
        if c.thr_before is None:
            c.thr_before = self._median(self._thr, before=True)

    def _send(self, c: Correction, wall: float, out: Output) -> None:
        self._last_at[_gpu_key(c)] = wall
        self._measure_before(c)
        c.pending, c.sent_at = "apply", wall
        out.touch(c)
        out.controls.append((c.rank, c.control("apply")))

    def _follow(self, c: Correction, policy: CorrectionPolicy, wall: float, out: Output) -> None:
        """Verify an applied correction once verify_windows whole windows ran after it."""
        if c.status != "applied" or c.pending is not None or c.applied_window is None:
            return
        # The window in flight when the ack came ran partly before the change: skipped.
        start = c.applied_window + 1
        after_p = [p for w, p in self._pace.get(c.incident, ()) if w > start]
        after_t = [t for w, t in self._thr if w > start]
        if min(len(after_p), len(after_t)) < policy.verify_windows:
            return
        pace = statistics.median(after_p[: policy.verify_windows])
        thr = statistics.median(after_t[: policy.verify_windows])
        ok, why = verdict_of(c.pace_before, c.thr_before, pace, thr)
        if c.thr_before:
            c.gain_pct = round((thr / c.thr_before - 1.0) * 100.0, 2)
        if ok:
            c.move("verified", wall, f"helped: {why}")
            out.touch(c)
            return
        c.reason = f"did not help: {why}; the state before restored"
        c.pending, c.sent_at = "rollback", wall
        out.touch(c)
        out.controls.append((c.rank, c.control("rollback")))

    def _closed(self, iid: str, rec: Mapping[str, Any], wall: float, out: Output) -> None:
        self._open.pop(iid, None)
        self._pace.pop(iid, None)
        # Memory stays bounded in a long job: the oldest ended corrections of closed
        # incidents go (an approve or deny of one then says "unknown correction id").
        ended = [
            k
            for k, c in self._all.items()
            if c.status in FINAL and not c.pending and c.incident not in self._open
        ]
        for k in ended[: max(0, len(self._all) - KEEP_ENDED)]:
            del self._all[k]
        why = (rec.get("closed") or {}).get("why")
        for c in self._all.values():
            if c.incident != iid or (c.status in FINAL and not c.pending):
                continue  # (a timed-out one still sends its rollback: its ack rewrites)
            if c.status == "awaiting_approval":
                c.move("expired", wall, "the incident closed before an approval")
                out.touch(c)
            elif c.status == "applied" and c.pending is None and why == "cleared":
                c.move("verified", wall, "helped: the finding cleared after it")
                out.touch(c)
            elif c.pending is not None:
                c.closed = dict(rec)  # its ack still comes (an agent restarting)

    def _median(self, pts: Iterable[tuple[int, float]], *, before: bool) -> float | None:
        vals = [v for w, v in pts if w <= self._window] if before else []
        return statistics.median(vals[-3:]) if vals else None

    # ------------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        st = CorrectionBookState(
            version=SNAPSHOT_VERSION,
            job=self.job,
            seq=self._seq,
            window=self._window,
            corrections=list(self._all.values()),
            last_at=dict(self._last_at),
            pace={k: list(d) for k, d in self._pace.items()},
            thr=list(self._thr),
            open=dict(self._open),
        )
        out: dict[str, Any] = msgspec.to_builtins(st)
        return out

    @classmethod
    def restore(cls, data: Mapping[str, Any]) -> CorrectionBook:
        st = msgspec.convert(data, CorrectionBookState)
        if st.version != SNAPSHOT_VERSION:
            raise ValueError(f"corrections state version {st.version} (this reads 1)")
        b = cls(st.job)
        b._seq, b._window = st.seq, st.window
        b._all = {c.id: c for c in st.corrections}
        b._last_at = dict(st.last_at)
        b._pace = {k: deque((int(w), float(v)) for w, v in d) for k, d in st.pace.items()}
        b._thr = deque(((int(w), float(v)) for w, v in st.thr), maxlen=64)
        b._open = dict(st.open)
        b._restored = True
        return b


class CorrectionBookState(msgspec.Struct, kw_only=True):
    """A job's corrections as saved in its state file (detect/state.py JobState)."""

    version: int
    job: str
    seq: int
    window: int
    corrections: list[Correction]
    last_at: dict[str, float]  # GPU key -> wall of its latest correction (the rate limit)
    pace: dict[str, list[tuple[int, float]]]
    thr: list[tuple[int, float]]
    open: dict[str, int]


def _gpu_key(c: Correction) -> str:
    return f"{c.host}/{c.gpu if c.gpu is not None else f'rank{c.rank}'}"


def _old_agent(facts: RankFacts | None) -> str:
    v = facts.version if facts else None
    if v is not None and v < (1, CORRECTION_MINOR):
        return f"agent speaks protocol {v[0]}.{v[1]}; corrections need 1.{CORRECTION_MINOR}"
    return ""
