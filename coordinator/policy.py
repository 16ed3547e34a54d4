"""Opt-in rebalancing: move batch work away from a slow rank, verify it helped, undo it if not.

Pure: the policy is a state machine over plain records. It never reads a clock,
a file or a socket; the coordinator feeds it one call per assembled window
(``on_window``) and one per acknowledgement that came back from the job
(``on_ack``), and forwards what it returns: each ``PlanEvent`` is a line for
the plans file, and an event whose ``control`` is set carries the plan the
agents must publish to the job (control action ``"plan"``).

Life of a plan (see coordinator/REBALANCE.md for the rules in prose):

    trigger -> recommended --(all ranks ack)--> applied --(3 windows)--> verified
                   |                                        \\-> rolled_back (+ escalate)
                   \\--(no ack in time)--> recommended, reason "not acknowledged ..."

A restore of the uniform split when the slow rank recovers is a plan of its own
and takes the same path.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MODES = ("off", "recommend", "apply")
STATUSES = ("recommended", "applied", "verified", "rolled_back")
TRIGGER_KINDS = frozenset({"rank", "degraded"})
TRIGGER_STATES = frozenset({"flagged", "ongoing"})
RESTORE_REASON = "rank recovered: uniform split restored"


# The operator-facing bounds (also `Settings` keys), checked in this one place:
# name -> (allowed?, what is allowed in words).
BOUNDS: dict[str, tuple[Any, str]] = {
    "max_shift_frac": (lambda v: 0.0 <= v < 1.0, "a fraction in [0, 1)"),
    "min_samples": (
        lambda v: v >= 1,
        "an integer of at least 1 (a rank with no samples would starve)",
    ),
    "min_plan_interval_windows": (lambda v: v >= 0, "an integer of at least 0"),
}


def bound_problem(name: str, value: Any) -> str:
    """'' when ``value`` is allowed for the policy bound ``name``, else what is allowed."""
    ok, allowed = BOUNDS[name]
    try:
        return "" if ok(value) else allowed
    except TypeError:
        return allowed


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """Knobs of the policy; the coordinator builds this from its ``Settings``."""

    mode: str = "off"  # off | recommend | apply
    max_shift_frac: float = 0.25  # a rank may lose or gain at most this fraction of uniform
    min_samples: int = 1  # no rank gets fewer samples per step than this
    min_plan_interval_windows: int = 4  # windows between two changes of plan
    window_steps: int = 50  # steps per window, to place apply_at_step when not told
    trigger_windows: int = 3  # a finding on the same rank this many windows in a row
    speed_windows: int = 4  # windows over which per-sample speed is measured
    lead_windows: int = 2  # apply_at_step lies this many windows past the current one
    ack_timeout_windows: int = 3  # windows after apply_at_step to wait for every ack
    verify_windows: int = 3  # whole windows after the switch that verification measures
    min_expected_gain: float = 0.02  # a plan must promise this much faster steps to be made
    verify_min_gain: float = 0.02  # relative throughput gain that counts as recovered
    verify_recover_frac: float = 0.5  # ... or this fraction of the throughput lost to the fault
    verify_noise_frac: float = 0.005  # ... provided the gain is above this noise floor
    recovered_tolerance: float = 0.05  # slow rank within this of its peers' speed = recovered
    baseline_windows: int = 8  # healthy windows whose median throughput is the baseline
    rollback_backoff_windows: int = 16  # no new plan for a rank this long after a failed one
    id_prefix: str = ""  # lets a restarted coordinator mint ids the job has not seen

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> PolicySettings:
        """Build from the coordinator's ``Settings`` (fields rebalance, max_shift_frac,
        min_samples, min_plan_interval_windows); ``overrides`` set any other knob."""
        base: dict[str, Any] = {
            "mode": settings.rebalance,
            "max_shift_frac": settings.max_shift_frac,
            "min_samples": settings.min_samples,
            "min_plan_interval_windows": settings.min_plan_interval_windows,
        }
        base.update(overrides)
        return cls(**base)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"rebalance mode must be one of {MODES}, got {self.mode!r}")
        for name in BOUNDS:
            problem = bound_problem(name, getattr(self, name))
            if problem:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected {problem}")
        for name in ("lead_windows", "ack_timeout_windows"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("window_steps", "trigger_windows", "speed_windows", "verify_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


@dataclass(slots=True)
class PlanEvent:
    """One change of a plan's status: one line of the plans file (DESIGN "Rebalance plans")."""

    id: str
    window: int
    rank: int  # the slow rank the plan works around
    finding: dict[str, Any] | None  # the finding that triggered it
    speeds: list[float]  # measured per-sample speed per rank, samples/s of compute
    before: list[int]  # samples per rank before the plan
    after: list[int]  # samples per rank under the plan (same sum as before)
    apply_at_step: int | None  # the step at which every rank switches (None: not sent)
    status: str  # recommended | applied | verified | rolled_back
    throughput_before: float | None = None  # samples/s measured before the plan
    throughput_after: float | None = None  # samples/s measured under the plan
    reason: str = ""
    escalate: bool = False  # the plan failed: the coordinator logs it at WARNING
    # What the agents must publish to the job now (control action "plan"), if anything.
    # Not part of the plans file: it is an instruction, the line above is the record.
    control: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "window": self.window,
            "rank": self.rank,
            "finding": self.finding,
            "speeds": [round(s, 3) for s in self.speeds],
            "before": list(self.before),
            "after": list(self.after),
            "apply_at_step": self.apply_at_step,
            "status": self.status,
            "throughput_before": _r(self.throughput_before),
            "throughput_after": _r(self.throughput_after),
            "reason": self.reason,
            "escalate": self.escalate,
        }


# --------------------------------------------------------------------------- splits


def uniform_split(global_batch: int, nranks: int) -> list[int]:
    """The even split; the first ``global_batch % nranks`` ranks take one sample more."""
    if nranks < 1 or global_batch < 0:
        raise ValueError("need nranks >= 1 and global_batch >= 0")
    q, r = divmod(global_batch, nranks)
    return [q + 1 if i < r else q for i in range(nranks)]


def split_bounds(
    global_batch: int, nranks: int, max_shift_frac: float, min_samples: int
) -> tuple[int, int]:
    """Whole-sample bounds (lo, hi) every rank's share must stay within.

    They are widened to the integer uniform shares (floor/ceil of G/n) so that
    the uniform split is always inside them and n*lo <= G <= n*hi always holds.
    """
    u = global_batch / nranks
    eps = 1e-9
    lo = max(min_samples, math.ceil(u * (1.0 - max_shift_frac) - eps))
    hi = math.floor(u * (1.0 + max_shift_frac) + eps)
    return min(lo, global_batch // nranks), max(hi, -(-global_batch // nranks))


def proportional_split(
    speeds: Sequence[float], global_batch: int, max_shift_frac: float, min_samples: int
) -> list[int]:
    """Samples per rank proportional to ``speeds``, clamped to the bounds, in whole samples.

    The continuous solution is x_i = clamp(lambda * s_i, lo, hi) with lambda chosen so
    that sum x_i = G (found by bisection: the sum is monotone in lambda). It is then
    rounded by largest remainder, which keeps the sum exactly G and every share
    within [lo, hi] because lo and hi are whole numbers.
    """
    n = len(speeds)
    if n < 1:
        raise ValueError("no ranks")
    if any(not (s > 0.0 and math.isfinite(s)) for s in speeds):
        raise ValueError(f"speeds must be positive and finite: {list(speeds)}")
    if global_batch < n * min_samples:
        raise ValueError(f"global batch {global_batch} cannot give {n} ranks {min_samples} each")
    lo, hi = split_bounds(global_batch, n, max_shift_frac, min_samples)

    def total(lam: float) -> float:
        return sum(min(hi, max(lo, lam * s)) for s in speeds)

    a, b = 0.0, hi / min(speeds)  # total(a) = n*lo <= G <= n*hi = total(b)
    for _ in range(200):
        m = 0.5 * (a + b)
        if total(m) < global_batch:
            a = m
        else:
            b = m
    x = [min(hi, max(lo, b * s)) for s in speeds]
    base = [min(hi, math.floor(v + 1e-9)) for v in x]
    left = global_batch - sum(base)
    # Largest remainder first; ties go to the faster rank, then the lower rank index.
    order = sorted(range(n), key=lambda i: (-(x[i] - base[i]), -speeds[i], i))
    for i in order:
        if left <= 0:
            break
        if base[i] < hi:
            base[i] += 1
            left -= 1
    # Bisection leaves x a hair off; settle any remaining sample on a rank with room.
    while left != 0:
        step = 1 if left > 0 else -1
        room = [i for i in order if lo <= base[i] + step <= hi]
        base[room[0]] += step
        left -= step
    return base


def step_compute_ms(split: Sequence[int], speeds: Sequence[float]) -> float:
    """Predicted compute time of a step: the slowest rank's samples / speed (speeds in samples/s)."""
    return max(1000.0 * n / s for n, s in zip(split, speeds, strict=True))


# --------------------------------------------------------------------------- policy


@dataclass(slots=True)
class _Window:
    window: int
    step_lo: int
    step_hi: int
    gap_ms: dict[int, float]
    samples: dict[int, int]
    throughput: float | None  # samples/s for the whole job
    flagged: frozenset[int]  # ranks with a rank/degraded finding flagged or ongoing
    findings: dict[int, dict[str, Any]]


@dataclass(slots=True)
class _Plan:
    event: PlanEvent  # the latest event of this plan; copies are returned
    restore: bool  # this plan restores the uniform split
    acks: dict[int, int] = field(default_factory=dict)  # rank -> step it switched at
    applied: bool = False


class RebalancePolicy:
    """Decides, per window, whether to rebalance, and follows each plan to its verdict.

    ``nranks`` is the job's world size; ``global_batch`` the samples per step over
    all ranks (None: learned from the ``samples`` reported by every rank).
    """

    def __init__(self, settings: PolicySettings, nranks: int, global_batch: int | None) -> None:
        if nranks < 1:
            raise ValueError("nranks must be >= 1")
        self.settings = settings
        self.nranks = nranks
        self.global_batch = global_batch
        self._mode = settings.mode
        self._history: deque[_Window] = deque(maxlen=64)
        self._healthy: deque[float] = deque(maxlen=settings.baseline_windows)
        self._split: list[int] | None = (
            uniform_split(global_batch, nranks) if global_batch is not None else None
        )
        self._plan: _Plan | None = None  # pending or applied, not yet judged
        self._active: PlanEvent | None = None  # the verified uneven plan the job runs on
        self._recommended: PlanEvent | None = None  # last plan recommended in recommend mode
        # rank -> first window it may be planned for again, after its plan was rolled back;
        # the backoff doubles with each rollback so a fault that rebalancing cannot fix
        # does not cycle plan -> rollback forever (each rollback escalates to a human).
        self._blocked: dict[int, int] = {}
        self._rollbacks: dict[int, int] = {}
        self._restore_failed: str | None = None  # id of the active plan a restore failed for
        self._last_change: int | None = None  # window of the last new plan
        self._seq = 0

    # ------------------------------------------------------------------ public

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def active_plan(self) -> PlanEvent | None:
        """The plan the policy is following (sent, applied or verified), or None."""
        if self._plan is not None:
            return dataclasses.replace(self._plan.event, control=None)
        if self._active is not None:
            return dataclasses.replace(self._active, control=None)
        return None

    @property
    def split(self) -> list[int] | None:
        """Samples per rank the job runs on as far as the policy knows."""
        return None if self._split is None else list(self._split)

    def update_settings(self, settings: PolicySettings) -> None:
        """New bounds from the next window on; plans and history are kept. The mode
        changes through ``set_mode`` (leaving ``apply`` has events to report)."""
        self.settings = dataclasses.replace(settings, mode=self._mode)
        if self._healthy.maxlen != settings.baseline_windows:
            self._healthy = deque(self._healthy, maxlen=settings.baseline_windows)

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data (int keys kept: for msgpack, not JSON)."""

        def ev(e: PlanEvent | None) -> dict[str, Any] | None:
            return None if e is None else dataclasses.asdict(e)

        p = self._plan
        return {
            "settings": dataclasses.asdict(self.settings),
            "nranks": self.nranks,
            "global_batch": self.global_batch,
            "mode": self._mode,
            # Shallow copies: a window's maps hold plain numbers (asdict would deep-copy
            # every rank's entry, seconds at 100k ranks).
            "history": [
                {
                    "window": w.window,
                    "step_lo": w.step_lo,
                    "step_hi": w.step_hi,
                    "gap_ms": dict(w.gap_ms),
                    "samples": dict(w.samples),
                    "throughput": w.throughput,
                    "flagged": sorted(w.flagged),
                    "findings": dict(w.findings),
                }
                for w in self._history
            ],
            "healthy": list(self._healthy),
            "split": self._split,
            "plan": None
            if p is None
            else {"event": ev(p.event), "restore": p.restore, "acks": p.acks, "applied": p.applied},
            "active": ev(self._active),
            "recommended": ev(self._recommended),
            "blocked": self._blocked,
            "rollbacks": self._rollbacks,
            "restore_failed": self._restore_failed,
            "last_change": self._last_change,
            "seq": self._seq,
        }

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> RebalancePolicy:
        def ev(d: Mapping[str, Any] | None) -> PlanEvent | None:
            return None if d is None else PlanEvent(**d)

        pol = cls(PolicySettings(**state["settings"]), int(state["nranks"]), state["global_batch"])
        pol._mode = state["mode"]
        for w in state["history"]:
            pol._history.append(
                _Window(
                    **{
                        **w,
                        "gap_ms": {int(k): float(v) for k, v in w["gap_ms"].items()},
                        "samples": {int(k): int(v) for k, v in w["samples"].items()},
                        "flagged": frozenset(int(r) for r in w["flagged"]),
                        "findings": {int(k): v for k, v in w["findings"].items()},
                    }
                )
            )
        pol._healthy.extend(state["healthy"])
        pol._split = None if state["split"] is None else [int(x) for x in state["split"]]
        p = state["plan"]
        if p is not None:
            event = ev(p["event"])
            assert event is not None
            pol._plan = _Plan(
                event=event,
                restore=bool(p["restore"]),
                acks={int(k): int(v) for k, v in p["acks"].items()},
                applied=bool(p["applied"]),
            )
        pol._active = ev(state["active"])
        pol._recommended = ev(state["recommended"])
        pol._blocked = {int(k): int(v) for k, v in state["blocked"].items()}
        pol._rollbacks = {int(k): int(v) for k, v in state["rollbacks"].items()}
        pol._restore_failed = state["restore_failed"]
        pol._last_change = state["last_change"]
        pol._seq = int(state["seq"])
        return pol

    def set_mode(self, mode: str) -> list[PlanEvent]:
        """Change mode at run time.

        Leaving ``apply`` undoes what the policy put in place (a plan waiting for
        its step, or an applied uneven split): outside ``apply`` it can no longer
        verify, roll back or restore, and an unmanaged uneven split is not safe.
        """
        if mode not in MODES:
            raise ValueError(f"rebalance mode must be one of {MODES}, got {mode!r}")
        old, self._mode = self._mode, mode
        out: list[PlanEvent] = []
        if old == "apply" and mode != "apply":
            out.extend(
                self._revert_all(f"rebalance mode changed to {mode}: previous split restored")
            )
        if mode != "recommend":
            self._recommended = None
        return out

    def on_window(
        self,
        window: int,
        findings: Iterable[Any],
        gap_ms: Mapping[int, float],
        step_ms: float | None,
        samples: Mapping[int, int | None] | None = None,
        *,
        step_lo: int | None = None,
        step_hi: int | None = None,
    ) -> list[PlanEvent]:
        """Feed one assembled window; returns the plan events it caused (maybe none).

        ``findings`` are the detector's findings of this window: objects with
        ``.kind/.state/.rank``, mappings with those keys, or (kind, state, rank)
        tuples. ``samples`` are the samples per step each rank reported (absent:
        the split the policy believes in). ``step_lo``/``step_hi`` bound the
        window's steps (default: window * window_steps, one window long).
        """
        ws = self.settings.window_steps
        lo = window * ws if step_lo is None else step_lo
        hi = lo + ws if step_hi is None else step_hi
        fmap = _flagged(findings)
        meas = {int(r): int(n) for r, n in (samples or {}).items() if n is not None}
        if self.global_batch is None and len(meas) == self.nranks:
            self.global_batch = sum(meas.values())
            self._split = [meas[r] for r in range(self.nranks)]
        thr = None
        if self.global_batch and step_ms is not None and step_ms > 0:
            thr = self.global_batch / step_ms * 1000.0
        w = _Window(
            window=window,
            step_lo=lo,
            step_hi=hi,
            gap_ms={int(r): float(g) for r, g in gap_ms.items() if g is not None and g > 0},
            samples=meas,
            throughput=thr,
            flagged=frozenset(fmap),
            findings=fmap,
        )
        self._history.append(w)
        if not w.flagged and self._plan is None and self._active is None and thr is not None:
            self._healthy.append(thr)
        if self._mode == "off" or self.global_batch is None or self._split is None:
            return []
        if self.global_batch < self.nranks * self.settings.min_samples:
            return []  # nothing to move: every rank already holds the minimum
        out: list[PlanEvent] = []
        if self._plan is not None:
            out.extend(self._follow(w))
        if self._plan is None:
            out.extend(self._maybe_restore(w))
        if self._plan is None and not out:
            out.extend(self._maybe_plan(w))
        return out

    def on_ack(self, plan_id: str, rank: int, step: int | None = None) -> list[PlanEvent]:
        """A rank's job acknowledged switching to ``plan_id`` (at ``step``).

        Returns the ``applied`` event once every rank has acknowledged. Acks of
        plans that are no longer followed (withdrawn, rolled back) are ignored.
        """
        p = self._plan
        if p is None or p.applied or p.event.id != plan_id or not 0 <= rank < self.nranks:
            return []
        at = p.event.apply_at_step or 0
        p.acks[rank] = at if step is None else int(step)
        if len(p.acks) < self.nranks:
            return []
        p.applied = True
        self._split = list(p.event.after)
        late = sorted(r for r, s in p.acks.items() if s > at)
        reason = f"acknowledged by all {self.nranks} ranks"
        if late:
            reason += f"; ranks {late} switched after step {at} (at {max(p.acks.values())})"
        return [self._emit(p, status="applied", reason=reason)]

    # ------------------------------------------------------------------ internals

    def _next_id(self, window: int, rank: int) -> str:
        self._seq += 1
        return f"{self.settings.id_prefix}p{self._seq}-w{window}-r{rank}"

    def _emit(self, p: _Plan, control: dict[str, Any] | None = None, **changes: Any) -> PlanEvent:
        p.event = dataclasses.replace(p.event, control=None, **changes)
        return dataclasses.replace(p.event, control=control)

    def _control(self, plan_id: str, split: Sequence[int], apply_at_step: int) -> dict[str, Any]:
        gb = int(sum(split))
        return {
            "action": "plan",
            "id": plan_id,
            "apply_at_step": int(apply_at_step),
            "samples": [int(n) for n in split],
            "global_batch": gb,
        }

    def _apply_step(self, w: _Window) -> int:
        return w.step_hi + self.settings.lead_windows * self.settings.window_steps

    def _speeds(self, windows: Sequence[_Window]) -> list[float] | None:
        """Per-sample compute speed per rank (samples/s): median over windows of samples / gap.

        The median, not a pooled ratio, so one window from before a change (the
        trigger needs 3 slow windows, the speed looks at 4) does not dilute it.
        """
        fallback = self._split
        out: list[float] = []
        for r in range(self.nranks):
            vals = []
            for w in windows:
                g = w.gap_ms.get(r)
                n = w.samples.get(r, fallback[r] if fallback is not None else None)
                if g is not None and n is not None and n > 0:
                    vals.append(1000.0 * n / g)
            if not vals:
                return None  # a rank without data cannot be planned around
            out.append(statistics.median(vals))
        return out

    def _median_thr(self, windows: Iterable[_Window]) -> float | None:
        vals = [w.throughput for w in windows if w.throughput is not None]
        return statistics.median(vals) if vals else None

    def _interval_ok(self, window: int) -> bool:
        last = self._last_change
        return last is None or window - last >= self.settings.min_plan_interval_windows

    def _triggered_rank(self) -> int | None:
        k = self.settings.trigger_windows
        if len(self._history) < k:
            return None
        last = list(self._history)[-k:]
        if [x.window for x in last] != list(range(last[0].window, last[0].window + k)):
            return None  # a missing window breaks the run
        common = frozenset.intersection(*(w.flagged for w in last))
        if len(common) != 1:
            # Two ranks flagged together: leave it to the detector's island/host rules.
            return None
        return next(iter(common))

    def _maybe_plan(self, w: _Window) -> list[PlanEvent]:
        s = self.settings
        rank = self._triggered_rank()
        if rank is not None and w.window < self._blocked.get(rank, w.window):
            return []
        if rank is None or not self._interval_ok(w.window):
            if rank is None and self._recommended is not None and not w.flagged:
                self._recommended = None  # the fault cleared; a new one gets a fresh plan
            return []
        recent = list(self._history)[-s.speed_windows :]
        speeds = self._speeds(recent)
        if speeds is None:
            return []
        if any(speeds[r] <= speeds[rank] for r in range(self.nranks) if r != rank):
            return []  # flagged, but not the slowest per sample: more samples won't help it
        now = self._speeds([w])
        if now is not None:
            peers_now = statistics.median(now[r] for r in range(self.nranks) if r != rank)
            if now[rank] >= peers_now * (1.0 - s.recovered_tolerance):
                # Still flagged while the finding clears, but its latest window is on
                # pace again: a new uneven split would only have to be undone.
                return []
        assert self.global_batch is not None and self._split is not None
        after = proportional_split(speeds, self.global_batch, s.max_shift_frac, s.min_samples)
        ref = self._split
        if self._mode == "recommend" and self._recommended is not None:
            ref = self._recommended.after
        gain = step_compute_ms(ref, speeds) / step_compute_ms(after, speeds) - 1.0
        if gain < s.min_expected_gain:
            return []
        before = list(self._split)
        pid = self._next_id(w.window, rank)
        thr_before = self._median_thr(recent)
        base = statistics.median(self._healthy) if self._healthy else None
        lost = (
            ""
            if base is None or thr_before is None
            else (f", {100.0 * (base - thr_before) / base:.1f}% below the healthy baseline")
        )
        ev = PlanEvent(
            id=pid,
            window=w.window,
            rank=rank,
            finding=w.findings.get(rank),
            speeds=speeds,
            before=before,
            after=after,
            apply_at_step=None,
            status="recommended",
            throughput_before=thr_before,
            reason="",
        )
        self._last_change = w.window
        head = (
            f"rank {rank} slowest per sample ({speeds[rank]:.1f} samples/s vs peers' median "
            f"{statistics.median(speeds[r] for r in range(self.nranks) if r != rank):.1f})"
            f"{lost}; predicted {100.0 * gain:.1f}% faster steps"
        )
        if self._mode == "recommend":
            ev.reason = f"{head}; recommend mode: not sent to the job"
            self._recommended = ev
            return [ev]
        at = self._apply_step(w)
        ev.apply_at_step = at
        ev.reason = f"{head}; sent to the job, every rank switches at step {at}"
        self._plan = _Plan(event=ev, restore=False)
        return [dataclasses.replace(ev, control=self._control(pid, after, at))]

    def _maybe_restore(self, w: _Window) -> list[PlanEvent]:
        """Restore the uniform split once the slow rank is as fast per sample as its peers."""
        act = self._active
        if act is None or self._mode != "apply" or not self._interval_ok(w.window):
            return []
        if self._restore_failed == act.id:
            return []  # restoring lost throughput once already; keep the working plan
        s = self.settings
        since = [x for x in self._history if x.step_lo >= (act.apply_at_step or 0)]
        if len(since) < s.verify_windows:
            return []
        speeds = self._speeds(since[-s.verify_windows :])
        if speeds is None or self.nranks < 2:
            return []
        peers = statistics.median(speeds[r] for r in range(self.nranks) if r != act.rank)
        if speeds[act.rank] < (1.0 - s.recovered_tolerance) * peers or act.rank in w.flagged:
            return []
        assert self.global_batch is not None and self._split is not None
        uniform = uniform_split(self.global_batch, self.nranks)
        pid = self._next_id(w.window, act.rank)
        at = self._apply_step(w)
        ev = PlanEvent(
            id=pid,
            window=w.window,
            rank=act.rank,
            finding=None,
            speeds=speeds,
            before=list(self._split),
            after=uniform,
            apply_at_step=at,
            status="recommended",
            throughput_before=self._median_thr(since[-s.verify_windows :]),
            reason=f"{RESTORE_REASON} (sent to the job, every rank switches at step {at})",
        )
        self._last_change = w.window
        self._plan = _Plan(event=ev, restore=True)
        return [dataclasses.replace(ev, control=self._control(pid, uniform, at))]

    def _follow(self, w: _Window) -> list[PlanEvent]:
        p = self._plan
        assert p is not None
        s = self.settings
        at = p.event.apply_at_step or 0
        if not p.applied:
            if w.step_hi < at + s.ack_timeout_windows * s.window_steps:
                return []
            # The job never confirmed: it may not use artemis.job at all, which is a
            # normal case. Nothing was applied, so nothing may claim a recovery; the
            # previous split is republished so ranks that did switch come back together.
            self._plan = None
            self._back_off(p, w)
            acked = sorted(p.acks)
            note = f" (acks from ranks {acked} of {self.nranks})" if acked else ""
            back = self._withdraw(p, w, "withdrawn")
            ev = self._emit(
                p,
                control=back,
                status="recommended",
                window=w.window,
                reason=(
                    f"not acknowledged by the job after {w.window - p.event.window} windows{note}; "
                    "plan withdrawn, the job keeps its previous split"
                ),
            )
            return [ev]
        start = max([at, *p.acks.values()])
        after_w = [x for x in self._history if x.step_lo >= start]
        if len(after_w) < s.verify_windows:
            return []
        thr_after = self._median_thr(after_w[: s.verify_windows])
        thr_before = p.event.throughput_before
        self._plan = None
        if thr_after is None or thr_before is None or thr_before <= 0:
            ok, why = False, "throughput could not be measured"
        elif p.restore:
            ok = thr_after >= thr_before * (1.0 - s.verify_min_gain)
            why = f"throughput {_pct(thr_before, thr_after)} ({thr_before:.1f} -> {thr_after:.1f} samples/s)"
        else:
            gain = thr_after - thr_before
            base = statistics.median(self._healthy) if self._healthy else None
            lost = None if base is None else base - thr_before
            ok = gain >= s.verify_min_gain * thr_before or (
                lost is not None
                and lost > 0
                and gain >= s.verify_recover_frac * lost
                and gain >= s.verify_noise_frac * thr_before
            )
            why = f"throughput {_pct(thr_before, thr_after)} ({thr_before:.1f} -> {thr_after:.1f} samples/s"
            if lost is not None and lost > 0:
                why += f", {100.0 * gain / lost:.0f}% of the {lost:.1f} samples/s lost"
            why += ")"
        if ok:
            self._active = None if p.restore else p.event
            ev = self._emit(
                p,
                status="verified",
                window=w.window,
                throughput_after=thr_after,
                reason=f"recovered: {why}" if not p.restore else f"{RESTORE_REASON}; {why}",
            )
            return [ev]
        back = self._withdraw(p, w, "rollback")
        self._split = list(p.event.before)
        self._last_change = w.window
        if p.restore:
            self._restore_failed = self._active.id if self._active is not None else None
        else:
            self._back_off(p, w)
        at_back = back["apply_at_step"]
        ev = self._emit(
            p,
            control=back,
            status="rolled_back",
            window=w.window,
            throughput_after=thr_after,
            escalate=True,
            reason=f"did not recover: {why}; previous split restored at step {at_back}",
        )
        return [ev]

    def _back_off(self, p: _Plan, w: _Window) -> None:
        """No new plan for this rank for a while (doubling): it failed or was ignored."""
        if p.restore:
            return
        n = self._rollbacks[p.event.rank] = self._rollbacks.get(p.event.rank, 0) + 1
        self._blocked[p.event.rank] = w.window + self.settings.rollback_backoff_windows * 2 ** (
            n - 1
        )

    def _withdraw(self, p: _Plan, w: _Window, tag: str) -> dict[str, Any]:
        """Control that republishes the split in force before ``p``, switching in the future."""
        return self._control(f"{p.event.id}-{tag}", p.event.before, self._apply_step(w))

    def _revert_all(self, reason: str) -> list[PlanEvent]:
        """Withdraw the pending plan and undo the applied one: back to the uniform split."""
        last = self._history[-1] if self._history else None
        pending, active = self._plan, self._active
        self._plan = self._active = None
        gb = self.global_batch
        if last is None or gb is None or self._split is None:
            return []
        uniform = uniform_split(gb, self.nranks)
        events: list[PlanEvent] = []
        if pending is not None:
            events.append(
                self._emit(pending, status="rolled_back", window=last.window, reason=reason)
            )
        if active is not None and (pending is None or not pending.restore):
            p = _Plan(event=active, restore=False)
            events.append(self._emit(p, status="rolled_back", window=last.window, reason=reason))
        if events and (self._split != uniform or (pending is not None and not pending.applied)):
            # One control for the lot: every rank goes back to the uniform split together.
            tag = "withdrawn" if pending is not None and not pending.applied else "reverted"
            events[-1].control = self._control(
                f"{events[-1].id}-{tag}", uniform, self._apply_step(last)
            )
        self._split = uniform
        self._last_change = last.window
        return events


def _flagged(findings: Iterable[Any]) -> dict[int, dict[str, Any]]:
    """Ranks with a rank/degraded finding flagged or ongoing, with that finding as a dict."""
    out: dict[int, dict[str, Any]] = {}
    for f in findings:
        if isinstance(f, Mapping):
            kind, state, rank = f.get("kind"), f.get("state"), f.get("rank")
            d: dict[str, Any] = dict(f)
        elif isinstance(f, tuple):
            kind, state, rank = f[0], f[1], f[2]
            d = {"kind": kind, "state": state, "rank": rank}
        else:
            kind, state, rank = (
                getattr(f, "kind", None),
                getattr(f, "state", None),
                getattr(f, "rank", None),
            )
            # The detector's Finding has to_json (exactly the DESIGN keys, JSON-safe).
            if hasattr(f, "to_json"):
                d = dict(f.to_json())
            elif hasattr(f, "to_dict"):
                d = dict(f.to_dict())
            elif dataclasses.is_dataclass(f) and not isinstance(f, type):
                d = dataclasses.asdict(f)
            else:
                d = {"kind": kind, "state": state, "rank": rank}
        if kind in TRIGGER_KINDS and state in TRIGGER_STATES and rank is not None:
            out.setdefault(int(rank), d)
    return out


def _pct(a: float, b: float) -> str:
    return f"{100.0 * (b - a) / a:+.1f}%"


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
