"""The life of one incident: a state enum, the one transition table, and the incident itself.

An incident's state follows from its record (``confirmed``, ``closed``, ``verdict``),
so saved books restore as they are; ``Incident.move`` is the only way to change
it, and an event the table does not list for the current state raises
``IllegalTransition`` (a rule bug cannot, say, confirm a closed incident).

    (flag) ─> OPEN ──(confirm)──> CONFIRMED ──(cleared)──> CLOSED     recovered
               │                      └───────(job_end)──> CLOSED     mitigated,
               │                                                      escalated or
               │                                                      unresolved
               └──(dismissed, cleared or job_end)──> DISMISSED        dismissed

``dismissed`` is the confirm test failing for ``flag_window`` windows while the
finding goes on; ``cleared`` and ``job_end`` before a confirmation dismiss too
(detect/DETECTOR.md "Incidents: confirm before acting").
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

MARKERS = ("onset", "flagged", "confirmed", "applied", "verified", "rolled_back", "cleared")


class IncidentState(str, enum.Enum):
    OPEN = "open"  # flagged, waiting for the confirm test
    CONFIRMED = "confirmed"  # the policy may act on it
    CLOSED = "closed"  # confirmed, then cleared or the job ended
    DISMISSED = "dismissed"  # closed without a confirmation


S = IncidentState
# (state, event) -> the state the event moves the incident to; nothing else moves it.
STEP: dict[tuple[IncidentState, str], IncidentState] = {
    (S.OPEN, "confirm"): S.CONFIRMED,
    (S.OPEN, "dismissed"): S.DISMISSED,
    (S.OPEN, "cleared"): S.DISMISSED,
    (S.OPEN, "job_end"): S.DISMISSED,
    (S.CONFIRMED, "cleared"): S.CLOSED,
    (S.CONFIRMED, "job_end"): S.CLOSED,
}
TRANSITIONS: dict[IncidentState, frozenset[IncidentState]] = {
    s: frozenset(to for (src, _), to in STEP.items() if src is s) for s in IncidentState
}
TERMINAL: frozenset[IncidentState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)


class IllegalTransition(RuntimeError):
    """An incident was asked to take an event its state does not allow."""


def num(v: Any) -> float | None:
    """A finite number from evidence, else None (bools and text are not numbers)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    x = float(v)
    return x if math.isfinite(x) else None


def rnd(v: float | None, digits: int = 3) -> float | None:
    """Rounded for the record; None for absent or not finite."""
    return None if v is None or not math.isfinite(v) else round(v, digits)


class Mean:
    """A running mean that ignores absent values."""

    __slots__ = ("n", "total")

    def __init__(self, total: float = 0.0, n: int = 0) -> None:
        self.total, self.n = total, n

    def add(self, v: float | None) -> None:
        if v is not None and math.isfinite(v):
            self.total += v
            self.n += 1

    @property
    def value(self) -> float | None:
        return self.total / self.n if self.n else None


@dataclass
class Incident:
    """One episode of a finding, from its flag to its close, and what it has seen."""

    id: str
    kind: str
    subject: str
    rank: int | None
    ranks: list[int]
    island: str | None
    hosts: list[str]
    opened: dict[str, Any]
    since: int | None
    confirmed: dict[str, Any] | None = None
    closed: dict[str, Any] | None = None
    cause: dict[str, Any] | None = None
    finding_evidence: dict[str, Any] | None = None
    means: dict[str, Mean] = field(default_factory=dict)
    windows: int = 0
    gpu_hours: float | None = None
    actions: dict[str, dict[str, Any]] = field(default_factory=dict)
    markers: list[dict[str, Any]] = field(default_factory=list)
    wait_left: int = 0
    last_check: dict[str, Any] | None = None  # the latest confirm test that failed
    checks: list[bool] = field(default_factory=list)  # the confirm test, window by window
    verdict: str | None = None
    reason: str = ""
    recovery: dict[str, Any] | None = None
    changes: list[str] = field(default_factory=list)  # since the last record out

    @property
    def state(self) -> IncidentState:
        if self.closed is None:
            return S.OPEN if self.confirmed is None else S.CONFIRMED
        return S.DISMISSED if self.verdict == "dismissed" else S.CLOSED

    def move(self, event: str, window: int, time: float | None, **how: Any) -> IncidentState:
        """Take ``event`` (the table's) at ``window``: confirm, or close with ``event`` as
        the why; a dismissal sets its verdict (the book judges the others)."""
        to = STEP.get((self.state, event))
        if to is None:
            raise IllegalTransition(f"incident {self.id}: {event} in state {self.state.value}")
        if to is S.CONFIRMED:
            self.confirmed = {"window": window, "time": time, **how}
        else:
            self.closed = {"window": window, "time": time, "why": event}
            if to is S.DISMISSED:
                self.verdict = "dismissed"
        return to

    def mean(self, name: str) -> float | None:
        m = self.means.get(name)
        return None if m is None else m.value

    def add(self, name: str, v: float | None) -> None:
        self.means.setdefault(name, Mean()).add(v)

    def mark(self, marker: str, window: int | None, time: float | None) -> None:
        if window is None:
            return
        self.markers.append({"marker": marker, "window": int(window), "time": time})
        self.markers.sort(key=lambda m: (m["window"], MARKERS.index(m["marker"])))

    def change(self, what: str) -> None:
        if what not in self.changes:
            self.changes.append(what)

    @property
    def key(self) -> tuple[str, str]:
        return episode_key(self.kind, self.subject)


def episode_key(kind: str, subject: str) -> tuple[str, str]:
    """The book's key of an episode. One hang and one missing-ranks episode at a time per
    job: their subject (the ranks) changes while they last."""
    return (kind, "" if kind in ("hang", "missing") else subject)


# The fields a snapshot keeps of an open incident (means are kept as [total, n]; the
# close and what is only written out at it are never part of an open incident's state).
_PLAIN = tuple(
    f.name
    for f in fields(Incident)
    if f.name not in ("closed", "means", "verdict", "recovery", "changes")
)


def incident_state(inc: Incident) -> dict[str, Any]:
    """An open incident as plain data (msgpack-able)."""
    d = {k: getattr(inc, k) for k in _PLAIN}
    d["means"] = {k: [m.total, m.n] for k, m in inc.means.items()}
    return d


def incident_from_state(d: Mapping[str, Any]) -> Incident:
    inc = Incident(**{k: d[k] for k in _PLAIN if k in d})
    inc.means = {str(k): Mean(float(v[0]), int(v[1])) for k, v in d.get("means", {}).items()}
    return inc
