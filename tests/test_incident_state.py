"""The incident lifecycle's transition table (detect/incident_state.py)."""

from __future__ import annotations

import pytest
from artemis.detect.incident_state import (
    STEP,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    Incident,
    IncidentState,
    incident_from_state,
    incident_state,
)

S = IncidentState


def _inc() -> Incident:
    return Incident(
        id="j-r3-w7",
        kind="rank",
        subject="3",
        rank=3,
        ranks=[3],
        island="a",
        hosts=["h0"],
        opened={"window": 7, "time": None},
        since=5,
    )


def test_the_table_has_one_start_and_two_ends() -> None:
    assert {S.CLOSED, S.DISMISSED} == TERMINAL
    assert TRANSITIONS[S.OPEN] == {S.CONFIRMED, S.DISMISSED}
    assert TRANSITIONS[S.CONFIRMED] == {S.CLOSED}
    # every close event of an unconfirmed incident dismisses it
    assert {STEP[(S.OPEN, e)] for e in ("dismissed", "cleared", "job_end")} == {S.DISMISSED}


def test_confirm_then_close() -> None:
    inc = _inc()
    assert inc.state is S.OPEN
    assert inc.move("confirm", 8, 1.5, rule="q1>peers_median") is S.CONFIRMED
    assert inc.confirmed == {"window": 8, "time": 1.5, "rule": "q1>peers_median"}
    assert inc.state is S.CONFIRMED
    assert inc.move("cleared", 12, 3.0) is S.CLOSED
    assert inc.closed == {"window": 12, "time": 3.0, "why": "cleared"}
    assert inc.verdict is None  # the book judges a confirmed incident's verdict
    with pytest.raises(IllegalTransition):
        inc.move("confirm", 13, None)


def test_close_before_confirmation_dismisses() -> None:
    inc = _inc()
    assert inc.move("job_end", 9, None) is S.DISMISSED
    assert inc.verdict == "dismissed" and inc.state is S.DISMISSED
    with pytest.raises(IllegalTransition):
        inc.move("cleared", 10, None)


def test_an_unknown_event_is_refused() -> None:
    with pytest.raises(IllegalTransition):
        _inc().move("dismissed_twice", 1, None)
    inc = _inc()
    inc.move("confirm", 8, None)
    with pytest.raises(IllegalTransition):
        inc.move("dismissed", 9, None)  # a confirmed incident is never dismissed


def test_state_round_trips_and_is_derived_from_the_record() -> None:
    inc = _inc()
    inc.add("ratio", 1.3)
    inc.move("confirm", 8, None)
    back = incident_from_state(incident_state(inc))
    assert back.state is S.CONFIRMED and back.mean("ratio") == pytest.approx(1.3)
    assert back.key == ("rank", "3")
