"""Several communicators per rank: the agent ships its main ring's windows only.

The layout of tests/test_torch_tp.py without torch: 4 ranks as two tensor-parallel
pairs ({0,1}, {2,3}: two all-reduces per step) and one job-wide all_reduce per step
(every rank's largest communicator, its main ring), written with the job's own ring
writer step by step while a real ``Agent`` polls the rings, its windows go through the
real ``WindowAssembler`` and ``JobMonitor`` (pure: the clock is the steps' own).

The agent infers collectives per step from what each ring holds, and a ring with more
collectives per step has enough of them sooner: here the pairs' rings at step ~65,
the job-wide ones at step ~129. Their windows are numbered by their own collectives,
so the pairs' window w is steps 10w-10w+10, the main ring's steps 20w-20w+20. Had
the pairs' windows been shipped, they would have filled the coordinator's windows 0-12
before any main row came: those windows then left without the main rows (which came
late and were dropped), and a slowdown from window 8 was first seen at window 13
(the real test flagged at 14 for an onset at 8).
"""

from __future__ import annotations

from pathlib import Path

from artemis.agent.config import AgentConfig
from artemis.agent.daemon import Agent
from artemis.detect.assembly import WindowAssembler
from artemis.detect.monitor import JobMonitor
from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowColumns
from artemis.ring.format import FUNC_CODES, KIND_COLL
from artemis.ring.writer import RingWriter

MS = 1_000_000
STEPS, WINDOW_STEPS = 240, 20
SLOW_RANK, SLOW_FROM = 1, 160  # window 8 of the main ring
WORLD, TP = 0xA0, (0xB0, 0xB1)
ALLREDUCE = FUNC_CODES["AllReduce"]


def _write_step(
    rings: dict[tuple[int, int], RingWriter], seq: dict[int, int], step: int, t0: int
) -> int:
    """One step of every rank from ``t0`` (the last job-wide all_reduce's end): compute
    (30 ms more on the slow rank), the pair's two all-reduces (a partner waits in the
    first for the slow rank), the job-wide one (the other pair waits in it). Returns
    the step's end."""
    compute = [20 * MS + (30 * MS if r == SLOW_RANK and step >= SLOW_FROM else 0) for r in range(4)]
    arrive = [t0 + c for c in compute]
    done = []
    for pair in ((0, 1), (2, 3)):
        start = max(arrive[r] for r in pair)
        for r in pair:
            for s, e in ((arrive[r], start + 2 * MS), (start + 2 * MS, start + 4 * MS)):
                rings[(r, TP[r // 2])].record(
                    kind=KIND_COLL, func=ALLREDUCE, coll_seq=seq[r], nbytes=256, start=s, end=e
                )
                seq[r] += 1
        done.append(start + 4 * MS)
    end = max(done) + MS
    for r in range(4):
        rings[(r, WORLD)].record(
            kind=KIND_COLL, func=ALLREDUCE, coll_seq=step, nbytes=4, start=done[r // 2], end=end
        )
    return end


def test_smaller_rings_are_held_back_and_a_slowdown_is_seen_from_its_window(
    tmp_path: Path,
) -> None:
    rings = {
        (r, c): RingWriter(tmp_path, "tp", c, r if c == WORLD else r % 2, n, global_rank=r)
        for r in range(4)
        for c, n in ((WORLD, 4), (TP[r // 2], 2))
    }
    sent: list[WindowColumns] = []

    def send(msg: object) -> int:
        sent.append(WindowColumns.from_records(list(msg.windows)))  # type: ignore[attr-defined]
        return len(sent)

    agent = Agent(
        AgentConfig(shm_dir=str(tmp_path), host="h", window_steps=WINDOW_STEPS, telemetry=[]),
        [],
        send,
        lambda: 0,
    )
    agent.scan()
    asm = WindowAssembler(deadline_s=5.0)
    asm.expect("tp", range(4))
    mon = JobMonitor("tp", Settings(mode="seed", suspect_ratio=1.5), nranks=4)
    seq = {r: 0 for r in range(4)}
    found = []
    scored: list[tuple[int, int, set[int]]] = []

    def pump(now: float) -> None:
        n = len(sent)
        agent.ship(agent.tick(now))
        for aw in [w for b in sent[n:] for w in asm.add(b, now)] + asm.expire(now):
            scored.append((aw.window, aw.columns.n, set(aw.columns.ints("nranks").tolist())))
            found.extend(mon.on_window(aw.window, aw.columns, aw.missing).findings)

    t = 1_000 * MS
    for step in range(STEPS):
        t = _write_step(rings, seq, step, t)
        if step % 2:
            pump(step * 0.06)  # the agent polls about every other step
    during = len(sent)
    for rw in rings.values():
        rw.close()  # finished: the last windows are cut
    pump(STEPS * 0.06)
    # the pairs' windows were cut (their collectives count in the main gaps) but not sent
    assert agent.secondary_windows > 0
    # (once the main rings are drained, at the end, nothing is held back: the coordinator
    # judges those ranks on their main rows already and leaves the others out)
    assert {int(x) for b in sent[:during] for x in b.ints("nranks")} == {4}
    # every window the coordinator scored has the main row of every rank, none was late
    assert asm.late == 0 and sum(asm.dropped.values()) == 0
    assert [w for w, _, _ in scored] == list(range(STEPS // WINDOW_STEPS))
    assert all(n == 4 and nr == {4} for _, n, nr in scored), scored
    # so the slow rank is suspect from the onset window on, and flagged in its third
    bad = [(f.window, f.state) for f in found if f.kind == "rank" and f.rank == SLOW_RANK]
    assert bad[:3] == [(8, "suspect"), (9, "suspect"), (10, "flagged")], found
    assert all(f.rank == SLOW_RANK for f in found if f.kind == "rank"), found
