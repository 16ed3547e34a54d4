"""Hang detection from rank progress, and the hang finding."""

from __future__ import annotations

import pytest
from artemis.coordinator.findings import FIELDS, hang_finding
from artemis.coordinator.hang import check_hang, hang_bound_s
from artemis.coordinator.settings import Settings
from artemis.protocol.records import RankProgress


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
