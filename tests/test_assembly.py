"""Window assembly: complete, deadline, order, duplicates, late, primary communicator."""

from __future__ import annotations

from artemis.detect.assembly import WindowAssembler
from artemis.protocol.records import RankWindow
from window_records import window_record


def rw(rank: int, window: int, comm: str = "c0", nranks: int = 3, job: str = "j") -> RankWindow:
    timing = {"gap_ms": 1.0, "coll_ms": 1.0, "step_ms": 2.0, "collectives": 10}
    return window_record(rank, window, steps=10, job=job, comm=comm, nranks=nranks, **timing)


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


# ---------------------------------------------------------------- runs


def _scored(a: WindowAssembler, comm: str, windows: range, ranks: range = range(3)) -> None:
    for w in windows:
        for r in ranks:
            a.add(rw(r, w, comm=comm), float(w))


def test_a_new_communicator_on_scored_windows_starts_a_new_run() -> None:
    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", [0, 1, 2])
    _scored(a, "A", range(3))
    a.add(rw(0, 3, comm="A"), 3.0)  # window 3 half in when the old run stops
    assert a.run("j") == "A" and a.pending == 1
    # The job id is reused: a new communicator, windows from 0 again.
    out = a.add(rw(0, 0, comm="B"), 10.0)
    assert [(x.run, x.window, x.complete, x.missing) for x in out] == [("A", 3, False, [1, 2])]
    a.add(rw(1, 0, comm="B"), 10.0)
    (done,) = a.add(rw(2, 0, comm="B"), 10.0)
    assert (done.run, done.window, done.complete) == ("B", 0, True) and a.run("j") == "B"
    # The old run's resends are dropped as such, counted and listed for the log.
    assert a.add(rw(0, 1, comm="A"), 11.0) == []
    assert a.dropped[("j", "old_run")] == 1
    assert [(d.reason, d.comm, d.window) for d in a.take_drops()] == [("old_run", "A", 1)]
    # ...and the new run's own resends are late, as before.
    assert a.add(rw(0, 0, comm="B"), 12.0) == [] and a.late == 1


def test_a_communicator_joining_the_running_job_is_not_a_new_run() -> None:
    # An island on its own communicator whose ranks were not seen yet (a late agent).
    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", [0, 1, 5])  # rank 5's agent said hello, its summaries come late
    _scored(a, "A", range(2), ranks=range(2))
    assert [x.missing for x in a.expire(50.0)] == [[5], [5]]
    # window 0 was scored without rank 5: its summary is a late part of it, not a drop
    (part,) = a.add(rw(5, 0, comm="C", nranks=1), 51.0)
    assert part.late and part.window == 0 and [r.rank for r in part.ranks] == [5]
    assert part.missing == [] and not a.dropped
    assert a.run("j") == "A" and a.late == 1
    # ...and only once: a resend of it is dropped as late
    assert a.add(rw(5, 0, comm="C", nranks=1), 51.5) == [] and a.dropped[("j", "late")] == 1
    a.add(rw(0, 2, comm="A"), 52.0)
    a.add(rw(1, 2, comm="A"), 52.0)
    (done,) = a.add(rw(5, 2, comm="C", nranks=1), 52.0)
    assert [r.rank for r in done.ranks] == [0, 1, 5] and done.run == "A"


def test_runs_survive_a_snapshot_and_an_ended_job_takes_any_new_run() -> None:
    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", [0, 1, 2])
    _scored(a, "A", range(3))
    b = WindowAssembler(deadline_s=5, grace_s=0)
    b.restore(a.snapshot())
    assert b.expected("j") == {0, 1, 2} and b.primary_comm("j", 1) == "A"
    assert b.add(rw(0, 2, comm="A"), 20.0) == [] and b.late == 1  # a resend: late
    b.add(rw(0, 0, comm="B"), 21.0)
    assert b.run("j") == "B"  # a new run, known only from the restored state
    assert ("j", 2, ["A"], []) in b.released_marks()
    # A job that ended: its next communicator starts a run, even one with new ranks.
    b.forget_job("j")
    (done,) = b.add(rw(7, 0, comm="D", nranks=8), 30.0)
    assert b.run("j") == "D" and (done.run, done.window, done.complete) == ("D", 0, True)


def test_a_snapshot_through_msgpack_and_an_older_list_form_restore_the_same_primaries() -> None:
    import msgpack

    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", [0, 1, 2, 3])
    # Rank 3 judged on a larger communicator than the others.
    for r in range(3):
        a.add(rw(r, 0, comm="A"), 0.0)
    a.add(rw(3, 0, comm="Z", nranks=8), 0.0)
    a.add(rw(3, 0, comm="A"), 0.0)
    saved = msgpack.unpackb(msgpack.packb(a.snapshot(), use_bin_type=True), raw=False)
    old = {
        "j": {
            **{k: v for k, v in saved["j"].items() if k not in ("prim_code", "comms")},
            "expected": [0, 1, 2, 3],
            "prim_n": [-3, -3, -3, -8],
            "prim_comm": ["A", "A", "A", "Z"],
        }
    }
    for state in (saved, old):
        b = WindowAssembler(deadline_s=5, grace_s=0)
        b.restore(state)
        assert b.expected("j") == {0, 1, 2, 3}
        assert [b.primary_comm("j", r) for r in range(4)] == ["A", "A", "A", "Z"]
        # The restored primaries still filter: rank 3's row of "A" is not its primary's.
        b.add(rw(0, 1, comm="A"), 1.0)
        b.add(rw(3, 1, comm="A"), 1.0)
        b.add(rw(1, 1, comm="A"), 1.0)
        b.add(rw(3, 1, comm="Z", nranks=8), 1.0)
        (done,) = b.add(rw(2, 1, comm="A"), 1.0)
        assert [(x.rank, x.comm) for x in done.ranks] == [(0, "A"), (1, "A"), (2, "A"), (3, "Z")]


def test_batches_of_interleaved_ranks_leave_sorted_by_rank() -> None:
    from artemis.protocol.columns import WindowColumns

    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", range(5))
    a.add(WindowColumns.from_records([rw(r, 0, nranks=5) for r in (4, 0, 2)]), 0.0)
    (done,) = a.add(WindowColumns.from_records([rw(r, 0, nranks=5) for r in (3, 1)]), 0.0)
    assert [x.rank for x in done.ranks] == [0, 1, 2, 3, 4] and done.complete


def test_tensor_parallel_rows_first_do_not_start_a_run_and_are_ignored_once_dp_is_known() -> None:
    # 6 ranks, tp = 2: TP groups {0,1} {2,3} {4,5} (size 2), DP communicators
    # {0,2,4} and {1,3,5} (size 3). The TP summaries of window 0 come first and
    # complete it; the DP ones that follow are this run's, not a new run.
    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", range(6))
    out = []
    for g in range(3):
        out += a.add([rw(2 * g, 0, f"t{g}", 2), rw(2 * g + 1, 0, f"t{g}", 2)], 0.0)
    assert [w.window for w in out] == [0]
    run = a.run("j")
    released = {}
    for w in (0, 1, 2, 3):
        for p in range(2):
            out = a.add([rw(r, w, f"d{p}", 3) for r in range(p, 6, 2)], 0.1 * w)
            for g in range(3):  # the groups' own rows of the same window, after
                out += a.add([rw(2 * g, w, f"t{g}", 2), rw(2 * g + 1, w, f"t{g}", 2)], 0.1 * w)
            released.update({x.window: x for x in out})
    assert a.run("j") == run  # one run
    assert a.primary_comm("j", 3) == "d1" and a.primary_comm("j", 4) == "d0"
    # The late DP rows of window 0 made DP primary (window 1 still took the TP rows of
    # ranks whose DP row came after them); from then on every rank is judged on DP,
    # and TP rows are ignored without counting as drops.
    for w in (2, 3):
        assert [r.comm for r in released[w].ranks] == ["d0", "d1"] * 3
    # windows 2 and 3: every group's two rows, twice each (after each DP communicator)
    assert a.secondary >= 2 * 3 * 2 * 2 and a.late == 9


def test_a_batch_with_tp_rows_before_dp_rows_keeps_every_rank_on_dp() -> None:
    # One node's first batch: windows 0-2 of its TP communicator ("a": sorts first)
    # and of its DP one ("z"). Each rank's DP row must replace its TP row in every
    # window; a DP row is no duplicate of the TP row seen before it.
    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", [0, 1])
    batch = [rw(r, w, "a", 2) for w in range(3) for r in (0, 1)]
    batch += [rw(r, w, "z", 4) for w in range(3) for r in (0, 1)]
    out = a.add(batch, 0.0) + a.expire(10.0)
    assert [w.window for w in out] == [0, 1, 2]
    for w in out:
        assert [(r.rank, r.comm) for r in w.ranks] == [(0, "z"), (1, "z")] and not w.missing
    assert a.duplicates == 0
