"""Benchmark: scoring one window (1k / 16k / 100k ranks) and Detector.score_window.

Run with `python -m bench.scoring` (or through `python -m bench`). Prints the
median of several runs and the peak memory traced while scoring.
"""

from __future__ import annotations

import copy
import statistics
import time
import tracemalloc
from collections.abc import Callable

import msgpack
import numpy as np
from artemis.detect.detector import Detector
from artemis.detect.monitor import JobMonitor
from artemis.detect.scoring import score
from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import RankWindow

from bench._timing import median_s
from bench._windows import bench_window

RUNS = 7


def _fresh_s(det: Detector, window: object, runs: int = 5) -> float:
    """Median time of scoring window 7 on copies of `det` as it stood after window 6:
    scoring the same window again would read as a persistent change to the
    adaptive rule's change test (and track ever more ranks)."""
    copies = [copy.deepcopy(det) for _ in range(runs + 1)]
    times = []
    for d in copies:
        t0 = time.perf_counter()
        d.score_window(7, window)  # type: ignore[arg-type]
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _peak_mib(fn: Callable[[], object]) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def _records(n: int, window: int, rng: np.random.Generator) -> list[RankWindow]:
    gap = 100.0 * (1 + 0.01 * rng.standard_normal(n))
    gap[n // 3] *= 1.2
    isl = ["nvidia" if r < n // 2 else "amd" for r in range(n)]
    return [bench_window(r, window, gap, island=isl[r]) for r in range(n)]


def main() -> None:
    rng = np.random.default_rng(0)
    print("scoring.score: one window, leave-one-out ratio + robust z, 2 islands")
    print(f"{'ranks':>8} {'median ms':>10} {'peak MiB':>9} {'goal':>10}")
    for n in (1_000, 16_000, 100_000):
        gap = 100.0 * (1 + 0.01 * rng.standard_normal(n))
        gid = (np.arange(n) >= n // 2).astype(np.int64)
        t = median_s(lambda g=gap, i=gid: score(g, i), RUNS, warm=True)  # type: ignore[misc]
        mem = _peak_mib(lambda g=gap, i=gid: score(g, i))  # type: ignore[misc]
        goal = "<= 100 ms" if n == 100_000 else ""
        print(f"{n:>8} {t * 1e3:>10.2f} {mem:>9.1f} {goal:>10}")

    print()
    print("Detector.score_window on window columns (as the coordinator feeds it), after")
    print("warm-up; baseline: the same window given as RankWindow records (converted first);")
    print("JobMonitor.on_window adds the missing-rank rule; snapshot = its state to msgpack")
    print(
        f"{'ranks':>8} {'records ms':>11} {'columns ms':>11} {'ratio':>6} {'peak MiB':>9}"
        f" {'monitor ms':>11} {'snapshot ms':>12} {'MB':>5} {'seed-mode ms':>13}"
    )
    for n in (1_000, 16_000, 100_000):
        windows = [_records(n, w, rng) for w in range(8)]
        cols = [WindowColumns.from_records(x) for x in windows]
        det = Detector(Settings(), "bench", n)
        seed = Detector(Settings(mode="seed"), "bench", n)  # the seed's rule, same run
        mon = JobMonitor("bench", Settings(), nranks=n)
        for w in range(7):
            det.score_window(w, cols[w])
            seed.score_window(w, cols[w])
            mon.on_window(w, cols[w])
        last, lc = windows[7], cols[7]
        t_rec = _fresh_s(det, last)
        t_col = _fresh_s(det, lc)
        fresh = copy.deepcopy(det)
        mem = _peak_mib(lambda d=fresh, x=lc: d.score_window(7, x))  # type: ignore[misc]
        t_seed = _fresh_s(seed, lc)
        mons = [copy.deepcopy(mon) for _ in range(6)]
        t_mon = median_s(lambda m=mons, x=lc: _fresh_window(m.pop(), x), 5, warm=True)  # type: ignore[misc]
        blob = msgpack.packb(mon.snapshot(), use_bin_type=True)
        t_snap = median_s(lambda m=mon: msgpack.packb(m.snapshot()), 5, warm=True)  # type: ignore[misc]
        print(
            f"{n:>8} {t_rec * 1e3:>11.1f} {t_col * 1e3:>11.1f} {t_rec / t_col:>6.1f} {mem:>9.1f}"
            f" {t_mon * 1e3:>11.1f} {t_snap * 1e3:>12.1f} {len(blob) / 1e6:>5.1f}"
            f" {t_seed * 1e3:>13.1f}"
        )
    _coordinator_memory()
    _late_path()


def _kept_bytes(det: Detector) -> int:
    """Bytes the detector keeps for late summaries (arrays, and 64 B a string cell)."""
    total = 0
    for ref in det._late.values():
        total += ref.weight.nbytes + ref.pending.nbytes
        for v in ref.rows.cols.values():
            total += v.nbytes if isinstance(v, np.ndarray) else 64 * len(v)
    return total


def _late_path() -> None:
    """Late summaries (DETECTOR.md "Late summaries"): a window scored with one island
    (half the job) missing, then its late part; baseline: the same window on time."""
    print()
    print("Late summaries: window 7 scored with the second island missing (it keeps its")
    print("peers), then that island's late part (Detector.score_late); baseline: the same")
    print("window scored on time, same detector state")
    print(
        f"{'ranks':>8} {'on time ms':>11} {'w/ missing ms':>14} {'late part ms':>13}"
        f" {'kept rows':>10} {'kept KB':>8}"
    )
    rng = np.random.default_rng(2)
    for n in (1_000, 16_000, 100_000):
        cols = [WindowColumns.from_records(_records(n, w, rng)) for w in range(8)]
        det = Detector(Settings(), "bench", n)
        for w in range(7):
            det.score_window(w, cols[w])
        r = cols[7].ints("rank")
        here, away = np.flatnonzero(r < n // 2), np.flatnonzero(r >= n // 2)
        on_time = _fresh_s(det, cols[7])
        part, rest = cols[7].take(here), cols[7].take(away)
        missing = r[away].tolist()
        t_miss, t_late, kept_rows, kept = [], [], 0, 0
        for _ in range(5):
            d = copy.deepcopy(det)
            t0 = time.perf_counter()
            d.score_window(7, part, missing)
            t1 = time.perf_counter()
            kept_rows, kept = d._late[7].rows.n, _kept_bytes(d)
            d.score_late(7, rest)
            t2 = time.perf_counter()
            t_miss.append(t1 - t0)
            t_late.append(t2 - t1)
        print(
            f"{n:>8} {on_time * 1e3:>11.1f} {statistics.median(t_miss) * 1e3:>14.1f}"
            f" {statistics.median(t_late) * 1e3:>13.1f} {kept_rows:>10} {kept / 1024:>8.0f}"
        )


def _coordinator_memory() -> None:
    """Coordinator state per rank for one job: assembly, the JobMonitor, the metrics."""
    import tempfile
    from pathlib import Path

    from artemis.coordinator.metrics import Metrics
    from artemis.coordinator.service import Coordinator
    from artemis.coordinator.sinks import FindingsWriter
    from artemis.rebalance.outputs import PlansWriter

    print()
    print("Coordinator state per rank, one job, 8 windows scored (tracemalloc); baseline:")
    print("one window's columns (arrays and list slots; strings shared with the decoder)")
    print(
        f"{'ranks':>8} {'state B/rank':>13} {'peak B/rank':>12} {'window B/rank':>14} {'goal':>9}"
    )
    rng = np.random.default_rng(1)
    for n in (10_000, 100_000):
        cols = [WindowColumns.from_records(_records(n, w, rng)) for w in range(8)]
        tracemalloc.start()
        one = WindowColumns.concat([cols[0].take(np.arange(n))])
        window_bytes = tracemalloc.get_traced_memory()[0]
        del one
        tracemalloc.stop()
        tmp = Path(tempfile.mkdtemp())
        tracemalloc.start()
        c = Coordinator(
            Settings(), FindingsWriter(tmp / "f"), PlansWriter(tmp / "p"), Metrics(), grace_s=0.0
        )
        c.assembler.expect("bench", range(n))
        for w in range(8):
            for aw in c.assembler.add(cols[w], float(w)):
                c._score(aw)
        cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"{n:>8} {cur / n:>13.0f} {peak / n:>12.0f} {window_bytes / n:>14.0f} {'<= 2048':>9}")


def _fresh_window(m: JobMonitor, cols: WindowColumns) -> None:
    """One more window for the monitor (it refuses a window it already scored)."""
    m.last_window -= 1
    m.on_window(m.last_window + 1, cols)


if __name__ == "__main__":
    main()
