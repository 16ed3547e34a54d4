"""Opt-in rebalancing: move batch work away from a slow rank, verify it helped, undo it if not.

Pure: the policy never reads a clock, a file or a socket. Its caller (the
per-job core) feeds it one call per assembled window (``on_window``) and one per
acknowledgement that came back from the job (``on_ack``), and forwards what it
returns: each ``PlanEvent`` is a line for the plans file, and an event whose
``control`` is set carries the plan the agents must publish to the job
(control action ``"plan"``). The rules in prose are in rebalance/README.md; the
life of one plan is the transition table in ``artemis.rebalance.state``; its knobs
and their bounds are ``artemis.rebalance.settings``, its event lines
``artemis.rebalance.events``, the windows it remembers ``artemis.rebalance.history``,
the verification rule ``artemis.rebalance.verify`` and its saved state's format
``artemis.rebalance.snapshot``.

Its whole state is plain data (``snapshot``/``restore``), so an applied plan
stays in force and is still verified after a coordinator restart. Its knobs
change at run time (``update_settings``, ``set_mode``) and its rank count grows
(``resize``) without losing what it knows.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from . import snapshot
from .events import STATUSES, PlanEvent, plan_control
from .history import (
    TRIGGER_KINDS,
    TRIGGER_STATES,
    Window,
    flagged_ranks,
    history_len,
    median_throughput,
    per_rank,
    per_sample_speeds,
    stalls,
)
from .settings import BOUNDS, MODES, PolicySettings, bound_problem
from .snapshot import SNAPSHOT_VERSION
from .split import proportional_split, step_compute_ms, uniform_split
from .state import Plan, PlanState, status_of
from .verify import verdict

# The names other modules import from here (README, DESIGN and the tests give this path).
__all__ = [
    "BOUNDS",
    "MODES",
    "RESTORE_REASON",
    "SNAPSHOT_VERSION",
    "STATUSES",
    "TRIGGER_KINDS",
    "TRIGGER_STATES",
    "PlanEvent",
    "PolicySettings",
    "RebalancePolicy",
    "bound_problem",
]

RESTORE_REASON = "rank recovered: uniform split restored"


class RebalancePolicy:
    """Decides, per window, whether to rebalance, and follows each plan to its verdict.

    ``nranks`` is the job's world size; ``global_batch`` the samples per step over
    all ranks (None: learned from the ``samples`` reported by every rank); ``job``
    is written into every event.

    At most three plans are live at once, each in its own state: advice
    (RECOMMENDED, recommend mode), the plan in flight (SENT or APPLIED), and the
    uneven plan in force (VERIFIED). A plan leaves the policy when it reaches a
    terminal state.
    """

    def __init__(
        self,
        settings: PolicySettings,
        nranks: int,
        global_batch: int | None,
        *,
        job: str = "",
    ) -> None:
        if nranks < 1:
            raise ValueError("nranks must be >= 1")
        self.settings = settings
        self.nranks = nranks
        self.global_batch = global_batch
        self.job = job
        # A learned global batch is a sum over the ranks known then; it is relearned
        # when more ranks appear. A configured one is the job's and stays.
        self._gb_learned = global_batch is None
        self._mode = settings.mode
        self._history: deque[Window] = deque(maxlen=history_len(settings))
        self._healthy: deque[float] = deque(maxlen=settings.baseline_windows)
        self._split: list[int] | None = (
            uniform_split(global_batch, nranks) if global_batch is not None else None
        )
        self._plans: list[Plan] = []  # live plans only, at most one per role
        # rank -> first window it may be planned for again, after its plan was rolled back;
        # the backoff doubles with each rollback so a fault that rebalancing cannot fix
        # does not cycle plan -> rollback forever (each rollback escalates to a human).
        self._blocked: dict[int, int] = {}
        self._rollbacks: dict[int, int] = {}
        self._last_change: int | None = None  # window of the last new plan
        self._hold: str | None = None  # why no new plan may start now (``hold``)
        self._now = -1  # the latest window seen
        self._seq = 0

    # ------------------------------------------------------------------ public

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def active_plan(self) -> PlanEvent | None:
        """The plan the policy is following (sent, applied or verified), or None."""
        p = self._pending or self._in_force
        return None if p is None else dataclasses.replace(p.event, control=None)

    @property
    def verifying(self) -> bool:
        """A plan is on its way (sent, or applied and not verified yet)."""
        return self._pending is not None

    def hold(self, reason: str | None) -> None:
        """No new plan, nor a restore of the uniform split, while ``reason`` stands (None
        lifts it): a correction of the job is on its way, and its verification must not
        measure a change of split too. A plan already on its way is still followed."""
        self._hold = reason or None

    @property
    def plans(self) -> list[Plan]:
        """The live plans, the policy's own objects: read them, do not change them."""
        return list(self._plans)

    @property
    def split(self) -> list[int] | None:
        """Samples per rank the job runs on as far as the policy knows."""
        return None if self._split is None else list(self._split)

    def set_mode(self, mode: str) -> list[PlanEvent]:
        """Change mode at run time.

        Leaving ``apply`` undoes what the policy put in place (a plan waiting for
        its step, or an applied uneven split): outside ``apply`` it can no longer
        verify, roll back or restore, and an unmanaged uneven split is not safe.
        """
        if mode not in MODES:
            raise ValueError(f"rebalance mode must be one of {MODES}, got {mode!r}")
        old, self._mode = self._mode, mode
        self.settings = dataclasses.replace(self.settings, mode=mode)
        out: list[PlanEvent] = []
        if old == "apply" and mode != "apply":
            out.extend(
                self._revert_all(f"rebalance mode changed to {mode}: previous split restored")
            )
        if mode != "recommend" and self._advice is not None:
            self._end(self._advice)
        return out

    def update_settings(self, settings: PolicySettings) -> None:
        """Apply new knobs to the running policy; the next window and plan use them.

        The mode is not taken from ``settings``: change it with ``set_mode``, which
        returns the events of undoing a plan. Plans already made keep their split
        and steps; only the next decision sees the new bounds.
        """
        settings.validate()
        self.settings = dataclasses.replace(settings, mode=self._mode)
        n = history_len(self.settings)
        if self._history.maxlen != n:
            self._history = deque(self._history, maxlen=n)
        if self._healthy.maxlen != self.settings.baseline_windows:
            self._healthy = deque(self._healthy, maxlen=self.settings.baseline_windows)

    def resize(self, nranks: int) -> list[PlanEvent]:
        """The job has ``nranks`` ranks now (more than before): keep what still holds.

        History, baselines, back-offs and plan ids are kept (new ranks start with no
        measurements). A plan splits the batch over the old rank count, and the
        job's clients ignore a plan for another world size, so a plan in flight or
        in force cannot be in force any more: it ends with a ``rolled_back`` event
        that says so, and, when the global batch is known, a control publishing
        the uniform split for the new size. A learned global batch is relearned.
        """
        if nranks < self.nranks:
            raise ValueError(
                f"a job's rank count only grows: {nranks} < {self.nranks} is a new run"
            )
        if nranks == self.nranks:
            return []
        old = self.nranks
        reason = (
            f"the job has {nranks} ranks now (was {old}): this plan splits the batch over "
            f"{old} ranks, which a job of {nranks} ranks ignores; ended, the job runs its "
            "uniform split"
        )
        pending, in_force = self._pending, self._in_force
        events: list[PlanEvent] = []
        for p in (pending, in_force):
            if p is not None:
                events.append(self._emit(p, PlanState.ROLLED_BACK, window=self._now, reason=reason))
        if self._advice is not None:
            self._end(self._advice)
        self._plans = []
        self.nranks = nranks
        self._history = deque(
            (w.padded(nranks) for w in self._history), maxlen=self._history.maxlen
        )
        if self._gb_learned:
            self.global_batch = None
            self._split = None
            self._healthy.clear()  # measured with a batch that lacked the new ranks
        else:
            assert self.global_batch is not None
            self._split = uniform_split(self.global_batch, nranks)
            if events and self._history:
                events[-1].control = plan_control(
                    f"{events[-1].id}-resized", self._split, self._apply_step(self._history[-1])
                )
        return events

    def on_window(
        self,
        window: int,
        findings: Iterable[Any],
        gap_ms: Mapping[int, float | None] | np.ndarray | Sequence[float],
        step_ms: float | None,
        samples: Mapping[int, int | None] | np.ndarray | Sequence[float] | None = None,
        *,
        step_lo: int | None = None,
        step_hi: int | None = None,
        held: bool = False,
        missing: Sequence[int] = (),
    ) -> list[PlanEvent]:
        """Feed one assembled window; returns the plan events it caused (maybe none).

        ``findings`` are the detector's findings of this window: objects with
        ``.kind/.state/.rank``, mappings with those keys, or (kind, state, rank)
        tuples. ``gap_ms`` is each rank's compute gap, as a mapping rank -> ms or
        an array indexed by rank (NaN: not measured); ``samples`` the samples per
        step each rank reported, likewise (absent: the split the policy believes
        in). ``step_lo``/``step_hi`` bound the window's steps (default: window *
        window_steps, one window long). ``held``: the window is not healthy whatever
        ``findings`` say (the caller holds back an unconfirmed finding): it never
        feeds the throughput baseline. ``missing``: ranks absent from the window
        (their agent gone): a plan still waiting for their acknowledgement is
        withdrawn at once, as it cannot be applied by every rank together.
        """
        ws = self.settings.window_steps
        lo = window * ws if step_lo is None else step_lo
        hi = lo + ws if step_hi is None else step_hi
        self._now = window
        fmap = flagged_ranks(findings)
        gap = per_rank(gap_ms, self.nranks)
        gap[~(np.isfinite(gap) & (gap > 0))] = np.nan
        meas = per_rank(samples if samples is not None else {}, self.nranks)
        if self.global_batch is None and bool(np.isfinite(meas).all()):
            self.global_batch = int(meas.sum())
            self._split = [int(v) for v in meas.tolist()]
        thr = None
        if self.global_batch and step_ms is not None and step_ms > 0:
            thr = self.global_batch / step_ms * 1000.0
        w = Window(window, lo, hi, gap, meas, thr, frozenset(fmap))
        self._history.append(w)
        if (
            not w.flagged
            and not held
            and not missing  # a window short of ranks measures another job's throughput
            and self._pending is None
            and self._in_force is None
            and thr is not None
        ):
            self._healthy.append(thr)
        if self._mode == "off" or self.global_batch is None or self._split is None:
            return []
        if self.global_batch < self.nranks * self.settings.min_samples:
            return []  # nothing to move: every rank already holds the minimum
        out: list[PlanEvent] = []
        if self._pending is not None:
            out.extend(self._follow(w, missing))
        if self._pending is None and self._hold is None:
            out.extend(self._maybe_restore(w))
        if self._pending is None and not out and self._hold is None:
            out.extend(self._maybe_plan(w, fmap))
        return out

    def on_ack(self, plan_id: str, rank: int, step: int | None = None) -> list[PlanEvent]:
        """A rank's job acknowledged switching to ``plan_id`` (at ``step``).

        Returns the ``applied`` event once every rank has acknowledged. Acks of
        plans that are no longer followed (withdrawn, rolled back) are ignored.
        """
        p = self._pending
        if p is None or p.state is not PlanState.SENT or p.id != plan_id:
            return []
        if not 0 <= rank < self.nranks:
            return []
        at = p.event.apply_at_step or 0
        p.acks[rank] = at if step is None else int(step)
        if len(p.acks) < self.nranks:
            return []
        self._split = list(p.event.after)
        late = sorted(r for r, s in p.acks.items() if s > at)
        reason = f"acknowledged by all {self.nranks} ranks"
        if late:
            reason += f"; ranks {late} switched after step {at} (at {max(p.acks.values())})"
        return [self._emit(p, PlanState.APPLIED, reason=reason)]

    # ------------------------------------------------------------------ state

    def snapshot(self, binary: bool = False) -> dict[str, Any]:
        """The whole state as plain JSON-able data (``json.dumps(..., allow_nan=False)``).

        Per-rank history arrays are little-endian float64 in base64; ``binary=True``
        leaves them as ``bytes`` instead (for msgpack: no base64, a third of the time
        for a 100k-rank job). ``restore`` reads either. The format: rebalance/snapshot.py.
        """
        return snapshot.dump(self, binary)

    @classmethod
    def restore(
        cls, state: Mapping[str, Any], settings: PolicySettings | None = None
    ) -> RebalancePolicy:
        """A policy that carries on exactly where ``snapshot`` left off.

        ``settings`` (e.g. the restarted coordinator's) replace the saved knobs,
        but not the saved mode: a mode change goes through ``set_mode``, whose
        events the caller must forward.
        """
        return snapshot.load(cls, state, settings)

    # ------------------------------------------------------------------ roles

    def _role(self, *states: PlanState, restore: bool | None = None) -> Plan | None:
        for p in self._plans:
            if p.state in states and (restore is None or p.restore == restore):
                return p
        return None

    @property
    def _pending(self) -> Plan | None:
        """The plan in flight: sent, or applied and being verified."""
        return self._role(PlanState.SENT, PlanState.APPLIED)

    @property
    def _in_force(self) -> Plan | None:
        """The verified uneven plan the job runs on."""
        return self._role(PlanState.VERIFIED, restore=False)

    @property
    def _advice(self) -> Plan | None:
        """The latest plan recommended in recommend mode."""
        return self._role(PlanState.RECOMMENDED)

    def _start(self, state: PlanState, window: int, ev: PlanEvent, restore: bool = False) -> Plan:
        p = Plan.new(state, window, ev, restore=restore)
        self._plans.append(p)
        return p

    def _end(self, p: Plan) -> None:
        p.move(PlanState.ENDED, self._now)
        self._drop(p)

    def _drop(self, p: Plan) -> None:
        if p.terminal:
            self._plans = [q for q in self._plans if q is not p]

    def _emit(
        self, p: Plan, to: PlanState, control: dict[str, Any] | None = None, **changes: Any
    ) -> PlanEvent:
        """Move ``p`` to ``to`` and return its event line (with ``control``, if any)."""
        p.move(to, self._now)
        status = status_of(to)
        p.event = dataclasses.replace(p.event, control=None, status=status, **changes)
        self._drop(p)
        return dataclasses.replace(p.event, control=control)

    # ------------------------------------------------------------------ internals

    def _next_id(self, window: int, rank: int) -> str:
        self._seq += 1
        return f"{self.settings.id_prefix}p{self._seq}-w{window}-r{rank}"

    def _apply_step(self, w: Window) -> int:
        return w.step_hi + self.settings.lead_windows * self.settings.window_steps

    def _speeds(self, windows: Sequence[Window]) -> np.ndarray | None:
        return per_sample_speeds(windows, self._split)

    def _baseline(self) -> float | None:
        return float(np.median(list(self._healthy))) if self._healthy else None

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

    def _maybe_plan(self, w: Window, fmap: Mapping[int, dict[str, Any]]) -> list[PlanEvent]:
        s = self.settings
        rank = self._triggered_rank()
        if rank is not None and w.window < self._blocked.get(rank, w.window):
            return []
        advice = self._advice
        if rank is None or not self._interval_ok(w.window):
            if rank is None and advice is not None and not w.flagged:
                self._end(advice)  # the fault cleared; a new one gets a fresh plan
            return []
        if rank >= self.nranks or self.nranks < 2:
            return []
        if stalls(fmap.get(rank)):
            # Stalls in a fraction of its steps (a data loader's wait, a stopped
            # process): fewer samples do not shorten a fixed stall, and the split would
            # only slow the job's other steps. Its incident escalates instead.
            return []
        recent = list(self._history)[-s.speed_windows :]
        speeds = self._speeds(recent)
        if speeds is None:
            return []
        peers = np.delete(speeds, rank)
        if bool((peers <= speeds[rank]).any()):
            return []  # flagged, but not the slowest per sample: more samples won't help it
        now = self._speeds([w])
        if now is not None:
            peers_now = float(np.median(np.delete(now, rank)))
            if now[rank] >= peers_now * (1.0 - s.recovered_tolerance):
                # Still flagged while the finding clears, but its latest window is on
                # pace again: a new uneven split would only have to be undone.
                return []
        assert self.global_batch is not None and self._split is not None
        after = proportional_split(speeds, self.global_batch, s.max_shift_frac, s.min_samples)
        ref = self._split
        if self._mode == "recommend" and advice is not None:
            ref = advice.event.after
        gain = step_compute_ms(ref, speeds) / step_compute_ms(after, speeds) - 1.0
        if gain < s.min_expected_gain:
            return []
        before = list(self._split)
        pid = self._next_id(w.window, rank)
        thr_before = median_throughput(recent)
        base = self._baseline()
        lost = (
            ""
            if base is None or thr_before is None
            else (f", {100.0 * (base - thr_before) / base:.1f}% below the healthy baseline")
        )
        ev = PlanEvent(
            id=pid,
            window=w.window,
            rank=rank,
            finding=fmap.get(rank),
            speeds=[float(x) for x in speeds.tolist()],
            before=before,
            after=after,
            apply_at_step=None,
            status="recommended",
            throughput_before=thr_before,
            reason="",
            job=self.job,
        )
        self._last_change = w.window
        head = (
            f"rank {rank} slowest per sample ({speeds[rank]:.1f} samples/s vs peers' median "
            f"{float(np.median(peers)):.1f}){lost}; predicted {100.0 * gain:.1f}% faster steps"
        )
        if self._mode == "recommend":
            ev.reason = f"{head}; recommend mode: not sent to the job"
            if advice is not None:
                self._end(advice)  # superseded by a better one
            self._start(PlanState.RECOMMENDED, w.window, ev)
            return [ev]
        at = self._apply_step(w)
        ev.apply_at_step = at
        ev.reason = f"{head}; sent to the job, every rank switches at step {at}"
        self._start(PlanState.SENT, w.window, ev)
        return [dataclasses.replace(ev, control=plan_control(pid, after, at))]

    def _maybe_restore(self, w: Window) -> list[PlanEvent]:
        """Restore the uniform split once the slow rank is as fast per sample as its peers."""
        act = self._in_force
        if act is None or self._mode != "apply" or not self._interval_ok(w.window):
            return []
        if act.restore_failed:
            return []  # restoring lost throughput once already; keep the working plan
        s = self.settings
        since = [x for x in self._history if x.step_lo >= (act.event.apply_at_step or 0)]
        if len(since) < s.verify_windows:
            return []
        speeds = self._speeds(since[-s.verify_windows :])
        if speeds is None or self.nranks < 2:
            return []
        rank = act.event.rank
        peers = float(np.median(np.delete(speeds, rank)))
        if speeds[rank] < (1.0 - s.recovered_tolerance) * peers or rank in w.flagged:
            return []
        assert self.global_batch is not None and self._split is not None
        uniform = uniform_split(self.global_batch, self.nranks)
        pid = self._next_id(w.window, rank)
        at = self._apply_step(w)
        ev = PlanEvent(
            id=pid,
            window=w.window,
            rank=rank,
            finding=None,
            speeds=[float(x) for x in speeds.tolist()],
            before=list(self._split),
            after=uniform,
            apply_at_step=at,
            status="recommended",
            throughput_before=median_throughput(since[-s.verify_windows :]),
            reason=f"{RESTORE_REASON} (sent to the job, every rank switches at step {at})",
            job=self.job,
        )
        self._last_change = w.window
        self._start(PlanState.SENT, w.window, ev, restore=True)
        return [dataclasses.replace(ev, control=plan_control(pid, uniform, at))]

    def _recovered(self, rank: int, windows: Sequence[Window]) -> bool:
        """``rank`` computes as fast per sample as its peers' median over ``windows``."""
        speeds = self._speeds(windows)
        if speeds is None or self.nranks < 2:
            return False
        peers = float(np.median(np.delete(speeds, rank)))
        return bool(speeds[rank] >= (1.0 - self.settings.recovered_tolerance) * peers)

    def _follow(self, w: Window, missing: Sequence[int] = ()) -> list[PlanEvent]:
        p = self._pending
        assert p is not None
        s = self.settings
        at = p.event.apply_at_step or 0
        if p.state is PlanState.SENT:
            gone = sorted({int(r) for r in missing} - set(p.acks))
            if gone:
                # Ranks whose agent is gone cannot get the plan or report their switch:
                # the others must not run on it alone. Withdrawn now, not at the timeout.
                return self._withdrawn(
                    p,
                    w,
                    f"ranks {gone} stopped reporting before acknowledging it"
                    f" (acks from ranks {sorted(p.acks)} of {self.nranks}); plan"
                    " withdrawn, the job keeps its previous split",
                )
            if w.step_hi < at + s.ack_timeout_windows * s.window_steps:
                return []
            # The job never confirmed: it may not use artemis.job at all, which is a
            # normal case. Nothing was applied, so nothing may claim a recovery; the
            # previous split is republished so ranks that did switch come back together.
            self._back_off(p, w)
            acked = sorted(p.acks)
            note = f" (acks from ranks {acked} of {self.nranks})" if acked else ""
            return self._withdrawn(
                p,
                w,
                f"not acknowledged by the job after {w.window - p.event.window} windows"
                f"{note}; plan withdrawn, the job keeps its previous split",
            )
        start = max([at, *p.acks.values()])
        after_w = [x for x in self._history if x.step_lo >= start]
        if len(after_w) < s.verify_windows:
            return []
        thr_after = median_throughput(after_w[: s.verify_windows])
        ev = p.event
        predicted = (
            None
            if p.restore or not ev.speeds
            else step_compute_ms(ev.before, ev.speeds) - step_compute_ms(ev.after, ev.speeds)
        )
        ok, why = verdict(
            s,
            ev.throughput_before,
            thr_after,
            self._baseline(),
            restore=p.restore,
            predicted_ms=predicted,
            batch=self.global_batch,
        )
        # What else happened in the verification windows, for the reason: the plan's
        # rank recovering by itself, or another rank slowing (both move the throughput).
        checked = after_w[: s.verify_windows]
        others = sorted(set().union(*(x.flagged for x in checked)) - {p.event.rank})
        if others:
            why += f"; ranks {others} flagged during the verification"
        elif not p.restore and self._recovered(p.event.rank, checked):
            why += f"; rank {p.event.rank} as fast per sample as its peers again (it recovered)"
        old = self._in_force
        if ok:
            ev = self._emit(
                p,
                PlanState.VERIFIED,
                window=w.window,
                throughput_after=thr_after,
                reason=f"recovered: {why}" if not p.restore else f"{RESTORE_REASON}; {why}",
            )
            if old is not None:
                self._end(old)  # replaced by the refined plan, or by the uniform split
            if p.restore:
                self._end(p)  # the uniform split needs no plan in force
            return [ev]
        back = self._withdraw(p, w, "rollback")
        self._split = list(p.event.before)
        self._last_change = w.window
        if p.restore:
            if old is not None:
                old.restore_failed = True
        else:
            self._back_off(p, w)
        return [
            self._emit(
                p,
                PlanState.ROLLED_BACK,
                control=back,
                window=w.window,
                throughput_after=thr_after,
                escalate=True,
                reason=f"did not recover: {why}; previous split restored at step {back['apply_at_step']}",
            )
        ]

    def _back_off(self, p: Plan, w: Window) -> None:
        """No new plan for this rank for a while (doubling): it failed or was ignored."""
        if p.restore:
            return
        rank = p.event.rank
        n = self._rollbacks[rank] = self._rollbacks.get(rank, 0) + 1
        self._blocked[rank] = w.window + self.settings.rollback_backoff_windows * 2 ** (n - 1)

    def _withdrawn(self, p: Plan, w: Window, reason: str) -> list[PlanEvent]:
        """``p`` never switched on every rank: withdrawn, the previous split republished."""
        back = self._withdraw(p, w, "withdrawn")
        return [self._emit(p, PlanState.WITHDRAWN, control=back, window=w.window, reason=reason)]

    def _withdraw(self, p: Plan, w: Window, tag: str) -> dict[str, Any]:
        """Control that republishes the split in force before ``p``, switching in the future."""
        return plan_control(f"{p.event.id}-{tag}", p.event.before, self._apply_step(w))

    def _revert_all(self, reason: str) -> list[PlanEvent]:
        """Withdraw the pending plan and undo the applied one: back to the uniform split."""
        last = self._history[-1] if self._history else None
        pending, active = self._pending, self._in_force
        gb = self.global_batch
        if last is None or gb is None or self._split is None:
            return []  # no window seen or no batch known: no plan can exist
        uniform = uniform_split(gb, self.nranks)
        unsent = pending is not None and pending.state is PlanState.SENT
        events: list[PlanEvent] = []
        if pending is not None:
            events.append(
                self._emit(pending, PlanState.ROLLED_BACK, window=last.window, reason=reason)
            )
        if active is not None:
            if pending is None or not pending.restore:
                events.append(
                    self._emit(active, PlanState.ROLLED_BACK, window=last.window, reason=reason)
                )
            else:
                self._end(active)  # the restore's rollback line covers it: uniform either way
        if events and (self._split != uniform or unsent):
            # One control for the lot: every rank goes back to the uniform split together.
            tag = "withdrawn" if unsent else "reverted"
            events[-1].control = plan_control(
                f"{events[-1].id}-{tag}", uniform, self._apply_step(last)
            )
        self._split = uniform
        self._last_change = last.window
        return events
