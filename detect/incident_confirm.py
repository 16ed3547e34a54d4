"""The confirm test of a rank incident, and the peer rows it reads (detect/DETECTOR.md "Incidents").

A `rank` (or `degraded`) incident is confirmed when the rank's lower quartile of
per-step compute gap has moved with its median against its peers' (the other
ranks of its island, of its class where classes split the island): a whole
distribution that moved, not a tail of stalls. Pure: reads one window's columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from artemis.detect.findings import Finding
from artemis.detect.incident_state import num, rnd
from artemis.protocol.columns import WindowColumns

# The confirm rule (detect/DETECTOR.md "Incidents"): the lower quartile's shift
# against the peers' must be at least this share of the median's (and the lower
# quartile above the peers' median) for the shape "slower".
CONFIRM_Q1_SHARE = 0.5
# The shape "stalls" is confirmed while its cost persists: the mean per-step gap at
# least this share above the peers' means. Half the default suspect margin
# (suspect_ratio 1.10): a pattern flagged at the margin stays confirmed through a
# window's noise, and a tail that costs the job next to nothing is not acted on.
CONFIRM_MEAN_SHIFT = 0.05


@dataclass
class WindowView:
    """What the book reads of one scored window: the columns and the detector's result."""

    window: int
    time: float | None
    cols: WindowColumns
    ranks: np.ndarray  # result.ranks (sorted)
    pace: np.ndarray  # result.pace_values, aligned on ranks
    islands: np.ndarray  # result.island_labels, aligned on ranks
    step_ms: float | None
    samples_per_s: float | None
    gpus: int
    # rows of each island (and class) in `cols`, found once per window
    peers: dict[tuple[int, str, str | None], np.ndarray] = field(default_factory=dict)


def peer_rows(f: Finding, view: WindowView) -> tuple[int | None, np.ndarray]:
    """The subject's row in the window's columns and its peers' rows: the other
    ranks of its island, and of its hardware class when the finding names one
    (the detector's scoring group, detect/DETECTOR.md)."""
    cols = view.cols
    ranks = cols.ints("rank")
    mine = np.flatnonzero(ranks == f.rank)
    if not mine.size:
        return None, np.zeros(0, dtype=np.int64)
    row = int(mine[-1])
    cls = (f.evidence or {}).get("hw_class")
    key = (view.window, str(f.island), None if cls is None else str(cls))
    cached = view.peers.get(key)
    if cached is not None:
        return row, cached[ranks[cached] != f.rank]
    # island labels per row as the detector assigned them (the result's, by rank):
    # arrays only, and once per island and window (this runs per finding)
    pos = np.minimum(np.searchsorted(view.ranks, ranks), max(view.ranks.size - 1, 0))
    known = view.ranks.size > 0
    ok = (view.ranks[pos] == ranks) if known else np.zeros(ranks.size, dtype=bool)
    labels = np.where(ok, view.islands[pos], None) if known else ok.astype(object)
    same = ok & (labels == f.island)
    if cls is not None:
        hw = np.asarray(cols["hw_class"], dtype=object)
        model = np.asarray(cols["tel_gpu_model"], dtype=object)
        hw = np.where(hw == np.array(None, dtype=object), model, hw)
        same &= hw == cls
    # the last row of each rank (a rank may report on two communicators)
    members = np.flatnonzero(same)
    # (more rows than usable ranks is the only way to have a rank twice: test cheaply)
    if members.size and cols.n > view.ranks.size and np.unique(ranks[members]).size < members.size:
        _, last = np.unique(ranks[members][::-1], return_index=True)
        members = np.sort(members[::-1][last])
    view.peers[key] = members
    mine_last = np.flatnonzero(ranks[members] == f.rank)
    if mine_last.size:
        row = int(members[mine_last[-1]])
    return row, members[ranks[members] != f.rank]


def shape_of(q1_shift: float, median_shift: float, mean_shift: float | None = None) -> str:
    """The shape of a slowdown (`SHAPES`) from its shifts against the reference:
    "slower" when the lower quartile moved with the median (at least
    `CONFIRM_Q1_SHARE` of its shift) and, where the mean is known, the median with
    the mean (as much of its shift: else the median moved by noise while stalls
    moved the mean); else "stalls" (a tail of long steps)."""
    slower = median_shift > 0 and q1_shift >= CONFIRM_Q1_SHARE * median_shift
    if mean_shift is not None and math.isfinite(mean_shift):
        slower = slower and median_shift >= CONFIRM_Q1_SHARE * mean_shift
    return "slower" if slower else "stalls"


def _per_sample(cols: WindowColumns, name: str, rows: np.ndarray) -> np.ndarray:
    """Column `name` at `rows`, per sample (scaled to the median split) where the ranks
    run different batch shares, as the detector judges them; NaN where absent."""
    a = cols.floats(name)[rows]
    samples = cols.floats("samples")
    if np.isfinite(samples).all() and (samples > 0).all():
        # a rank under a plan does less work: compare per sample (as the detector does)
        a = a / samples[rows] * float(np.median(samples))
    return a


def quartile_check(f: Finding, view: WindowView | None) -> dict[str, Any] | None:
    """The confirm test on this window (detect/DETECTOR.md "Incidents"). Its shape
    first (`shape_of`): the subject's lower quartile of per-step gap shifted against
    its peers' lower quartiles (their median) by at least half as much as its
    median against theirs is "slower": a whole distribution that moved, and it
    passes. Otherwise it is "stalls" (its median moved by stalls in some of its
    steps, its lower quartile by a fraction of its noise): it passes while their
    cost persists, its mean per-step gap at least `CONFIRM_MEAN_SHIFT` above its
    peers' (the median of their means). Per sample where the ranks run different
    batch shares, as the detector judges them; a rank judged on its own history is
    compared against its own confirmed pace; one without peers (`degraded`)
    against its own warm-up baseline. None: nothing to test with."""
    if view is None or f.rank is None:
        return None
    row, peers = peer_rows(f, view)
    if row is None:
        return None
    cols = view.cols
    me = np.array([row])
    q1 = float(_per_sample(cols, "gap_q1_ms", me)[0])
    q2 = float(_per_sample(cols, "gap_q2_ms", me)[0])
    mean = float(_per_sample(cols, "gap_mean_ms", me)[0])
    if not math.isfinite(q1):
        return None
    if not math.isfinite(q2):
        q2 = float(_per_sample(cols, "gap_ms", me)[0])
    ev = f.evidence or {}
    if f.kind == "degraded" or not peers.size:
        base = num(ev.get("baseline_gap_ms"))
        if base is None or not base > 0:
            return None
        ref1 = ref2 = ref_mean = base
        out: dict[str, Any] = {"rule": "q1_shift>=half_median_shift vs baseline"}
        out.update(q1_ms=rnd(q1, 3), median_ms=rnd(q2, 3), baseline_ms=rnd(base, 3))
    else:
        p1 = _per_sample(cols, "gap_q1_ms", peers)
        p2 = _per_sample(cols, "gap_q2_ms", peers)
        p2 = np.where(np.isfinite(p2), p2, _per_sample(cols, "gap_ms", peers))
        pm = _per_sample(cols, "gap_mean_ms", peers)
        p1, p2, pm = p1[np.isfinite(p1)], p2[np.isfinite(p2)], pm[np.isfinite(pm)]
        if not p1.size or not p2.size:
            return None
        ref1, ref2 = float(np.median(p1)), float(np.median(p2))
        ref_mean = float(np.median(pm)) if pm.size else math.nan
        pace = 1.0
        shift = num(ev.get("shift"))
        ratio = num(f.ratio)
        if f.basis == "history" and shift is not None and ratio is not None and shift > -1:
            # judged against its own confirmed pace (a rank always a little off its
            # peers): the shift is measured from that pace
            pace = ratio / (1.0 + shift)
            ref1, ref2, ref_mean = ref1 * pace, ref2 * pace, ref_mean * pace
        out = {"rule": "q1>peers_median" if pace == 1.0 else "q1>peers_median*pace"}
        out.update(
            q1_ms=rnd(q1, 3),
            median_ms=rnd(q2, 3),
            peers_q1_ms=rnd(ref1, 3),
            peers_median_ms=rnd(ref2, 3),
            peers=int(p2.size),
        )
        if pace != 1.0:
            out["pace"] = rnd(pace, 4)
    s1, s2 = q1 / ref1 - 1.0, q2 / ref2 - 1.0
    out["q1_shift"], out["median_shift"] = rnd(s1, 4), rnd(s2, 4)
    # like with like: the lower quartile against the peers' lower quartiles (a
    # step-length jitter every rank shares moves both alike)
    sm = mean / ref_mean - 1.0 if ref_mean > 0 else math.nan
    out["shape"] = shape_of(s1, s2, sm)
    passed = out["shape"] == "slower"
    if not passed and math.isfinite(sm):
        # stalls: confirmed by their cost, the mean (an older agent sends none: the
        # quartile test alone then, which dismisses them)
        out["rule"] = f"stalls: mean_shift>={CONFIRM_MEAN_SHIFT}"
        out["mean_ms"] = rnd(mean, 3)
        if "baseline_ms" not in out:  # (a degraded rank's mean against its baseline)
            out["peers_mean_ms"] = rnd(ref_mean, 3)
        out["mean_shift"] = rnd(sm, 4)
        passed = sm >= CONFIRM_MEAN_SHIFT
    out["passed"] = bool(passed)
    return out


def not_shifted(check: Mapping[str, Any]) -> str:
    """Why a failed confirm test dismisses: a tail of long steps, and (where the mean is
    known) one whose cost did not persist."""
    ref = check.get("peers_median_ms", check.get("baseline_ms"))
    what = "its peers' median" if "peers_median_ms" in check else "its own baseline"
    s1, s2 = check.get("q1_shift") or 0.0, check.get("median_shift") or 0.0
    text = (
        f"its lower quartile of per-step compute gap ({check.get('q1_ms')} ms, "
        f"{100 * s1:+.1f}%) did not move with its median ({check.get('median_ms')} ms, "
        f"{100 * s2:+.1f}%) against {what} ({ref} ms): a tail of long steps (stalls), "
        "not a slower rank"
    )
    sm = check.get("mean_shift")
    if sm is None:
        return text
    return text + (
        f", whose cost did not persist (mean per-step gap {check.get('mean_ms')} ms, "
        f"{100 * sm:+.1f}%, under {100 * CONFIRM_MEAN_SHIFT:.0f}%)"
    )
