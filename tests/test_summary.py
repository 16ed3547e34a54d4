"""The agent's window summariser, period inference and progress.

Record streams are simulated here with barrier semantics: every collective ends
for all ranks at the same moment, ``transfer`` after the last rank arrived, and
each rank arrives ``compute`` after its previous collective ended. Expected
values are computed from the generator's inputs (compute and transfer times),
never from the timestamps the summariser reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from artemis.agent.progress import ProgressTracker, ring_position
from artemis.agent.summary import WindowSummarizer, infer_period
from artemis.protocol.records import RankWindow
from artemis.ring import format as rf
from artemis.ring.format import CLOCK_DEVICE_TICKS, STATE_DONE, STATE_IN_FLIGHT
from hypothesis import given, settings
from hypothesis import strategies as st

# The reader hands over records in the ring slot dtype; the CPU-slot dtype is a
# superset (tests below feed both).
SLOT_DT = rf.SLOT_DTYPE

AR, AG, RS = 1, 2, 3
MB = 1 << 20
PATTERN = [(AR, 25 * MB), (AR, 25 * MB), (AR, 10 * MB), (AR, 3 * MB)]  # C = 4


def simulate(
    steps: int,
    pattern: list[tuple[int, int]],
    compute: np.ndarray,  # (nranks, steps, C) integer ns before each collective
    transfer: np.ndarray,  # (steps, C) integer ns
    offsets: list[int],  # per-rank clock offset (ns or ticks)
    clock: int = 1,
    unit: float = 1.0,  # timestamp units per ns (ticks)
) -> list[np.ndarray]:
    """Per-rank DONE records of a synchronous job (barrier at every collective)."""
    nranks = compute.shape[0]
    c = len(pattern)
    n = steps * c
    comp = compute.reshape(nranks, n)
    tr = transfer.reshape(n)
    starts = np.zeros((nranks, n), dtype=np.int64)
    ends = np.zeros(n, dtype=np.int64)
    prev_end = np.zeros(nranks, dtype=np.int64)
    for i in range(n):
        starts[:, i] = prev_end + comp[:, i]
        ends[i] = starts[:, i].max() + tr[i]
        prev_end[:] = ends[i]
    out = []
    for r in range(nranks):
        rec = np.zeros(n, dtype=SLOT_DT)
        rec["kind"] = 1
        rec["state"] = STATE_DONE
        rec["clock"] = clock
        rec["peer"] = -1
        rec["seq"] = np.arange(n)
        rec["coll_seq"] = np.arange(n)
        rec["func"] = [pattern[i % c][0] for i in range(n)]
        rec["bytes"] = [pattern[i % c][1] for i in range(n)]
        rec["start"] = np.round(starts[r] * unit).astype(np.int64) + offsets[r]
        rec["end"] = np.round(ends * unit).astype(np.int64) + offsets[r]
        out.append(rec)
    return out


def feed_in_polls(
    s: WindowSummarizer, rec: np.ndarray, chunk: int, rng: np.random.Generator | None = None
) -> list[RankWindow]:
    wins = []
    for i in range(0, rec.size, chunk):
        part = rec[i : i + chunk].copy()
        if rng is not None:
            rng.shuffle(part)
        s.feed(part)
        wins += s.take_windows()
    return wins


def summarizer(rank: int = 0, **kw: Any) -> WindowSummarizer:
    kw.setdefault("window_steps", 50)
    return WindowSummarizer("job", "00000000deadbeef", rank, 4, "node-a", **kw)


def expected_gap_ms(comp_r: np.ndarray, present: np.ndarray, w: int, W: int) -> float:
    """Median over whole steps of a window of the per-step compute sum (ms)."""
    steps, c = comp_r.shape
    flat_present = present.reshape(-1)
    vals = []
    for k in range(w * W, min((w + 1) * W, steps)):
        idx = range(k * c - 1, k * c + c)  # needs the previous step's last record too
        if min(idx) < 0 or not all(flat_present[i] for i in idx):
            continue
        vals.append(comp_r[k].sum() / 1e6)
    return float(np.median(vals))


# ---------------------------------------------------------------------------
# infer_period


def _minimal_cyclic_period(pat: list[tuple[int, int]]) -> int:
    p = len(pat)
    for d in range(1, p + 1):
        if p % d == 0 and all(pat[i] == pat[(i + d) % p] for i in range(p)):
            return d
    return p


def _seq(pattern: list[tuple[int, int]], n: int, phase: int = 0) -> tuple[np.ndarray, np.ndarray]:
    items = [pattern[(i + phase) % len(pattern)] for i in range(n)]
    return np.array([f for f, _ in items]), np.array([b for _, b in items])


def test_period_of_mixed_buckets() -> None:
    f, b = _seq(PATTERN, 200)
    assert infer_period(f, b) == 4


def test_period_with_reduce_scatter_and_all_gather() -> None:
    # ZeRO-like: reduce-scatter of 3 buckets then all-gather of the same 3 sizes
    sizes = [40 * MB, 40 * MB, 12 * MB]
    pattern = [(RS, s) for s in sizes] + [(AG, s) for s in sizes]
    f, b = _seq(pattern, 300, phase=2)
    assert infer_period(f, b) == 6
    # the same stream without the all-gathers has period 3
    f2, b2 = _seq(pattern[:3], 300)
    assert infer_period(f2, b2) == 3


def test_function_alone_distinguishes_equal_sizes() -> None:
    pattern = [(RS, 8 * MB), (AG, 8 * MB)]
    f, b = _seq(pattern, 200)
    assert infer_period(f, b) == 2


def test_period_none_until_enough_records() -> None:
    max_period = 16
    p = len(PATTERN)
    need = max(3 * p, p + 2 * max_period)
    f, b = _seq(PATTERN, need - 1)
    assert infer_period(f, b, max_period=max_period) is None
    f, b = _seq(PATTERN, need)
    assert infer_period(f, b, max_period=max_period) == p


def test_long_period_not_mistaken_for_its_repeated_prefix() -> None:
    # 39 identical all-reduces then an all-gather: period 40, not 1
    pattern = [(AR, 4 * MB)] * 39 + [(AG, MB)]
    f, b = _seq(pattern, 40 + 2 * 64)
    assert infer_period(f, b) == 40


def test_identical_collectives_have_period_one() -> None:
    f, b = _seq([(AR, MB)], 200)
    assert infer_period(f, b) == 1


def test_period_survives_lost_entries_and_one_extra_collective() -> None:
    rng = np.random.default_rng(3)
    f, b = _seq(PATTERN, 2000)
    f[rng.choice(2000, 100, replace=False)] = -1  # lost
    assert infer_period(f, b) == 4
    # one stray collective inserted (e.g. a one-off barrier)
    f = np.insert(f, 1000, AG)
    b = np.insert(b, 1000, 8)
    assert infer_period(f, b) == 4


def test_no_period_in_noise() -> None:
    rng = np.random.default_rng(0)
    f = rng.integers(1, 4, 400)
    b = rng.integers(1, 5, 400)
    assert infer_period(f, b) is None


@settings(max_examples=60, deadline=None)
@given(
    pat=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4)), min_size=1, max_size=12),
    phase=st.integers(0, 11),
    extra=st.integers(0, 30),
)
def test_period_property(pat: list[tuple[int, int]], phase: int, extra: int) -> None:
    # sizes of gradient buckets, above CONTROL_BYTES (the filter's own test is below)
    pat = [(f, b * 1024) for f, b in pat]
    max_period = 16
    n = len(pat) + 2 * max_period + extra + 3 * len(pat)
    f, b = _seq(pat, n, phase)
    assert infer_period(f, b, max_period=max_period) == _minimal_cyclic_period(pat)


def _with_control(
    pattern: list[tuple[int, int]], steps: int, every: dict[int, tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` repeats of ``pattern``, with control collective ``every[k]`` after each
    k-th step (a loss all-reduced every k steps, a barrier every 100)."""
    items: list[tuple[int, int]] = []
    for step in range(steps):
        items += pattern
        items += [c for k, c in sorted(every.items()) if step % k == k - 1]
    return np.array([f for f, _ in items]), np.array([b for _, b in items])


@pytest.mark.parametrize(
    "pattern",
    [[(AR, 4 * MB)], [(AR, 25 * MB), (AR, 25 * MB), (AR, 3 * MB)], [(RS, 8 * MB), (AG, 8 * MB)]],
)
def test_a_script_s_own_reductions_leave_the_step_s_period(pattern: list[tuple[int, int]]) -> None:
    """A loss all-reduced every 10 steps and a barrier every 100: the buckets' period.
    Before, a one-bucket job's stream had none (every 10 steps: period 11, broken at
    each barrier) and it was never scored."""
    f, b = _with_control(pattern, 400, {10: (AR, 4), 100: (AR, 0)})
    assert infer_period(f, b) == _minimal_cyclic_period(pattern)
    # its start-up's broadcasts and a metric every 7 steps, beside the loss
    f, b = _with_control(pattern, 400, {7: (AR, 16), 10: (AR, 4)})
    assert infer_period(f, b) == _minimal_cyclic_period(pattern)


def test_a_small_reduction_every_step_or_every_other_stays_in_the_step() -> None:
    # a loss all-reduced every step is part of the step; every other step, of two
    f, b = _with_control([(AR, 4 * MB)], 300, {1: (AR, 4)})
    assert infer_period(f, b) == 2
    f, b = _with_control([(AR, 4 * MB)], 300, {2: (AR, 4)})
    assert infer_period(f, b) == 3
    # a rare collective that is not small is the step's (a bucket in every 5th step)
    f, b = _with_control([(AR, 4 * MB)], 400, {5: (AR, 2 * MB)})
    assert infer_period(f, b) == 6


# ---------------------------------------------------------------------------
# WindowSummarizer


def _job(rng: np.random.Generator, steps: int, nranks: int = 4) -> tuple[np.ndarray, np.ndarray]:
    c = len(PATTERN)
    compute = rng.integers(2_000_000, 3_000_000, (nranks, steps, c))  # 2-3 ms
    compute[:, :, 0] += 20_000_000  # forward pass + data before the first bucket
    transfer = rng.integers(500_000, 1_500_000, (steps, c))
    return compute, transfer


def test_slow_rank_gap_exceeds_peers_by_its_extra_compute() -> None:
    rng = np.random.default_rng(1)
    steps, W = 150, 50
    compute, transfer = _job(rng, steps)
    extra_ms = 7.5
    compute_slow = compute.copy()
    compute_slow[2, :, 0] += int(extra_ms * 1e6)
    offsets = [0, 1_700_000_000_000_000_000, 123_456_789, 5_000_000_000_000]
    recs_fast = simulate(steps, PATTERN, compute, transfer, offsets)
    recs_slow = simulate(steps, PATTERN, compute_slow, transfer, offsets)
    present = np.ones((steps, 4), dtype=bool)
    for r in range(4):
        s_f, s_s = summarizer(r), summarizer(r)
        wf = feed_in_polls(s_f, recs_fast[r], 37) + s_f.flush()
        ws = feed_in_polls(s_s, recs_slow[r], 37) + s_s.flush()
        assert [w.window for w in ws] == [0, 1, 2]
        for w_f, w_s in zip(wf, ws, strict=True):
            assert w_f.gap_ms == pytest.approx(
                expected_gap_ms(compute[r], present, w_f.window, W), abs=1e-6
            )
            if r == 2:
                assert w_s.gap_ms - w_f.gap_ms == pytest.approx(extra_ms, abs=1e-6)
            assert w_s.clock == "device" and w_s.lost == 0
            assert w_s.collectives == W * 4 and w_s.bytes == W * sum(b for _, b in PATTERN)


def test_step_and_coll_ms_from_barrier_semantics() -> None:
    rng = np.random.default_rng(2)
    steps, W = 100, 50
    compute, transfer = _job(rng, steps)
    recs = simulate(steps, PATTERN, compute, transfer, [0, 10, 20, 30])
    # independent expectation: arrival = max over ranks of compute; step time =
    # sum over collectives of (latest arrival's compute + transfer)
    step_time = (compute.max(axis=0) + transfer).sum(axis=1) / 1e6  # (steps,)
    coll_time = (compute.max(axis=0)[None] - compute + transfer[None]).sum(axis=2) / 1e6
    wins = [feed_in_polls(summarizer(r), recs[r], 64) for r in range(4)]
    for r in range(4):
        w1 = wins[r][0]
        assert w1.window == 0
        # step 0 has no previous step's last collective: steps 1..49 only
        assert w1.step_ms == pytest.approx(float(np.median(step_time[1:W])), abs=1e-6)
        # step 0 is whole for durations (no previous record needed)
        assert w1.coll_ms == pytest.approx(float(np.median(coll_time[r, :W])), abs=1e-6)
        # every rank's gap + wait adds up to the same step
        assert w1.step_ms == pytest.approx(wins[0][0].step_ms)


def test_windows_align_by_coll_seq_across_ranks_and_poll_sizes() -> None:
    rng = np.random.default_rng(4)
    steps = 130
    compute, transfer = _job(rng, steps)
    recs = simulate(steps, PATTERN, compute, transfer, [7, 10**18, 3, 10**12])
    got = []
    for r, chunk in zip(range(4), [1, 17, 200, 999], strict=True):
        s = summarizer(r)
        got.append(
            [
                (w.window, w.step_lo, w.step_hi, w.coll_lo, w.coll_hi)
                for w in feed_in_polls(s, recs[r], chunk) + s.flush()
            ]
        )
    assert got[0] == got[1] == got[2] == got[3]
    assert got[0] == [(0, 0, 50, 0, 200), (1, 50, 100, 200, 400), (2, 100, 130, 400, 520)]


def test_cpu_slot_records_give_the_same_windows() -> None:
    # A ring with 128-byte CPU slots hands over a wider dtype: same windows.
    rng = np.random.default_rng(4)
    compute, transfer = _job(rng, 120, nranks=1)
    rec = simulate(120, PATTERN, compute, transfer, [0])[0]
    wide = np.zeros(rec.size, dtype=rf.SLOT_CPU_DTYPE)
    for name in rec.dtype.names or ():
        wide[name] = rec[name]
    wide["cpu_start_ns"], wide["cpu_end_ns"] = rec["start"], rec["end"]
    s1, s2 = summarizer(), summarizer()
    base = feed_in_polls(s1, rec, 37) + s1.flush()
    cpu = feed_in_polls(s2, wide, 37) + s2.flush()
    assert len(base) == 3 and base == cpu


def test_window_waits_for_records_past_its_end() -> None:
    rng = np.random.default_rng(5)
    compute, transfer = _job(rng, 60, nranks=1)
    rec = simulate(60, PATTERN, compute, transfer, [0])[0]
    s = summarizer(colls_per_step=4)
    s.feed(rec[:200])  # exactly window 0
    assert s.take_windows() == []
    s.feed(rec[200:203])  # not yet a whole step past the end
    assert s.take_windows() == []
    s.feed(rec[203:204])
    assert [w.window for w in s.take_windows()] == [0]


def test_out_of_order_completion_gives_the_same_windows() -> None:
    rng = np.random.default_rng(6)
    steps = 120
    compute, transfer = _job(rng, steps, nranks=1)
    rec = simulate(steps, PATTERN, compute, transfer, [99])[0]
    s1 = summarizer()
    ordered = feed_in_polls(s1, rec, 50) + s1.flush()
    s2 = summarizer()
    # shuffle within polls and swap neighbours across poll borders
    swapped = rec.copy()
    for i in range(49, steps * 4 - 1, 50):
        swapped[[i, i + 1]] = swapped[[i + 1, i]]
    shuffled = feed_in_polls(s2, swapped, 50, rng) + s2.flush()
    assert shuffled == ordered


def test_lost_records_are_counted_and_timing_uses_whole_steps() -> None:
    rng = np.random.default_rng(7)
    steps, W = 100, 50
    compute, transfer = _job(rng, steps, nranks=1)
    rec = simulate(steps, PATTERN, compute, transfer, [0])[0]
    drop = np.array([13, 14, 55, 203, 211, 250, 398])
    present = np.ones(steps * 4, dtype=bool)
    present[drop] = False
    s = summarizer(colls_per_step=4)
    wins = feed_in_polls(s, rec[present], 40) + s.flush()
    assert [w.lost for w in wins] == [3, 4]
    assert [w.collectives for w in wins] == [197, 196]
    for w in wins:
        assert w.gap_ms == pytest.approx(
            expected_gap_ms(compute[0], present.reshape(steps, 4), w.window, W), abs=1e-6
        )


def test_reader_losses_not_explained_by_gaps_are_added_once() -> None:
    rng = np.random.default_rng(8)
    compute, transfer = _job(rng, 100, nranks=1)
    rec = simulate(100, PATTERN, compute, transfer, [0])[0]
    keep = np.ones(400, dtype=bool)
    keep[[10, 20, 30]] = False  # three collectives lost ...
    for reported, total in [(5, 5), (2, 3)]:  # ... among `reported` records the reader lost
        s = summarizer(colls_per_step=4)
        s.feed(rec[keep][:150])
        s.add_lost(reported)
        s.feed(rec[keep][150:])
        wins = s.take_windows() + s.flush()
        assert sum(w.lost for w in wins) == total


def test_agent_attaching_late_starts_at_the_window_of_its_first_record() -> None:
    rng = np.random.default_rng(9)
    compute, transfer = _job(rng, 200, nranks=1)
    rec = simulate(200, PATTERN, compute, transfer, [0])[0]
    s = summarizer()
    wins = feed_in_polls(s, rec[537:], 64) + s.flush()
    assert [w.window for w in wins] == [2, 3]
    assert wins[0].coll_lo == 400 and wins[0].lost == 537 - 400
    assert wins[1].lost == 0


def test_device_ticks_are_converted_with_tick_hz() -> None:
    rng = np.random.default_rng(10)
    steps, W = 60, 50
    compute, transfer = _job(rng, steps, nranks=1)
    hz = 100e6  # 100 MHz: one tick = 10 ns
    compute = compute // 10 * 10  # whole ticks, so the expectation is exact
    transfer = transfer // 10 * 10
    rec = simulate(steps, PATTERN, compute, transfer, [12345], unit=hz / 1e9)
    present = np.ones((steps, 4), dtype=bool)
    s = summarizer(clock_kind=CLOCK_DEVICE_TICKS, tick_hz=hz)
    w = feed_in_polls(s, rec[0], 100)[0]
    assert w.clock == "device"
    assert w.gap_ms == pytest.approx(expected_gap_ms(compute[0], present, 0, W), abs=1e-6)
    # the reader's header names the clock by string; tick_hz alone implies ticks
    for kw in ({"clock_kind": "device_ticks", "tick_hz": hz}, {"tick_hz": hz}):
        assert feed_in_polls(summarizer(**kw), rec[0], 100)[0] == w
    s2 = summarizer(clock_kind=CLOCK_DEVICE_TICKS)
    w2 = feed_in_polls(s2, rec[0], 100)[0]
    assert w2.clock == "ticks"
    # unknown rate: raw ticks / 1e6
    assert w2.gap_ms == pytest.approx(w.gap_ms * hz / 1e9, rel=1e-9)


def test_host_clock_records() -> None:
    rng = np.random.default_rng(11)
    compute, transfer = _job(rng, 60, nranks=1)
    rec = simulate(60, PATTERN, compute, transfer, [0], clock=0)[0]
    s = summarizer(clock_kind=CLOCK_DEVICE_TICKS, tick_hz=1e8)
    w = feed_in_polls(s, rec, 100)[0]
    assert w.clock == "host"
    assert w.gap_ms == pytest.approx(
        expected_gap_ms(compute[0], np.ones((60, 4), bool), 0, 50), abs=1e-6
    )


def test_bridge_records_give_bridge_ms_and_peer() -> None:
    rng = np.random.default_rng(12)
    steps, c = 100, 4
    compute, transfer = _job(rng, steps, nranks=1)
    rec = simulate(steps, PATTERN, compute, transfer, [0])[0]
    # one bridge per step after the step's collectives, on the host clock
    dur = rng.integers(1_000_000, 4_000_000, steps)
    br = np.zeros(steps, dtype=SLOT_DT)
    br["kind"], br["state"], br["clock"], br["peer"] = 3, STATE_DONE, 0, 1
    br["coll_seq"] = (np.arange(steps) + 1) * c
    br["start"] = 10**9 + np.arange(steps) * 10**8
    br["end"] = br["start"] + dur
    p2p = rec[:10].copy()
    p2p["kind"] = 2  # ignored
    s = summarizer(colls_per_step=c)
    s.feed(np.concatenate([rec, br, p2p]))
    wins = s.flush()
    for w in wins:
        # bridge with coll_seq in [coll_lo, coll_hi): steps whose index k+1 is in the window
        sel = (br["coll_seq"] >= w.coll_lo) & (br["coll_seq"] < w.coll_hi)
        assert w.bridge_ms == pytest.approx(float(np.median(dur[sel])) / 1e6)
        assert w.bridge_peer == 1
    assert sum(w.collectives for w in wins) == steps * c


def test_in_flight_records_are_ignored() -> None:
    rng = np.random.default_rng(13)
    compute, transfer = _job(rng, 60, nranks=1)
    rec = simulate(60, PATTERN, compute, transfer, [0])[0]
    junk = rec[100:110].copy()
    junk["state"] = STATE_IN_FLIGHT
    junk["end"] = 0
    s1, s2 = summarizer(), summarizer()
    s1.feed(rec)
    s2.feed(np.concatenate([junk, rec]))
    assert s1.flush() == s2.flush()


def test_no_window_before_the_period_is_known() -> None:
    rng = np.random.default_rng(14)
    compute, transfer = _job(rng, 60, nranks=1)
    rec = simulate(60, PATTERN, compute, transfer, [0])[0]
    s = summarizer(window_steps=5)
    s.feed(rec[:100])  # 100 < 4 + 2 * 64: period still unknown
    assert s.colls_per_step is None and s.take_windows() == []
    s.feed(rec[100:])
    assert s.colls_per_step == 4
    assert [w.window for w in s.take_windows()] == list(range(11))


# ---------------------------------------------------------------------------
# ring_position, ProgressTracker


def _records(seqs: Sequence[int] | range, state: int = STATE_DONE, kind: int = 1) -> np.ndarray:
    r = np.zeros(len(seqs), dtype=SLOT_DT)
    r["seq"] = seqs
    r["coll_seq"] = seqs
    r["state"] = state
    r["kind"] = kind
    return r


def test_ring_position() -> None:
    done = _records([3, 4, 5])
    infl = _records([6, 7], state=STATE_IN_FLIGHT)
    assert ring_position(done, infl) == (5, 6)
    assert ring_position(_records([]), _records([])) == (-1, None)
    assert ring_position(_records([]), infl, last_done=6) == (6, 7)


def test_progress_tracker_times() -> None:
    t = ProgressTracker("job", "c", 3, "node-a")
    p = t.observe(100.0, 9, 10)
    assert (p.last_done, p.inflight, p.inflight_s, p.idle_s) == (9, 10, 0.0, 0.0)
    p = t.observe(104.5, 9, 10)
    assert (p.inflight_s, p.idle_s) == (4.5, 4.5)
    p = t.observe(106.0, 10, 11)  # progress: both clocks restart
    assert (p.inflight_s, p.idle_s) == (0.0, 0.0)
    p = t.observe(107.0, 11, None)
    assert (p.inflight, p.inflight_s, p.idle_s) == (None, 0.0, 0.0)
    p = t.observe(110.0, 11, None, finished=True)
    assert p.idle_s == 3.0 and p.finished
    # ring index changes alone (p2p traffic) count as activity
    p = t.observe(111.0, 11, None, ring_index=5)
    assert p.idle_s == 0.0
    p = t.update(112.0, _records([12]), _records([13], state=STATE_IN_FLIGHT), ring_index=5)
    assert (p.last_done, p.inflight) == (12, 13)


def test_progress_tracker_changed_flag_and_current() -> None:
    t = ProgressTracker("job", "c", 0, "node-a")
    assert t.current().last_done == -1 and t.current().inflight is None
    t.observe(10.0, None, 5)
    p = t.observe(13.0, None, 5)
    assert (p.last_done, p.inflight_s, p.idle_s) == (-1, 3.0, 3.0)
    p = t.observe(14.0, None, 5, changed=True)  # e.g. p2p records polled
    assert (p.inflight_s, p.idle_s) == (4.0, 0.0)
    assert t.current() == p


def test_a_step_longer_than_max_period_is_found_with_more_data() -> None:
    """FSDP over 48 layers: an all-gather a layer forward, an all-gather and a
    reduce-scatter a layer backward, around the embedding's: 146 collectives a step,
    past max_period (64). The summariser finds them once 146 + 2 x 8 x 64 are in (what
    rules out every longer step up to 8 x 64), and cuts windows of 146 x window_steps;
    a one-bucket job is still found within 3 x 64."""
    layer = 6 * MB
    pattern = [(AG, 40 * MB)] + [(AG, layer)] * 48
    pattern += [c for _ in range(48) for c in ((AG, layer), (RS, layer))] + [(RS, 40 * MB)]
    assert len(pattern) == 146 and _minimal_cyclic_period(pattern) == 146
    steps = 40
    rng = np.random.default_rng(3)
    compute = rng.integers(100_000, 200_000, (1, steps, len(pattern)))
    transfer = rng.integers(50_000, 100_000, (steps, len(pattern)))
    (rec,) = simulate(steps, pattern, compute, transfer, [0])
    need = 146 + 2 * 8 * 64
    s = summarizer(window_steps=10)
    wins = feed_in_polls(s, rec[: need - 30], 10)
    assert wins == [] and s.colls_per_step is None  # the short steps ruled out, not yet
    wins += feed_in_polls(s, rec[need - 30 :], 10)
    assert s.colls_per_step == 146 and len(wins) >= 2, (s.colls_per_step, len(wins))
    assert all(w.step_hi - w.step_lo == 10 for w in wins[:-1])
    assert not s.patternless
    # a stream of one size a step (DDP, one bucket) is found at once
    one = summarizer(window_steps=10)
    c1 = rng.integers(100_000, 200_000, (1, 300, 1))
    (rec1,) = simulate(300, [(AR, 4 * MB)], c1, rng.integers(50_000, 100_000, (300, 1)), [0])
    feed_in_polls(one, rec1[: 3 * 64 + 2], 16)
    assert one.colls_per_step == 1


def test_a_stream_with_no_step_is_called_patternless_after_the_long_search() -> None:
    rng = np.random.default_rng(5)
    n = 4 * 8 * 64 + 64
    pattern = [(AR, int(b)) for b in rng.integers(1, 64, n) * MB]  # a new size each time
    (rec,) = simulate(
        1, pattern, rng.integers(1, 9, (1, 1, n)) * 100_000, np.full((1, n), 50_000), [0]
    )
    s = summarizer()
    feed_in_polls(s, rec[: 4 * 8 * 64 - 64], 64)
    assert s.colls_per_step is None and not s.patternless
    feed_in_polls(s, rec[4 * 8 * 64 - 64 :], 64)
    assert s.colls_per_step is None and s.patternless
