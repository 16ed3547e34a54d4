"""Incident records and per-window rows in the shapes of docs/DESIGN.md "Incidents
(coordinator -> world)", for the store's and `artemis incidents`' tests."""

from __future__ import annotations

import copy
from typing import Any

from incident_parts import about_rank, confirmed_by_q1, cost, dismissed_record, evidence, markers

T0 = 1764584400.0  # unix s of window 0
WINDOW_S = 5.0


def t(window: int) -> float:
    return T0 + window * WINDOW_S


def flagship(job: str = "flagship-sim") -> list[dict[str, Any]]:
    """The changes of one incident, in order: opened, confirmed, action (applied,
    then verified), closed as mitigated. Each is the whole record."""
    # the rank's telemetry against its peers' (rank, peers)
    telemetry = {"sm_mhz": (1694.0, 1978.0), "temp_c": (61.0, 63.0), "power_frac": (0.48, 0.71)}
    base: dict[str, Any] = {
        **about_rank(job, "c0ffee", 2, "nvidia", "node-a", 18),
        "change": "opened",
        "status": "open",
        "opened": {"window": 18, "time": t(18)},
        "confirmed": None,
        "closed": None,
        "cause": {
            "kind": "clocks",
            "text": "clocks low (SM 1694 MHz vs 1978 MHz on its peers), no throttle reason:"
            " locked clocks or a misconfigured GPU",
            "evidence": {"sm_mhz": 1694, "peers_sm_mhz": 1978},
            "explained": 0.93,
            "alternatives": [{"kind": "power", "text": "power near its cap", "explained": 0.2}],
        },
        "evidence": evidence(3, 115.1, 100.0, 1.151, **telemetry),
        "cost": cost(15.0, 11.7, 0.004, 9.6),
        "actions": [],
        "escalation": {
            "cause": "clocks",
            "check": "rank 2 on node-a runs SM 1694 MHz against 1978 MHz on its peers:"
            " are application clocks locked? nvidia-smi -q -d CLOCK; reset with nvidia-smi -rgc",
        },
        "verdict": None,
        "reason": "",
        "markers": markers(onset=16, flagged=18),
    }
    out = [copy.deepcopy(base)]
    r = copy.deepcopy(base)
    r["change"] = "confirmed"
    r["confirmed"] = confirmed_by_q1(18, t(18), 113.2, 100.1)
    r["markers"].append({"marker": "confirmed", "window": 18})
    out.append(copy.deepcopy(r))
    r["change"] = "action"
    hist = [
        {"status": "recommended", "window": 20, "time": t(20)},
        {"status": "applied", "window": 23, "time": t(23)},
    ]
    r["actions"] = [
        {
            "plan": "p-2-20",
            "status": "applied",
            "history": list(hist),
            "throughput_before": 310.2,
            "throughput_after": None,
            "gain_pct": None,
        }
    ]
    r["markers"].append({"marker": "applied", "window": 23})
    out.append(copy.deepcopy(r))
    hist.append({"status": "verified", "window": 28, "time": t(28)})
    r["actions"] = [
        {
            "plan": "p-2-20",
            "status": "verified",
            "history": hist,
            "throughput_before": 310.2,
            "throughput_after": 341.0,
            "gain_pct": 9.9,
        }
    ]
    r["markers"].append({"marker": "verified", "window": 28})
    out.append(copy.deepcopy(r))
    r["change"] = "closed"
    r["status"] = "closed"
    r["closed"] = {"window": 60, "time": t(60), "why": "job_end"}
    r["cost"] = {"excess_ms": 4.1, "loss_pct": 3.0, "gpu_hours": 0.011, "gpu_hours_per_day": 2.6}
    r["evidence"]["windows"] = 42
    r["verdict"] = "mitigated"
    r["reason"] = "plan p-2-20 in force: throughput 310.2 -> 341.0 samples/s (+9.9%)"
    out.append(copy.deepcopy(r))
    return out


def dismissed(job: str = "stalls-sim") -> dict[str, Any]:
    """An incident that cleared before it was confirmed."""
    reason = "its lower quartile stayed under the peers' median: a few long stalls"
    about = about_rank(job, "beef", 5, "nvidia", "node-b", 9)
    return dismissed_record(
        about, (9, 13), t, (evidence(4, 104.0, 100.0, 1.04), cost(0.4, 0.4, 0.0001, 0.3), reason)
    )


def job_rows(job: str, lo: int, hi: int) -> list[dict[str, Any]]:
    return [
        {
            "job": job,
            "window": w,
            "time": t(w),
            "step_ms": 100.0 + w,
            "samples_per_s": 320.0 - w,
            "ratio_p10": 0.98,
            "ratio_p50": 1.0,
            "ratio_p90": 1.02 + w / 1000,
        }
        for w in range(lo, hi)
    ]


def incident_rows(incident: str, lo: int, hi: int) -> list[dict[str, Any]]:
    return [
        {
            "incident": incident,
            "window": w,
            "time": t(w),
            "ratio": 1.15 + w / 1000,
            "gap_ms": 115.0 + w,
            "peers_gap_ms": 100.0,
        }
        for w in range(lo, hi)
    ]
