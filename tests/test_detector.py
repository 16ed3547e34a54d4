"""Detector: every kind and state transition, baselines, classes, cost."""

from __future__ import annotations

import math

import numpy as np
import pytest
from artemis.detect.detector import Detector, WindowResult
from artemis.detect.settings import Settings
from artemis.protocol.records import Telemetry
from test_detector_support import WINDOW_STEPS, make_window

ISL8 = ["nvidia"] * 4 + ["amd"] * 4


def run(det: Detector, gaps: np.ndarray, start: int = 0, **kw: object) -> list[WindowResult]:
    """Feed windows start.. with per-window gap rows; returns the results."""
    return [
        det.score_window(start + w, make_window(start + w, row, **kw)) for w, row in enumerate(gaps)
    ]


def states(results: list[WindowResult], kind: str, subject: str) -> list[str | None]:
    """Per window: the state reported for (kind, subject), None when not reported."""
    out: list[str | None] = []
    for res in results:
        hit = [f.state for f in res.findings if f.kind == kind and f.subject == subject]
        assert len(hit) <= 1
        out.append(hit[0] if hit else None)
    return out


# Per-window slowdown pattern of rank 2 (1 = slow by 20%) and the states expected.
S, F, ON, C = "suspect", "flagged", "ongoing", "cleared"
PATTERNS = [
    ("never", [0, 0, 0, 0, 0, 0], [None] * 6),
    ("one blip", [1, 0, 0, 0, 0, 0], [S, None, None, None, None, None]),
    ("two-window blip", [1, 1, 0, 0, 0, 0, 0], [S, S, None, None, None, None, None]),
    ("two apart", [1, 0, 0, 0, 1, 0, 0, 0], [S, None, None, None, S, None, None, None]),
    ("three in a row", [1, 1, 1, 1], [S, S, F, ON]),
    ("three of four", [1, 0, 1, 1, 1], [S, None, S, F, ON]),
    ("clears after three good", [1, 1, 1, 0, 0, 0, 0], [S, S, F, ON, ON, C, None]),
    ("relapse resets the good run", [1, 1, 1, 0, 0, 1, 0, 0, 0], [S, S, F, ON, ON, ON, ON, ON, C]),
    ("flags again after clearing", [1, 1, 1, 0, 0, 0, 1, 1, 1], [S, S, F, ON, ON, C, S, S, F]),
]


@pytest.mark.parametrize(("name", "pattern", "expected"), PATTERNS, ids=[p[0] for p in PATTERNS])
def test_rank_state_machine(name: str, pattern: list[int], expected: list[str | None]) -> None:
    det = Detector(Settings(), "job1", 8)
    rng = np.random.default_rng(3)
    warm = 100.0 * (1 + 0.005 * rng.standard_normal((6, 8)))
    run(det, warm, islands=ISL8)
    rows = 100.0 * (1 + 0.005 * rng.standard_normal((len(pattern), 8)))
    rows[:, 2] *= np.where(np.array(pattern) == 1, 1.2, 1.0)
    res = run(det, rows, start=6, islands=ISL8)
    assert states(res, "rank", "2") == expected
    # Nobody else is ever reported.
    others = {(f.kind, f.subject) for r in res for f in r.findings}
    assert others <= {("rank", "2")}


def test_since_is_the_window_the_streak_began() -> None:
    det = Detector(Settings(), "job1", 8)
    rows = np.full((12, 8), 100.0)
    rows[7:, 2] = 118.0
    rows[8, 2] = 100.0  # one good window inside the streak: 3 of 4 still flags at 10
    res = run(det, rows, islands=ISL8)
    flag = [f for r in res for f in r.findings if f.state == "flagged"]
    assert [(f.window, f.since) for f in flag] == [(10, 7)]


def test_window_zero_is_never_judged_nor_a_baseline() -> None:
    det = Detector(Settings(), "job1", 4, islands={r: "a" for r in range(4)})
    r0 = det.score_window(0, make_window(0, [100, 100, 100, 300]))
    assert r0.findings == []
    assert r0.pace[3] == pytest.approx(3.0)
    # A single-rank island in window 0 must not seed its history baseline.
    solo = Detector(Settings(), "job1", 1)
    solo.score_window(0, make_window(0, [500.0]))
    for w in range(1, 7):
        res = solo.score_window(w, make_window(w, [100.0]))
    assert res.pace[0] == pytest.approx(1.0)


def test_finding_fields_for_a_flagged_rank() -> None:
    det = Detector(Settings(), "job1", 8, hosts={r: f"h{r}" for r in range(8)})
    rows = np.tile(np.array([100.0, 101, 99, 100.5, 80, 81, 79, 80.5]), (9, 1))
    rows[6:, 2] = 99 * 1.2
    res = run(det, rows, islands=ISL8, hosts=[f"h{r}" for r in range(8)])
    f = next(f for f in res[8].findings if f.state == "flagged")
    peers = np.median([100.0, 101, 100.5])
    assert (f.kind, f.rank, f.ranks, f.hosts, f.island) == ("rank", 2, [2], ["h2"], "nvidia")
    assert f.ratio == pytest.approx(99 * 1.2 / peers)
    assert f.history == pytest.approx(1.2)
    assert f.excess_ms == pytest.approx(99 * 1.2 - peers)
    step = res[8].step_ms
    assert f.loss_pct == pytest.approx(100 * (99 * 1.2 - peers) / step)
    # 20% slower than its peers and than its own confirmed pace: both judged it
    assert (f.basis, f.confidence, f.signal, f.steps) == ("both", "peers", "gap", [400, 450])
    assert f.evidence is not None and f.evidence["shift"] == pytest.approx(0.2, abs=1e-3)
    assert f.evidence["intermittent"] is False
    assert f.evidence is not None and f.evidence["peers"] == 3
    assert f.z is not None and f.z > 10


def test_gpu_hours_accumulate_from_since_once_confirmed() -> None:
    gpus = 32
    det = Detector(Settings(gpu_count=gpus), "job1", 8)
    rows = np.full((10, 8), 100.0)
    rows[6:, 5] = 115.0
    res = run(det, rows, islands=ISL8)
    per_window = 15.0 / 1000 * WINDOW_STEPS * gpus / 3600
    # Suspect windows 6 and 7 count only once flagged at 8; then 9 adds one more.
    assert res[7].gpu_hours_lost == 0.0
    assert res[8].gpu_hours_lost == pytest.approx(3 * per_window)
    assert res[9].gpu_hours_lost == pytest.approx(4 * per_window)
    f9 = res[9].findings[0]
    assert f9.evidence is not None and f9.evidence["gpu_hours"] == pytest.approx(4 * per_window)
    # A blip that is never confirmed costs nothing.
    det2 = Detector(Settings(), "job1", 8)
    rows2 = np.full((10, 8), 100.0)
    rows2[6:8, 5] = 130.0
    assert run(det2, rows2, islands=ISL8)[-1].gpu_hours_lost == 0.0


def test_unconfirmed_regression_never_becomes_the_baseline() -> None:
    # A 4-rank island is judged by peers; rank 0 is slow in warm-up windows 1-3
    # (flagged), so its history must be measured against its healthy windows only.
    det = Detector(Settings(), "job1", 4)
    rows = np.full((12, 4), 100.0)
    rows[1:4, 0] = 130.0
    res = run(det, rows)
    assert res[11].pace[0] == pytest.approx(1.0)
    f = next(f for r in res for f in r.findings if f.state == "flagged")
    assert f.window == 3
    # History of rank 0 in window 11 is 100 / baseline(100) = 1.0, not 100/130.
    det.score_window(12, make_window(12, [120.0, 100, 100, 100]))
    r13 = det.score_window(13, make_window(13, [120.0, 100, 100, 100]))
    f13 = next(x for x in r13.findings if x.rank == 0)
    assert f13.history == pytest.approx(1.2)


def test_degraded_rank_judged_by_its_history() -> None:
    # Island "amd" has two ranks (< min_island_peers=3): peers cannot judge.
    isl = ["nvidia"] * 4 + ["amd"] * 2
    det = Detector(Settings(), "job1", 6)
    rows = np.tile(np.array([100.0, 100, 100, 100, 60, 60]), (12, 1))
    rows[7:, 5] = 72.0  # +20% against its own warm-up
    res = run(det, rows, islands=isl)
    assert states(res, "degraded", "5")[7:10] == ["suspect", "suspect", "flagged"]
    f = next(f for f in res[9].findings if f.kind == "degraded")
    assert (f.basis, f.confidence, f.island) == ("history", "history", "amd")
    assert f.history == pytest.approx(1.2)
    assert f.excess_ms == pytest.approx(12.0)
    assert f.z is None
    assert res[9].pace[5] == pytest.approx(1.2)
    # The other amd rank is fine against its own history; no rank kind in amd.
    assert not any(f.rank == 4 for r in res for f in r.findings)


def test_island_drift_flags_the_island_not_its_ranks() -> None:
    det = Detector(Settings(), "job1", 8, hosts={r: f"h{r // 4}" for r in range(8)})
    rng = np.random.default_rng(5)
    rows = 100.0 * (1 + 0.005 * rng.standard_normal((14, 8)))
    rows[9:, 4:] *= 1.2
    res = run(det, rows, islands=ISL8, hosts=[f"h{r // 4}" for r in range(8)])
    assert states(res, "island", "amd")[9:12] == ["suspect", "suspect", "flagged"]
    assert states(res, "island", "nvidia") == [None] * 14
    assert not any(f.kind in ("rank", "degraded") for r in res for f in r.findings)
    f = next(f for f in res[11].findings if f.kind == "island")
    assert f.ranks == [4, 5, 6, 7] and f.hosts == ["h1"] and f.rank is None
    base = np.median([np.median(rows[w, 4:]) for w in range(1, 6)])
    assert f.drift == pytest.approx(np.median(rows[11, 4:]) / base)
    # Against the other island, which did not drift.
    assert f.ratio is not None and f.ratio == pytest.approx(1.2, rel=0.02)
    assert (f.basis, f.confidence) == ("history", "baseline")


def test_two_slow_ranks_of_four_are_rank_findings_not_an_island_drift() -> None:
    """A CPU hog on a core that two of a 4-rank job's ranks share (issue 31's real-job
    grid) slows both by 30%: each is slow against its peers, a `rank` finding of its
    own. The island's median (the mean of its middle two) moved 15% with them; the
    ranks the rank rule already named are not the island's drift, so no `island`."""
    det = Detector(Settings(), "job1", 4)
    rng = np.random.default_rng(11)
    rows = 100.0 * (1 + 0.005 * rng.standard_normal((14, 4)))
    rows[8:, [0, 2]] *= 1.3
    res = run(det, rows)
    assert states(res, "rank", "0")[10] == "flagged" and states(res, "rank", "2")[10] == "flagged"
    assert not [(f.kind, f.window) for r in res for f in r.findings if f.kind == "island"]
    assert np.median(rows[12]) / np.median(rows[2]) > Settings().drift_ratio  # what it was


def test_an_island_drift_hidden_in_its_wait_for_a_held_rank_is_not_reported() -> None:
    """A 2-rank job (one island): rank 1's loader stalls (its gap doubles) and rank 0,
    which waits for it, computes 15% slower meanwhile (busy all of its gap: a real
    2-rank gloo job did, bench/README.md "Other sizes"). The island's own ranks less
    the held one are rank 0: its drift is hidden inside its 17 ms wait a step for
    rank 1 and costs the job nothing, so only `degraded` 1 is reported. Where the
    own drift is more than that wait (rank 0 30% slower, rank 1 50%: 6 ms over a
    4 ms wait), the island is slower too, and says so."""

    def flagged(own: float, held: float) -> set[tuple[str, str]]:
        rng = np.random.default_rng(3)
        gap = 20.0 * np.exp(0.01 * rng.standard_normal((16, 2)))
        gap[10:, 0] *= own
        gap[10:, 1] *= held
        coll = np.full((16, 2), 2.0)  # the transfer; the earlier arrival waits the rest
        coll[:, 0] += np.maximum(0.0, gap[:, 1] - gap[:, 0])
        coll[:, 1] += np.maximum(0.0, gap[:, 0] - gap[:, 1])
        det = Detector(Settings(), "job1", 2)
        res = [det.score_window(w, make_window(w, gap[w], coll=coll[w])) for w in range(16)]
        return {(f.kind, f.subject) for r in res for f in r.findings if f.state == "flagged"}

    assert flagged(1.15, 2.0) == {("degraded", "1")}
    assert flagged(1.3, 1.5) == {("degraded", "1"), ("island", "default")}


def test_collective_slowdown_uses_the_last_arrival() -> None:
    # One straggler inflates everyone else's time in collectives (they wait for
    # it); that must not read as a collective slowdown.
    det = Detector(Settings(), "job1", 4)
    gap = np.full((16, 4), 100.0)
    coll = np.full((16, 4), 10.0)
    gap[6:, 1] = 125.0
    coll[6:, [0, 2, 3]] = 35.0  # waiting 25 ms for rank 1
    coll[6:, 1] = 10.0
    res = [det.score_window(w, make_window(w, gap[w], coll=coll[w])) for w in range(12)]
    assert not any(f.kind == "collective" for r in res for f in r.findings)
    assert states(res, "rank", "1")[8] == "flagged"
    # Now the transfer itself slows by 30% for everyone.
    coll[12:] *= 1.3
    res = [det.score_window(w, make_window(w, gap[w], coll=coll[w])) for w in range(12, 16)]
    assert states(res, "collective", "default")[:3] == ["suspect", "suspect", "flagged"]
    f = next(f for f in res[2].findings if f.kind == "collective")
    assert f.ratio == pytest.approx(1.3) and f.signal == "coll"
    assert f.excess_ms == pytest.approx(3.0)


def test_collective_ignores_waiting_for_another_island() -> None:
    # amd's compute slows by 20%: nvidia ranks wait inside the shared collective.
    det = Detector(Settings(), "job1", 8)
    gap = np.full((14, 8), 100.0)
    coll = np.full((14, 8), 10.0)
    gap[8:, 4:] = 120.0
    coll[8:, :4] = 30.0
    res = [
        det.score_window(w, make_window(w, gap[w], coll=coll[w], islands=ISL8)) for w in range(14)
    ]
    kinds = {(f.kind, f.subject) for r in res for f in r.findings if f.state == "flagged"}
    assert kinds == {("island", "amd")}


def _slowing_bridge(w: int) -> dict[int, tuple[float, int]]:
    """Bridge times of ranks 0 and 4 (the islands' leaders) for window `w`: 5 ms, and
    7 ms from window 8 on (rank 4 half a ms more)."""
    b = 5.0 if w < 8 else 7.0
    return {0: (b, 1), 4: (b + 0.5, 0)}


def test_link_from_bridge_records() -> None:
    det = Detector(Settings(), "job1", 8, island_order=["nvidia", "amd"])
    res = []
    for w in range(12):
        bridge = _slowing_bridge(w)
        res.append(det.score_window(w, make_window(w, [100.0] * 8, islands=ISL8, bridge=bridge)))
    assert states(res, "link", "amd<->nvidia")[8:11] == ["suspect", "suspect", "flagged"]
    f = next(f for f in res[10].findings if f.kind == "link")
    assert f.ranks == [0, 4] and f.ratio == pytest.approx(7.0 / 5.0)
    assert f.signal == "bridge" and f.excess_ms == pytest.approx(2.0)


def test_link_finding_carries_the_leaders_nic_counters() -> None:
    # The amd leader's host saw symbol errors once the link slowed: the evidence says
    # which host's port, with its counts; hosts without errors are not listed.
    det = Detector(Settings(), "job1", 8, island_order=["nvidia", "amd"])
    res = []
    for w in range(12):
        bridge = _slowing_bridge(w)
        errs = 12 if w >= 8 else 0
        tel = {0: Telemetry(nic_symbol_errors=0), 4: Telemetry(nic_symbol_errors=errs)}
        win = make_window(w, [100.0] * 8, islands=ISL8, bridge=bridge, telemetry=tel)
        res.append(det.score_window(w, win))
    f = next(f for f in res[10].findings if f.kind == "link")
    assert f.evidence is not None
    assert f.evidence["nic_symbol_errors"] == 12
    assert f.evidence["nic_hosts"] == {"node-1": {"nic_symbol_errors": 12}}
    # Without NIC counters the evidence has no NIC keys at all.
    plain = next(f for f in run_link() if f.kind == "link")
    assert plain.evidence is not None and "nic_hosts" not in plain.evidence


def run_link() -> list:
    det = Detector(Settings(), "job1", 8, island_order=["nvidia", "amd"])
    out: list = []
    for w in range(11):
        b = 5.0 if w < 8 else 7.0
        win = make_window(w, [100.0] * 8, islands=ISL8, bridge={0: (b, 1), 4: (b + 0.5, 0)})
        out = det.score_window(w, win).findings
    return out


def test_hardware_classes_keep_an_older_generation_quiet() -> None:
    classes = ["A100"] * 4 + ["V100"] * 4
    rows = np.tile(np.array([100.0] * 4 + [166.0] * 4), (10, 1))
    quiet = Detector(Settings(), "job1", 8)
    res = run(quiet, rows, classes=classes)
    assert all(not r.findings for r in res)
    assert res[-1].pace[6] == pytest.approx(1.0)
    # With classes off, the older class reads as four stragglers... among 8 peers.
    loud = Detector(Settings(hardware_classes="off"), "job1", 8)
    res = run(loud, rows, classes=classes)
    assert {f.rank for f in res[-1].findings} == {4, 5, 6, 7}
    # A V100 slowing within its class is still found with classes on.
    rows2 = rows.copy()
    rows2[6:, 5] *= 1.2
    res = run(Detector(Settings(), "job1", 8), rows2, classes=classes)
    assert states(res, "rank", "5")[8] == "flagged"
    f = next(f for f in res[8].findings if f.rank == 5)
    assert f.evidence is not None and f.evidence["hw_class"] == "V100"


def test_islands_from_telemetry_then_config_then_default() -> None:
    tel = {r: Telemetry(vendor="amd") for r in range(2)}
    det = Detector(Settings(), "job1", 4, islands={2: "cfg"})
    res = det.score_window(1, make_window(1, [100.0] * 4, telemetry=tel))
    assert res.islands == {0: "amd", 1: "amd", 2: "cfg", 3: "default"}
    res = det.score_window(
        2, make_window(2, [100.0] * 4, islands=["x", None, None, None], telemetry=tel)
    )
    assert res.islands[0] == "x" and res.islands[1] == "amd"


def test_missing_ranks_and_unusable_records() -> None:
    det = Detector(Settings(), "job1", 8)
    recs = make_window(1, [100.0, 100, 100, float("nan"), 100], ranks=[0, 1, 2, 3, 4], nranks=8)
    res = det.score_window(1, recs, missing=[6, 7])
    assert res.missing == [3, 6, 7]
    assert set(res.pace) == {0, 1, 2, 4}
    empty = det.score_window(2, [], missing=list(range(8)))
    assert empty.missing == list(range(8)) and math.isnan(empty.step_ms)
    with pytest.raises(ValueError, match="outside the job's ranks"):
        det.score_window(3, make_window(3, [1.0] * 9))


def test_cause_is_attached_to_rank_findings() -> None:
    tel = {
        r: Telemetry(sm_mhz=1530, temp_c=60, power_w=300, power_limit_w=700, throttle={})
        for r in range(8)
    }
    tel[2] = Telemetry(sm_mhz=1110, temp_c=61, power_w=250, power_limit_w=700, throttle={})
    det = Detector(Settings(), "job1", 8)
    rows = np.full((4, 8), 100.0)
    rows[1:, 2] = 118.0
    res = run(det, rows, islands=ISL8, telemetry=tel)
    f = next(f for f in res[3].findings if f.state == "flagged")
    assert f.cause is not None and f.cause["kind"] == "clocks"
    assert f.cause["evidence"]["peers_sm_mhz"] == 1530
    assert "cpu_pct" in f.missing and "sm_mhz" not in f.missing


def test_update_settings_applies_from_the_next_window() -> None:
    det = Detector(Settings(mode="seed"), "job1", 8)
    rows = np.full((10, 8), 100.0)
    rows[6:, 1] = 106.0  # 6% slow: under the default 1.10
    res = run(det, rows[:8], islands=ISL8)
    assert all(not r.findings for r in res)
    det.update_settings(
        Settings(mode="seed")
        .set("suspect_ratio", "1.05")
        .set("flag_after", "2")
        .set("warmup_windows", "3")
    )
    res = run(det, rows[8:], start=8, islands=ISL8)
    assert states(res, "rank", "1") == ["suspect", "flagged"]
    assert det.active() == [("rank", "1")]
