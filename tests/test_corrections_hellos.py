"""Which agent serves a rank, from the hellos (coordinator/corrections.py): the latest
hello naming it, kept past a disconnect, looked up through an index rebuilt after each
hello."""

from __future__ import annotations

from artemis.coordinator.corrections import CorrectionShell
from artemis.protocol.messages import RankInfo
from artemis.protocol.peers import PeerInfo


def _peer(agent: str, ranks: range, job: str = "j", conn: int = 0) -> PeerInfo:
    return PeerInfo(
        agent_id=agent,
        host=f"host-{agent}",
        agent_version="t",
        incarnation="i",
        ranks=tuple(RankInfo(job, "c", r, 1000) for r in ranks),
        address="",
        version=(1, 3),
        connected_at=0.0,
        conn_id=conn,
    )


def test_the_latest_hello_naming_a_rank_wins_and_outlives_its_connection() -> None:
    c = CorrectionShell()
    a, b = _peer("a", range(0, 8)), _peer("b", range(4, 12))
    c.on_connect(a)
    assert c.facts("j", 5).host == "host-a"
    c.on_connect(b)  # names 4..11 later: those are b's now, 0..3 still a's
    assert [c.facts("j", r).host for r in (3, 4, 11)] == ["host-a", "host-b", "host-b"]
    assert c.facts("j", 12).host is None and c.facts("other", 3).host is None
    c.on_connect(_peer("a", range(0, 8), conn=1))  # a again, the same hello
    assert [c.facts("j", r).host for r in (3, 5, 9)] == ["host-a", "host-a", "host-b"]
    c.on_disconnect(b)
    # Gone, but still the agent its hello named (a new run of the job is served by it).
    assert c._agent("j", 9) == "b" and c.facts("j", 9).host is None


def test_an_agent_whose_hello_changed_keeps_the_ranks_only_its_older_one_named() -> None:
    c = CorrectionShell()
    c.on_connect(_peer("a", range(0, 4)))
    c.on_connect(_peer("a", range(2, 6), conn=1))
    assert [c._agent("j", r) for r in (0, 3, 5, 6)] == ["a", "a", "a", None]
    c.on_connect(_peer("b", range(0, 1)))
    assert [c._agent("j", r) for r in (0, 1)] == ["b", "a"]
