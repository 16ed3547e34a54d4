"""A job's incident data in the shapes of docs/DESIGN.md "Incidents (coordinator -> world)".

For the report's tests (tests/test_report*.py): a rank slowed by locked clocks and
rebalanced (mitigated), a host-side slowdown that cleared (recovered) and a stall
burst that was never confirmed (dismissed). Every number follows from a small model
of the job (step time, peers' spread), so the plots have something real to show.
"""

from __future__ import annotations

import math
from typing import Any

from incident_parts import about_rank, confirmed_by_q1, cost, dismissed_record, evidence, markers

T0 = 1764584400.0  # 2025-12-01 10:20 UTC


def _noise(i: int, k: int) -> float:
    """Deterministic noise in [-1, 1]."""
    return math.sin(i * 12.9898 + k * 78.233) * 0.5 + math.sin(i * 3.1 + k * 1.7) * 0.5


def contract_bundle(
    windows: int = 60, ranks: int = 8, window_s: float = 5.0, job: str = "flagship-sim"
) -> dict[str, Any]:
    base_ms, batch = 100.0, 256
    # (rank, first slow window, last slow window, slowdown): the ground truth.
    faults = [(2, 16, windows, 0.15), (6, 34, 41, 0.08), (5, 44, 46, 0.12)]
    mitigation_from = 23  # the plan moves samples off rank 2: it waits less

    def slow(rank: int, w: int) -> float:
        s = 0.0
        for r, a, b, x in faults:
            if r == rank and a <= w <= b:
                s = x
        if rank == 2 and w >= mitigation_from:
            s *= 0.35
        return s

    rows = []
    for w in range(windows):
        worst = max(slow(r, w) for r in range(ranks))
        step = base_ms * (1 + worst) * (1 + 0.004 * _noise(w, 1))
        spread = 0.012 + 0.003 * abs(_noise(w, 2))
        rows.append(
            {
                "job": job,
                "run": "c0ffee12",
                "window": w,
                "time": T0 + (w + 1) * window_s,
                "step_ms": round(step, 3),
                "samples_per_s": round(batch / (step / 1000.0), 2),
                "ratio_p10": round(1 - spread, 4),
                "ratio_p50": round(1 + 0.002 * _noise(w, 3), 4),
                "ratio_p90": round(1 + spread, 4),
            }
        )

    def t(w: int) -> float:
        return T0 + (w + 1) * window_s

    def subject_rows(iid: str, rank: int, lo: int, hi: int) -> list[dict[str, Any]]:
        out = []
        for w in range(lo, hi + 1):
            # The ratio is the rank's gap over its peers' median: the plan does not make the
            # GPU faster, it gives it less to do, so the per-sample pace stays slow.
            ratio = 1 + (
                slow(rank, w) / 0.35 if rank == 2 and w >= mitigation_from else slow(rank, w)
            )
            ratio *= 1 + 0.01 * _noise(w, rank)
            peers = 62.0 * (1 + 0.003 * _noise(w, 9))
            out.append(
                {
                    "incident": iid,
                    "window": w,
                    "time": t(w),
                    "ratio": round(ratio, 4),
                    "gap_ms": round(peers * ratio, 3),
                    "peers_gap_ms": round(peers, 3),
                }
            )
        return out

    i1 = f"{job}-r2-w18"
    i2 = f"{job}-r6-w36"
    i3 = f"{job}-r5-w46"
    last = windows - 1
    # the rank's telemetry against its peers' (rank, peers)
    telemetry = {
        "sm_mhz": (1694.0, 1978.0),
        "temp_c": (61.0, 63.2),
        "power_frac": (0.48, 0.71),
        "pcie_degraded": (0.0, 0.0),
    }
    inc1: dict[str, Any] = {
        **about_rank(job, "c0ffee12", 2, "nvidia", "node-a", 18),
        "change": "closed",
        "status": "closed",
        "opened": {"window": 18, "time": t(18)},
        "confirmed": confirmed_by_q1(18, t(18), 70.4, 62.1),
        "closed": {"window": last, "time": t(last), "why": "job_end"},
        "cause": {
            "kind": "clocks",
            "text": "clocks low (SM 1694 MHz vs 1978 MHz on its peers), no throttle reason: "
            "locked clocks or a misconfigured GPU",
            "evidence": {"sm_mhz": 1694, "peers_sm_mhz": 1978},
            "explained": 0.93,
            "alternatives": [],
        },
        "evidence": evidence(last - 18 + 1, 71.3, 62.0, 1.15, **telemetry),
        "cost": cost(9.3, 8.5, 0.0041, 1.63),
        "actions": [
            {
                "plan": "p1-w20-r2",
                "status": "verified",
                "history": [
                    {"status": "recommended", "window": 20, "time": t(20)},
                    {"status": "applied", "window": 23, "time": t(23)},
                    {"status": "verified", "window": 28, "time": t(28)},
                ],
                "throughput_before": 2226.1,
                "throughput_after": 2433.9,
                "gain_pct": 9.3,
            }
        ],
        "escalation": {
            "cause": "clocks",
            "check": "rank 2 on node-a runs its SM clock at 1694 MHz against 1978 MHz "
            "on its peers with no throttle reason: check whether application "
            "clocks are locked (nvidia-smi -q -d CLOCK) and reset them "
            "(nvidia-smi -rgc)",
        },
        "verdict": "mitigated",
        "reason": "plan p1-w20-r2 in force, throughput +9.3% measured",
        "markers": markers(onset=16, flagged=18, confirmed=18, applied=23, verified=28),
    }
    inc2: dict[str, Any] = {
        **about_rank(job, "c0ffee12", 6, "amd", "node-b", 36),
        "change": "closed",
        "status": "closed",
        "opened": {"window": 36, "time": t(36)},
        "confirmed": confirmed_by_q1(37, t(37), 65.9, 62.0),
        "closed": {"window": 42, "time": t(42), "why": "cleared"},
        "cause": {
            "kind": "host",
            "text": "host CPU busy 97% against 41% on its peers: a noisy neighbour or the "
            "data loader",
            "evidence": {},
            "explained": None,
            "alternatives": [{"kind": "thermal", "text": "slightly warmer", "explained": 0.1}],
        },
        "evidence": evidence(
            7, 66.9, 62.0, 1.08, cpu_pct=(97.0, 41.0), sm_mhz=(1975.0, 1978.0), temp_c=(66.0, 63.0)
        ),
        "cost": cost(4.9, 4.6, 0.0004, 0.88),
        "actions": [],
        "escalation": {
            "cause": "host",
            "check": "node-b: find the process competing with rank 6 for CPU "
            "(97% busy against 41% on its peers), or the data loader's "
            "workers",
        },
        "verdict": "recovered",
        "reason": "cleared at window 42; step time back to 100.2 ms",
        "markers": markers(onset=34, flagged=36, confirmed=37, cleared=42),
    }
    reason = "a few long stalls: its lower quartile stayed at the peers' median"
    parts = (evidence(3, 69.0, 62.0, 1.11), cost(6.8, 6.3, 0.0001, 1.2), reason)
    about = about_rank(job, "c0ffee12", 5, "amd", "node-b", 46)
    inc3 = dismissed_record(about, (46, 48), t, parts, onset=44)
    subjects = {
        i1: subject_rows(i1, 2, 18, last),
        i2: subject_rows(i2, 6, 36, 42),
        i3: subject_rows(i3, 5, 46, 48),
    }
    return {
        "job": {
            "job": job,
            "run": "c0ffee12",
            "ranks": ranks,
            "hosts": 2,
            "islands": {"nvidia": ranks // 2, "amd": ranks - ranks // 2},
        },
        "incidents": [inc1, inc2, inc3],
        "windows": rows,
        "subjects": subjects,
        "source": "tests/report_data.py",
        "generated": T0 + windows * window_s + 1,
    }


def drawn_bars(inc: dict[str, Any]) -> set[str]:
    """The telemetry bars a record should get: metrics at least 0.5% from the peers,
    but no percentage under one point on both sides (near zero on its scale)."""
    return {
        k
        for k, v in inc["evidence"]["telemetry"].items()
        if v["peers"] != 0
        and abs(v["rank"] / v["peers"] - 1) >= 0.005
        and not (k.endswith("_pct") and abs(v["rank"]) < 1 and abs(v["peers"]) < 1)
    }


def cpu_bundle(batch: int = 5) -> dict[str, Any]:
    """The same job run on CPU ranks (issue 31, item 9): its incidents' hours are CPU
    rank-hours (`cost.unit` cpu), no global batch is known (no samples/s), its evidence
    is host telemetry (a 0.03% vs 0.04% steal among it), and its windows reach the
    coordinator in batches: the first `batch` windows are scored together, at the
    time of the last of them, as when an agent attaches and reads its backlog."""
    b = contract_bundle(job="cpu-job")
    b["job"]["window_steps"] = 50  # 100 ms steps in 5 s windows
    first = b["windows"][batch - 1]["time"]
    for i, r in enumerate(b["windows"]):
        r["samples_per_s"] = None
        if i < batch:
            r["time"] = first
    for inc in b["incidents"]:
        inc["cost"]["unit"] = "cpu"
        inc["island"] = None
    b["incidents"][0]["evidence"]["telemetry"] = {
        "steal_pct": {"rank": 0.03, "peers": 0.04},
        "cpu_pct": {"rank": 61.0, "peers": 40.0},
        "gap_busy_pct": {"rank": 55.0, "peers": 94.0},
    }
    return b
