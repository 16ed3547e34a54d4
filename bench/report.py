"""The incident report at scale: page size and render time against job size.

A synthetic job of W windows and N ranks (gap ratios around 1.0, rank 2 at 1.15
from window W/4 on) with 10 incidents, one of them as long as the job. Per size:

* bands: the per-window p10/p50/p90 over the N ranks' ratios (``np.quantile``,
  what the incident core does per window to make the job rows), total over W;
* render: ``render(bundle)`` of the page from those rows (median of RUNS);
* page: its size in bytes, and the size of its pace plots alone;
* lines (the baseline, measured in the same run): the pace plot of one incident
  drawn the naive way, every rank its own polyline over the W windows
  (``svg.line_chart`` with N lines): its bytes and time, for N up to 1000 (past
  that it is only bigger: linear in N). The ratio is lines / bands for that plot.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
from artemis.report import render, svg

RUNS = 3
SIZES = ((100, 64), (1_000, 1_000), (1_000, 10_000), (10_000, 10_000))
NAIVE_MAX_RANKS = 1_000
T0 = 1764584400.0


def _ratios(windows: int, ranks: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = 1.0 + 0.01 * rng.standard_normal((windows, ranks))
    r[windows // 4 :, 2] += 0.15
    return r


def _incident(i: int, lo: int, hi: int, job: str) -> dict[str, Any]:
    return {
        "id": f"{job}-r{i}-w{lo}", "job": job, "kind": "rank", "subject": str(i), "rank": i,
        "ranks": [i], "island": "nvidia", "hosts": [f"node-{i}"], "status": "closed",
        "opened": {"window": lo, "time": T0 + lo}, "closed": {"window": hi, "time": T0 + hi,
                                                            "why": "cleared"},
        "confirmed": {"window": lo, "time": T0 + lo, "q1_ms": 70.0, "peers_median_ms": 62.0},
        "cause": {"kind": "clocks", "text": "clocks low", "explained": 0.9, "alternatives": []},
        "evidence": {"windows": hi - lo + 1, "gap_ms": 71.0, "peers_gap_ms": 62.0, "ratio": 1.15,
                     "telemetry": {"sm_mhz": {"rank": 1694.0, "peers": 1978.0},
                                   "temp_c": {"rank": 61.0, "peers": 63.0}}},
        "cost": {"excess_ms": 9.0, "loss_pct": 8.0, "gpu_hours": 1.0, "gpu_hours_per_day": 9.0},
        "actions": [], "escalation": {"cause": "clocks", "check": "nvidia-smi -q -d CLOCK"},
        "verdict": "recovered", "reason": "cleared",
        "markers": [{"marker": "onset", "window": max(0, lo - 2)},
                    {"marker": "flagged", "window": lo}, {"marker": "confirmed", "window": lo},
                    {"marker": "cleared", "window": hi}],
    }  # fmt: skip


def _bundle(ratios: np.ndarray, bands: np.ndarray) -> dict[str, Any]:
    windows, ranks = ratios.shape
    job = "bench"
    rows = [
        {"job": job, "window": w, "time": T0 + w, "step_ms": 100.0, "samples_per_s": 2560.0,
         "ratio_p10": float(bands[w, 0]), "ratio_p50": float(bands[w, 1]),
         "ratio_p90": float(bands[w, 2])}
        for w in range(windows)
    ]  # fmt: skip
    spans = [(windows // 4, windows - 1)] + [
        (int(windows * k / 12), int(windows * k / 12) + max(3, windows // 50)) for k in range(3, 12)
    ]
    incs = [_incident(i + 2, lo, min(hi, windows - 1), job) for i, (lo, hi) in enumerate(spans)]
    subjects = {
        inc["id"]: [
            {"incident": inc["id"], "window": w, "time": T0 + w,
             "ratio": float(ratios[w, inc["rank"] % ranks]), "gap_ms": 70.0, "peers_gap_ms": 62.0}
            for w in range(inc["opened"]["window"], inc["closed"]["window"] + 1)
        ]
        for inc in incs
    }  # fmt: skip
    return {
        "job": {"job": job, "ranks": ranks, "gpu_count": ranks, "window_steps": 50},
        "incidents": incs,
        "windows": rows,
        "subjects": subjects,
        "generated": T0,
    }


def _naive_pace(ratios: np.ndarray) -> str:
    windows, ranks = ratios.shape
    xs = [float(w) for w in range(windows)]
    lines = [
        svg.Line(f"rank-{r}", f"rank {r}", xs, ratios[:, r].tolist(), width=0.5)
        for r in range(ranks)
    ]
    return svg.line_chart(svg.Chart("naive", "pace", "every rank", "gap ratio", (0, windows - 1),
                                    lines=lines))  # fmt: skip


def _median_time(fn: Any) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(RUNS):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    print(
        f"{'windows':>8} {'ranks':>7} {'bands s':>8} {'render s':>9} {'page KB':>8} "
        f"{'pace KB':>8} {'lines KB':>9} {'lines s':>8} {'lines/bands':>12}"
    )
    for windows, ranks in SIZES:
        ratios = _ratios(windows, ranks, seed=windows + ranks)
        bands_s, bands = _median_time(
            lambda r=ratios: np.stack([np.quantile(row, (0.1, 0.5, 0.9)) for row in r])
        )
        bundle = _bundle(ratios, bands)
        render_s, page = _median_time(lambda b=bundle: render(b))
        first = bundle["incidents"][0]["id"]
        start = page.index(f'<svg xmlns="http://www.w3.org/2000/svg" id="pace-{first}"')
        pace_kb = (page.index("</svg>", start) + 6 - start) / 1024
        if ranks <= NAIVE_MAX_RANKS:
            lo = bundle["incidents"][0]["opened"]["window"]
            naive_s, naive = _median_time(lambda r=ratios[lo:]: _naive_pace(r))
            lines = (
                f"{len(naive) / 1024:>9.0f} {naive_s:>8.3f} {len(naive) / 1024 / pace_kb:>12.0f}"
            )
        else:
            lines = f"{'-':>9} {'-':>8} {'-':>12}"
        print(
            f"{windows:>8} {ranks:>7} {bands_s:>8.3f} {render_s:>9.3f} {len(page) / 1024:>8.0f} "
            f"{pace_kb:>8.0f} {lines}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
