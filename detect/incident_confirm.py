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
# quartile above the peers' median).
CONFIRM_Q1_SHARE = 0.5


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


def quartile_check(f: Finding, view: WindowView | None) -> dict[str, Any] | None:
    """The confirm test on this window (detect/DETECTOR.md "Incidents"): the
    subject's lower quartile of per-step gap must be shifted against its peers'
    lower quartiles (their median) by at least half as much as its median is
    against theirs, and above their median (`CONFIRM_Q1_SHARE`). A whole
    distribution that moved passes (every quantile moves together); a rank slowed
    by stalls in some of its steps does not (its median moves by the stall, its
    lower quartile by a fraction of its noise). Per sample where the ranks run
    different batch shares, as the detector judges them; a rank judged on its own
    history is compared against its own confirmed pace; one without peers
    (`degraded`) against its own warm-up baseline. None: nothing to test with."""
    if view is None or f.rank is None:
        return None
    row, peers = peer_rows(f, view)
    if row is None:
        return None
    cols = view.cols
    q1 = float(cols.floats("gap_q1_ms")[row])
    q2 = float(cols.floats("gap_q2_ms")[row])
    if not math.isfinite(q1):
        return None
    if not math.isfinite(q2):
        q2 = float(cols.floats("gap_ms")[row])
    samples = cols.floats("samples")
    scale = samples if np.isfinite(samples).all() and (samples > 0).all() else None
    if scale is not None:
        # a rank under a plan does less work: compare per sample (as the detector does)
        k = float(np.median(scale))
        q1, q2 = q1 / scale[row] * k, q2 / scale[row] * k
    ev = f.evidence or {}
    if f.kind == "degraded" or not peers.size:
        base = num(ev.get("baseline_gap_ms"))
        if base is None or not base > 0:
            return None
        ref1 = ref2 = base
        out: dict[str, Any] = {"rule": "q1_shift>=half_median_shift vs baseline"}
        out.update(q1_ms=rnd(q1, 3), median_ms=rnd(q2, 3), baseline_ms=rnd(base, 3))
    else:
        p1 = cols.floats("gap_q1_ms")[peers]
        p2 = cols.floats("gap_q2_ms")[peers]
        p2 = np.where(np.isfinite(p2), p2, cols.floats("gap_ms")[peers])
        if scale is not None:
            k = float(np.median(scale))
            p1, p2 = p1 / scale[peers] * k, p2 / scale[peers] * k
        p1, p2 = p1[np.isfinite(p1)], p2[np.isfinite(p2)]
        if not p1.size or not p2.size:
            return None
        ref1, ref2 = float(np.median(p1)), float(np.median(p2))
        pace = 1.0
        shift = num(ev.get("shift"))
        ratio = num(f.ratio)
        if f.basis == "history" and shift is not None and ratio is not None and shift > -1:
            # judged against its own confirmed pace (a rank always a little off its
            # peers): the shift is measured from that pace
            pace = ratio / (1.0 + shift)
            ref1, ref2 = ref1 * pace, ref2 * pace
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
    out["passed"] = bool(s2 > 0 and s1 >= CONFIRM_Q1_SHARE * s2)
    return out


def not_shifted(check: Mapping[str, Any]) -> str:
    ref = check.get("peers_median_ms", check.get("baseline_ms"))
    what = "its peers' median" if "peers_median_ms" in check else "its own baseline"
    s1, s2 = check.get("q1_shift") or 0.0, check.get("median_shift") or 0.0
    return (
        f"its lower quartile of per-step compute gap ({check.get('q1_ms')} ms, "
        f"{100 * s1:+.1f}%) did not move with its median ({check.get('median_ms')} ms, "
        f"{100 * s2:+.1f}%) against {what} ({ref} ms): a tail of long steps (stalls), "
        "not a slower rank"
    )
