"""The plan state machine and what the per-job core needs from the policy.

* the transition table: every legal transition is taken, every other one refused;
* a plan's life seen through its state history, in the job model of
  tests/test_rebalance_policy.py;
* snapshot/restore at every window of a run, mid-plan included: the restored policy
  carries on exactly as the uninterrupted one (same lines, same controls), whether
  the plan is verified or rolled back;
* update_settings reaching the next plan; resize keeping what still holds;
* one statement of the policy's bounds, used by PolicySettings and Settings alike.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
from artemis.detect.settings import Settings, SettingsError
from artemis.rebalance.policy import (
    BOUNDS,
    PlanEvent,
    PolicySettings,
    RebalancePolicy,
)
from artemis.rebalance.split import split_bounds, uniform_split
from artemis.rebalance.state import (
    INITIAL,
    STATUS_OF,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    Plan,
    PlanState,
)
from test_rebalance_policy import WS, Job

S = PlanState


def _ev(pid: str = "p1") -> PlanEvent:
    return PlanEvent(
        id=pid,
        window=0,
        rank=0,
        finding=None,
        speeds=[1.0, 1.0],
        before=[2, 2],
        after=[3, 1],
        apply_at_step=None,
        status="recommended",
    )


def _plan_in(state: PlanState) -> Plan:
    """A plan brought to ``state`` along legal transitions only."""
    path = {
        S.RECOMMENDED: [S.RECOMMENDED],
        S.SENT: [S.SENT],
        S.APPLIED: [S.SENT, S.APPLIED],
        S.VERIFIED: [S.SENT, S.APPLIED, S.VERIFIED],
        S.ROLLED_BACK: [S.SENT, S.ROLLED_BACK],
        S.WITHDRAWN: [S.SENT, S.WITHDRAWN],
        S.ENDED: [S.RECOMMENDED, S.ENDED],
    }[state]
    p = Plan.new(path[0], 0, _ev())
    for i, st in enumerate(path[1:], start=1):
        p.move(st, i)
    assert p.state is state
    return p


# --------------------------------------------------------------------------- the table


def test_table_covers_every_state_and_names_the_terminal_ones() -> None:
    assert set(TRANSITIONS) == set(PlanState)
    assert set(STATUS_OF) == set(PlanState)
    assert {S.ROLLED_BACK, S.WITHDRAWN, S.ENDED} == TERMINAL
    assert {S.RECOMMENDED, S.SENT} == INITIAL
    # every status a plans-file line may carry comes from some state
    assert {v for v in STATUS_OF.values() if v} == {
        "recommended",
        "applied",
        "verified",
        "rolled_back",
    }


@pytest.mark.parametrize(
    ("frm", "to"), [(a, b) for a, nxt in TRANSITIONS.items() for b in sorted(nxt)]
)
def test_every_legal_transition(frm: PlanState, to: PlanState) -> None:
    p = _plan_in(frm)
    before = list(p.history)
    p.move(to, 99)
    assert p.state is to
    assert p.history == [*before, (to, 99)]
    assert p.terminal == (to in TERMINAL)


@pytest.mark.parametrize(
    ("frm", "to"),
    [(a, b) for a in PlanState for b in PlanState if b not in TRANSITIONS[a]],
)
def test_every_illegal_transition_is_refused(frm: PlanState, to: PlanState) -> None:
    p = _plan_in(frm)
    before = list(p.history)
    with pytest.raises(IllegalTransition, match=f"{frm.value} -> {to.value}"):
        p.move(to, 99)
    assert p.state is frm and p.history == before  # nothing changed


@pytest.mark.parametrize("state", sorted(set(PlanState) - INITIAL))
def test_a_plan_starts_only_recommended_or_sent(state: PlanState) -> None:
    with pytest.raises(IllegalTransition):
        Plan.new(state, 0, _ev())


def test_plan_json_round_trip() -> None:
    p = _plan_in(S.APPLIED)
    p.acks = {0: 10, 1: 12}
    q = Plan.from_json(json.loads(json.dumps(p.to_json())), p.event)
    assert q == p


# --------------------------------------------------------------------------- plans in the policy


def _policy(
    mode: str = "apply", nranks: int = 4, gb: int | None = 128, **kw: Any
) -> RebalancePolicy:
    return RebalancePolicy(PolicySettings(mode=mode, window_steps=WS, **kw), nranks, gb, job="jx")


def test_a_plans_life_is_its_state_history() -> None:
    job = Job(_policy())
    job.run(10)
    job.speed[2] = 1000.0 / 1.3
    evs = job.run(10)
    assert [e.status for e in evs] == ["recommended", "applied", "verified"]
    assert all(e.job == "jx" for e in evs)
    (live,) = job.policy.plans
    assert live.id == evs[0].id and live.state is S.VERIFIED
    assert [s for s, _ in live.history] == [S.SENT, S.APPLIED, S.VERIFIED]
    assert [w for _, w in live.history] == sorted(w for _, w in live.history)
    # the restore: the uneven plan ends, the restore plan is verified then ends too
    job.speed[2] = 1000.0
    evs = job.run(12)
    assert [e.status for e in evs] == ["recommended", "applied", "verified"]
    assert job.policy.plans == []
    assert live.state is S.ENDED and live.history[-1][0] is S.ENDED


# --------------------------------------------------------------------------- snapshot / restore


def _lines(evs: list[PlanEvent]) -> list[tuple[dict[str, Any], Any]]:
    return [(e.to_dict(), e.control) for e in evs]


def _restored(job: Job) -> Job:
    """The same job, its policy rebuilt from a JSON snapshot (what a restart reads back)."""
    text = json.dumps(job.policy.snapshot(), allow_nan=False)
    twin = copy.deepcopy(job)
    twin.policy = RebalancePolicy.restore(json.loads(text))
    twin.events = []
    return twin


class LateAckJob(Job):
    """The job model, but a rank acks a plan only when it reaches the plan's step (as the
    real client does), so a plan stays SENT for windows and a restart can fall there.
    The last rank's ack comes a window later still, naming a later step (a node whose
    agent published late), so a restart can also fall between partial acks."""

    def run(self, windows: int) -> list[PlanEvent]:
        new: list[PlanEvent] = []
        for _ in range(windows):
            lo = self.window * WS
            last = self.nranks - 1
            for c in list(self.pending):
                at = c["apply_at_step"]
                if lo == at:
                    self.split = list(c["samples"])
                    for r in range(last):
                        new.extend(self.policy.on_ack(c["id"], r, at))
                elif lo == at + WS:
                    self.pending.remove(c)
                    new.extend(self.policy.on_ack(c["id"], last, at + WS))
            g = self.gaps()
            evs = self.policy.on_window(
                self.window,
                self.findings(),
                g,
                max(g.values()) + self.coll_ms,
                dict(enumerate(self.split)),
            )
            for e in evs:
                new.append(e)
                if e.control is not None:
                    self.controls.append(e.control)
                    self.pending.append(e.control)
            self.window += 1
        self.events.extend(new)
        return new


def _slow_pipeline(job: Job, floor: dict[int, float]) -> None:
    """Rank 2 waits for its input: its step takes at least floor ms whatever its batch."""

    def gaps() -> dict[int, float]:
        return {
            r: max(1000.0 * job.split[r] / job.speed[r], floor.get(r, 0.0))
            for r in range(job.nranks)
        }

    job.gaps = gaps  # type: ignore[method-assign]


@pytest.mark.parametrize("outcome", ["verified", "rolled_back"])
def test_restore_at_every_window_carries_on_exactly(outcome: str) -> None:
    """Snapshot after every window of a run (before, during and after a plan), restore
    from JSON, and run both on: the restored policy writes exactly the lines and sends
    exactly the controls the uninterrupted one does, verification and rollback included."""

    def fresh() -> tuple[Job, dict[int, float]]:
        job = LateAckJob(_policy())
        floor: dict[int, float] = {}
        _slow_pipeline(job, floor)
        return job, floor

    total, onset, recover = 60, 6, 34

    def step(job: Job, floor: dict[int, float], w: int) -> list[PlanEvent]:
        if w == onset:
            if outcome == "verified":
                job.speed[2] = 1000.0 / 1.3
            else:
                floor[2] = 46.0
        if w == recover:
            job.speed[2], floor[2] = 1000.0, 0.0
        return job.run(1)

    ref, ref_floor = fresh()
    per_window = [step(ref, ref_floor, w) for w in range(total)]
    statuses = [e.status for evs in per_window for e in evs]
    assert outcome in statuses  # the run does exercise the path under test
    states_seen: set[PlanState] = set()
    for cut in range(1, total):
        job, floor = fresh()
        for w in range(cut):
            step(job, floor, w)
        states_seen |= {p.state for p in job.policy.plans}
        twin = _restored(job)
        _slow_pipeline(twin, floor)  # the copy's gaps read the copy's split and speeds
        for w in range(cut, total):
            got = step(twin, floor, w)
            assert _lines(got) == _lines(per_window[w]), f"cut at {cut}, window {w}"
        assert twin.split == ref.split
    # cuts fell while a plan was sent, applied and (verified path) in force
    assert {S.SENT, S.APPLIED} <= states_seen
    if outcome == "verified":
        assert S.VERIFIED in states_seen


def test_binary_snapshot_round_trips_through_msgpack() -> None:
    """snapshot(binary=True) keeps history arrays as bytes (for msgpack); it restores to
    the same state as the JSON form, mid-plan, NaN (a rank that did not report) included."""
    import msgpack

    job = LateAckJob(_policy())
    job.run(6)
    job.speed[2] = 1000.0 / 1.3
    job.run(4)  # the plan is sent, not yet acked
    job.policy.on_window(job.window, [], {0: 30.0, 2: 41.0}, 45.0)  # ranks 1, 3 missing
    assert [p.state for p in job.policy.plans] == [S.SENT]
    want = job.policy.snapshot()
    packed = msgpack.packb(job.policy.snapshot(binary=True))
    back = RebalancePolicy.restore(msgpack.unpackb(packed, strict_map_key=False))
    assert back.snapshot() == want
    assert RebalancePolicy.restore(json.loads(json.dumps(want))).snapshot() == want


def test_restore_takes_new_settings_but_keeps_the_mode() -> None:
    pol = _policy()
    pol.on_window(0, [], {0: 32.0, 1: 32.0, 2: 32.0, 3: 32.0}, 40.0)
    new = PolicySettings(mode="off", window_steps=WS, max_shift_frac=0.1)
    back = RebalancePolicy.restore(json.loads(json.dumps(pol.snapshot())), new)
    assert back.mode == "apply" and back.settings.max_shift_frac == 0.1
    with pytest.raises(ValueError, match="snapshot version"):
        RebalancePolicy.restore({**pol.snapshot(), "version": 99})


# --------------------------------------------------------------------------- update_settings


def test_update_settings_reaches_the_next_plan() -> None:
    """A live `set max_shift_frac 0.1` before the fault: the plan keeps the new bounds,
    exactly as a policy started with them would."""
    gaps = {0: 32.0, 1: 32.0, 2: 64.0, 3: 32.0}  # rank 2 at half speed: the bounds bite
    flagged = [("rank", "flagged", 2)]
    s = dict.fromkeys(range(4), 32)

    live = _policy()
    live.on_window(0, [], {0: 32.0, 1: 32.0, 2: 32.0, 3: 32.0}, 37.0, s)
    coord = Settings().set("max_shift_frac", "0.1")
    live.update_settings(PolicySettings.from_settings(coord, window_steps=WS))
    assert live.mode == "apply"  # the coordinator's rebalance=off does not switch it off
    assert live.settings.max_shift_frac == 0.1
    evs = [e for w in range(1, 4) for e in live.on_window(w, flagged, gaps, 69.0, s)]
    assert [e.status for e in evs] == ["recommended"]
    lo, hi = split_bounds(128, 4, 0.1, 1)
    assert all(lo <= n <= hi for n in evs[0].after) and evs[0].after[2] == lo == 29

    started = _policy(max_shift_frac=0.1)
    started.on_window(0, [], {0: 32.0, 1: 32.0, 2: 32.0, 3: 32.0}, 37.0, s)
    want = [e for w in range(1, 4) for e in started.on_window(w, flagged, gaps, 69.0, s)]
    assert _lines(evs) == _lines(want)
    # without the update the same windows give the wider split
    wide = _policy()
    wide.on_window(0, [], {0: 32.0, 1: 32.0, 2: 32.0, 3: 32.0}, 37.0, s)
    wide_evs = [e for w in range(1, 4) for e in wide.on_window(w, flagged, gaps, 69.0, s)]
    assert wide_evs[0].after[2] == 24 < evs[0].after[2]


def test_update_settings_interval_and_history_lengths() -> None:
    job = Job(_policy(min_plan_interval_windows=4))
    job.run(3)
    job.speed[1] = 1000.0 / 1.3
    first = job.run(4)
    assert [e.status for e in first] == ["recommended", "applied"]
    job.policy.update_settings(replace(job.policy.settings, min_plan_interval_windows=30))
    job.speed[1] = 1000.0 / 1.6  # slower still: a refined plan is wanted, but not for 30
    later = job.run(40)
    new = [e for e in later if e.status == "recommended" and e.id != first[0].id]
    assert new and new[0].window - first[0].window >= 30
    # longer runs of windows: the history grows to what the rules read
    job.policy.update_settings(replace(job.policy.settings, speed_windows=20))
    assert job.policy._history.maxlen == 20


# --------------------------------------------------------------------------- resize


def test_resize_without_a_plan_keeps_the_history() -> None:
    """Ranks 4 and 5 appear mid-run: the trigger run of rank 2 carries on over the resize."""
    pol = _policy(gb=132)
    flagged = [("rank", "flagged", 2)]
    four = {0: 33.0, 1: 33.0, 2: 50.0, 3: 33.0}
    for w in range(2):
        assert pol.on_window(w, flagged, four, 55.0) == []
    assert pol.resize(6) == []
    assert pol.nranks == 6 and pol.split == uniform_split(132, 6)
    six = {0: 22.0, 1: 22.0, 2: 33.0, 3: 22.0, 4: 22.0, 5: 22.0}
    evs = pol.on_window(2, flagged, six, 40.0)
    assert [e.status for e in evs] == ["recommended"]  # windows 0, 1, 2 in a row
    assert len(evs[0].after) == 6 and sum(evs[0].after) == 132 and evs[0].after[2] < 22
    assert pol.resize(6) == []
    with pytest.raises(ValueError, match="only grows"):
        pol.resize(5)


@pytest.mark.parametrize("configured", [True, False])
def test_resize_ends_a_plan_in_force_and_says_why(configured: bool) -> None:
    job = Job(_policy(gb=128 if configured else None))
    job.run(6)
    job.speed[2] = 1000.0 / 1.3
    job.run(10)
    plan = job.policy.active_plan
    assert plan is not None and plan.status == "verified"
    evs = job.policy.resize(8)
    (ev,) = evs
    assert ev.id == plan.id and ev.status == "rolled_back" and not ev.escalate
    assert "8 ranks now (was 4)" in ev.reason and "ignores" in ev.reason
    assert job.policy.plans == [] and job.policy.active_plan is None
    if configured:  # the batch is known: every rank told to run the uniform split of 8
        assert ev.control is not None and ev.control["samples"] == uniform_split(128, 8)
        assert ev.control["apply_at_step"] % WS == 0
        assert job.policy.split == [16] * 8
    else:  # learned from 4 ranks' samples: relearned once all 8 report
        assert ev.control is None
        assert job.policy.global_batch is None and job.policy.split is None
        job.policy.on_window(
            job.window, [], dict.fromkeys(range(8), 10.0), 15.0, dict.fromkeys(range(8), 16)
        )
        assert job.policy.global_batch == 128
    # ids keep counting: a later plan never reuses an id the job has seen
    snap = job.policy.snapshot()
    assert snap["seq"] == 1 and snap["nranks"] == 8
    back = RebalancePolicy.restore(json.loads(json.dumps(snap)))
    assert all(w.gap_ms.size == w.samples.size == 8 for w in back._history)


def test_resize_withdraws_a_plan_in_flight() -> None:
    pol = _policy()
    gaps = {0: 32.0, 1: 32.0, 2: 45.0, 3: 32.0}
    evs = [e for w in range(3) for e in pol.on_window(w, [("rank", "flagged", 2)], gaps, 50.0)]
    assert [p.state for p in pol.plans] == [S.SENT]
    (ev,) = pol.resize(5)
    assert ev.id == evs[0].id and ev.status == "rolled_back" and ev.window == 2
    assert ev.control is not None and ev.control["samples"] == uniform_split(128, 5)
    assert pol.on_ack(evs[0].id, 0, 250) == []  # no longer followed


# --------------------------------------------------------------------------- bounds


def test_one_statement_of_the_bounds_refuses_max_shift_frac_one_in_both() -> None:
    with pytest.raises(ValueError) as pe:
        PolicySettings(max_shift_frac=1.0)
    with pytest.raises(SettingsError) as se:
        Settings().set("max_shift_frac", "1.0")
    with pytest.raises(SettingsError) as se2:
        Settings(max_shift_frac=1.0)
    for err in (pe, se, se2):
        assert "max_shift_frac" in str(err.value) and "[0, 1)" in str(err.value)
    assert BOUNDS["max_shift_frac"].describe() == "a number in [0, 1)"
    assert Settings.describe("max_shift_frac") == BOUNDS["max_shift_frac"].describe()
    assert Settings().set("max_shift_frac", "0.1").max_shift_frac == 0.1
    for key in ("min_samples", "min_plan_interval_windows"):
        assert Settings.describe(key) == BOUNDS[key].describe()


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_every_bound_is_enforced_at_its_edge(name: str) -> None:
    b = BOUNDS[name]
    below: Any = int(b.lo) - 1 if b.integer else b.lo - 1e-9
    with pytest.raises(ValueError, match=name):
        PolicySettings(**{name: below})
    PolicySettings(**{name: int(b.lo) if b.integer else b.lo})  # the edge itself is allowed
    if b.hi is not None:
        with pytest.raises(ValueError, match=name):
            PolicySettings(**{name: b.hi})  # open at the top


def test_job_package_does_not_load_the_policy() -> None:
    """A training script importing artemis.job loads the maths and the files only."""
    code = (
        "import sys, artemis.job; "
        "print(sorted(m for m in sys.modules if m.startswith(('artemis.rebalance', 'prometheus'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(
        ["artemis.rebalance", "artemis.rebalance.files", "artemis.rebalance.split"]
    )
