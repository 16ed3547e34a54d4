"""Which correction fits an incident, and whether one helped: pure rules of the book.

``fit`` reads an incident's cause (and the rank's power limits) and names the
action that can put its setting back: cause ``clocks`` -> reset_clocks; cause
``power`` with the enforced limit below the default -> restore_power_limit;
``thermal`` never. ``verdict_of`` judges a correction as plans are judged
(rebalance/verify.py). Split from rebalance/corrections.py (the book and its
life of a correction) to keep each module one thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .settings import PolicySettings
from .verify import verdict

POWER_SLACK = 0.01  # an enforced limit this close to the default is the default


@dataclass(frozen=True)
class RankFacts:
    """What the shell knows of a rank: where it runs and what its agent speaks."""

    host: str | None = None
    gpu: int | None = None
    version: tuple[int, int] | None = None  # None: no agent of it connected now
    power_limit_w: float | None = None
    power_limit_default_w: float | None = None


def fit(rec: Mapping[str, Any], facts: RankFacts | None = None) -> tuple[str | None, str]:
    """(the action that fits the incident's cause, or None; why in words)."""
    if rec.get("confirmed") is None:
        return None, "not confirmed"
    if rec.get("rank") is None:
        return None, f"a {rec.get('kind')} incident has no one GPU to correct"
    cause = rec.get("cause") or {}
    kind = cause.get("kind")
    if kind == "clocks":
        throttle = (cause.get("evidence") or {}).get("throttle") or {}
        if throttle:
            return None, f"clocks low with throttle reasons {sorted(throttle)}: not locked clocks"
        return "reset_clocks", "clocks below their maximum with no throttle reason"
    if kind == "power":
        limit = facts.power_limit_w if facts else None
        default = facts.power_limit_default_w if facts else None
        if limit is None or default is None:
            return None, "the node reports no default power limit: a lowered limit is not told"
        if limit >= default * (1.0 - POWER_SLACK):
            return None, (
                f"power limit {limit:.0f} W is the default ({default:.0f} W): the GPU draws "
                "near its limit, nothing to restore"
            )
        return "restore_power_limit", f"power limit {limit:.0f} W below its default {default:.0f} W"
    if kind == "thermal":
        return None, "thermal: heat is not a setting Artemis can correct"
    return None, f"no correction fits cause {kind!r}"


def verdict_of(
    pace_before: float | None, thr_before: float | None, pace: float, thr: float
) -> tuple[bool, str]:
    """The rank's pace and the job's throughput after against before (as plans are
    verified: rebalance/verify.py): the pace must win back half its excess over its
    peers (pace 1.0), and the throughput must not fall."""
    s = PolicySettings()
    ok_thr, moved = verdict(s, thr_before, thr, None, restore=False)
    kept, _ = verdict(s, thr_before, thr, None, restore=True)
    pb = pace_before
    pace_ok = pb is not None and pb > 1.0 and (pace - 1.0) <= s.verify_recover_frac * (pb - 1.0)
    words = f"pace {_r(pb)} -> {pace:.3f}, {moved}"
    return (pace_ok and kept) or (ok_thr and pb is None), words


def _r(v: float | None) -> str:
    return "?" if v is None else f"{v:.3f}"
