"""artemis.rebalance: opt-in rebalancing, in one room (rules in rebalance/README.md).

    split    the maths: uniform and proportional splits, bounds, a rank's slice
    state    one plan's life: PlanState, the transition table, Plan
    settings PolicySettings, its bounds (msgspec.Meta on each knob; BOUNDS read from them)
    events   PlanEvent: one line of the plans file
    history  the windows the policy remembers, per-rank arrays and speeds
    verify   the verification rule (did the plan help?)
    snapshot the policy's state as plain data
    policy   RebalancePolicy: the rules, pure
    files    the plan and ack files on a node: names, format, atomic writes, readers
    outputs  the plans JSONL writer and the plan metrics

The policy API is importable from here (``from artemis.rebalance import
RebalancePolicy``). Names load on first use, so a training script that imports
``artemis.job`` (which needs only ``split`` and ``files``) never loads the policy
or prometheus_client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .events import PlanEvent
    from .files import PlanFormatError
    from .outputs import PlansWriter
    from .policy import RebalancePolicy
    from .settings import BOUNDS, MODES, PolicySettings, bound_problem
    from .split import proportional_split, rank_slice, split_bounds, uniform_split
    from .state import TRANSITIONS, IllegalTransition, Plan, PlanState

_WHERE = {
    "PlanFormatError": "files",
    "PlansWriter": "outputs",
    "BOUNDS": "settings",
    "MODES": "settings",
    "PlanEvent": "events",
    "PolicySettings": "settings",
    "RebalancePolicy": "policy",
    "bound_problem": "settings",
    "proportional_split": "split",
    "rank_slice": "split",
    "split_bounds": "split",
    "uniform_split": "split",
    "TRANSITIONS": "state",
    "IllegalTransition": "state",
    "Plan": "state",
    "PlanState": "state",
}

__all__ = [
    "BOUNDS",
    "MODES",
    "TRANSITIONS",
    "IllegalTransition",
    "Plan",
    "PlanEvent",
    "PlanFormatError",
    "PlanState",
    "PlansWriter",
    "PolicySettings",
    "RebalancePolicy",
    "bound_problem",
    "proportional_split",
    "rank_slice",
    "split_bounds",
    "uniform_split",
]


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'artemis.rebalance' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{mod}", __name__), name)
