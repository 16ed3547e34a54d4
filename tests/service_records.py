"""Inputs for the coordinator's in-process tests (journal, hang restarts): a rank's window
summary in a 4-rank, 2-host communicator `c0`, and the peer of the host that sends it."""

from __future__ import annotations

from artemis.protocol.messages import RankInfo
from artemis.protocol.peers import PeerInfo
from artemis.protocol.records import RankWindow


def rank_window(
    job: str,
    rank: int,
    window: int,
    *,
    gap_ms: float = 100.0,
    step_ms: float = 110.0,
    collectives: int = 20,
) -> RankWindow:
    """Rank `rank`'s window `window` (10 steps, `collectives` collectives of 10 ms)."""
    return RankWindow(
        job=job,
        comm="c0",
        rank=rank,
        nranks=4,
        host=f"h{rank // 2}",
        window=window,
        step_lo=window * 10,
        step_hi=window * 10 + 10,
        coll_lo=window * collectives,
        coll_hi=(window + 1) * collectives,
        gap_ms=gap_ms,
        coll_ms=10.0,
        step_ms=step_ms,
        collectives=collectives,
        bytes=0,
        lost=0,
        clock="device",
    )


def host_peer(job: str, host: str, minor: int = 1) -> PeerInfo:
    """The agent of host `hN` (ranks 2N and 2N+1), speaking protocol 1.`minor`."""
    h = int(host[1:])
    ranks = tuple(RankInfo(job, "c0", r, 4) for r in (2 * h, 2 * h + 1))
    return PeerInfo(host, host, "t", "i", ranks, "127.0.0.1:1", (1, minor), 0.0, 1)
