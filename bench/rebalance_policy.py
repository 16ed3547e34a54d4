"""The rebalance policy at scale: cost per window, cost of a plan, memory, snapshot size.

A synthetic job of N ranks (every rank 32 samples per step, compute gap 32 ms with
noise, rank 2 at 45 ms and flagged every window) is fed to ``RebalancePolicy`` in
apply mode, with every rank acking each plan at once. Per N:

* window (arrays): median ``on_window`` time over the windows that made no plan
  event, the window's columns given as float arrays (what the per-job core has);
* window (mappings): the same windows given as dicts rank -> value (the shape the
  coordinator's service passed before the columnar batch): the baseline, measured in
  the same run; the ratio is mappings / arrays;
* plan window: ``on_window`` time of the window that computed and sent the plan
  (per-sample speeds over 4 windows, the proportional split, the event and control);
* memory: bytes per rank held by the policy once its history is full
  (tracemalloc, after the windows, in one extra run: tracing slows allocation, so
  the timed runs are not traced);
* snapshot: JSON bytes per rank, and the time of snapshot + json round trip + restore;
  the same through msgpack with ``snapshot(binary=True)`` (arrays as raw bytes).

Every figure is the median over RUNS runs.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
from artemis.rebalance.policy import PolicySettings, RebalancePolicy

SIZES = (64, 1_000, 10_000, 100_000)
RUNS = 3
WINDOWS = 12


@dataclass
class Run:
    window_s: float
    plan_s: float
    bytes_per_rank: float
    snap_bytes_per_rank: float
    snap_s: float
    snap_msgpack_s: float


def _feed(n: int, arrays: bool, seed: int, trace: bool = False) -> Run:
    """One run; ``trace`` measures memory (tracemalloc slows every allocation, so the
    timed runs do not trace)."""
    rng = np.random.default_rng(seed)
    gaps = [32.0 + rng.random(n) for _ in range(WINDOWS)]
    for g in gaps:
        g[2] = 45.0
    samples = np.full(n, 32.0)
    inputs: list[tuple[Any, Any]]
    if arrays:
        inputs = [(g, samples) for g in gaps]
    else:
        inputs = [
            ({r: float(v) for r, v in enumerate(g.tolist())}, dict.fromkeys(range(n), 32))
            for g in gaps
        ]
    flagged = [("rank", "flagged", 2)]
    gc.collect()
    if trace:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0] if trace else 0
    pol = RebalancePolicy(PolicySettings(mode="apply", window_steps=50), n, 32 * n, job="bench")
    quiet: list[float] = []
    plan: list[float] = []
    for w, (gap, smp) in enumerate(inputs):
        t0 = time.perf_counter()
        evs = pol.on_window(w, flagged, gap, 50.0, smp)
        dt = time.perf_counter() - t0
        sent = any(e.control is not None and e.status == "recommended" for e in evs)
        (plan if sent else quiet if not evs else []).append(dt)
        for e in evs:
            if e.control is not None and e.status == "recommended":
                for r in range(n):
                    pol.on_ack(e.control["id"], r, e.control["apply_at_step"])
    held = tracemalloc.get_traced_memory()[0] - base if trace else 0
    if trace:
        tracemalloc.stop()
    t0 = time.perf_counter()
    text = json.dumps(pol.snapshot(), allow_nan=False)
    RebalancePolicy.restore(json.loads(text))
    snap_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    packed = msgpack.packb(pol.snapshot(binary=True))
    RebalancePolicy.restore(msgpack.unpackb(packed, strict_map_key=False))
    snap_msgpack_s = time.perf_counter() - t0
    return Run(
        window_s=statistics.median(quiet),
        plan_s=statistics.median(plan) if plan else float("nan"),
        bytes_per_rank=held / n,
        snap_bytes_per_rank=len(text) / n,
        snap_s=snap_s,
        snap_msgpack_s=snap_msgpack_s,
    )


def main() -> int:
    print(
        f"{'ranks':>8} {'window arrays':>14} {'window maps':>12} {'ratio':>6} "
        f"{'plan window':>12} {'policy B/rank':>14} {'snapshot B/rank':>16} {'json rt':>10} {'msgpack rt':>11}"
    )
    for n in SIZES:
        arr = [_feed(n, True, s) for s in range(RUNS)]
        maps = [_feed(n, False, s) for s in range(RUNS)]
        mem = _feed(n, True, 0, trace=True).bytes_per_rank
        wa = statistics.median(r.window_s for r in arr)
        wm = statistics.median(r.window_s for r in maps)
        print(
            f"{n:>8} {1e3 * wa:>11.3f} ms {1e3 * wm:>9.3f} ms {wm / wa:>6.1f} "
            f"{1e3 * statistics.median(r.plan_s for r in arr):>9.1f} ms "
            f"{mem:>14.0f} "
            f"{statistics.median(r.snap_bytes_per_rank for r in arr):>16.0f} "
            f"{1e3 * statistics.median(r.snap_s for r in arr):>7.1f} ms "
            f"{1e3 * statistics.median(r.snap_msgpack_s for r in arr):>8.1f} ms",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
