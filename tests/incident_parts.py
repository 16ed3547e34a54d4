"""The parts of an incident record (docs/DESIGN.md "Incidents (coordinator -> world)")
that the tests' fixtures (tests/store_records.py, tests/report_data.py) build alike:
whom a rank incident is about, its evidence, its cost, and a cause nothing explains.
Each part is written out once here, in the record's key order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The cause of an incident no telemetry explains.
UNEXPLAINED: dict[str, Any] = {
    "kind": "unknown",
    "text": "no telemetry explains it",
    "evidence": {},
    "explained": None,
    "alternatives": [],
}


def about_rank(
    job: str, run: str, rank: int, island: str, host: str, opened: int
) -> dict[str, Any]:
    """A rank incident's first keys: its id (rank and opening window), job, run and subject."""
    return {
        "id": f"{job}-r{rank}-w{opened}",
        "job": job,
        "run": run,
        "kind": "rank",
        "subject": str(rank),
        "rank": rank,
        "ranks": [rank],
        "island": island,
        "hosts": [host],
    }


def evidence(
    windows: int, gap_ms: float, peers_gap_ms: float, ratio: float, **telemetry: tuple[float, float]
) -> dict[str, Any]:
    """An incident's evidence; ``telemetry``: metric=(the rank's value, its peers')."""
    return {
        "windows": windows,
        "gap_ms": gap_ms,
        "peers_gap_ms": peers_gap_ms,
        "ratio": ratio,
        "telemetry": {k: {"rank": r, "peers": p} for k, (r, p) in telemetry.items()},
    }


def cost(excess_ms: float, loss_pct: float, gpu_hours: float, per_day: float) -> dict[str, float]:
    return {
        "excess_ms": excess_ms,
        "loss_pct": loss_pct,
        "gpu_hours": gpu_hours,
        "gpu_hours_per_day": per_day,
    }


def markers(**windows: int) -> list[dict[str, Any]]:
    """An incident's markers, in the order given: marker name = its window."""
    return [{"marker": m, "window": w} for m, w in windows.items()]


def confirmed_by_q1(
    window: int, time: float, q1_ms: float, peers_median_ms: float
) -> dict[str, Any]:
    """An incident's ``confirmed``: its gap's lower quartile above the peers' median."""
    return {
        "window": window,
        "time": time,
        "rule": "q1>peers_median",
        "q1_ms": q1_ms,
        "peers_median_ms": peers_median_ms,
    }


def dismissed_record(
    about: dict[str, Any],
    span: tuple[int, int],
    t: Callable[[int], float],
    parts: tuple[dict[str, Any], dict[str, Any], str],
    onset: int | None = None,
) -> dict[str, Any]:
    """A rank incident flagged at ``span[0]`` that cleared at ``span[1]`` before it was
    confirmed, nothing explaining it: ``parts`` are its evidence, cost and reason;
    ``onset``, the window its onset marker names, if it has one."""
    opened, cleared = span
    ev, cost_, reason = parts
    onset_marker = [] if onset is None else markers(onset=onset)
    return {
        **about,
        "change": "closed",
        "status": "closed",
        "opened": {"window": opened, "time": t(opened)},
        "confirmed": None,
        "closed": {"window": cleared, "time": t(cleared), "why": "cleared"},
        "cause": UNEXPLAINED,
        "evidence": ev,
        "cost": cost_,
        "actions": [],
        "escalation": None,
        "verdict": "dismissed",
        "reason": reason,
        "markers": [*onset_marker, *markers(flagged=opened, cleared=cleared)],
    }
