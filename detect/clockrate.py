"""A rank whose device clock runs at the wrong rate, found and corrected from its peers.

In a synchronous job every rank of a communicator waits for the others in each
collective, so every rank measures the same step time (the end of a step's last
collective to the next one's: docs/DESIGN.md, the window summary's `step_ms`);
a slow rank makes everyone's step longer, not only its own. A rank whose
`step_ms` differs from its communicator's median by more than `RATE_TOLERANCE`
therefore measures time on a clock that runs fast or slow (a wrong tick rate,
a drifting timer), and every duration it reports is off by the same factor.
Left alone it would be flagged (a clock running 30% slow reports a 30% longer
compute gap). Its durations are rescaled by median / own step time here, and the
correction is counted (reason `rate`, docs/RELIABILITY.md "4. Device-clock
anomalies"). Pure: columns in, columns out.

The agent cannot do this itself: a rank's host clock is a reference only when
the job runs in real time (the simulator's device times are virtual), and an
agent sees only its own node's ranks. A communicator of fewer than
`RATE_MIN_RANKS` timed ranks is left alone (no majority to trust). Only rows
timed on a device clock are rescaled: the host's CLOCK_MONOTONIC runs at the
true rate, so a host-timed rank off its peers' step time is left as it is
(and counts in the peers' median like any other).
"""

from __future__ import annotations

import math

import numpy as np
from artemis.protocol.columns import WindowColumns

RATE_TOLERANCE = 0.05  # step times of one communicator agree far closer (DETECTOR.md)
RATE_MIN_RANKS = 3
# The durations a rank reports on its own clock.
RATE_FIELDS = (
    "gap_ms",
    "coll_ms",
    "step_ms",
    "gap_q1_ms",
    "gap_q2_ms",
    "gap_q3_ms",
    "gap_mean_ms",
    "gap_max_ms",
    "bridge_ms",
)


def correct_rates(cols: WindowColumns) -> tuple[WindowColumns, dict[int, float]]:
    """(the columns with wrong-rate ranks rescaled, {rank: factor applied})."""
    if cols.n < RATE_MIN_RANKS:
        return cols, {}
    step = cols.floats("step_ms")
    comm = np.asarray(cols["comm"], dtype=object)
    device = np.asarray(cols["clock"], dtype=object) != "host"
    factor = np.ones(cols.n)
    band = math.log1p(RATE_TOLERANCE)
    for c in set(cols["comm"]):
        idx = np.flatnonzero((comm == c) & np.isfinite(step) & (step > 0))
        if idx.size < RATE_MIN_RANKS:
            continue
        ratio = step[idx] / float(np.median(step[idx]))
        off = np.abs(np.log(ratio)) > band
        if 2 * int(off.sum()) >= idx.size:
            continue  # no majority agrees on the step time: nothing to trust
        off &= device[idx]
        factor[idx[off]] = 1.0 / ratio[off]
    fix = np.flatnonzero(factor != 1.0)
    if not fix.size:
        return cols, {}
    new = dict(cols.cols)
    for name in RATE_FIELDS:
        new[name] = cols.floats(name) * factor  # NaN (absent) stays NaN
    ranks = cols.ints("rank")
    return WindowColumns(cols.n, new), {int(ranks[i]): float(factor[i]) for i in fix}


def reported(cols: WindowColumns) -> dict[str, int]:
    """The agents' own clock-anomaly counts over a window's rows, by reason."""
    out = {}
    for reason in ("reversed", "jump", "wrap", "reset"):
        n = int(np.nansum(cols.floats(f"clock_{reason}")))
        if n:
            out[reason] = n
    return out
