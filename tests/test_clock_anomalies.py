"""Device-clock anomalies in ring records, through the real ring writer and reader
(ring/writer.py -> ring/reader.py -> agent/summary.py): each one is corrected or left
out, counted by reason, and the window's timings stay those of a clean clock.

The simulator's scenarios of the same anomalies, through the real plugin, agents and
coordinator, are in tests/test_clock_scenarios.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from artemis.agent.device_clock import device_timeline
from artemis.agent.summary import WindowSummarizer
from artemis.detect.clockrate import correct_rates
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import RankWindow
from artemis.ring.format import FUNC_CODES, KIND_COLL, REC_DEVICE
from artemis.ring.reader import RingReader
from artemis.ring.writer import RingWriter
from window_records import window_record

C, W, WINDOWS = (
    4,
    2,
    12,
)  # collectives per step, steps per window (2: one bad step moves a median), windows
COMPUTE_NS = (8_000_000, 3_000_000, 3_000_000, 2_000_000)  # before each collective
COLL_NS = 1_000_000
T0 = 1_700_000_000 * 10**9  # a %globaltimer-like epoch-ns start
ANOMALY_AT = 2 * W * C + 5  # a collective inside window 2
HOUR = 3600 * 10**9
STEP_NS = sum(COMPUTE_NS) + C * COLL_NS
# Where a counter wraps, in device ns from the start: in the compute gap before the
# anomaly's step, or inside its first collective.
WRAP_GAP = (ANOMALY_AT // C) * STEP_NS + 4_000_000
WRAP_IN_RECORD = (ANOMALY_AT // C) * STEP_NS + COMPUTE_NS[0] + COLL_NS // 2

Clock = Callable[[int, int], int]  # (collective index, true device ns) -> what the ring holds


def _ring(tmp: Path, clock: Clock, *, reversed_at: int | None = None) -> Path:
    w = RingWriter(tmp, "j", 0xC10C, 0, 1, 1024)
    t = T0
    host = 10**12  # host CLOCK_MONOTONIC at enqueue: the real elapsed time
    for i in range(WINDOWS * W * C + C):
        start = t + COMPUTE_NS[i % C]
        end = start + COLL_NS
        s, e = clock(i, start), clock(i, end)
        if i == reversed_at:
            s, e = e, s  # end before start
        w.record(
            kind=KIND_COLL,
            func=FUNC_CODES["AllReduce"],
            coll_seq=i,
            nbytes=1 << 20,
            start=s,
            end=e,
            clock=REC_DEVICE,
            enqueue_ns=host + (start - T0),
        )
        t = end
    w.close(finish=True)
    return w.path


def _windows(path: Path) -> list[RankWindow]:
    sm = WindowSummarizer("j", "c", 0, 1, "h", window_steps=W, colls_per_step=C)
    with RingReader(path) as r:
        sm.feed(r.poll().done)
    return sm.flush()


def _clean(i: int, t: int) -> int:
    return t


CASES: dict[str, tuple[Clock, dict[str, object]]] = {
    "jump": (lambda i, t: t + (3 * HOUR if i >= ANOMALY_AT else 0), {}),
    "reset": (lambda i, t: t - T0 + 5_000 if i >= ANOMALY_AT else t, {}),
    # a 48-bit counter that wraps inside window 2 (before and after: small offsets)
    "wrap": (lambda i, t: (t - T0 + (1 << 48) - WRAP_GAP) % (1 << 48), {}),
    "wrap_in_record": (lambda i, t: (t - T0 + (1 << 40) - WRAP_IN_RECORD) % (1 << 40), {}),
    "wrap64": (lambda i, t: (t - T0 - WRAP_GAP) % (1 << 64), {}),
    "reversed": (_clean, {"reversed_at": ANOMALY_AT}),
}
REASON = {c: "wrap" if c.startswith("wrap") else c for c in CASES}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_anomaly_is_corrected_or_left_out_and_counted(tmp_path: Path, case: str) -> None:
    clock, kw = CASES[case]
    clean = _windows(_ring(tmp_path / "clean", _clean))
    bad = _windows(_ring(tmp_path / "bad", clock, **kw))  # type: ignore[arg-type]
    assert [w.window for w in bad] == [w.window for w in clean]
    for a, b in zip(clean, bad, strict=True):
        # The medians over the window's steps are those of the clean clock (with two
        # steps a window, one bad step would move them: the anomaly's step is left out).
        assert math.isclose(b.gap_ms, a.gap_ms, rel_tol=1e-9), (b.window, b.gap_ms, a.gap_ms)
        assert math.isclose(b.coll_ms, a.coll_ms, rel_tol=1e-9), (b.window, b.coll_ms)
        assert math.isclose(b.step_ms, a.step_ms, rel_tol=1e-9), (b.window, b.step_ms)
        assert b.collectives == a.collectives
        counts = {r: getattr(b, f"clock_{r}") or 0 for r in ("reversed", "jump", "wrap", "reset")}
        want = {r: 0 for r in counts}
        if b.window == 2:
            want[REASON[case]] = 1
        assert counts == want, (b.window, counts)
    # A wrap is corrected exactly: even the quartiles of the anomaly's window agree.
    if case.startswith("wrap"):
        assert bad[2].gap_q1_ms == pytest.approx(clean[2].gap_q1_ms)


def test_without_the_check_a_jump_would_count_hours_of_compute(tmp_path: Path) -> None:
    """What the check prevents: the jump's gap is hours long (one step's worth)."""
    clock, _ = CASES["jump"]
    path = _ring(tmp_path, clock)
    with RingReader(path) as r:
        done = r.poll().done
    s, e = done["start"].astype(np.int64), done["end"].astype(np.int64)
    assert (s[1:] - e[:-1]).max() > 3 * HOUR - 1
    tl = device_timeline(
        done["start"], done["end"], done["enqueue_ns"], np.ones(len(done), bool), 1e9
    )
    assert tl.counts["jump"] == 1 and int(tl.broken.sum()) == 1
    assert int(np.diff(tl.start).max()) < 10**9


def test_a_real_pause_seen_by_the_host_clock_is_not_a_jump() -> None:
    """An hour between two collectives on both clocks (a checkpoint, an evaluation) is a
    long gap, not an anomaly."""
    start = np.array([T0, T0 + 2 * 10**6 + HOUR], dtype=np.uint64)
    end = start + np.uint64(10**6)
    enq = np.array([10**12, 10**12 + 2 * 10**6 + HOUR], dtype=np.uint64)
    tl = device_timeline(start, end, enq, np.ones(2, bool), 1e9)
    assert not any(tl.counts.values()) and not tl.broken.any()
    assert int(tl.start[1] - tl.end[0]) == HOUR + 10**6


def _cols(step: list[float], gap: list[float], clock: str = "device") -> WindowColumns:
    n = len(step)
    colls = {"coll_hi": 40, "collectives": 40, "coll_ms": 5.0}  # 40 collectives of 5 ms
    rows = [
        window_record(
            r, 3, steps=10, nranks=n, gap_ms=gap[r], step_ms=step[r], clock=clock, **colls
        )
        for r in range(n)
    ]
    return WindowColumns.from_records(rows)


def test_a_clock_at_the_wrong_rate_is_rescaled_to_its_peers_step_time() -> None:
    # Rank 5's clock runs 30% fast: all its durations are 1.3x. Rank 2 is really slow:
    # a longer gap, but the same step time as everyone (it waits in the collectives).
    step = [100.0] * 8
    gap = [60.0] * 8
    step[5], gap[5] = 130.0, 78.0
    gap[2] = 75.0
    fixed, rates = correct_rates(_cols(step, gap))
    assert rates == {5: pytest.approx(1 / 1.3)}
    assert fixed.floats("gap_ms").tolist() == pytest.approx([60, 60, 75, 60, 60, 60, 60, 60])
    assert fixed.floats("step_ms").tolist() == pytest.approx([100.0] * 8)
    assert fixed.floats("coll_ms")[5] == pytest.approx(5.0 / 1.3)


def test_rate_correction_needs_a_majority_and_leaves_agreeing_steps_alone() -> None:
    cols = _cols([100.0, 101.0, 99.0, 104.0], [60.0, 61.0, 59.0, 70.0])
    fixed, rates = correct_rates(cols)
    assert rates == {} and fixed is cols  # within the tolerance: a real slow rank stays
    # Two of four disagree: no majority, nothing is trusted, nothing rescaled.
    _, rates = correct_rates(_cols([100.0, 100.0, 130.0, 130.0], [60.0] * 4))
    assert rates == {}
    # The host clock runs at the true rate: a host-timed rank is never rescaled.
    _, rates = correct_rates(_cols([100.0, 100.0, 100.0, 130.0], [60.0] * 4, clock="host"))
    assert rates == {}
