"""Confirm before acting: how often a flagged rank's incident is confirmed, and when.

Everything downstream of the GPUs is the real code, in-process: ring records
as the plugin writes them, one agent `WindowSummarizer` per rank (which computes
the per-step gap quartiles), and the coordinator's `JobMonitor` (detector and
`IncidentBook`) with default `Settings`. The baseline, measured on the same
windows and flags, is the issue's example rule: the first window from the
flag on (up to `flag_window` after it) where the rank's lower quartile is
above its peers' median confirms it. The rule in use (detect/DETECTOR.md
"Incidents"): the lower quartile shifted against the peers' lower quartiles
at least half as much as the median against theirs, in the window tested and
in at least half of the windows tested since the streak began: the shape
"slower". A rank whose lower quartile did not move is shaped "stalls" and is
confirmed while their cost persists (its mean per-step gap at least 5% above
its peers').

* slowdowns: the simulator's lockstep model (`sim/model.py`), 32 ranks, one
  island, 50-step windows of 100 ms steps, rank 13 slowed from window 8
  (bench/detection.py's job and noise models), 8 windows of fault. Of the runs
  whose rank was flagged: confirmed in the flag window, confirmed later,
  dismissed.
* stalls: 8 ranks; rank 3 stalls in a share of its steps (a fixed stall on top
  of its compute, the rest of its steps healthy), from window 3, 14 windows.
  Of the runs whose stalled rank was flagged: confirmed with the shape "stalls"
  (the right answer: it costs the job window after window, and its distribution
  did not move, only its upper part), with another shape, or dismissed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
from artemis.agent.summary import WindowSummarizer
from artemis.detect import incidents
from artemis.detect.findings import ACTIVE_STATES, RANK_KINDS
from artemis.detect.monitor import JobMonitor
from artemis.detect.settings import Settings
from artemis.protocol.records import RankWindow
from artemis.ring.format import CLOCK_DEVICE_NS, KIND_COLL, REC_DEVICE, SLOT_DTYPE, STATE_DONE
from artemis.sim.inproc import summarised
from artemis.sim.scenario import Scenario

from bench.detection import NOISE_MODELS, ONSET, SLOW_RANK, scenario

SEEDS = 5
SLOWDOWNS = (0.05, 0.10, 0.15)
# (share of the steps stalled, stall as a share of the compute gap): a quarter of the
# steps stalled 60% (its median does not move, its mean 15%), and most of the steps
# stalled 20% (its median moves too, its lower quartile not before 75%)
STALLS = ((0.25, 0.6), (0.55, 0.2), (0.65, 0.2), (0.75, 0.2))
STALL_SEEDS = 10


def lockstep_windows(sc: Scenario) -> list[tuple[int, list[RankWindow]]]:
    summ = [
        WindowSummarizer("b", "b1", r, sc.ranks, "h", sc.window_steps, clock_kind=CLOCK_DEVICE_NS)
        for r in range(sc.ranks)
    ]
    out: dict[int, list[RankWindow]] = {}
    for _r, rw in summarised(sc, summ):
        out.setdefault(rw.window, []).append(rw)
    return sorted(out.items())


def stall_windows(
    ranks: int, stalled: int, share: float, stall_frac: float, noise: float, seed: int
) -> list[tuple[int, list[RankWindow]]]:
    """Lockstep steps of 2 collectives; rank `stalled` adds a stall of `stall_frac` of the
    compute gap in `share` of its steps from window 3 on."""
    steps, c, gap, coll, windows = 50, 2, 80.0, 20.0, 14
    rng = np.random.default_rng(seed)
    summ = [
        WindowSummarizer(
            "b", "b2", r, ranks, "h", steps, colls_per_step=c, clock_kind=CLOCK_DEVICE_NS
        )
        for r in range(ranks)
    ]
    out: dict[int, list[RankWindow]] = {}
    t = 1.0e3
    for w in range(windows):
        n = steps * c
        comp = gap / c * (1 + noise * rng.standard_normal((n, ranks)))
        if w >= 3:
            hit = rng.random(steps) < share
            comp[0::c, stalled] += np.where(hit, gap * stall_frac, 0.0)
        starts = np.zeros((n, ranks))
        ends = np.zeros(n)
        for i in range(n):
            starts[i] = t + comp[i]
            ends[i] = starts[i].max() + coll / c
            t = ends[i]
        seqs = np.arange(w * n, (w + 1) * n, dtype=np.uint64)
        for r, s in enumerate(summ):
            rec = np.zeros(n, dtype=SLOT_DTYPE)
            rec["kind"], rec["state"], rec["clock"] = KIND_COLL, STATE_DONE, REC_DEVICE
            rec["func"], rec["bytes"], rec["peer"] = 1, 1 << 20, -1
            rec["seq"] = rec["coll_seq"] = seqs
            rec["start"] = (starts[:, r] * 1e6).astype(np.uint64)
            rec["end"] = (ends * 1e6).astype(np.uint64)
            s.feed(rec)
            for rw in s.take_windows(final=w == windows - 1):
                out.setdefault(rw.window, []).append(rw)
    return sorted(out.items())


def outcome(
    windows: list[tuple[int, list[RankWindow]]], rank: int, ranks: int, shape: str = "slower"
) -> str:
    """ "none" (never flagged), "at_flag", "later", "dismissed", or "other_shape"
    (confirmed with a shape other than `shape`) for `rank`'s incident."""
    m = JobMonitor("b", Settings(), nranks=ranks)
    recs: list[dict[str, Any]] = []
    for w, rows in windows:
        recs += m.on_window(w, rows).incidents
    recs += m.finish().incidents
    mine = [r for r in recs if r["rank"] == rank and r["kind"] in RANK_KINDS]
    if not mine:
        return "none"
    last = mine[-1]
    if last["verdict"] == "dismissed":
        return "dismissed"
    if last["confirmed"].get("shape", shape) != shape:
        return "other_shape"
    return "at_flag" if last["confirmed"]["window"] == last["opened"]["window"] else "later"


def plain_rule(windows: list[tuple[int, list[RankWindow]]], rank: int, ranks: int) -> str:
    """The issue's example rule on the same windows and the same flag: confirmed in the
    first window from the flag on (up to flag_window after it) where the rank's lower
    quartile is above the median of its peers' medians."""
    m = JobMonitor("b", Settings(), nranks=ranks)
    flag = None
    by = dict(windows)
    for w, rows in windows:
        for f in m.on_window(w, rows).findings:
            if f.rank == rank and f.state == "flagged" and flag is None:
                flag = w
    if flag is None:
        return "none"
    for w in range(flag, flag + Settings().flag_window + 1):
        of = {r.rank: r for r in by.get(w, [])}
        if rank not in of:
            continue
        peers = [r.gap_q2_ms for k, r in of.items() if k != rank and r.gap_q2_ms is not None]
        q1 = of[rank].gap_q1_ms
        if peers and q1 is not None and q1 > float(np.median(peers)):
            return "at_flag" if w == flag else "later"
    return "dismissed"


def both_rules(
    windows: list[tuple[int, list[RankWindow]]], rank: int, ranks: int, shape: str = "slower"
) -> list[str]:
    """[rule in use (the right `shape` expected), plain rule] on the same windows."""
    return [outcome(windows, rank, ranks, shape), plain_rule(windows, rank, ranks)]


def _cell(res: list[str]) -> str:
    flagged = [r for r in res if r != "none"]
    if not flagged:
        return "not flagged"
    n = len(flagged)
    other = sum(r == "other_shape" for r in flagged)
    return (
        f"{sum(r == 'at_flag' for r in flagged)}/{sum(r == 'later' for r in flagged)}/"
        f"{sum(r == 'dismissed' for r in flagged)} of {n}"
        + (f" ({other} other shape)" if other else "")
    )


def slowdowns() -> None:
    print("true slowdowns: confirmed at flag / later / dismissed, of the runs flagged")
    hdr = f"{'model':>10} {'slowdown':>8} {'rule in use':>16} {'plain q1>P2':>16}"
    print(hdr)
    print("-" * len(hdr))
    for model in NOISE_MODELS:
        for slow in SLOWDOWNS:
            used: list[str] = []
            plain: list[str] = []
            for seed in range(SEEDS):
                sc = scenario(model, 50, 3000 + seed, ONSET + 8, slow)
                sc = dataclasses.replace(sc, telemetry_noise=0.0)
                a, b = both_rules(lockstep_windows(sc), SLOW_RANK, sc.ranks)
                used.append(a)
                plain.append(b)
            print(f"{model:>10} {slow:>8.0%} {_cell(used):>16} {_cell(plain):>16}")


def stalls() -> None:
    print()
    print(
        "stalls (a stall of a share of the gap in a share of one rank's steps): confirmed "
        "as stalls at flag / later / dismissed, of the runs flagged (the plain rule: any shape)"
    )
    hdr = f"{'noise':>6} {'share':>6} {'stall':>6} {'rule in use':>16} {'plain q1>P2':>16}"
    print(hdr)
    print("-" * len(hdr))
    for noise in (0.01, 0.03):
        for share, frac in STALLS:
            used: list[str] = []
            plain: list[str] = []
            for seed in range(STALL_SEEDS):
                wins = stall_windows(8, 3, share, frac, noise, 50 + seed)
                a, b = both_rules(wins, 3, 8, "stalls")
                used.append(a)
                plain.append(b)
            print(f"{noise:>6.0%} {share:>6.0%} {frac:>6.0%} {_cell(used):>16} {_cell(plain):>16}")


def cost() -> None:
    """The book's own time per window (rows, one open incident's update and its confirm
    test) against the detector's on the same window: JobMonitor.on_window minus
    Detector.score_window would mix in the missing-rank rule, so both are timed."""
    from artemis.detect.detector import Detector
    from artemis.protocol.columns import WindowColumns

    from bench.scoring import _records

    print()
    print("cost per window: IncidentBook.on_window (one open incident) vs Detector.score_window")
    hdr = f"{'ranks':>7} {'detector ms':>12} {'book ms':>8} {'ratio':>6}"
    print(hdr)
    print("-" * len(hdr))
    rng = np.random.default_rng(0)
    for n in (1000, 16000, 100000):
        det = Detector(Settings(), "bench", n)
        cols = None
        res = None
        for w in range(8):
            recs = _records(n, w, rng)
            q = [
                dataclasses.replace(r, gap_q1_ms=r.gap_ms * 0.99, gap_q2_ms=r.gap_ms) for r in recs
            ]
            cols = WindowColumns.from_records(q)
            res = det.score_window(w, cols)
        assert cols is not None and res is not None
        flagged = [f for f in res.findings if f.state in ACTIVE_STATES]
        assert flagged, "the bench window has no open finding"
        snap = det.snapshot()
        dts, bts = [], []
        for _ in range(5):
            d = Detector(Settings(), "bench", n)
            d.restore_state(snap)
            t = time.perf_counter()
            r8 = d.score_window(8, cols)
            dts.append(time.perf_counter() - t)
            book = incidents.IncidentBook("bench")
            view = incidents.WindowView(
                8, 0.0, cols, r8.ranks, r8.pace_values, r8.island_labels, r8.step_ms, None, n
            )
            book.on_window(view, flagged)  # opens it
            t = time.perf_counter()
            book.on_window(view, r8.findings)
            book.take()
            bts.append(time.perf_counter() - t)
        dm, bm = float(np.median(dts)) * 1e3, float(np.median(bts)) * 1e3
        print(f"{n:>7} {dm:>12.1f} {bm:>8.2f} {bm / dm:>6.3f}")


def main() -> int:
    t0 = time.perf_counter()
    slowdowns()
    stalls()
    cost()
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
