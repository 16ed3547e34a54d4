"""Detection over a grid: slowdown x noise model x window length, and per fault kind.

Everything downstream of the GPUs is the real code, run in-process
(`sim/inproc.py`): the simulator's lockstep model, ring records as the plugin
writes them, one agent `WindowSummarizer` per rank, the rank's simulated
telemetry through the agent's own reader, and the coordinator's `Detector`
with default `Settings` (mode `adaptive`); the seed's rule (`mode = "seed"`)
is measured on the same runs as the baseline.

Job: 32 ranks, 8 per host, one island, 100 ms steps, 4 collectives per step.
A fault slows rank 13 from window 8 on (after window 0 and the warm-up).
The last table runs the same job with `tp = 2`: the slow rank's TP partner waits
for it inside their group's collectives (sim/inproc.py feeds those to the
summariser as the agent does).

* windows to flag: windows of faulty data up to and including the one in which
  the slow rank was first reported `flagged` (the onset window counts as 1),
  median over seeds, a miss counting as longer than any flag; "-" when most
  seeds never flagged within the run's windows after onset.
* false flags: `flagged` reports of any kind on any other subject, per 10k
  healthy rank-windows, from fault-free runs (64 ranks) of each noise model
  and window length; with none seen, the 95% upper bound (3 / n) in brackets.
* per kind: recall = runs whose slow rank was flagged within 4 windows;
  precision = true flags / all flags in those runs; diagnosis = flagged runs
  whose cause names the fault's kind.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from artemis.detect.settings import Settings
from artemis.sim import inproc
from artemis.sim.scenario import COMPUTE_FAULTS, Scenario, parse_scenario

RANKS = 32
SLOW_RANK = 13
ONSET = 8
AFTER_ONSET = 8
SEEDS = 5
KIND_SEEDS = 20
HEALTHY_RANKS = 64
HEALTHY_WINDOWS = 160
SLOWDOWNS = (0.03, 0.05, 0.08, 0.10, 0.15, 0.20)
WINDOW_STEPS = (50, 10)
NOISE_MODELS: dict[str, dict[str, float]] = {
    "clean": {"noise": 0.01},
    "realistic": {
        "noise": 0.01,
        "rank_spread": 0.02,
        "shared_jitter": 0.05,
        "stall_prob": 0.005,
        "stall_ms": 60.0,
        "telemetry_noise": 0.03,
    },
    "heavy": {
        "noise": 0.02,
        "rank_spread": 0.02,
        "shared_jitter": 0.08,
        "stall_prob": 0.02,
        "stall_ms": 100.0,
        "telemetry_noise": 0.05,
    },
}


def scenario(
    model: str,
    steps: int,
    seed: int,
    windows: int,
    slowdown: float | None,
    kind: str = "clocks",
    ranks: int = RANKS,
    tp: int = 1,
) -> Scenario:
    data: dict[str, Any] = {
        "job": {
            "tp": tp,
            "ranks": ranks,
            "ranks_per_host": 8,
            "step_ms": 100.0,
            "collectives_per_step": 4,
            "window_steps": steps,
            "windows": windows,
            "seed": seed,
            **NOISE_MODELS[model],
        }
    }
    if slowdown is not None:
        data["fault"] = [
            {"kind": kind, "rank": SLOW_RANK, "start_window": ONSET, "slowdown": slowdown}
        ]
    return parse_scenario(data, f"bench-detection({model}, {steps} steps, seed={seed})")


@dataclass
class RunResult:
    flag_window: int | None  # first window the slow rank was reported flagged
    false_flags: int  # flagged reports on any other subject
    healthy_rank_windows: int  # judged rank-windows of the other ranks


def run(sc: Scenario, slow_rank: int | None, settings: Settings | None = None) -> RunResult:
    """The in-process pipeline (sim/inproc.py) on one scenario."""
    slow = () if slow_rank is None else (slow_rank,)
    res = inproc.run(sc, slow, settings, telemetry=False)
    fw = None if slow_rank is None else res.flag_window.get(slow_rank)
    return RunResult(fw, res.false_flags, res.healthy_rank_windows)


def _median_windows(lat: list[int | None]) -> str:
    if sum(x is not None for x in lat) * 2 <= len(lat):
        return "-"
    return str(statistics.median_low([x if x is not None else 10**9 for x in lat]))


def _fmt_rate(flags: int, n: int) -> str:
    if flags:
        return f"{1e4 * flags / n:.2f}"
    return f"0 (<{3e4 / n:.2f})"


def grid() -> None:
    seed_mode = Settings(mode="seed")
    print("windows to flag (median over seeds; adaptive / seed rule, same runs)")
    hdr = f"{'slowdown':>8} " + " ".join(
        f"{m + '/' + str(w):>16}" for m in NOISE_MODELS for w in WINDOW_STEPS
    )
    print(hdr)
    print("-" * len(hdr))
    for slow in SLOWDOWNS:
        cells = []
        for m in NOISE_MODELS:
            for w in WINDOW_STEPS:
                a: list[int | None] = []
                b: list[int | None] = []
                for seed in range(SEEDS):
                    sc = scenario(m, w, 1000 + seed, ONSET + AFTER_ONSET, slow)
                    for out, st in ((a, None), (b, seed_mode)):
                        r = run(sc, SLOW_RANK, st)
                        out.append(None if r.flag_window is None else r.flag_window - ONSET + 1)
                cells.append(f"{_median_windows(a)} / {_median_windows(b)}")
        print(f"{slow:>8.0%} " + " ".join(f"{c:>16}" for c in cells))
    print()
    print(
        f"false flags per 10k healthy rank-windows ({HEALTHY_RANKS} ranks x {HEALTHY_WINDOWS} windows)"
    )
    hdr2 = f"{'model':>10} {'steps':>5} {'adaptive':>15} {'seed rule':>15} {'rank-windows':>12}"
    print(hdr2)
    print("-" * len(hdr2))
    for m in NOISE_MODELS:
        for w in WINDOW_STEPS:
            sc = scenario(m, w, 7, HEALTHY_WINDOWS + 1, None, ranks=HEALTHY_RANKS)
            ra = inproc.run(sc, (), None, telemetry=False)
            rb = inproc.run(sc, (), seed_mode, telemetry=False)
            kinds = ",".join(f"{k}:{v}" for k, v in sorted(ra.false_by_kind.items()))
            print(
                f"{m:>10} {w:>5} {_fmt_rate(ra.false_flags, ra.healthy_rank_windows):>15} "
                f"{_fmt_rate(rb.false_flags, rb.healthy_rank_windows):>15} "
                f"{ra.healthy_rank_windows:>12} {kinds}"
            )


def per_kind() -> None:
    print()
    print(
        f"per kind, realistic noise, 50-step windows, {KIND_SEEDS} seeds: recall (flagged "
        "within 4 windows), precision, diagnosis right (of flagged)"
    )
    hdr = f"{'kind':>8} {'slowdown':>8} {'recall':>7} {'precision':>9} {'diagnosis':>9} {'median explained':>16}"
    print(hdr)
    print("-" * len(hdr))
    for kind in COMPUTE_FAULTS:
        for slow in (0.05, 0.10):
            hit = true = false = right = 0
            expl: list[float] = []
            for seed in range(KIND_SEEDS):
                sc = scenario("realistic", 50, 2000 + seed, ONSET + 5, slow, kind)
                r = inproc.run(sc, (SLOW_RANK,))
                fw = r.flag_window.get(SLOW_RANK)
                false += r.false_flags
                if fw is not None:
                    true += 1
                    hit += fw - ONSET + 1 <= 4
                    c = r.cause.get(SLOW_RANK) or {}
                    right += c.get("kind") == kind
                    if c.get("explained") is not None:
                        expl.append(float(c["explained"]))
            prec = true / (true + false) if true + false else float("nan")
            med = f"{statistics.median(expl):.2f}" if expl else "-"
            print(
                f"{kind:>8} {slow:>8.0%} {hit / KIND_SEEDS:>7.2f} {prec:>9.2f} "
                f"{(right / true if true else float('nan')):>9.2f} {med:>16}"
            )


def tensor_parallel() -> None:
    print()
    print(
        f"tp = 2 (TP groups of 2, a DP communicator per position), realistic noise, 50-step "
        f"windows, {SEEDS} seeds: windows to flag (median), false flags (any other subject)"
    )
    hdr = f"{'slowdown':>8} {'windows':>8} {'false flags':>12}"
    print(hdr)
    print("-" * len(hdr))
    for slow in (0.05, 0.10):
        lat: list[int | None] = []
        false = 0
        for seed in range(SEEDS):
            sc = scenario("realistic", 50, 3000 + seed, ONSET + AFTER_ONSET, slow, tp=2)
            r = run(sc, SLOW_RANK)
            lat.append(None if r.flag_window is None else r.flag_window - ONSET + 1)
            false += r.false_flags
        print(f"{slow:>8.0%} {_median_windows(lat):>8} {false:>12}")


def main() -> int:
    t0 = time.perf_counter()
    print(
        f"{RANKS} ranks (8/host, one island), 4 collectives/step, 100 ms steps; fault on rank "
        f"{SLOW_RANK} from window {ONSET}; default Settings (mode adaptive) vs mode seed"
    )
    print("noise models: " + "; ".join(f"{k}: {v}" for k, v in NOISE_MODELS.items()))
    print()
    grid()
    per_kind()
    tensor_parallel()
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
