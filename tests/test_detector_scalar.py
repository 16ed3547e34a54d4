"""The scalar kinds' adaptive rule (island, collective, link): a limit scaled by the
scalar's own recent noise, and the tail rule (detect/DETECTOR.md, "The combined
test"). Short windows with common stalls make the island's transfer time heavy-tailed:
these must not flag, while a real collective slowdown still does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from artemis.detect.detector import Detector
from artemis.detect.settings import Settings
from artemis.sim.inproc import run
from artemis.sim.scenario import parse_scenario
from test_detector_support import make_window

REALISTIC = {
    "noise": 0.01,
    "rank_spread": 0.02,
    "shared_jitter": 0.05,
    "stall_prob": 0.005,
    "stall_ms": 60.0,
}


def _short_windows_job(windows: int, seed: int) -> dict[str, Any]:
    """32 ranks at 100 ms steps in 10-step windows (1 s), with REALISTIC's noise."""
    return {
        "ranks": 32,
        "ranks_per_host": 8,
        "step_ms": 100.0,
        "collectives_per_step": 4,
        "window_steps": 10,
        "windows": windows,
        "seed": seed,
        **REALISTIC,
    }


def _states(det: Detector, colls: np.ndarray, start: int) -> list[str | None]:
    out: list[str | None] = []
    for i, c in enumerate(colls):
        w = start + i
        res = det.score_window(w, make_window(w, np.full(4, 100.0), coll=np.full(4, c)))
        hit = [f.state for f in res.findings if f.kind == "collective"]
        out.append(hit[0] if hit else None)
    return out


def _warm(mode: str) -> Detector:
    det = Detector(Settings(mode=mode), "job1", 4)
    rng = np.random.default_rng(2)
    _states(det, 10.0 * (1 + 0.01 * rng.standard_normal(30)), 0)
    return det


def test_scattered_excursions_flag_only_under_the_seed_rule() -> None:
    # A tail: one excursion, then three over the limit in four windows (two in a row,
    # a gap, one more). The seed rule flags it; the adaptive one, having seen the
    # tail, counts only second windows in a row: one bad window, no flag.
    pattern = np.array([10.0, 10, 16, 10, 10, 10, 16, 16, 10, 16, 10, 10, 10])
    assert "flagged" in _states(_warm("seed"), pattern, 30)
    assert "flagged" not in _states(_warm("adaptive"), pattern, 30)


def test_a_persistent_collective_slowdown_still_flags_after_a_tail() -> None:
    pattern = np.array([10.0, 10, 16, 10, 10, 10, 13, 13, 13, 13, 13])
    st = _states(_warm("adaptive"), pattern, 30)
    # the tail at window 32 costs the slowdown (from window 36) one window: flagged
    # in its 4th window instead of its 3rd
    assert st[6:10] == [None, "suspect", "suspect", "flagged"], st


def test_without_a_tail_the_first_window_counts() -> None:
    st = _states(_warm("adaptive"), np.full(4, 13.0), 30)
    assert st[:3] == ["suspect", "suspect", "flagged"]


@pytest.mark.parametrize("seed", [1, 8])
def test_healthy_short_windows_with_stalls_flag_nothing(seed: int) -> None:
    """10-step windows of 100 ms, stalls in 0.5% of rank-steps at 60 ms on 64 ranks (a
    quarter of all steps has one somewhere): no flag of any kind in >= 10k rank-windows.
    Both seeds flagged `collective` under the earlier rule (a limit from five warm-up
    windows, any three over it in four)."""
    sc = parse_scenario(
        {
            "job": {
                "ranks": 64,
                "ranks_per_host": 8,
                "step_ms": 100.0,
                "collectives_per_step": 4,
                "window_steps": 10,
                "windows": 162,
                "seed": seed,
                **REALISTIC,
            }
        }
    )
    res = run(sc, telemetry=False)
    assert res.healthy_rank_windows >= 10_000
    assert res.false_flags == 0, res.false_by_kind


def test_a_30_percent_collective_slowdown_in_short_windows_is_flagged() -> None:
    sc = parse_scenario(
        {
            "job": _short_windows_job(windows=24, seed=0),
            "fault": [
                {"kind": "collective", "island": "nvidia", "start_window": 16, "slowdown": 0.3}
            ],
        }
    )
    res = run(sc, telemetry=False)
    w = res.first_flag.get(("collective", "default"))
    assert w is not None and w - 16 + 1 <= 4


def test_short_windows_flag_a_10_percent_straggler_within_3_under_realistic_noise() -> None:
    """The issue's part 3: `window_steps = 10` at 100 ms steps, stalls and jitter as
    above: a 10% straggler within 3 windows (3 s), nothing else flagged. Measured: 19
    of seeds 100-119 within 3, seed 101 in 4 (its onset window shifts it 6.8 noise sds,
    short of the CUSUM's one-window reach: DETECTOR.md, "Known limits")."""
    took = []
    for seed in range(100, 108):
        sc = parse_scenario(
            {
                "job": _short_windows_job(windows=16 + 4, seed=seed),
                "fault": [{"kind": "clocks", "rank": 13, "start_window": 16, "slowdown": 0.1}],
            }
        )
        res = run(sc, [13], telemetry=False)
        assert res.false_flags == 0, (seed, res.false_by_kind)
        w = res.flag_window.get(13)
        took.append(99 if w is None else w - 16 + 1)
    assert max(took) <= 4 and sum(t <= 3 for t in took) >= 7, took


# A kept real-job run (bench/realjobs, `gpt` `bridge` 10, out/realjobs-q8): its link's
# value (the bridge time of its two island leaders, ms) in windows 0-19, the bridge
# slowed by 10 ms an exchange from window 10 (its first whole window: 11).
REAL_BRIDGE_MS = [3.47, 2.76, 3.0, 1.97, 1.1, 2.38, 2.9, 2.78, 1.65, 2.06]
REAL_BRIDGE_MS += [4.95, 12.2, 11.95, 11.55, 12.12, 12.2, 10.93, 11.3, 11.6, 11.8]


def _link_states(values: list[float]) -> list[str | None]:
    det = Detector(Settings(), "job1", 8, island_order=["nvidia", "amd"])
    isl = ["nvidia"] * 4 + ["amd"] * 4
    out: list[str | None] = []
    for w, b in enumerate(values):
        win = make_window(w, [14.0] * 8, islands=isl, bridge={0: (b, 1), 4: (b + 0.5, 0)})
        hit = [f.state for f in det.score_window(w, win).findings if f.kind == "link"]
        out.append(hit[0] if hit else None)
    return out


def test_a_slow_bridge_with_millisecond_noise_is_flagged_under_the_defaults() -> None:
    # Its healthy windows spread 1.1-3.5 ms: as log deviations, the low ones made an
    # sd of 0.47, a limit of 10.7x, and each slowed window under it fed the noise
    # (the limit reached 4,800x): never flagged. On the linear scale (SCALAR_LINEAR)
    # the 4.5-5x bridge is flagged in 3 windows of its onset.
    st = _link_states(REAL_BRIDGE_MS)
    assert st[:10] == [None] * 10, st
    assert st[11:14] == ["suspect", "suspect", "flagged"], st


def test_a_bridge_within_its_millisecond_noise_is_not_flagged() -> None:
    # the same run's healthy windows, again and again: 60 windows, nothing
    assert all(s is None for s in _link_states(REAL_BRIDGE_MS[:10] * 6))
