"""Baselines across jobs, the pure core (detect/baselines.py) inside `JobMonitor`.

The windows are real: the simulator's lockstep model writes ring records as the
plugin does, one agent `WindowSummarizer` per rank summarises them (with the
per-step gap quartiles), and the job's `JobMonitor` scores them with default
settings. The store is played by the records `baseline_records` returns and
`on_baselines` takes back (the store itself: tests/test_baselines_sim.py).
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
from artemis.agent.summary import WindowSummarizer
from artemis.detect.baselines import UNKNOWN_CLASS, BaselineBook, software_hash
from artemis.detect.fingerprint import workload_hash
from artemis.detect.monitor import JobMonitor
from artemis.detect.settings import Settings
from artemis.protocol.records import RankWindow
from artemis.ring.format import CLOCK_DEVICE_NS
from artemis.sim.inproc import summarised
from artemis.sim.scenario import parse_scenario

OLD = {"driver": "535.104.05", "cuda": "12.2", "nccl": "2.19.3", "env": {"NCCL_ALGO": "Ring"}}
NEW = {**OLD, "driver": "550.54.14"}
WORKLOAD = workload_hash(["sig-of-the-step"] * 8, 8)


def windows(seed: int, faults: list[dict[str, Any]] | None = None) -> list[list[RankWindow]]:
    """The job's windows (8 ranks, 16 windows of 20 steps of 50 ms), in order."""
    sc = parse_scenario(
        {
            "job": {
                "ranks": 8,
                "ranks_per_host": 4,
                "step_ms": 50.0,
                "collectives_per_step": 4,
                "window_steps": 20,
                "windows": 16,
                "noise": 0.02,
                "seed": seed,
            },
            "fault": faults or [],
        }
    )
    summ = [
        WindowSummarizer(
            "j", "c1", r, sc.ranks, f"h{r // 4}", sc.window_steps, clock_kind=CLOCK_DEVICE_NS
        )
        for r in range(sc.ranks)
    ]
    out: dict[int, list[RankWindow]] = {}
    for _r, rw in summarised(sc, summ):
        out.setdefault(rw.window, []).append(rw)
    return [out[w] for w in sorted(out)]


def play(
    job: str,
    wins: list[list[RankWindow]],
    software: dict[str, Any],
    stored: list[dict[str, Any]],
) -> tuple[JobMonitor, list[Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """One job through its monitor, the store read after its first window (as the
    coordinator does once the fingerprint is in) and written at its end; returns the
    monitor, its findings, its incident records and the baselines it writes."""
    m = JobMonitor(job, Settings(), run=f"{job}-run", nranks=8)
    found, recs = [], []
    for i, rows in enumerate(wins):
        out = m.on_window(i, rows)
        found += out.findings
        recs += out.incidents
        if i == 0:
            # every rank's fingerprint (as its agent sends it), then the store read
            assert m.baseline_wanted() == []
            for r in range(8):
                m.on_fingerprint(r, software, "sig-of-the-step")
            for _, cls in m.baseline_wanted():
                same = [b for b in stored if b["hw_class"] == cls]
                own = [b for b in same if b["software_hash"] == software_hash(software)]
                m.on_baselines(cls, same[-1] if same else None, own[-1] if own else None)
    recs += m.finish().incidents
    return m, found, recs, m.baseline_records(wall=1.0e9)


def kinds(found: list[Any]) -> set[tuple[str, str]]:
    return {(f.kind, f.state) for f in found if f.kind in ("change", "regression")}


def first_job() -> dict[str, Any]:
    _, found, _, out = play("a", windows(3), OLD, [])
    assert not found
    (b,) = out
    return b


def test_a_healthy_job_stores_its_confirmed_windows() -> None:
    b = first_job()
    s = Settings()
    assert b["workload"] == WORKLOAD and b["hw_class"] == UNKNOWN_CLASS
    assert b["software"] == OLD and b["software_hash"] == software_hash(OLD)
    # after warm-up (windows 1..5) and confirmed by flag_window windows after each:
    # windows 6 .. 15 - flag_window of the 16
    first, last = s.warmup_windows + 1, 15 - s.flag_window
    assert b["jobs"] == [{"job": "a", "run": "a-run", "windows": last - first + 1,
                          "first": first, "last": last}]  # fmt: skip
    assert b["windows"] == last - first + 1 == len(b["dist"]["gap_q2_ms"])
    # 50 ms of compute per step, then 10% of it transferring (sim/model.py)
    assert 49 < b["gap_q2_ms"] < 51 and b["gap_q1_ms"] < b["gap_q2_ms"]
    assert 54 < b["step_ms"] < 58


def test_new_driver_and_8pct_slower_is_a_change_naming_the_driver() -> None:
    base = first_job()
    slow = [{"kind": "software", "start_window": 0, "slowdown": 0.08}]
    _, found, recs, out = play("b", windows(4, slow), NEW, [base])
    assert ("change", "flagged") in kinds(found)
    assert not {f.kind for f in found} - {"change"}, [(f.kind, f.subject) for f in found]
    f = next(f for f in found if f.kind == "change" and f.state == "flagged")
    assert f.evidence is not None and f.cause is not None
    assert f.evidence["changed"] == {"driver": ["535.104.05", "550.54.14"]}
    assert f.cause["kind"] == "software" and "driver 535.104.05 -> 550.54.14" in f.cause["text"]
    assert 6.5 < f.evidence["slower_pct"] < 9.5, f.evidence
    assert f.ratio is not None and 1.06 < f.ratio < 1.10
    assert f.since == Settings().warmup_windows + 1 and f.ranks == list(range(8))
    assert f.evidence["baseline"]["software"] == base["software_hash"]
    # an incident like every other finding, confirmed by its flag; never a plan
    (inc,) = [r for r in recs if r["kind"] == "change"][-1:]
    assert inc["confirmed"] is not None and inc["verdict"] == "unresolved"
    assert not inc["actions"]
    # no window of it was healthy: the slow software does not become a baseline
    assert out == []


def test_same_fingerprint_and_8pct_slower_is_a_regression_of_unknown_cause() -> None:
    base = first_job()
    slow = [{"kind": "software", "start_window": 0, "slowdown": 0.08}]
    _, found, recs, out = play("c", windows(5, slow), OLD, [base])
    assert ("regression", "flagged") in kinds(found) and ("change", "flagged") not in kinds(found)
    f = next(f for f in found if f.kind == "regression" and f.state == "flagged")
    assert f.cause is not None and f.cause["kind"] == "unknown"
    assert f.evidence is not None and "changed" not in f.evidence
    assert f.evidence["checked"] == ["cuda", "driver", "env.NCCL_ALGO", "nccl"]
    assert f.cause["evidence"]["checked"] == f.evidence["checked"]
    assert any(r["kind"] == "regression" and r["confirmed"] for r in recs)
    assert out == []


def test_new_driver_at_the_same_speed_is_nothing_and_a_baseline_of_its_own() -> None:
    base = first_job()
    _, found, recs, out = play("d", windows(6), NEW, [base])
    assert not found and not recs
    (b,) = out
    assert b["software_hash"] == software_hash(NEW) != base["software_hash"]
    assert b["jobs"][0]["job"] == "d" and b["windows"] == base["windows"]


def test_the_same_fingerprint_again_adds_to_its_baseline() -> None:
    base = first_job()
    _, found, _, out = play("e", windows(7), OLD, [base])
    assert not found
    (b,) = out
    assert b["software_hash"] == base["software_hash"]
    assert [j["job"] for j in b["jobs"]] == ["a", "e"]
    assert b["windows"] == 2 * base["windows"]


def test_a_straggler_does_not_move_the_baseline() -> None:
    base = first_job()
    onset = 12
    slow = [{"kind": "clocks", "rank": 2, "start_window": onset, "slowdown": 0.3}]
    _, found, _, out = play("s", windows(8, slow), OLD, [base])
    assert any(f.kind == "rank" and f.rank == 2 and f.state == "flagged" for f in found)
    assert not kinds(found)  # one slow rank is not the whole class
    (b,) = out
    (mine,) = [j for j in b["jobs"] if j["job"] == "s"]
    # only windows before the straggler's first suspect window, each confirmed by
    # flag_window windows after it with no finding
    assert mine["last"] <= onset - Settings().flag_window - 1, mine
    assert b["windows"] == base["windows"] + mine["windows"]
    lo, hi = min(base["dist"]["gap_q2_ms"]), max(base["dist"]["gap_q2_ms"])
    added = b["dist"]["gap_q2_ms"][base["windows"] :]
    assert all(lo * 0.98 < x < hi * 1.02 for x in added), (added, lo, hi)


def test_one_slow_window_is_not_persistent() -> None:
    base = first_job()
    blip = [{"kind": "software", "start_window": 9, "end_window": 10, "slowdown": 0.08}]
    _, found, _, out = play("f", windows(9, blip), NEW, [base])
    states = {f.state for f in found if f.kind == "change"}
    assert states == {"suspect"}, [(f.kind, f.state, f.window) for f in found]
    (b,) = out  # the windows after the blip (confirmed) still make a baseline
    assert all(j["first"] > 9 for j in b["jobs"])


def test_the_store_answering_late_judges_the_windows_before_it() -> None:
    base = first_job()
    slow = [{"kind": "software", "start_window": 0, "slowdown": 0.08}]
    m = JobMonitor("g", Settings(), run="g-run", nranks=8)
    wins = windows(4, slow)
    found: list[Any] = []
    for i, rows in enumerate(wins[:10]):
        found += m.on_window(i, rows).findings
    assert not found
    m.baselines.identify(WORKLOAD, NEW)
    assert m.baselines.wanted() == [(WORKLOAD, UNKNOWN_CLASS)]
    m.on_baselines(UNKNOWN_CLASS, base, None)
    found += m.on_window(10, wins[10]).findings
    # windows 6..9 judged at once with window 10: persistent already
    assert [(f.kind, f.state, f.since) for f in found] == [("change", "flagged", 6)]


def test_snapshot_restore_carries_the_comparison() -> None:
    base = first_job()
    slow = [{"kind": "software", "start_window": 0, "slowdown": 0.08}]
    wins = windows(4, slow)
    m = JobMonitor("h", Settings(), run="h-run", nranks=8)
    m.on_window(0, wins[0])
    m.baselines.identify(WORKLOAD, NEW)
    m.on_baselines(UNKNOWN_CLASS, base, None)
    for i in range(1, 8):
        m.on_window(i, wins[i])
    state = msgpack.unpackb(msgpack.packb(m.snapshot()), strict_map_key=False)
    r = JobMonitor.restore(state, Settings())
    assert isinstance(r.baselines, BaselineBook) and r.baselines.wanted() == []
    a = [(f.kind, f.state) for f in m.on_window(8, wins[8]).findings]
    b = [(f.kind, f.state) for f in r.on_window(8, wins[8]).findings]
    assert a == b == [("change", "flagged")]


def test_a_late_agent_makes_the_job_fingerprint_again() -> None:
    """Ranks 0-3 announced and fingerprinted first (a job of 4 as far as the monitor
    knows), then the second host's agent: the workload hash has the rank count, so the
    job is identified again and its baselines are read again, for the right workload."""
    m = JobMonitor("l", Settings(), run="l-run")
    m.expect(range(4), "h0")
    for r in range(4):
        m.on_fingerprint(r, OLD, "sig-of-the-step")
    m.on_window(0, windows(3)[0][:4])
    assert m.baseline_wanted() == [(workload_hash(["sig-of-the-step"] * 4, 4), UNKNOWN_CLASS)]
    m.on_baselines(UNKNOWN_CLASS, None, None)
    m.expect(range(4, 8), "h1")
    assert m.baseline_wanted() == []  # ranks 4-7 have not sent theirs: not known yet
    for r in range(4, 8):
        m.on_fingerprint(r, OLD, "sig-of-the-step")
    assert m.baseline_wanted() == [(WORKLOAD, UNKNOWN_CLASS)]


def test_window_stats_of_a_big_two_class_job_from_a_sample() -> None:
    """Past SAMPLE rows the medians come from an even sample (within 0.1% of all the
    rows' here); who a finding names is every rank of its class, exactly."""
    from artemis.detect.baselines import SAMPLE, window_stats
    from artemis.protocol.columns import WindowColumns

    n = 2 * SAMPLE + 1000
    rng = np.random.default_rng(5)
    gap = np.where(np.arange(n) < n // 3, 100.0, 140.0) * (1 + 0.02 * rng.standard_normal(n))
    rows = [
        RankWindow(job="j", comm="c" * 16, rank=r, nranks=n, host=f"h{r // 8}", window=7,
                   step_lo=0, step_hi=50, coll_lo=0, coll_hi=200, gap_ms=float(gap[r]),
                   coll_ms=5.0, step_ms=150.0, collectives=200, bytes=1, lost=0, clock="device",
                   hw_class="A100" if r < n // 3 else "H100", gap_q1_ms=float(gap[r]) * 0.99,
                   gap_q2_ms=float(gap[r]))
        for r in range(n)
    ]  # fmt: skip
    got = window_stats(7, WindowColumns.from_records(rows), 150.0, exclude={3})
    assert sorted(got) == ["A100", "H100"]
    for name, sel in (("A100", np.arange(n) < n // 3), ("H100", np.arange(n) >= n // 3)):
        st, who = got[name]
        assert abs(st.gap_q2_ms / float(np.median(gap[sel])) - 1) < 1e-3
        want = [r for r in np.flatnonzero(sel).tolist() if r != 3]
        assert who.ranks() == want
        assert who.hosts() == sorted({f"h{r // 8}" for r in want})
