"""The fleet end-to-end checks (tests/fleet_harness.py) fail for the reasons they exist.

Each check is fed the records a fleet would write (findings, plans and incidents lines
tagged with the member that wrote them, the store's rows): a clean hand-over passes,
and each fault the checks are there for (a window scored twice, by one member or by
two; a window lost; a finding restarted; the incident split; a plan left unverified)
is named. No processes: the checks are pure functions of the outputs.
"""

from __future__ import annotations

from typing import Any

import fleet_harness as fh
from fleet_harness import Outputs

JOB, RANK = "j", 2
INC = "j-r2-w3"


def _line(w: int, by: str, state: str = "ongoing", since: int = 1) -> dict[str, Any]:
    return {"job": JOB, "kind": "rank", "rank": RANK, "window": w, "state": state,
            "since": since, "_by": by}  # fmt: skip


def _clean() -> Outputs:
    """Windows 1-8, c0 scoring 1-4 and c1 (after c0's kill) 5-8; one incident; one plan
    recommended and applied by c0, verified by c1."""
    states = ["suspect", "suspect", "flagged"] + ["ongoing"] * 5
    findings = [_line(w, "c0" if w <= 4 else "c1", states[w - 1]) for w in range(1, 9)]
    plans = [
        {"job": JOB, "id": "p1", "status": "recommended", "_by": "c0"},
        {"job": JOB, "id": "p1", "status": "applied", "_by": "c0"},
        {"job": JOB, "id": "p1", "status": "verified", "_by": "c1"},
    ]
    inc = {"id": INC, "job": JOB, "rank": RANK, "closed": None}
    return Outputs(
        findings=findings,
        plans=plans,
        incident_lines=[{**inc, "_by": "c0"}, {**inc, "_by": "c1"}],
        store_incidents=[inc],
        store_windows={JOB: list(range(9))},
        incident_windows={INC: list(range(1, 9))},
        logs=[],
    )


def _all(out: Outputs) -> list[str]:
    return [
        *fh.check_scored_once(out, JOB, RANK, range(1, 9)),
        *fh.check_finding_continues(out, JOB, RANK),
        *fh.check_one_incident(out, JOB, RANK),
        *fh.check_plan_verified(out, JOB),
    ]


def test_a_clean_handover_passes() -> None:
    assert _all(_clean()) == []


def test_a_window_scored_by_two_owners_is_named() -> None:
    out = _clean()
    out.findings.append(_line(5, "c0"))  # the old owner went on scoring window 5
    problems = _all(out)
    assert any("more than once" in p and "5" in p for p in problems), problems
    assert fh.check_owners_apart(out, JOB) == [
        "j: two owners scored the same windows: {5: ['c0', 'c1']}"
    ]


def test_a_window_scored_twice_by_one_member_is_named() -> None:
    out = _clean()
    out.findings.append(_line(6, "c1"))
    assert fh.check_owners_apart(out, JOB) == []
    assert any("more than once" in p for p in fh.check_scored_once(out, JOB, RANK, range(1, 9)))


def test_a_lost_window_is_named_unless_the_store_has_it() -> None:
    out = _clean()
    out.findings = [f for f in out.findings if f["window"] != 4]
    assert fh.check_scored_once(out, JOB, RANK, range(1, 9)) == []  # its rows are stored
    out.incident_windows[INC].remove(4)
    out.store_windows[JOB].remove(4)
    problems = fh.check_scored_once(out, JOB, RANK, range(1, 9))
    assert any("never scored" in p and "[4]" in p for p in problems), problems
    assert any("without a row" in p for p in problems), problems


def test_a_restarted_finding_and_a_split_incident_are_named() -> None:
    out = _clean()
    for f in out.findings:
        if f["window"] >= 5:
            f["since"] = 5
    out.findings[4]["state"] = "flagged"
    assert len(fh.check_finding_continues(out, JOB, RANK)) == 2
    out.store_incidents = [{**out.store_incidents[0], "closed": {"window": 4}},
                           {"id": "j-r2-w5", "job": JOB, "rank": RANK, "closed": None}]  # fmt: skip
    problems = fh.check_one_incident(out, JOB, RANK)
    assert any("2 incidents" in p for p in problems) and any("closed" in p for p in problems)


def test_a_plan_left_applied_or_acked_twice_is_named() -> None:
    out = _clean()
    out.plans.pop()  # never verified
    assert fh.check_plan_verified(out, JOB) == [
        "j: plans neither verified nor rolled back: {'p1': 'applied'}"
    ]
    out.plans += [out.plans[1], {"job": JOB, "id": "p1", "status": "verified", "_by": "c1"}]
    assert any("more than once" in p for p in fh.check_plan_verified(out, JOB))
