"""Baselines across jobs: what comparing with the stored baseline adds to a window.

`JobMonitor.on_window` on the same window columns, after warm-up, with the
job's baselines off (the baseline of this table, measured in the same run: a
coordinator without a store, the in-process detector) and on (the job
identified, its two hardware classes settled with a stored baseline each, so
every window is judged against them and its values wait for confirmation).
The job: two islands of two GPU classes, per-step gap quartiles in every row
(as the agent sends them), 50-step windows. Also `window_stats` alone (the
per-class medians; also for a job of one class), and the size of the baselines' part of the monitor's
snapshot after 200 windows (it is bounded: a few floats per window kept).
Median of 5 runs, off and on in turn.
"""

from __future__ import annotations

import copy
import statistics

import msgpack
import numpy as np
from artemis.detect.baselines import Baseline, WindowStats, window_stats
from artemis.detect.monitor import JobMonitor
from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowColumns

from bench._timing import median_s
from bench._windows import bench_window

RUNS = 5
SIZES = (1_000, 16_000, 100_000)


def _cols(n: int, window: int, rng: np.random.Generator, classes: int = 2) -> WindowColumns:
    gap = 100.0 * (1 + 0.01 * rng.standard_normal(n))
    recs = [
        bench_window(
            r,
            window,
            gap,
            island="nvidia" if r < n // 2 else "amd",
            hw_class="H100" if r < n // 2 or classes == 1 else "MI300X",
            gap_q1_ms=float(gap[r]) * 0.98,
            gap_q2_ms=float(gap[r]),
            gap_q3_ms=float(gap[r]) * 1.02,
        )
        for r in range(n)
    ]
    return WindowColumns.from_records(recs)


def _stored(cls: str) -> dict[str, object]:
    b = Baseline("w", cls, {"driver": "1"}, "h1")
    b.add([WindowStats(w, 110.0, 98.0, 100.0, 99.0, 101.0) for w in range(6, 60)], "old", "r")
    return b.to_record()


def _fresh(m: JobMonitor, cols: WindowColumns) -> None:
    """One more window for the monitor (it refuses a window it already scored)."""
    m.last_window -= 1
    m.on_window(m.last_window + 1, cols)


def main() -> None:
    rng = np.random.default_rng(13)
    print("JobMonitor.on_window with the job's baselines off (baseline, same run) and on")
    print("(two classes judged against their stored baselines); window_stats alone; the")
    print("baselines' share of the monitor's snapshot after 200 windows")
    print(
        f"{'ranks':>8} {'off ms':>8} {'on ms':>8} {'added ms':>9} {'ratio':>6}"
        f" {'window_stats ms':>16} {'(one class)':>12} {'snapshot KB':>12}"
    )
    for n in SIZES:
        cols = [_cols(n, w, rng) for w in range(8)]
        on = JobMonitor("bench", Settings(), nranks=n)
        off = JobMonitor("bench", Settings(), nranks=n)
        off.baselines.enabled = False
        on.baselines.identify("w", {"driver": "2"})
        for cls in ("H100", "MI300X"):
            on.on_baselines(cls, _stored(cls), None)
        for w in range(8):
            on.on_window(w, cols[w])
            off.on_window(w, cols[w])
        last = cols[7]
        ons = [copy.deepcopy(on) for _ in range(RUNS)]
        offs = [copy.deepcopy(off) for _ in range(RUNS)]
        # off and on in turn, so a change of the machine's load hits both alike
        t_offs, t_ons = [], []
        for _ in range(RUNS):
            t_offs.append(median_s(lambda m=offs, x=last: _fresh(m.pop(), x), 1))  # type: ignore[misc]
            t_ons.append(median_s(lambda m=ons, x=last: _fresh(m.pop(), x), 1))  # type: ignore[misc]
        t_off, t_on = statistics.median(t_offs), statistics.median(t_ons)
        t_ws = median_s(lambda x=last: window_stats(7, x, 110.0), RUNS)  # type: ignore[misc]
        one = _cols(n, 7, rng, classes=1)
        t_ws1 = median_s(lambda x=one: window_stats(7, x, 110.0), RUNS)  # type: ignore[misc]
        b = on.baselines
        for w in range(8, 200):  # the per-window values only (bounded), not the scoring
            b.on_window(w, last, 110.0)
            b.after_window(w, healthy=True)
        kb = len(msgpack.packb(b.snapshot(), use_bin_type=True)) / 1e3
        print(
            f"{n:>8} {t_off * 1e3:>8.1f} {t_on * 1e3:>8.1f} {(t_on - t_off) * 1e3:>9.1f}"
            f" {t_on / t_off:>6.2f} {t_ws * 1e3:>16.1f} {t_ws1 * 1e3:>12.1f} {kb:>12.1f}"
        )


if __name__ == "__main__":
    main()
