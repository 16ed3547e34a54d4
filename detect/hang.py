"""Hang detection from the ranks' progress: a pure function (the finding it makes is
`findings.hang_finding`).

A collective completes only when every rank has arrived. A rank that stops
arriving leaves every other rank sitting in the next collective. So: take the
furthest collective any rank has reached (in flight, else last completed);
the ranks that have not reached it are behind; if the ranks waiting in it have
waited longer than the bound, it is a hang, and the ranks furthest behind are
named.

Bound = max(hang_floor_s, hang_step_factor x median step time). A healthy rank
waits at most about one step for the slowest peer, so 20 steps is far outside
normal jitter (checkpointing, evaluation pauses are typically shorter than that
when steps are slow; the floor covers fast steps). Durations are measured by
each agent on its own clock; nothing is compared across hosts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from artemis.detect.settings import Settings
from artemis.protocol.records import RankProgress


@dataclass(frozen=True)
class HangVerdict:
    ranks: list[int]  # the ranks furthest behind (sorted)
    behind: list[int]  # every rank that has not reached the collective the others wait in
    collective: int  # coll_seq the waiting ranks sit in
    last_done: dict[int, int]  # rank -> last completed coll_seq, every rank considered
    waiting_s: float  # longest wait among the ranks in `collective`
    bound_s: float


def hang_bound_s(step_ms: float | None, settings: Settings) -> float:
    """Seconds a rank may wait in a collective before it counts as a hang."""
    if step_ms is None or not step_ms > 0:
        return settings.hang_floor_s
    return max(settings.hang_floor_s, settings.hang_step_factor * step_ms / 1000.0)


def check_hang(
    progress: Sequence[RankProgress], step_ms: float | None, settings: Settings
) -> HangVerdict | None:
    """A verdict when some ranks hold every other rank in a collective past the bound."""
    live = {p.rank: p for p in progress if not p.finished}
    if len(live) < 2:
        return None
    reached = {r: (p.inflight if p.inflight is not None else p.last_done) for r, p in live.items()}
    front = max(reached.values())
    waiting = [p for p in live.values() if p.inflight == front]
    behind = sorted(r for r, seq in reached.items() if seq < front)
    if not behind or not waiting:
        return None
    waited = max(p.inflight_s for p in waiting)
    bound = hang_bound_s(step_ms, settings)
    if waited < bound:
        return None
    lowest = min(reached[r] for r in behind)
    culprits = [r for r in behind if reached[r] == lowest]
    return HangVerdict(
        ranks=culprits,
        behind=behind,
        collective=front,
        last_done={r: live[r].last_done for r in sorted(live)},
        waiting_s=waited,
        bound_s=bound,
    )
