"""Window assembly: complete, deadline, order, duplicates, late, primary communicator."""

from __future__ import annotations

from artemis.coordinator.assembly import WindowAssembler
from artemis.protocol.records import RankWindow


def rw(rank: int, window: int, comm: str = "c0", nranks: int = 3, job: str = "j") -> RankWindow:
    return RankWindow(
        job=job,
        comm=comm,
        rank=rank,
        nranks=nranks,
        host="h",
        window=window,
        step_lo=window * 10,
        step_hi=window * 10 + 10,
        coll_lo=0,
        coll_hi=0,
        gap_ms=1.0,
        coll_ms=1.0,
        step_ms=2.0,
        collectives=10,
        bytes=0,
        lost=0,
        clock="device",
    )


def test_complete_window_released_once_all_expected_ranks_report() -> None:
    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", [0, 1, 2])
    assert a.add(rw(0, 0), 0.0) == []
    assert a.add(rw(1, 0), 0.1) == []
    (done,) = a.add(rw(2, 0), 0.2)
    assert done.complete and done.missing == [] and [r.rank for r in done.ranks] == [0, 1, 2]
    # A resend of an already released window is late, not scored twice.
    assert a.add(rw(2, 0), 0.3) == [] and a.late == 1


def test_deadline_reports_missing_ranks() -> None:
    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", [0, 1, 2])
    a.add(rw(0, 3), 10.0)
    a.add(rw(1, 3), 11.0)
    assert a.expire(14.9) == []
    (done,) = a.expire(15.0)
    assert not done.complete and done.missing == [2] and done.window == 3


def test_duplicates_ignored_and_windows_leave_in_order() -> None:
    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", [0, 1])
    a.add(rw(0, 1), 0.0)
    assert a.add(rw(0, 1), 0.1) == [] and a.duplicates == 1
    a.add(rw(0, 2), 0.2)
    assert a.add(rw(1, 2), 0.3) == []  # window 2 is ready but waits for window 1
    out = a.add(rw(1, 1), 0.4)
    assert [w.window for w in out] == [1, 2]


def test_rank_judged_on_its_largest_communicator() -> None:
    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", [0, 1])
    assert a.add(rw(0, 0, comm="tp", nranks=2), 0.0) == []
    a.add(rw(0, 0, comm="dp", nranks=8), 0.0)
    (done,) = a.add(rw(1, 0, comm="dp", nranks=8), 0.0)
    assert {r.comm for r in done.ranks} == {"dp"}
    # The smaller communicator's summaries are ignored from now on.
    assert a.add(rw(0, 1, comm="tp", nranks=2), 1.0) == []
    assert a.pending == 0


def test_after_a_restart_a_window_waits_for_agents_that_have_not_reconnected_yet() -> None:
    # A fresh coordinator: only the first agent's ranks (0, 1) are known so far.
    a = WindowAssembler(deadline_s=10, grace_s=3)
    a.expect("j", [0, 1])
    assert a.add(rw(0, 7), 100.0) == []
    assert a.add(rw(1, 7), 100.1) == []  # every known rank is in, but within the grace
    a.expect("j", [2])  # the second agent reconnects and announces rank 2
    assert a.expire(103.5) == []  # past the grace: now rank 2 is awaited
    (done,) = a.add(rw(2, 7), 104.0)
    assert done.complete and [r.rank for r in done.ranks] == [0, 1, 2]


def test_after_the_grace_a_window_of_every_known_rank_is_complete_at_once() -> None:
    a = WindowAssembler(deadline_s=5, grace_s=1)
    a.expect("j", [0, 1])
    a.add(rw(0, 0), 0.0)
    a.add(rw(1, 0), 0.2)
    (done,) = a.expire(1.0)
    assert done.complete
    a.add(rw(0, 1), 1.1)
    (done,) = a.add(rw(1, 1), 1.2)
    assert done.complete and done.window == 1
