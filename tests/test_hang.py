"""Hang detection from rank progress, the hang finding, and a hang reported once across
a restart of the coordinator."""

from __future__ import annotations

import msgpack
import pytest
from artemis.detect.findings import FIELDS, hang_finding
from artemis.detect.hang import check_hang, hang_bound_s
from artemis.detect.monitor import RESTORED_DUMP_WAIT_S, JobMonitor, MonitorOutput
from artemis.detect.settings import Settings
from artemis.protocol.records import RankProgress, RankWindow
from service_records import rank_window


def prog(
    rank: int, last_done: int, inflight: int | None, inflight_s: float = 0.0, finished: bool = False
) -> RankProgress:
    return RankProgress(
        "job1",
        "c0",
        rank,
        f"h{rank}",
        last_done,
        inflight,
        inflight_s,
        idle_s=inflight_s,
        finished=finished,
    )


S = Settings()


def test_bound_is_floor_or_steps() -> None:
    assert hang_bound_s(None, S) == 10.0
    assert hang_bound_s(100.0, S) == 10.0  # 20 x 0.1 s = 2 s < floor
    assert hang_bound_s(2000.0, S) == 40.0  # 20 x 2 s
    assert hang_bound_s(2000.0, Settings(hang_step_factor=5.0, hang_floor_s=1.0)) == 10.0


def test_rank_that_stops_arriving_is_named() -> None:
    ps = [prog(0, 99, 100, 12.0), prog(1, 99, 100, 11.0), prog(2, 99, 100, 12.5), prog(3, 99, None)]
    v = check_hang(ps, 50.0, S)
    assert v is not None
    assert v.ranks == [3] and v.behind == [3] and v.collective == 100
    assert v.waiting_s == 12.5 and v.bound_s == 10.0
    assert v.last_done == {0: 99, 1: 99, 2: 99, 3: 99}


def test_under_the_bound_is_not_a_hang() -> None:
    ps = [prog(0, 99, 100, 9.0), prog(1, 99, 100, 9.5), prog(3, 99, None)]
    assert check_hang(ps, 50.0, S) is None
    # Slow steps raise the bound: 20 x 1 s = 20 s.
    ps = [prog(0, 99, 100, 15.0), prog(3, 99, None)]
    assert check_hang(ps, 1000.0, S) is None
    assert check_hang(ps, 100.0, S) is not None


def test_names_the_ranks_furthest_behind() -> None:
    ps = [prog(0, 120, 121, 30.0), prog(1, 119, None), prog(2, 110, None), prog(3, 110, None)]
    v = check_hang(ps, None, S)
    assert v is not None and v.ranks == [2, 3] and v.behind == [1, 2, 3]


@pytest.mark.parametrize(
    "ps",
    [
        [prog(0, 99, 100, 50.0), prog(1, 99, 100, 50.0)],  # all in the same collective
        [prog(0, 99, None), prog(1, 99, None)],  # all computing
        [prog(0, 99, 100, 50.0)],  # one rank
        [prog(0, 99, 100, 50.0), prog(1, 50, None, finished=True)],  # the other exited
    ],
)
def test_no_verdict(ps: list[RankProgress]) -> None:
    assert check_hang(ps, 50.0, S) is None


def test_hang_finding_carries_dumps_and_progress() -> None:
    ps = [prog(0, 99, 100, 12.0), prog(1, 99, None)]
    v = check_hang(ps, 50.0, S)
    assert v is not None
    f = hang_finding(
        v,
        job="j",
        window=8,
        dumps=["/tmp/d/rank1.jsonl"],
        hosts={0: "h0", 1: "h1"},
        islands={0: "nvidia", 1: "nvidia"},
        steps=[160, 180],
    )
    j = f.to_json()
    assert list(j) == [*FIELDS, "job"] and j["job"] == "j"
    assert (j["kind"], j["state"], j["rank"], j["ranks"], j["hosts"]) == (
        "hang",
        "flagged",
        1,
        [1],
        ["h1"],
    )
    assert j["island"] == "nvidia"
    assert j["evidence"]["dumps"] == ["/tmp/d/rank1.jsonl"]
    assert j["evidence"]["last_done"] == {"0": 99, "1": 99}
    assert j["evidence"]["waiting_s"] == 12.0
    assert f.subject == "1"


# ------------------------------------------------- a restart between the dump request and the report

HS = Settings(hang_floor_s=1.0)


def _window(w: int) -> list[RankWindow]:
    return [rank_window("j", r, w) for r in range(4)]


def _progress(finished: bool = False) -> list[RankProgress]:
    """Rank 3 stopped after collective 99; the others have waited 12 s in collective 100
    (`finished`: the job has since given up, every ring closed)."""
    return [prog(r, 99, None if r == 3 or finished else 100, 12.0, finished) for r in range(4)]


def _restart(m: JobMonitor) -> JobMonitor:
    """A restart from `m`'s saved state, through msgpack bytes as on disk."""
    raw = msgpack.packb(m.snapshot(), use_bin_type=True)
    state = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    return JobMonitor.restore(state, HS, dump_wait_s=5.0)


def _suspected() -> JobMonitor:
    m = JobMonitor("j", HS, nranks=4, dump_wait_s=5.0)
    m.on_window(0, _window(0))
    m.on_progress(_progress())
    first = m.tick(100.0)
    assert [(c.action, c.body["ranks"]) for c in first.controls] == [("dump", [0, 1, 2, 3])]
    assert not first.findings
    m.on_dump(0, "/d/0.jsonl")  # one dump in before the coordinator dies
    return m


def _hangs(out: MonitorOutput) -> list[dict[str, object]]:
    return [f.to_json() for f in out.findings if f.kind == "hang"]


def test_a_hang_saved_between_its_dump_request_and_its_report_is_reported_once() -> None:
    """The kill trials' lost hang (docs/RELIABILITY.md section 2): the coordinator dies
    after asking for the dumps; by the time it is back the job has given up (every rank
    finished), so the hang can never be found again from progress. The verdict saved
    with the dump request is reported once, by the restarted coordinator."""
    b = _restart(_suspected())
    b.on_progress(_progress(finished=True))
    quiet = b.tick(500.0)  # the dump wait starts again on this clock: no report yet
    assert not quiet.findings and not quiet.controls  # and no second dump request
    for r in (1, 2, 3):  # resent by the agents (never acked), or asked again
        b.on_dump(r, f"/d/{r}.jsonl")
    (h,) = _hangs(b.tick(500.1))  # every dump in: reported
    assert (h["ranks"], h["window"], h["steps"]) == ([3], 5, [50, 51])
    assert h["evidence"]["dumps"] == [f"/d/{r}.jsonl" for r in range(4)]  # type: ignore[index]
    assert not b.on_dump(3, "/d/3-again.jsonl")  # a resent dump after the report: no state
    # Reported and saved: another restart (the job hung again, as seen) reports nothing.
    c = _restart(b)
    c.on_progress(_progress())
    assert not c.tick(900.0).findings and not c.tick(999.0).findings
    assert not c.finish().findings and c.dumps_wanted(range(4)) == []
    # The same saved state, no other dump coming: reported with its one, at the longer
    # wait of a restored hang (the agents must reconnect before they are asked again).
    d = _restart(_suspected())
    wait = RESTORED_DUMP_WAIT_S
    assert wait > 5.0
    assert not d.tick(50.0).findings and not d.tick(50.0 + wait - 0.1).findings
    (h,) = _hangs(d.tick(50.0 + wait))
    assert h["evidence"]["dumps"] == ["/d/0.jsonl"]  # type: ignore[index]
    assert not _hangs(d.tick(90.0)) and not _hangs(_restart(d).tick(99.0))


def test_the_dumps_still_wanted_are_asked_of_an_agent_that_connects() -> None:
    b = _restart(_suspected())
    assert b.dumps_wanted([2, 3]) == [2, 3] and b.dumps_wanted([0, 1]) == [1]
    assert b.on_dump(1, "/d/1.jsonl")  # taken into the hang: the shell saves the state
    assert b.dumps_wanted([0, 1]) == [] and b.dumps_wanted(range(4)) == [2, 3]


def test_a_coordinator_stopped_with_the_dumps_outstanding_reports_the_hang_at_its_end() -> None:
    b = _restart(_suspected())
    (h,) = _hangs(b.finish())
    assert h["evidence"]["dumps"] == ["/d/0.jsonl"]  # type: ignore[index]


def test_an_older_snapshot_holds_only_a_reported_hang() -> None:
    """Snapshots written before `reported` was saved held a hang only once reported."""
    m = _suspected()
    m.tick(200.0)  # the dump wait is over: reported
    state = m.snapshot()
    del state["hang"]["reported"], state["hang"]["expected"]
    b = JobMonitor.restore(state, HS, dump_wait_s=5.0)
    b.on_progress(_progress())
    assert not b.tick(300.0).findings and not b.finish().findings
