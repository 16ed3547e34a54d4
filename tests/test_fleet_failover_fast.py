"""What a fleet takeover waits for, without processes: the heir's assembly and agents.

The failover benchmark (bench/fleet_failover.py) measures the whole path; these pin the
two rules that make it cost the lease and not the lease plus an assembly deadline.
"""

from __future__ import annotations

from typing import Any

from artemis.detect.assembly import WindowAssembler
from artemis.protocol.records import RankWindow
from window_records import window_record


def rw(rank: int, window: int) -> RankWindow:
    timing = {"gap_ms": 1.0, "coll_ms": 1.0, "step_ms": 2.0, "collectives": 10}
    return window_record(rank, window, steps=10, job="j", comm="c0", nranks=3, **timing)


def _owner_state() -> dict[str, Any]:
    """The state the dead owner committed: windows 0-5 released, ranks 0-2 known."""
    a = WindowAssembler(deadline_s=2, grace_s=0)
    a.expect("j", [0, 1, 2])
    for w in range(6):
        for r in range(3):
            a.add(rw(r, w), float(w))
    return a.snapshot(["j"])


def test_a_restored_window_is_released_once_every_known_rank_is_in() -> None:
    heir = WindowAssembler(deadline_s=2.0)  # grace = deadline: a member that just started
    heir.restore(_owner_state())
    # The journal holds ranks 0 and 1 of window 6; the agent of rank 2 resends it.
    assert heir.add(rw(0, 6), 100.0) == []
    assert heir.add(rw(1, 6), 100.0) == []
    (done,) = heir.add(rw(2, 6), 100.01)
    assert done.window == 6 and done.complete and done.missing == []
    # ...and a resend of a window the owner scored is late, not scored again.
    assert heir.add(rw(2, 5), 100.02) == [] and heir.late == 1


def test_a_job_not_restored_still_waits_the_grace_for_announcements() -> None:
    fresh = WindowAssembler(deadline_s=2.0)
    fresh.expect("j", [0, 1])
    assert fresh.add(rw(0, 6), 100.0) == []
    assert fresh.add(rw(1, 6), 100.01) == []  # within the grace
    (done,) = fresh.expire(102.0)
    assert done.complete


def test_a_restored_job_forgotten_waits_the_grace_again() -> None:
    heir = WindowAssembler(deadline_s=2.0)
    heir.restore(_owner_state())
    heir.forget_job("j")  # the job ended; a new run of it starts from nothing known
    heir.expect("j", [0])
    assert heir.add(rw(0, 0), 100.0) == []
