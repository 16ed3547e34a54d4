"""Cutting the agent's data messages by job (protocol/jobsplit.py) and taking a job's
unacknowledged messages out of a link's outbox (AgentLink.take_jobs): what moves to
another uplink, what stays, in which order, under which seq."""

from __future__ import annotations

import dataclasses

from artemis.protocol.client import AgentIdentity, AgentLink
from artemis.protocol.jobsplit import jobs_of, split_by_job
from artemis.protocol.messages import Dump, Heartbeat, Windows
from artemis.protocol.tcp import TcpTransport
from protocol_helpers import SECRET, progress, window


def two_job_batch(w: int) -> Windows:
    rows = [
        dataclasses.replace(window(rank=r, w=w), job=job)
        for r in range(4)
        for job in ("job-a", "job-b")  # interleaved: the cut must keep each job's order
    ]
    return Windows(host="node-a", windows=tuple(rows))


def test_a_batch_is_cut_by_job_in_order() -> None:
    msg = two_job_batch(3)
    stay, move = split_by_job(msg, {"job-b"})
    assert isinstance(stay, Windows) and isinstance(move, Windows)
    assert [(r.job, r.rank) for r in stay.windows] == [("job-a", r) for r in range(4)]
    assert [(r.job, r.rank) for r in move.windows] == [("job-b", r) for r in range(4)]
    assert split_by_job(msg, {"job-c"}) == (msg, None)
    assert split_by_job(msg, {"job-a", "job-b"}) == (None, msg)


def test_a_heartbeat_always_stays_and_its_jobs_parts_move() -> None:
    hb = Heartbeat(
        progress=(progress(0), dataclasses.replace(progress(1), job="job-b")),
        buffered=4,
        plan_acks=({"job": "job-b", "plan_id": "p", "rank": 1, "step": 9},),
    )
    assert jobs_of(hb) == {"job-1", "job-b"}
    stay, move = split_by_job(hb, {"job-b"})
    assert isinstance(stay, Heartbeat) and isinstance(move, Heartbeat)
    assert [p.job for p in stay.progress] == ["job-1"] and not stay.plan_acks
    assert [p.job for p in move.progress] == ["job-b"] and len(move.plan_acks) == 1
    assert stay.buffered == move.buffered == 4
    dump = Dump(job="job-b", comm="c", rank=1)
    assert split_by_job(dump, {"job-b"}) == (None, dump)


def test_take_jobs_moves_a_jobs_part_and_keeps_the_rest_under_its_seq() -> None:
    ident = AgentIdentity(agent_id="node-a", host="node-a", agent_version="t")
    link = AgentLink(TcpTransport(), "127.0.0.1:1", SECRET, ident)
    seqs = [link.enqueue(two_job_batch(w)) for w in range(3)]
    seqs.append(link.enqueue(Dump(job="job-b", comm="c", rank=1)))
    seqs.append(link.enqueue(Dump(job="job-a", comm="c", rank=2)))
    moved = link.take_jobs({"job-b"})
    assert [(seq, whole) for seq, _, whole in moved] == [
        (seqs[0], False),
        (seqs[1], False),
        (seqs[2], False),
        (seqs[3], True),
    ]
    assert [m.columns.n for _, m, _ in moved[:3] if isinstance(m, Windows)] == [4, 4, 4]
    left = list(link._outbox.frames_from(1))  # what the next connection would send
    assert [seq for seq, _ in left] == [seqs[0], seqs[1], seqs[2], seqs[4]]  # the gap: seq 4
    assert [seq for seq, _ in link._outbox.frames_from(seqs[3])] == [seqs[4]]
    assert link.stats.buffered == 4
