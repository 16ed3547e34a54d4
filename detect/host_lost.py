"""The host's evidence: a rank that lost wall time its peers did not, and made them wait.

Pure (no I/O). On a CPU collective (gloo reduces on the ranks' CPUs) a rank
stopped or throttled inside an all-reduce holds every rank there, and each
rank's arrival, its gap, shows nothing: the timing alone cannot say which rank
it was (DETECTOR.md "Known limits"). The host can. Two figures say a process
was kept off its CPU for a reason outside it, and a healthy peer's read 0:

- `stopped_pct`: sampled state T (SIGSTOP, a scheduler's suspend, a debugger);
- `cg_throttled_pct`: its cgroup's CPU quota ran out (a container's limit).

A rank is bad by them (DETECTOR.md "The host's evidence") when

- its lost share (the two summed: a stopped task is not runnable, so never
  throttled at once) is at least `1 - 1/suspect_ratio` (9.1% at 1.10) of the
  wall time above the median of the others of its group (its mate's, in a
  group of two): on the critical path that much lost makes the step
  `suspect_ratio` slower; and
- it costs: the others wait for it, their median time in the collectives
  over its own by at least `WAIT_MIN` of the seed's margin of a step (3% at
  1.10). A rank with slack (a GPU job's launch thread throttled while the
  kernels run) makes nobody wait and is not judged bad, whatever its figures.

Run delay is not among the figures: on a shared host every rank waits for a
CPU by turns, and its differences are the host's noise that the timing tests
already judge. The cost of such a window is that wait (`wait_ms`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from artemis.detect import scoring
from artemis.detect.arrays import F64
from artemis.detect.settings import Settings
from artemis.detect.view import View

# The wait a rank must cause, as a share of its group's median step, in units of
# the seed's margin (suspect_ratio - 1). The lost share is the main witness; the
# wait only says the lost time was on the critical path, and its own noise (a
# shared host's: the last arrival moves from rank to rank) kept half the margin
# (5% of a step) from 3 in 10 of the test job's windows with a 7 ms stop in a
# 72 ms step (tests/test_host_lost.py).
WAIT_MIN = 0.3


def lost_margin(s: Settings) -> float:
    """The lost share (points of the wall time over the others') that judges a rank:
    `1 - 1/suspect_ratio`, what makes a step `suspect_ratio` slower on the critical
    path. (PEER_MIN's 5%, 4.8 points, was tried: the same on every kept run.)"""
    return 100.0 * (1.0 - 1.0 / s.suspect_ratio)


def lost_share(v: View, at_least: float) -> F64 | None:
    """Per rank, the % of the wall time its host kept it off its CPU for a reason
    outside it (stopped + throttled, each capped at 100); NaN where neither figure is
    reported; None where no rank's reaches `at_least` (the usual window: then no
    rank can pass the margin, and the test costs two column scans)."""
    stopped = v.cols.floats("tel_stopped_pct")[v.row]
    throttled = v.cols.floats("tel_cg_throttled_pct")[v.row]
    top = np.nanmax(stopped, initial=0.0) + np.nanmax(throttled, initial=0.0)
    if not top >= at_least:
        return None
    with np.errstate(invalid="ignore"):
        have = np.isfinite(stopped) | np.isfinite(throttled)
        lost = np.fmin(np.nan_to_num(stopped), 100.0) + np.fmin(np.nan_to_num(throttled), 100.0)
    return np.where(have, lost, np.nan)


def host_test(
    v: View, s: Settings, judged: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.bool_], F64 | None]:
    """(bad by the host's evidence, the wait each rank causes in ms: the median of its
    group's others' time in the collectives less its own; None where no rank lost
    any time). Against the others of its group (the leave-one-out median), so a
    rank with one mate (`degraded`: a 2-rank job) is judged against that mate."""
    n = v.r.size
    margin = lost_margin(s)
    lost = lost_share(v, margin)
    if lost is None:
        return np.zeros(n, dtype=bool), None
    others = scoring.score(np.nan_to_num(lost), v.gid)
    wait = scoring.score(v.coll, v.gid).loo_median - v.coll
    step = scoring.score(v.actual + v.coll, v.gid).loo_median
    with np.errstate(invalid="ignore"):
        bad = (
            judged
            & (others.group_size >= 2)
            & (lost - others.loo_median >= margin)
            & (wait >= WAIT_MIN * (s.suspect_ratio - 1.0) * step)
        )
    return bad, wait
