"""The grid's arithmetic on one run's records (pure: no I/O, no clocks).

A window is ``window_steps * colls_per_step`` collectives, numbered as the detector
numbers them (``coll_seq // window_colls``). Onset is the first whole window under
the fault: the first window that starts at or after the onset step's collective.
The slowdown is the job's own: rank 0's mean step time in the windows from onset
against the same run's windows before the one the fault began in (warm-up left
out). "Flagged" is a line with ``state: flagged``; windows to flag are counted as
bench/detection.py counts them on the simulator: the windows under the fault up to
and including the one flagged, the onset window counting as 1 (the 3-of-4 rule's
fastest is 3, or 2 where the window the fault began in was already suspect; 0:
flagged in that partial window).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from artemis.detect.findings import RANK_KINDS

WARMUP_WINDOWS = 2  # the job's first windows (DDP's bucket rebuild, cold caches): not a baseline


@dataclass(frozen=True)
class Expected:
    """What a fault should give: a ``rank`` finding on these ranks with this cause
    kind, or a ``link`` finding (cause None: the kind is the answer)."""

    kind: str
    ranks: tuple[int, ...] = ()
    cause: str | None = None


def colls_per_step(seqs: Sequence[int]) -> int:
    """Collectives per step, from the trace's steady state (its second half)."""
    half = len(seqs) // 2
    deltas = [b - a for a, b in zip(seqs[half:], seqs[half + 1 :], strict=False)]
    if not deltas:
        raise ValueError("a trace of fewer than 3 steps: no collectives per step to learn")
    return max(1, round(statistics.median(deltas)))


def onset_window(onset_seq: int, window_colls: int) -> int:
    """The first whole window under the fault."""
    return -(-onset_seq // window_colls)


def onset_step(before_windows: int, window_steps: int) -> int:
    """The step a cell's fault starts at: mid-window, after its healthy windows, so
    the onset window (the first whole one) is unambiguous. A healthy run is measured
    from the same step (``aa_slowdown``)."""
    return before_windows * window_steps + window_steps // 2


def healthy_onset_step(cell: dict[str, Any]) -> int | None:
    """For a recorded healthy run, the step its cell's fault would have started at
    (``judge``'s ``healthy_from``); None for a fault cell, or a record without it."""
    if cell.get("mechanism") != "none" or "before_windows" not in cell:
        return None
    return onset_step(cell["before_windows"], cell["window_steps"])


def window_step_ms(
    seqs: Sequence[int], times_ns: Sequence[int], window_colls: int
) -> dict[int, float]:
    """Mean step time (ms) per window, each step in the window its start falls in;
    the trace's last window (cut short by the job's end) is left out."""
    per: dict[int, list[float]] = {}
    for i in range(len(seqs) - 1):
        per.setdefault(seqs[i] // window_colls, []).append((times_ns[i + 1] - times_ns[i]) / 1e6)
    last = max(per, default=-1)
    return {w: statistics.fmean(v) for w, v in per.items() if w != last}


def slowdown(step_ms: dict[int, float], onset_seq: int, window_colls: int) -> float | None:
    """The job's step time under the fault over before it, minus 1 (0.2: 20% slower);
    None when either side has no window."""
    first_faulted = onset_seq // window_colls  # the window the fault began in
    start = onset_window(onset_seq, window_colls)
    before = [v for w, v in step_ms.items() if WARMUP_WINDOWS <= w < first_faulted]
    after = [v for w, v in step_ms.items() if w >= start]
    if not before or not after:
        return None
    return statistics.fmean(after) / statistics.fmean(before) - 1.0


def matches(line: dict[str, Any], exp: Expected) -> bool:
    """Whether a finding names the fault's subject. A ``rank`` is named by either rank
    kind: ``degraded`` is the same rank judged against its own history, as a job with
    fewer than ``min_island_peers`` ranks is (a 2-rank job; detect/DETECTOR.md)."""
    if exp.kind == "rank":
        return line.get("kind") in RANK_KINDS and line.get("rank") in exp.ranks
    return line.get("kind") == exp.kind


def first_flag(lines: Sequence[dict[str, Any]], exp: Expected, since: int) -> dict[str, Any] | None:
    """The first flagged line naming the subject, from window ``since`` (the window
    the fault began in: the detector may score its part under the fault)."""
    for f in lines:
        if f.get("state") == "flagged" and matches(f, exp) and f.get("window", -1) >= since:
            return f
    return None


def cause_right(line: dict[str, Any] | None, exp: Expected) -> bool:
    if line is None or not matches(line, exp):
        return False
    if exp.cause is None:
        return True
    return bool((line.get("cause") or {}).get("kind") == exp.cause)


def summary_finding(
    summary: dict[str, Any], exp: Expected, flag: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The end summary's (latest) finding on the subject (on the flagged rank, where
    one was flagged), or None."""
    found = [
        f
        for f in summary.get("findings", [])
        if matches(f, exp) and (flag is None or f.get("rank") == flag.get("rank"))
    ]
    return found[-1] if found else None


def false_flags(
    lines: Sequence[dict[str, Any]], exp: Expected | None, since: int
) -> list[dict[str, Any]]:
    """Flagged lines that are not the fault: another subject, or the subject before
    the window the fault began in. ``exp`` None: a healthy run, every flag is false."""
    return [
        f
        for f in lines
        if f.get("state") == "flagged"
        and (exp is None or not matches(f, exp) or f.get("window", -1) < since)
    ]


def healthy_rank_windows(ranks: int, windows: int, exp: Expected | None, since: int) -> int:
    """Rank-windows that should not be flagged: every rank's windows, less the fault's
    subjects' windows from the one it began in (a slowed link slows every rank)."""
    if exp is None:
        return ranks * windows
    hit = ranks if exp.kind != "rank" else len(exp.ranks)
    return ranks * windows - hit * max(0, windows - since)


def binom_cdf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    return min(
        1.0,
        sum(
            math.exp(
                math.lgamma(n + 1)
                - math.lgamma(i + 1)
                - math.lgamma(n - i + 1)
                + i * lp
                + (n - i) * lq
            )
            for i in range(k + 1)
        ),
    )


def upper_bound(k: int, n: int, conf: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound on a rate from k events in n trials
    (k = 0: 1 - (1-conf)^(1/n), about 3/n: the rule of three)."""
    if n <= 0:
        raise ValueError(f"n={n}: no trials to bound a rate over")
    if k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(100):  # bisection: P(X <= k; p) falls as p rises
        mid = (lo + hi) / 2
        if binom_cdf(k, n, mid) > 1 - conf:
            lo = mid
        else:
            hi = mid
    return hi


def judge(
    trace: dict[str, Any],
    window_steps: int,
    onset: dict[str, Any] | None,
    lines: Sequence[dict[str, Any]],
    summary: dict[str, Any],
    exp: Expected | None,
    seen_s: dict[int, float] | None = None,
    healthy_from: int | None = None,
) -> dict[str, Any]:
    """One run's figures. ``trace``: rank 0's ``coll_seq`` and ``t_ns`` per step;
    ``onset``: the onset file (None: a healthy run); ``seen_s``: seconds from onset
    to when the grid saw each line (by its index in ``lines``); ``healthy_from``: for
    a healthy run, the step its cell's fault would have started at: its
    ``aa_slowdown`` is what the slowdown's arithmetic reads there with no fault (the
    measure's own noise, an A/A comparison)."""
    seqs, times = trace["coll_seq"], trace["t_ns"]
    wc = window_steps * colls_per_step(seqs)
    windows = int(summary.get("windows_scored") or 0)
    ranks = int(summary.get("ranks") or 0)
    out: dict[str, Any] = {"window_colls": wc, "windows_scored": windows, "ranks": ranks}
    if onset is None and healthy_from is not None and healthy_from < len(seqs):
        out["aa_slowdown"] = slowdown(window_step_ms(seqs, times, wc), seqs[healthy_from], wc)
    since = 10**9
    if onset is not None and exp is not None:
        since = onset["coll_seq"] // wc
        start = onset_window(onset["coll_seq"], wc)
        sd = slowdown(window_step_ms(seqs, times, wc), onset["coll_seq"], wc)
        flag = first_flag(lines, exp, since)
        summ = summary_finding(summary, exp, flag)
        flagged = {f.get("rank") for f in lines if f.get("state") == "flagged" and matches(f, exp)}
        out |= {
            "onset_window": start,
            "slowdown": sd,
            "flag_window": None if flag is None else flag["window"],
            "windows_to_flag": None if flag is None else flag["window"] - start + 1,
            "seconds_to_flag": None
            if flag is None or seen_s is None
            else seen_s.get(next(i for i, f in enumerate(lines) if f is flag)),
            "flag_cause": None if flag is None else (flag.get("cause") or {}).get("kind"),
            "flag_mechanism": None
            if flag is None
            else ((flag.get("cause") or {}).get("evidence") or {}).get("mechanism"),
            "cause_right_flag": cause_right(flag, exp),
            "summary_cause": None if summ is None else (summ.get("cause") or {}).get("kind"),
            "cause_right_summary": cause_right(summ, exp),
            # a finding cleared before the job's end has no cause in the summary
            "summary_state": None if summ is None else summ.get("state"),
            "expected_flagged": sorted(r for r in flagged if r is not None)
            if exp.kind == "rank"
            else [],
        }
    bad = false_flags(lines, exp, since)
    out["false_flags"] = len(bad)
    out["false_flag_subjects"] = sorted(
        {f"{f.get('kind')} {f.get('rank', f.get('island'))} w{f.get('window')}" for f in bad}
    )
    out["healthy_rank_windows"] = healthy_rank_windows(ranks, windows, exp, since)
    return out
