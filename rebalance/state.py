"""The life of one plan: a state enum, the one transition table, and the plan record.

A plan's state is one ``PlanState`` plus the history of how it got there; a
transition the table does not list raises ``IllegalTransition``, so a policy bug
cannot, say, verify a plan nobody applied. The plans file speaks in four statuses
(docs/DESIGN.md "Rebalance plans"); ``STATUS_OF`` maps each state to the status
its event carries.

    (new) ─> RECOMMENDED ─────────────────────────────────────────> ENDED
      └────> SENT ──(every rank acks)──> APPLIED ──(verify)──> VERIFIED ──> ENDED
              │  └──(no ack in time)──> WITHDRAWN      │              │
              └──────────────────────────> ROLLED_BACK <──────────────┘

RECOMMENDED is advice in ``recommend`` mode (never sent); ENDED is a plan that
stopped being in force without an event of its own (a newer plan replaced it,
a restore made the split uniform again, the fault it advised on cleared).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class PlanState(str, enum.Enum):
    RECOMMENDED = "recommended"  # recommend mode: written to the plans file, not sent
    SENT = "sent"  # sent to the job, waiting for every rank's ack
    APPLIED = "applied"  # every rank switched; being verified
    VERIFIED = "verified"  # helped (or, a restore, did not hurt): in force
    ROLLED_BACK = "rolled_back"  # undone: did not help, or the policy had to undo it
    WITHDRAWN = "withdrawn"  # not acknowledged in time: the previous split republished
    ENDED = "ended"  # no longer in force, replaced or made moot


INITIAL: frozenset[PlanState] = frozenset({PlanState.RECOMMENDED, PlanState.SENT})

TRANSITIONS: dict[PlanState, frozenset[PlanState]] = {
    PlanState.RECOMMENDED: frozenset({PlanState.ENDED}),
    PlanState.SENT: frozenset({PlanState.APPLIED, PlanState.WITHDRAWN, PlanState.ROLLED_BACK}),
    PlanState.APPLIED: frozenset({PlanState.VERIFIED, PlanState.ROLLED_BACK}),
    PlanState.VERIFIED: frozenset({PlanState.ENDED, PlanState.ROLLED_BACK}),
    PlanState.ROLLED_BACK: frozenset(),
    PlanState.WITHDRAWN: frozenset(),
    PlanState.ENDED: frozenset(),
}

TERMINAL: frozenset[PlanState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)

# The status a plans-file line carries for a plan entering each state. A withdrawn
# plan stays "recommended" (DESIGN: nothing was applied, so nothing may claim more);
# ENDED writes no line.
STATUS_OF: dict[PlanState, str | None] = {
    PlanState.RECOMMENDED: "recommended",
    PlanState.SENT: "recommended",
    PlanState.APPLIED: "applied",
    PlanState.VERIFIED: "verified",
    PlanState.ROLLED_BACK: "rolled_back",
    PlanState.WITHDRAWN: "recommended",
    PlanState.ENDED: None,
}


def status_of(state: PlanState) -> str:
    """The status of the plans-file line a plan entering ``state`` writes."""
    st = STATUS_OF[state]
    if st is None:
        raise ValueError(f"a plan entering {state.value} writes no plans-file line")
    return st


class IllegalTransition(RuntimeError):
    """A plan was asked to move to a state the transition table does not allow."""


@dataclass(slots=True)
class Plan:
    """One plan: its state, how it got there, and what the policy follows it by.

    ``history`` is (state, window) for every state it entered, in order. ``event``
    is the latest line written for it (a ``PlanEvent``, kept as ``Any`` so this
    module has no policy import). ``acks`` maps rank -> step it switched at.
    """

    id: str
    state: PlanState
    event: Any
    restore: bool = False  # this plan restores the uniform split
    acks: dict[int, int] = field(default_factory=dict)
    restore_failed: bool = False  # in force, and restoring uniform from it lost throughput
    history: list[tuple[PlanState, int]] = field(default_factory=list)

    @classmethod
    def new(cls, state: PlanState, window: int, event: Any, *, restore: bool = False) -> Plan:
        if state not in INITIAL:
            raise IllegalTransition(f"a plan starts as one of {sorted(INITIAL)}, not {state}")
        return cls(
            id=event.id, state=state, event=event, restore=restore, history=[(state, window)]
        )

    def move(self, to: PlanState, window: int) -> None:
        """Enter ``to`` at ``window``; raises ``IllegalTransition`` if the table forbids it."""
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransition(
                f"plan {self.id}: {self.state.value} -> {to.value} is not a legal transition "
                f"(from {self.state.value}: {sorted(s.value for s in TRANSITIONS[self.state])})"
            )
        self.state = to
        self.history.append((to, window))

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state.value,
            "restore": self.restore,
            "acks": {str(r): s for r, s in sorted(self.acks.items())},
            "restore_failed": self.restore_failed,
            "history": [[s.value, w] for s, w in self.history],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], event: Any) -> Plan:
        return cls(
            id=str(d["id"]),
            state=PlanState(d["state"]),
            event=event,
            restore=bool(d["restore"]),
            acks={int(r): int(s) for r, s in d["acks"].items()},
            restore_failed=bool(d["restore_failed"]),
            history=[(PlanState(s), int(w)) for s, w in d["history"]],
        )
