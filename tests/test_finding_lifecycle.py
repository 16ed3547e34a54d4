"""The finding lifecycle's transition table (detect/lifecycle.py) and the frozen Finding."""

from __future__ import annotations

import dataclasses

import pytest
from artemis.detect.findings import Finding, rank_finding
from artemis.detect.lifecycle import TRANSITIONS, Event, Ledger, Phase, Track
from artemis.detect.settings import Settings

S = Settings()  # flag_after 3 of flag_window 4, clear_after 3


def run(track: Track, verdicts: str, rule: bool = False, start: int = 1) -> list[str | None]:
    return [
        track.observe(start + i, v == "B", S, intermittent_rule=rule)
        for i, v in enumerate(verdicts)
    ]


def test_table_reports_flagged_entering_active_and_cleared_leaving_it() -> None:
    for (phase, _event), (nxt, state) in TRANSITIONS.items():
        if nxt is Phase.ACTIVE and phase is not Phase.ACTIVE:
            assert state == "flagged"
        elif phase is Phase.ACTIVE:
            assert state == ("cleared" if nxt is Phase.QUIET else "ongoing")
        else:
            assert state in ("suspect", None)
    # every event can happen from some phase
    assert {e for _p, e in TRANSITIONS} == set(Event)


def test_a_streak_is_flagged_then_cleared() -> None:
    t = Track(S.flag_window)
    assert run(t, "BGBB") == ["suspect", None, "suspect", "flagged"]
    assert t.since == 1 and t.active
    assert run(t, "GBGGG", start=5) == ["ongoing"] * 4 + ["cleared"]
    assert not t.active and t.idle


def test_a_suspicion_fades_and_the_next_one_starts_afresh() -> None:
    t = Track(S.flag_window)
    assert run(t, "BGGGG") == ["suspect", None, None, None, None]
    assert t.since is None and not t.active
    assert run(t, "B", start=9) == ["suspect"] and t.since == 9


def test_intermittent_rule_flags_and_clears_after_twice_the_good_windows() -> None:
    t = Track(S.flag_window)
    states = run(t, "BGBGBGBG", rule=True)
    assert states[-2:] == ["flagged", "ongoing"] and t.intermittent
    # an intermittent flag clears only after 2 x clear_after good windows
    assert run(t, "GGGGG", rule=True, start=9) == ["ongoing"] * 4 + ["cleared"]
    assert not t.intermittent


def measured_run(track: Track, verdicts: str, s: Settings = S, start: int = 1) -> list[str | None]:
    """``M``: bad by a measurement (the host's evidence), ``B``: by timing, ``G``: good."""
    return [
        track.observe(start + i, v != "G", s, measured=v == "M") for i, v in enumerate(verdicts)
    ]


def test_a_measured_rank_is_confirmed_in_two_windows_in_a_row() -> None:
    assert measured_run(Track(S.flag_window), "MM") == ["suspect", "flagged"]
    # timing after a measurement, or a measurement after timing: 3 of 4 as ever
    assert measured_run(Track(S.flag_window), "BM") == ["suspect", "suspect"]
    assert measured_run(Track(S.flag_window), "MBM") == ["suspect", "suspect", "flagged"]
    # not in a row: a debugger's attach, then one throttled period later
    assert measured_run(Track(S.flag_window), "MGM") == ["suspect", None, "suspect"]
    # an operator's flag_after of 1 is still 1
    one = Settings(flag_after=1)
    assert measured_run(Track(one.flag_window), "M", one) == ["flagged"]


def test_a_measured_run_survives_a_snapshot_and_restarts_after_clearing() -> None:
    t = Track(S.flag_window)
    assert measured_run(t, "M") == ["suspect"]
    again = Track.restore(t.snapshot(), S.flag_window)
    assert measured_run(again, "M", start=2) == ["flagged"]
    assert measured_run(again, "GGG", start=3) == ["ongoing", "ongoing", "cleared"]
    assert again.measured == 0 and measured_run(again, "M", start=6) == ["suspect"]
    # an older snapshot (no `measured`) restores as none counted
    old = {k: v for k, v in t.snapshot().items() if k != "measured"}
    assert Track.restore(old, S.flag_window).measured == 0


def test_the_ledger_counts_a_suspects_cost_once_confirmed() -> None:
    led = Ledger()
    t = led.track(("rank", "3"), S.flag_window)
    for w in (1, 2):
        assert led.advance(t, w, True, 10.0, 0.5, S) == "suspect"
    assert led.gpu_hours == 0.0 and t.pending_hours == 10.0
    assert led.advance(t, 3, True, 10.0, 0.5, S) == "flagged"
    assert led.gpu_hours == t.hours == 15.0 and t.pending_hours == 0.0
    assert led.active() == [("rank", "3")]


def test_a_finding_is_frozen_and_keyword_only() -> None:
    f = rank_finding(
        job="j",
        state="flagged",
        window=3,
        steps=[0, 10],
        rank=2,
        island="a",
        hosts=["h"],
        since=1,
        ratio=1.2,
        z=8.0,
        history=None,
        excess_ms=1.0,
        loss_pct=None,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.ratio = 2.0  # type: ignore[misc]
    g = dataclasses.replace(f, ratio=2.0)
    assert g.ratio == 2.0 and f.ratio == 1.2
    with pytest.raises(TypeError):
        Finding("rank", "flagged", 0)  # type: ignore[misc]
    # the fields a kind never sets default to null or empty
    bare = Finding(kind="hang", state="flagged", window=0)
    assert bare.to_json()["ranks"] == [] and bare.to_json()["cause"] is None
