"""Recurring stalls (issue 31, item 2): found by their cost, confirmed with their shape.

A rank that makes its peers wait in a fraction of its steps, window after
window, moves its mean per-step gap but not its median. The windows here are
ring records of a lockstep job (every collective ends when its last rank
arrives) summarised by the agent's own `WindowSummarizer`, and go through
`JobMonitor` (detector, incident book, rebalance policy) as the coordinator
feeds it. The cause is modelled (a rank sleeps in some of its steps, or all of
its compute is slower) and its effects follow; expectations come from the
cause (the stall's length and share), never from a run's output.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from artemis.detect.findings import Finding
from artemis.detect.monitor import JobMonitor, MonitorOutput
from artemis.detect.settings import Settings
from artemis.protocol.records import RankWindow, Telemetry
from artemis.rebalance.policy import stalls
from artemis.sim import inproc
from artemis.sim.scenario import Scenario, ScenarioError, parse_scenario
from test_detector_support import lockstep_windows

STEPS, C = 40, 2  # steps per window, collectives per step
ONSET = 3


@dataclasses.dataclass(frozen=True)
class Cause:
    """What the stalled rank does in the windows `during`: sleeps `stall_ms` before its
    step in every `every`-th step (or in a random `frac` of them), or computes `slow`
    slower in every step. `base`: its compute's offset in every window (a faster or
    slower part, from the start)."""

    stall_ms: float = 0.0
    every: int = 0
    frac: float = 0.0
    slow: float = 0.0
    during: range = range(ONSET, 1 << 30)
    base: float = 0.0


def stall_windows(
    nranks: int, windows: int, stalled: int, cause: Cause, gap: float = 50.0
) -> list[tuple[int, list[RankWindow]]]:
    """Ring records of a lockstep job whose rank `stalled` follows `cause`, on a compute
    gap of `gap` ms a step; summarised by the agent's summariser (64 samples a rank)."""
    rng = np.random.default_rng(7)

    def timing(w: int, i: int) -> tuple[Any, float]:
        comp = gap / C * (1 + 0.01 * rng.standard_normal(nranks))
        step = w * STEPS + i // C
        comp[stalled] *= 1.0 + cause.base
        if w in cause.during:
            comp[stalled] *= 1.0 + cause.slow
            every = cause.every
            hit = step % every == 0 if every else rng.random() < cause.frac
            if i % C == 0 and hit:
                comp[stalled] += cause.stall_ms  # the stall: the rank sleeps, its peers wait
        return comp, 10.0

    wins = lockstep_windows(nranks, windows, STEPS, C, timing)
    return [(w, [dataclasses.replace(rw, samples=64) for rw in rows]) for w, rows in wins]


def run(
    wins: list[tuple[int, list[RankWindow]]], nranks: int = 4, rebalance: str = "apply"
) -> list[MonitorOutput]:
    s = dataclasses.replace(Settings(), rebalance=rebalance)
    m = JobMonitor("stalls", s, nranks=nranks, global_batch=64 * nranks)
    outs = [m.on_window(w, rows, wall=1.0e9 + w) for w, rows in wins]
    outs.append(m.finish())
    return outs


def flagged(outs: list[MonitorOutput]) -> list[Finding]:
    return [f for o in outs for f in o.findings if f.state == "flagged"]


def last_records(outs: list[MonitorOutput]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for o in outs for r in o.incidents}


def test_recurring_stall_is_flagged_by_its_cost_and_confirmed_as_stalls() -> None:
    """8 ms of sleep in 1 of 4 steps on a 10 ms compute gap: its median stays its
    peers', its mean is 2 ms (20%) above theirs, window after window. Flagged within
    the 3-of-4 rule with shape "stalls" and that cost, confirmed (not dismissed) with
    its shape, never rebalanced, escalated with the input and host check."""
    stall_ms, every, gap = 8.0, 4, 10.0
    wins = stall_windows(4, 14, 1, Cause(stall_ms=stall_ms, every=every), gap)
    outs = run(wins)
    flags = flagged(outs)
    assert [f.rank for f in flags] == [1], [(f.kind, f.subject) for f in flags]
    f = flags[0]
    s = Settings()
    assert ONSET + s.flag_after - 1 <= f.window <= ONSET + s.flag_window - 1
    assert f.evidence is not None and f.evidence["shape"] == "stalls"
    assert f.ratio is not None and f.ratio < s.suspect_ratio  # the median did not move
    cost = stall_ms / every  # what its peers wait per step, on average
    assert f.excess_ms == pytest.approx(cost, rel=0.15)
    mean_excess = f.evidence["gap_mean_ms"] - f.evidence["peers_gap_mean_ms"]
    assert mean_excess == pytest.approx(cost, rel=0.15)
    (rec,) = last_records(outs).values()
    assert rec["confirmed"] is not None, rec["reason"]
    assert rec["confirmed"]["shape"] == "stalls"
    assert rec["confirmed"]["mean_shift"] == pytest.approx(cost / gap, rel=0.2)
    assert rec["verdict"] == "unresolved", rec["reason"]
    assert "recurring stalls" in rec["escalation"]["check"]
    assert "data loader" in rec["escalation"]["check"]
    assert not [ev for o in outs for ev in o.plans], "a plan for stalls"


@pytest.mark.parametrize(
    ("stall", "suspect"),
    [
        # the same recurring stall, for one window only: suspect there, never flagged
        (Cause(stall_ms=8.0, every=4, during=range(5, 6)), True),
        # one long stall (a GC pause, a page fault) in one step (the window's first): its
        # mean moves 75%, but not without its longest step, so not even suspect
        (Cause(stall_ms=300.0, every=5 * STEPS, during=range(5, 6)), False),
    ],
    ids=["one_window", "one_step"],
)
def test_one_off_stalls_stay_unflagged(stall: Cause, suspect: bool) -> None:
    outs = run(stall_windows(4, 12, 1, stall, 10.0))
    assert flagged(outs) == []
    assert not last_records(outs)
    seen = [(f.window, f.state) for o in outs for f in o.findings if f.rank == 1]
    assert seen == ([(5, "suspect")] if suspect else []), seen


def test_a_rank_that_slows_but_still_arrives_before_its_peers_is_not_flagged() -> None:
    """A rank 15% faster than its peers from the start slows by 9%: the change test
    sees its pace move, but it still arrives before the others, at every step, and
    nobody waits for it (DETECTOR.md "A bad window costs something", rank_rule.costless).
    The same 9% on a rank at its peers' pace is flagged (the control)."""
    after = range(8, 1 << 30)  # after the warm-up: the change test's baseline is set
    fast = Cause(slow=0.09, base=-0.15, during=after)
    outs = run(stall_windows(4, 20, 1, fast, 10.0), rebalance="off")
    seen = [(f.window, f.state, f.excess_ms) for o in outs for f in o.findings if f.rank == 1]
    assert seen == [], seen
    level = run(stall_windows(4, 20, 1, Cause(slow=0.09, during=after), 10.0), rebalance="off")
    (f,) = flagged(level)
    assert (f.rank, f.basis) == (1, "history")
    assert f.excess_ms == pytest.approx(10.0 * 0.09 / 1.09, rel=0.15)  # against its own pace


def test_uniformly_slower_rank_has_shape_slower() -> None:
    """Every step 20% slower: its lower quartile moved with its median, "slower"."""
    wins = stall_windows(4, 12, 1, Cause(slow=0.2), 10.0)
    outs = run(wins, rebalance="off")
    flags = flagged(outs)
    assert [f.rank for f in flags] == [1]
    assert flags[0].evidence is not None and flags[0].evidence["shape"] == "slower"
    (rec,) = last_records(outs).values()
    assert rec["confirmed"] is not None and rec["confirmed"]["shape"] == "slower"
    assert "recurring stalls" not in rec["escalation"]["check"]


def test_stalls_in_most_steps_are_confirmed_as_stalls_and_never_planned() -> None:
    """Stalls in 65% of the steps move the median too (it is flagged like a slower
    rank) but not the lower quartile: confirmed as stalls by their persistent cost
    (issue 31 changes the old "dismissed"), and the policy, which would plan for a
    rank slowest per sample, does not rebalance stalls."""
    wins = stall_windows(4, 22, 1, Cause(frac=0.65, stall_ms=12.0))
    outs = run(wins)
    flags = flagged(outs)
    assert [f.rank for f in flags] == [1], [(f.kind, f.subject) for f in flags]
    assert flags[0].ratio is not None and flags[0].ratio >= Settings().suspect_ratio
    (rec,) = last_records(outs).values()
    assert rec["confirmed"] is not None and rec["confirmed"]["shape"] == "stalls"
    assert rec["verdict"] == "unresolved"
    assert not [ev for o in outs for ev in o.plans], "a plan for stalls"


def test_policy_reads_the_shape() -> None:
    assert stalls({"evidence": {"shape": "stalls"}})
    assert not stalls({"evidence": {"shape": "slower"}})
    assert not stalls({"evidence": {}}) and not stalls(None)


def test_summariser_mean_and_quartiles_see_the_stalls() -> None:
    frac, stall_ms = 0.65, 12.0
    wins = stall_windows(4, 6, 1, Cause(frac=frac, stall_ms=stall_ms))
    _w, rows = wins[-1]
    by = {r.rank: r for r in rows}
    slow, peer = by[1], by[0]
    assert slow.gap_q1_ms is not None and slow.gap_q3_ms is not None
    assert slow.gap_q1_ms <= slow.gap_q2_ms <= slow.gap_q3_ms
    assert slow.gap_q2_ms == pytest.approx(slow.gap_ms)
    assert slow.gap_q1_ms < 1.05 * peer.gap_q2_ms  # most of the distribution is unshifted
    assert slow.gap_q3_ms > 1.15 * peer.gap_q2_ms  # the stalls are in its upper half
    assert slow.gap_mean_ms is not None and peer.gap_mean_ms is not None
    # the mean carries the stalls' share of their length (the draw: binomial noise)
    share = (slow.gap_mean_ms - peer.gap_mean_ms) / stall_ms
    assert share == pytest.approx(frac, abs=0.15)
    assert slow.gap_max_ms is not None and slow.gap_max_ms >= slow.gap_q3_ms


# --------------------------------------------------------------------------- simulator


def _sim(share: float, slowdown: float, model: dict[str, float], kind: str = "stalls") -> Scenario:
    data: dict[str, Any] = {
        "job": {"ranks": 8, "ranks_per_host": 4, "step_ms": 100.0, "collectives_per_step": 3}
        | {"window_steps": 50, "windows": 18, "seed": 5, **model},
        "fault": [
            {"kind": kind, "rank": 5, "start_window": 8, "share": share, "slowdown": slowdown}
        ],
    }
    return parse_scenario(data, "stalls-test")


REALISTIC = {"noise": 0.01, "rank_spread": 0.01, "shared_jitter": 0.03, "stall_prob": 0.002}


def test_simulated_recurring_stall_is_flagged_confirmed_and_costed() -> None:
    """The simulator's `stalls` fault (the rank sleeps 60 ms before a quarter of its
    steps, on top of realistic noise with one-off stalls on every rank): flagged
    within the 3-of-4 rule, shape "stalls", its cost the sleep's share, confirmed."""
    share, slowdown = 0.25, 0.6
    sc = _sim(share, slowdown, REALISTIC)
    wins = list(enumerate(inproc.summaries(sc, telemetry=False)))
    outs = run(wins, nranks=sc.ranks, rebalance="off")
    flags = flagged(outs)
    assert [f.rank for f in flags] == [5], [(f.kind, f.subject, f.window) for f in flags]
    f = flags[0]
    assert 8 + Settings().flag_after - 1 <= f.window <= 8 + Settings().flag_window - 1
    assert f.evidence is not None and f.evidence["shape"] == "stalls"
    # the sleep's cost per step, from the cause: share x length (the share is drawn)
    assert f.excess_ms == pytest.approx(share * slowdown * sc.step_ms, rel=0.35)
    (rec,) = last_records(outs).values()
    assert rec["confirmed"] is not None and rec["confirmed"]["shape"] == "stalls"


def test_stalls_fault_keys_are_checked() -> None:
    with pytest.raises(ScenarioError, match="share"):
        _sim(1.5, 0.6, {})
    with pytest.raises(ScenarioError, match="only for kind 'stalls'"):
        _sim(0.5, 0.1, {}, kind="clocks")


def test_older_agents_without_a_mean_are_judged_as_before() -> None:
    """Summaries without `gap_mean_ms`/`gap_max_ms` (an agent from before issue 31): the
    stall test does not judge them, so the recurring stall of the first test, which
    moves no median, is not flagged, and nothing fails on the absent fields."""
    wins = stall_windows(4, 14, 1, Cause(stall_ms=8.0, every=4), 10.0)
    old = [
        (w, [dataclasses.replace(r, gap_mean_ms=None, gap_max_ms=None) for r in rows])
        for w, rows in wins
    ]
    assert flagged(run(old)) == []
    assert [f.rank for f in flagged(run(wins))] == [1]  # the same windows, with the mean


# --------------------------------------------------------------------------- the cause


BUSY = 0.95  # a healthy rank computes 95% of its gap (the rest: launches, the loader)


def stopped_telemetry(
    wins: list[tuple[int, list[RankWindow]]], stalled: int, cause: Cause, gap: float
) -> list[tuple[int, list[RankWindow]]]:
    """The host figures the cause makes: a stopped (or sleeping) process is neither
    running nor runnable while stopped, so its gap is busy only for its compute,
    `BUSY x own` of its mean `own + stall_ms / every` (`own`: its gap, `slow` off its
    peers'); no run delay beyond its peers'."""
    out = []
    for w, rows in wins:
        stopped = w in cause.during
        new = []
        for r in rows:
            own = gap * (1.0 + cause.slow) if stopped and r.rank == stalled else gap
            mean_gap = own + (cause.stall_ms / cause.every if stopped and r.rank == stalled else 0)
            tel = Telemetry(
                cpu_pct=55.0,
                proc_cpu_pct=100.0 * BUSY * own / mean_gap,
                gap_busy_pct=100.0 * BUSY * own / mean_gap,
                run_delay_pct=3.0,
                cg_throttled_pct=0.0,
                cg_nr_throttled=0,
            )
            new.append(dataclasses.replace(r, telemetry=tel))
        out.append((w, new))
    return out


def rank_lines(outs: list[MonitorOutput], rank: int) -> list[Finding]:
    return [f for o in outs for f in o.findings if f.kind == "rank" and f.rank == rank]


def test_a_stopped_rank_is_host_idle_in_every_line_though_its_median_did_not_move() -> None:
    """SIGSTOP 8 ms in 1 of 4 steps of a rank 3% faster than its peers by itself
    (issue 31's quiet grid: flag lines `unknown`). Its median gap stays below its
    peers' (ratio under 1), so the median's slowdown left the host fit nothing to
    explain; the stalls' cost is their mean (+17%), and the idle time the stops make
    explains all of it, in every line."""
    cause = Cause(stall_ms=8.0, every=4, slow=-0.03)
    wins = stopped_telemetry(stall_windows(4, 14, 1, cause, 10.0), 1, cause, 10.0)
    lines = [f for f in rank_lines(run(wins, rebalance="off"), 1) if f.state != "cleared"]
    assert [f.state for f in lines].count("flagged") == 1
    assert all(f.ratio is not None and f.ratio < 1.0 for f in lines)  # the point of the test
    for f in lines:
        c = f.to_json()["cause"]
        assert c["kind"] == "host", (f.window, f.ratio, c["text"])
        assert c["evidence"]["mechanism"] == "idle"
        assert c["explained"] >= 0.9
        assert "as_of_window" not in c["evidence"]  # each named from its own window


def test_an_episode_keeps_its_cause_in_windows_with_nothing_to_explain() -> None:
    """The stops end at window 9 with the finding still open (an episode of stalls
    clears after twice clear_after good windows, as an intermittent one: how many stall
    in a window is luck): those good windows have no excess to explain, and their
    telemetry is the peers'. Their lines keep the episode's cause (the end summary is
    the latest line), saying which window named it, never `unknown` from noise."""
    cause = Cause(stall_ms=8.0, every=4, slow=-0.03, during=range(ONSET, 9))
    good = 2 * Settings().clear_after
    wins = stopped_telemetry(stall_windows(4, 9 + good + 1, 1, cause, 10.0), 1, cause, 10.0)
    lines = rank_lines(run(wins, rebalance="off"), 1)
    after = [f for f in lines if f.window >= 9]
    assert [f.state for f in after] == ["ongoing"] * (good - 1) + ["cleared"]
    for f in after[:-1]:
        c = f.to_json()["cause"]
        assert c["kind"] == "host" and c["evidence"]["mechanism"] == "idle", c["text"]
        assert c["evidence"]["as_of_window"] == 8
    assert after[-1].to_json()["cause"] is None


def test_a_window_with_fewer_of_its_figures_does_not_overturn_the_episodes_cause() -> None:
    """The job's last window is sampled as its processes end: the stopped rank's host
    figures are gone while its window is still bad. `unknown` from that absence would
    be the end summary's cause (the latest line); the episode's `host` stands, with the
    window that named it. (The 2-rank hog of bench/README.md "The GPT grid": its last
    3-step window had no stopped figure and said `unknown` over 7 windows of `host`.)"""
    cause = Cause(stall_ms=8.0, every=4, slow=-0.03)
    wins = stopped_telemetry(stall_windows(4, 14, 1, cause, 10.0), 1, cause, 10.0)
    last_w, last = wins[-1]
    gone = [
        dataclasses.replace(r, telemetry=Telemetry(cpu_pct=55.0)) if r.rank == 1 else r
        for r in last
    ]
    wins[-1] = (last_w, gone)
    lines = [f for f in rank_lines(run(wins, rebalance="off"), 1) if f.state != "cleared"]
    end = lines[-1].to_json()
    assert end["window"] == last_w and end["state"] == "ongoing", end
    assert end["cause"]["kind"] == "host", end["cause"]["text"]
    assert end["cause"]["evidence"]["as_of_window"] == last_w - 1
