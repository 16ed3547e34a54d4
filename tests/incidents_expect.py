"""What a simulated run's `incidents.jsonl` must hold, from the scenario and the findings.

The end-to-end tests (tests/test_e2e_scenarios.py, tests/test_e2e_rebalance.py)
call `check_incidents` on what the coordinator wrote. The verdict each fault
must end in comes from the scenario alone (its faults, their end, the
rebalance mode, whether the job honours plans: docs/DESIGN.md "Incidents");
the episodes an incident must exist for come from the findings file (one
incident per flagged episode), which the scenario tests already judge.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from artemis.sim.scenario import Fault, Scenario
from e2e_expect import COMPUTE_FAULTS, lockstep_throughput, read_jsonl

# docs/DESIGN.md "Incidents": the record's keys, written out here rather than taken
# from the coordinator so that a change there cannot move the goalposts.
INCIDENT_KEYS = {
    "id",
    "job",
    "run",
    "kind",
    "subject",
    "rank",
    "ranks",
    "island",
    "hosts",
    "change",
    "status",
    "opened",
    "confirmed",
    "closed",
    "cause",
    "evidence",
    "cost",
    "actions",
    "escalation",
    "verdict",
    "reason",
    "markers",
}
VERDICTS = {"recovered", "mitigated", "escalated", "unresolved", "dismissed"}
MARKERS = ("onset", "flagged", "confirmed", "applied", "verified", "rolled_back", "cleared")
CLEAR_AFTER = 3  # Settings.clear_after default (docs/DESIGN.md "Findings")


def incidents_file(findings: Path) -> Path:
    """DESIGN: `incidents.jsonl` next to the findings."""
    return findings.parent / "incidents.jsonl"


def latest(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rec in lines:
        out[rec["id"]] = rec
    return out


def _episodes(findings: list[dict[str, Any]], job: str) -> list[tuple[str, str, int]]:
    """(kind, subject key, flag window) of every flagged episode in the findings."""
    out = []
    for f in findings:
        if f["job"] != job or f["state"] != "flagged":
            continue
        if f["kind"] in ("rank", "degraded"):
            subject = str(f["rank"])
        elif f["kind"] in ("hang", "missing"):
            subject = ""
        else:
            subject = f["island"] or ""
        out.append((f["kind"], subject, f["window"]))
    return sorted(out)


def expected_verdict(sc: Scenario, fault: Fault) -> str:
    """The verdict a compute fault's incident must end in, from the scenario alone."""
    mode = str(sc.detector.get("rebalance", "off"))
    if fault.end_window is not None and fault.end_window + CLEAR_AFTER + 1 < sc.windows:
        return "recovered"
    if mode == "apply" and sc.honours_plans:
        return "mitigated"
    # heat is not a setting: no correction can be applied, so a person must act (issue 29)
    if fault.kind == "thermal":
        return "escalated"
    return "unresolved"


def check_incidents(sc: Scenario, findings: list[dict[str, Any]], path: Path, job: str) -> None:
    lines = read_jsonl(path) if path.exists() else []
    for rec in lines:
        assert set(rec) >= INCIDENT_KEYS, f"{path}: keys {sorted(rec)}"
        assert rec["job"] == job
    recs = latest(lines)
    # one incident per flagged episode, and none without one
    have = sorted(
        (
            r["kind"],
            "" if r["kind"] in ("hang", "missing") else r["subject"],
            r["opened"]["window"],
        )
        for r in recs.values()
    )
    assert have == _episodes(findings, job), f"{sc.path}: incidents {have}"
    for r in recs.values():
        # the coordinator was stopped after the run: every incident ends closed
        assert r["status"] == "closed" and r["verdict"] in VERDICTS, (r["id"], r["status"])
        marks = [m["marker"] for m in r["markers"]]
        assert marks == sorted(marks, key=MARKERS.index), marks
        windows = [m["window"] for m in r["markers"]]
        assert windows == sorted(windows), r["markers"]
        if r["verdict"] == "dismissed":
            assert r["escalation"] is None and r["reason"]
        else:
            assert r["escalation"]["check"], r["id"]
    for fault in sc.faults:
        if fault.kind in COMPUTE_FAULTS:
            for rank in fault.ranks:
                mine = [
                    r
                    for r in recs.values()
                    if r["kind"] in ("rank", "degraded") and r["rank"] == rank
                ]
                assert len(mine) == 1, f"{sc.path}: rank {rank}: {[r['id'] for r in mine]}"
                r = mine[0]
                assert r["confirmed"] is not None, r["reason"]
                # a clear slowdown is confirmed in the window that flagged it
                assert r["confirmed"]["window"] == r["opened"]["window"], r["confirmed"]
                assert r["verdict"] == expected_verdict(sc, fault), (r["verdict"], r["reason"])
                assert r["escalation"]["cause"] == r["cause"]["kind"]
                assert r["cost"]["gpu_hours"] > 0 and r["cost"]["loss_pct"] > 0
                if r["verdict"] == "mitigated":
                    tp = lockstep_throughput(sc, fault.slowdown)
                    (a,) = [a for a in r["actions"] if a["status"] == "verified"]
                    # at least half of what the fault lost, measured (rebalance/README.md)
                    assert a["gain_pct"] >= 50.0 * tp.lost / tp.faulted, a
                if r["verdict"] == "recovered":
                    assert r["closed"]["why"] == "cleared"
                    assert r["closed"]["window"] >= fault.end_window
        elif fault.kind in ("island", "collective", "link", "hang"):
            mine = [r for r in recs.values() if r["kind"] == fault.kind]
            assert mine, f"{sc.path}: no {fault.kind} incident"
            for r in mine:
                assert r["confirmed"] is not None and r["confirmed"]["rule"].startswith("flag")
                assert r["verdict"] == "unresolved", r["reason"]
        elif fault.kind == "agent_down":
            mine = [r for r in recs.values() if r["kind"] == "missing"]
            assert len(mine) == 1 and mine[0]["verdict"] in ("unresolved", "recovered")
    if not sc.faults:
        assert not recs, f"{sc.path}: a healthy job has incidents {list(recs)}"
