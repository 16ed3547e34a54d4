"""Late summaries: scored against their own window's peers when they arrive (issue 14).

A seeded simulator scenario (real agent summariser, real telemetry model) runs
through the real `WindowAssembler` and `JobMonitor` twice: once with every
summary on time, once with node B's summaries held back for a stretch of
windows (a partition: its windows are released at their deadline with B's
ranks missing) and then delivered in window order (the backlog after the
heal). The rank findings must be the same, window for window, apart from the
`missing` findings of the outage; every window is scored once for each rank.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from artemis.detect.assembly import AssembledWindow, WindowAssembler
from artemis.detect.detector import LATE_PEERS, LATE_WINDOWS, Detector
from artemis.detect.findings import Finding
from artemis.detect.monitor import JobMonitor
from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import RankWindow
from artemis.sim.inproc import summaries
from artemis.sim.scenario import parse_scenario
from window_records import window_record

DEADLINE = 2.5  # s; one window arrives per second of the test's clock
NODE_B = range(4, 8)
SLOW = 6  # on node B: its findings are the ones that come late


def _scenario(slow_rank: int = SLOW, windows: int = 30) -> Any:
    return parse_scenario(
        {
            "job": {
                "ranks": 8,
                "ranks_per_host": 4,
                "step_ms": 100.0,
                "collectives_per_step": 3,
                "window_steps": 30,
                "windows": windows,
                "noise": 0.01,
                "rank_spread": 0.01,
                "shared_jitter": 0.02,
                "telemetry_noise": 0.02,
                "seed": 14,
            },
            "fault": [{"kind": "thermal", "rank": slow_rank, "start_window": 9, "slowdown": 0.15}],
        },
        "late",
    )


class Pipe:
    """Assembly + monitor, fed as the coordinator's service feeds them (pure)."""

    def __init__(self) -> None:
        self.asm = WindowAssembler(deadline_s=DEADLINE, grace_s=0.0, late_windows=LATE_WINDOWS)
        self.asm.expect("inproc", range(8))
        self.mon = JobMonitor("inproc", Settings(), nranks=8)
        self.mon.expect(range(8))
        self.findings: list[Finding] = []
        self.scored: collections.Counter[tuple[int, int]] = collections.Counter()  # (w, rank)
        self.late_scored = 0
        self.late_dropped = 0

    def feed(self, rows: Sequence[RankWindow], now: float) -> None:
        if rows:
            self._take(self.asm.add(WindowColumns.from_records(list(rows)), now))

    def tick(self, now: float) -> None:
        self._take(self.asm.expire(now))

    def _take(self, released: list[AssembledWindow]) -> None:
        for aw in released:
            ranks = aw.columns.ints("rank").tolist()
            if aw.late:
                out, late = self.mon.on_late(aw.window, aw.columns)
                self.late_scored += late.scored
                self.late_dropped += late.duplicate + late.expired
                scored = ranks if late.scored else []
            else:
                out = self.mon.on_window(aw.window, aw.columns, aw.missing)
                scored = ranks if out.result is not None else []
            for r in scored:
                self.scored[(aw.window, r)] += 1
            self.findings += out.findings


def _run(
    windows: list[list[RankWindow]],
    held: Callable[[int], bool] = lambda w: False,
    between: Callable[[Pipe, int], None] | None = None,
) -> Pipe:
    """Window w's summaries arrive at t = w; node B's are held while `held(w)` and sent
    (its backlog, in window order) with the first window that is not held."""
    p = Pipe()
    backlog: list[RankWindow] = []
    for w, rows in enumerate(windows):
        t = float(w)
        p.tick(t)
        if held(w):
            p.feed([x for x in rows if x.rank not in NODE_B], t)
            backlog += [x for x in rows if x.rank in NODE_B]
            continue
        if backlog:
            # the agent resends what it kept, window by window (one message each)
            for bw in sorted({x.window for x in backlog}):
                p.feed([x for x in backlog if x.window == bw], t)
            backlog = []
        p.feed(rows, t)
        if between is not None:
            between(p, w)
    p.tick(len(windows) + 2 * DEADLINE)
    return p


def _key(f: Finding) -> tuple[Any, ...]:
    cause = (f.cause or {}).get("kind") if f.cause else None
    return (f.kind, f.subject, f.window, f.state, f.since, cause, f.ratio, f.z)


def _rank_findings(p: Pipe, exact: bool = True) -> list[tuple[Any, ...]]:
    """Every finding but the outage's `missing` ones; `exact`: with ratio and z."""
    return sorted(_key(f)[: None if exact else 6] for f in p.findings if f.kind != "missing")


@pytest.fixture(scope="module")
def windows() -> list[list[RankWindow]]:
    return summaries(_scenario())


def test_a_partitioned_nodes_late_windows_are_scored_once_as_if_on_time(
    windows: list[list[RankWindow]],
) -> None:
    base = _run(windows)
    part = _run(windows, held=lambda w: 6 <= w < 18)
    # The outage was seen: B's ranks went missing and came back.
    missing = [f for f in part.findings if f.kind == "missing"]
    assert {f.state for f in missing} == {"flagged", "ongoing", "cleared"}
    assert all(sorted(f.ranks) == list(NODE_B) for f in missing if f.state != "cleared")
    # Every window scored exactly once for every rank, in both runs.
    want = {(w, r): 1 for w in range(len(windows)) for r in range(8)}
    assert dict(base.scored) == want
    assert dict(part.scored) == want
    # windows 6..15 were past their deadline at the heal (t = 18), 16 and 17 not yet
    late = [w for w in range(6, 18) if w + DEADLINE <= 18]
    assert len(late) == 10
    assert part.late_scored == len(late) * 4 and part.late_dropped == 0
    assert part.asm.late == len(late) * 4 and not part.asm.dropped
    # The slow rank (on node B) is flagged, diagnosed and followed exactly as without
    # the partition: same windows, states, ratios, z and cause.
    flagged = [f for f in base.findings if f.rank == SLOW and f.state == "flagged"]
    assert flagged and flagged[0].cause and flagged[0].cause["kind"] == "thermal"
    assert flagged[0].window < 18  # it was flagged inside the outage, from late windows
    assert _rank_findings(part) == _rank_findings(base)


def test_a_slow_rank_on_the_node_that_stays_is_unchanged(
    windows: list[list[RankWindow]],
) -> None:
    ws = summaries(_scenario(slow_rank=2))
    base = _run(ws)
    part = _run(ws, held=lambda w: 6 <= w < 18)
    assert [f for f in base.findings if f.rank == 2 and f.state == "flagged"]
    # Judged on time during the outage against the peers present (3, not 7): the same
    # kinds, subjects, windows, states and causes; its ratio and z are those of fewer
    # peers (a window already scored is not scored again).
    assert _rank_findings(part, exact=False) == _rank_findings(base, exact=False)


def test_a_resend_of_a_late_window_is_not_scored_twice(
    windows: list[list[RankWindow]],
) -> None:
    def resend(p: Pipe, w: int) -> None:
        if w == 18:  # right after the backlog: the agent resends it all once more
            for bw in range(6, 18):
                p.feed([x for x in windows[bw] if x.rank in NODE_B], float(w))

    part = _run(windows, held=lambda w: 6 <= w < 18, between=resend)
    assert set(part.scored.values()) == {1}
    assert part.asm.dropped[("inproc", "late")] == 12 * 4  # every resent row
    assert _rank_findings(part) == _rank_findings(_run(windows))


def test_the_catch_up_survives_a_restart_of_the_core(windows: list[list[RankWindow]]) -> None:
    """Half of the backlog scored, then the monitor and assembly restored from their
    snapshots (the coordinator's saved job state), then the rest: the same findings."""

    def restart(p: Pipe) -> None:
        mon, asm = p.mon.snapshot(), p.asm.snapshot()
        p.mon = JobMonitor.restore(mon, Settings())
        p.asm = WindowAssembler(deadline_s=DEADLINE, grace_s=0.0, late_windows=LATE_WINDOWS)
        p.asm.restore(asm)

    p = Pipe()
    for w in range(6):
        p.feed(windows[w], float(w))
    for w in range(6, 18):
        p.tick(float(w))
        p.feed([x for x in windows[w] if x.rank not in NODE_B], float(w))
    p.tick(20.0)  # every held window past its deadline (those pending are the journal's)
    for bw in range(6, 12):
        p.feed([x for x in windows[bw] if x.rank in NODE_B], 20.0)
    restart(p)
    for bw in range(6, 18):  # the agent resends from window 6: those scored are dropped
        p.feed([x for x in windows[bw] if x.rank in NODE_B], 20.0)
    for w in range(18, len(windows)):
        p.tick(float(w + 2))
        p.feed(windows[w], float(w + 2))
    p.tick(len(windows) + 2 + 2 * DEADLINE)
    base = _run(windows)
    assert set(p.scored.values()) == {1} and len(p.scored) == 8 * len(windows)
    assert p.asm.dropped[("inproc", "late")] == 6 * 4
    assert _rank_findings(p) == _rank_findings(base)


def test_late_windows_older_than_the_bound_are_dropped_as_late() -> None:
    ws = summaries(_scenario(windows=LATE_WINDOWS + 10))
    p = Pipe()
    for w in range(3):
        p.feed(ws[w], float(w))
    for w in range(3, LATE_WINDOWS + 6):
        p.tick(float(w))
        p.feed([x for x in ws[w] if x.rank not in NODE_B], float(w))
    p.tick(float(LATE_WINDOWS + 6) + DEADLINE)
    front = LATE_WINDOWS + 5  # the newest window released
    for w in range(3, LATE_WINDOWS + 6):
        p.feed([x for x in ws[w] if x.rank in NODE_B], float(LATE_WINDOWS + 9))
    p.tick(float(LATE_WINDOWS + 20))
    too_old = front - LATE_WINDOWS - 3 + 1  # windows 3 .. front - LATE_WINDOWS
    assert p.asm.dropped[("inproc", "late")] == too_old * 4
    assert p.late_scored == (front - 3 + 1 - too_old) * 4
    assert set(p.scored.values()) == {1}


def test_a_big_group_keeps_a_bounded_sample_of_its_order_statistics() -> None:
    """A 6k-rank window with 100 ranks missing keeps LATE_PEERS rows (weights summing
    to the group) and scores a late rank as it would have been scored on time."""
    rng = np.random.default_rng(3)
    n = 6_000
    template = WindowColumns.from_records(
        [
            window_record(r, job="big", nranks=n, host=f"h{r // 8}", step_ms=140.0, collectives=200)
            for r in range(n)
        ]
    )

    def window(w: int) -> WindowColumns:
        gap = 100.0 * (1 + 0.01 * rng.standard_normal(n))
        gap[17] *= 1.3  # the slow one, among the ranks that come late
        cols = dict(template.cols)
        cols.update(
            window=np.full(n, w),
            step_lo=np.full(n, 50 * w),
            step_hi=np.full(n, 50 * w + 50),
            gap_ms=gap,
        )
        return WindowColumns(n, cols)

    on_time = Detector(Settings(), "big", n)
    late = Detector(Settings(), "big", n)
    away = np.arange(100)
    flags: dict[str, list[int]] = {"on_time": [], "late": []}
    for w in range(8):
        cols = window(w)
        a = on_time.score_window(w, cols)
        gone = np.isin(cols.ints("rank"), away)
        late.score_window(w, cols.take(np.flatnonzero(~gone)), missing=away.tolist())
        ref = late._late[w]
        assert ref.weight.sum() == n - 100 and ref.rows.n == LATE_PEERS
        # half of them first: judged, then part of the (still bounded) sample
        first = late.score_late(w, cols.take(np.flatnonzero(gone)[:50]))
        assert first.scored == 50 and first.result is not None
        assert ref.weight.sum() == n - 50 and ref.rows.n <= LATE_PEERS
        got = late.score_late(w, cols.take(np.flatnonzero(gone)))  # all 100 resent
        assert got.scored == 50 and got.duplicate == 50 and got.result is not None
        assert w not in late._late  # nobody left to come: nothing kept
        mine: dict[int, float] = {}
        for part in (first.result, got.result):
            mine.update(zip(part.ranks.tolist(), part.pace_values.tolist(), strict=True))
        theirs = dict(zip(a.ranks.tolist(), a.pace_values.tolist(), strict=True))
        for r in away.tolist():
            assert mine[r] == pytest.approx(theirs[r], rel=2e-3)
        late_findings = first.result.findings + got.result.findings
        assert {(f.rank, f.state) for f in late_findings} == {
            (f.rank, f.state) for f in a.findings if f.rank in away
        }
        flags["on_time"] += [w for f in a.findings if f.rank == 17 and f.state == "flagged"]
        flags["late"] += [w for f in late_findings if f.rank == 17 and f.state == "flagged"]
    assert flags["late"] == flags["on_time"] == [3]
