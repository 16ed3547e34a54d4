"""Incident records and per-window rows in the shapes of docs/DESIGN.md "Incidents
(coordinator -> world)", for the store's and `artemis incidents`' tests."""

from __future__ import annotations

import copy
from typing import Any

T0 = 1764584400.0  # unix s of window 0
WINDOW_S = 5.0


def t(window: int) -> float:
    return T0 + window * WINDOW_S


def flagship(job: str = "flagship-sim") -> list[dict[str, Any]]:
    """The changes of one incident, in order: opened, confirmed, action (applied,
    then verified), closed as mitigated. Each is the whole record."""
    base: dict[str, Any] = {
        "id": f"{job}-r2-w18",
        "job": job,
        "run": "c0ffee",
        "kind": "rank",
        "subject": "2",
        "rank": 2,
        "ranks": [2],
        "island": "nvidia",
        "hosts": ["node-a"],
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
        "evidence": {
            "windows": 3,
            "gap_ms": 115.1,
            "peers_gap_ms": 100.0,
            "ratio": 1.151,
            "telemetry": {
                "sm_mhz": {"rank": 1694.0, "peers": 1978.0},
                "temp_c": {"rank": 61.0, "peers": 63.0},
                "power_frac": {"rank": 0.48, "peers": 0.71},
            },
        },
        "cost": {"excess_ms": 15.0, "loss_pct": 11.7, "gpu_hours": 0.004, "gpu_hours_per_day": 9.6},
        "actions": [],
        "escalation": {
            "cause": "clocks",
            "check": "rank 2 on node-a runs SM 1694 MHz against 1978 MHz on its peers:"
            " are application clocks locked? nvidia-smi -q -d CLOCK; reset with nvidia-smi -rgc",
        },
        "verdict": None,
        "reason": "",
        "markers": [{"marker": "onset", "window": 16}, {"marker": "flagged", "window": 18}],
    }
    out = [copy.deepcopy(base)]
    r = copy.deepcopy(base)
    r["change"] = "confirmed"
    r["confirmed"] = {
        "window": 18,
        "time": t(18),
        "rule": "q1>peers_median",
        "q1_ms": 113.2,
        "peers_median_ms": 100.1,
    }
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
    return {
        "id": f"{job}-r5-w9",
        "job": job,
        "run": "beef",
        "kind": "rank",
        "subject": "5",
        "rank": 5,
        "ranks": [5],
        "island": "nvidia",
        "hosts": ["node-b"],
        "change": "closed",
        "status": "closed",
        "opened": {"window": 9, "time": t(9)},
        "confirmed": None,
        "closed": {"window": 13, "time": t(13), "why": "cleared"},
        "cause": {
            "kind": "unknown",
            "text": "no telemetry explains it",
            "evidence": {},
            "explained": None,
            "alternatives": [],
        },
        "evidence": {
            "windows": 4,
            "gap_ms": 104.0,
            "peers_gap_ms": 100.0,
            "ratio": 1.04,
            "telemetry": {},
        },
        "cost": {"excess_ms": 0.4, "loss_pct": 0.4, "gpu_hours": 0.0001, "gpu_hours_per_day": 0.3},
        "actions": [],
        "escalation": None,
        "verdict": "dismissed",
        "reason": "its lower quartile stayed under the peers' median: a few long stalls",
        "markers": [{"marker": "flagged", "window": 9}, {"marker": "cleared", "window": 13}],
    }


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
