"""One change of a plan's status, as the plans file and the control channel carry it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STATUSES = ("recommended", "applied", "verified", "rolled_back")


@dataclass(slots=True)
class PlanEvent:
    """One change of a plan's status: one line of the plans file (DESIGN "Rebalance plans")."""

    id: str
    window: int
    rank: int  # the slow rank the plan works around
    finding: dict[str, Any] | None  # the finding that triggered it
    speeds: list[float]  # measured per-sample speed per rank, samples/s of compute
    before: list[int]  # samples per rank before the plan
    after: list[int]  # samples per rank under the plan (same sum as before)
    apply_at_step: int | None  # the step at which every rank switches (None: not sent)
    status: str  # recommended | applied | verified | rolled_back
    throughput_before: float | None = None  # samples/s measured before the plan
    throughput_after: float | None = None  # samples/s measured under the plan
    reason: str = ""
    escalate: bool = False  # the plan failed: the coordinator logs it at WARNING
    job: str = ""  # the job the plan is for (added key; the seed keys stay)
    # What the agents must publish to the job now (control action "plan"), if anything.
    # Not part of the plans file: it is an instruction, the line above is the record.
    control: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plans-file line (rounded for reading; ``to_state`` keeps the exact values)."""
        return {
            "id": self.id,
            "window": self.window,
            "rank": self.rank,
            "finding": self.finding,
            "speeds": [round(s, 3) for s in self.speeds],
            "before": list(self.before),
            "after": list(self.after),
            "apply_at_step": self.apply_at_step,
            "status": self.status,
            "throughput_before": _r(self.throughput_before),
            "throughput_after": _r(self.throughput_after),
            "reason": self.reason,
            "escalate": self.escalate,
            "job": self.job,
        }

    def to_state(self) -> dict[str, Any]:
        """Every field exactly (floats survive JSON), control excluded: for snapshots."""
        d = dataclasses.asdict(self)
        d.pop("control")
        return d

    @classmethod
    def from_state(cls, d: Mapping[str, Any]) -> PlanEvent:
        return cls(**{k: v for k, v in d.items() if k != "control"})


def plan_control(plan_id: str, split: Sequence[int], apply_at_step: int) -> dict[str, Any]:
    """The control (action "plan") the agents publish to the job: every rank switches
    to ``split`` at ``apply_at_step``."""
    return {
        "action": "plan",
        "id": plan_id,
        "apply_at_step": int(apply_at_step),
        "samples": [int(n) for n in split],
        "global_batch": int(sum(split)),
    }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
