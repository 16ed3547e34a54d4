"""An established peer's ranks held by field (protocol/peers.py HelloRanks): the same
RankInfos back, in order, equal to their tuple, whatever repeats and whatever not."""

from __future__ import annotations

import pytest
from artemis.protocol.messages import RankInfo
from artemis.protocol.peers import HelloRanks, rank_pairs


def _ranks() -> tuple[RankInfo, ...]:
    return tuple(
        RankInfo(
            "job", "comm", 1000 + r, 4096, pid=None if r == 2 else 4000 + r, gpu_index=r % 8,
            vendor="nvidia", gpu_model="H100" if r < 3 else "A100",
        )
        for r in range(6)
    )  # fmt: skip


def test_every_rank_comes_back_as_it_was_and_compares_equal_to_its_tuple() -> None:
    ranks = _ranks()
    held = HelloRanks(ranks)
    assert isinstance(held, HelloRanks) and len(held) == 6
    assert list(held) == list(ranks) and held == ranks and ranks == held
    assert held[-1] == ranks[-1] and held[1:3] == ranks[1:3]
    assert held == HelloRanks(ranks) and hash(held) == hash(HelloRanks(ranks))
    assert held != ranks[:5] and held != HelloRanks(ranks[::-1])
    with pytest.raises(IndexError):
        held[6]


def test_a_value_every_rank_shares_is_held_once() -> None:
    job = "".join(["jo", "b"])  # equal values, distinct objects, as decoded
    held = HelloRanks(tuple(RankInfo("".join(["jo", "b"]), "c", r, 8) for r in range(4)))
    assert held[0].job == job and held[0].job is held[3].job and held[2].rank == 2


def test_an_empty_hello() -> None:
    held = HelloRanks(())
    assert len(held) == 0 and list(held) == [] and held == ()


def test_rank_pairs_reads_the_fields_as_the_rankinfos_have_them() -> None:
    ranks = _ranks()
    want = [(r.job, r.rank) for r in ranks]
    assert list(rank_pairs(HelloRanks(ranks))) == want == list(rank_pairs(ranks))
    one = HelloRanks(ranks[:1])  # a single rank: every field "the same for all"
    assert list(rank_pairs(one)) == [("job", 1000)] and one.values("pid") == (4000,)
