"""The rebalance policy's whole state as plain data, and back (format version 1).

Kept apart from the rules so the format is read in one place: an applied plan
stays in force and is still verified after a coordinator restart, and a saved
state from an older coordinator restores as long as the version matches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .events import PlanEvent
from .history import Window
from .settings import PolicySettings
from .state import Plan

if TYPE_CHECKING:
    from .policy import RebalancePolicy

SNAPSHOT_VERSION = 1


def dump(pol: RebalancePolicy, binary: bool = False) -> dict[str, Any]:
    """``pol``'s state: JSON-able, or with raw ``bytes`` arrays when ``binary`` (msgpack)."""
    return {
        "version": SNAPSHOT_VERSION,
        "job": pol.job,
        "settings": pol.settings.to_json(),
        "nranks": pol.nranks,
        "global_batch": pol.global_batch,
        "global_batch_learned": pol._gb_learned,
        "split": pol.split,
        "history": [w.to_json(binary) for w in pol._history],
        "healthy": list(pol._healthy),
        "plans": [{**p.to_json(), "event": p.event.to_state()} for p in pol._plans],
        "blocked": {str(r): w for r, w in sorted(pol._blocked.items())},
        "rollbacks": {str(r): n for r, n in sorted(pol._rollbacks.items())},
        "last_change": pol._last_change,
        "now": pol._now,
        "seq": pol._seq,
    }


def load(
    cls: type[RebalancePolicy], state: Mapping[str, Any], settings: PolicySettings | None
) -> RebalancePolicy:
    """A policy of class ``cls`` carrying on from ``state``; ``settings`` replace the
    saved knobs but not the saved mode."""
    if state.get("version") != SNAPSHOT_VERSION:
        raise ValueError(
            f"rebalance snapshot version {state.get('version')!r}, expected {SNAPSHOT_VERSION}"
        )
    saved = PolicySettings(**state["settings"])
    use = saved if settings is None else dataclasses.replace(settings, mode=saved.mode)
    pol = cls(use, int(state["nranks"]), state["global_batch"], job=str(state["job"]))
    pol._gb_learned = bool(state["global_batch_learned"])
    pol._split = None if state["split"] is None else [int(x) for x in state["split"]]
    pol._history.extend(Window.from_json(w) for w in state["history"])
    pol._healthy.extend(float(x) for x in state["healthy"])
    pol._plans = [Plan.from_json(d, PlanEvent.from_state(d["event"])) for d in state["plans"]]
    pol._blocked = {int(r): int(w) for r, w in state["blocked"].items()}
    pol._rollbacks = {int(r): int(n) for r, n in state["rollbacks"].items()}
    pol._last_change = state["last_change"]
    pol._now = int(state["now"])
    pol._seq = int(state["seq"])
    return pol
