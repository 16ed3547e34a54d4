"""A window's device-clock times checked for the clock's anomalies (reversed, jump, wrap,
reset: docs/RELIABILITY.md "4. Device-clock anomalies") and laid on one continuous
timeline. Pure."""

from __future__ import annotations

import numpy as np

# Device-clock anomalies (docs/RELIABILITY.md "4. Device-clock anomalies"), per reason.
CLOCK_REASONS = ("reversed", "jump", "wrap", "reset")
WRAP_BITS = (32, 40, 48, 56)  # device counters narrower than 64 bits (64 wraps modulo 2**64)
JUMP_S = 600.0  # the device clock stepping this much further than the host's did is a jump
BACK_S = 1.0  # the device clock going back more than this (no wrap explains it) is a reset


class Timeline:
    """A window's device times made continuous: see `device_timeline`."""

    __slots__ = ("broken", "counts", "end", "keep", "start")

    def __init__(
        self,
        keep: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        broken: np.ndarray,
        counts: dict[str, int],
    ) -> None:
        self.keep, self.start, self.end, self.broken, self.counts = keep, start, end, broken, counts


def _wrap_fix(a: int, b: int, lo: int, hi: int) -> int | None:
    """`b - a` on a counter narrower than 64 bits that wrapped between a and b, when that
    difference lands in [lo, hi]; else None."""
    for k in WRAP_BITS:
        top = 1 << k
        if a < top and b < top and lo <= b + top - a <= hi:
            return b + top - a
    return None


def device_timeline(
    start: np.ndarray,
    end: np.ndarray,
    enqueue: np.ndarray,
    inside: np.ndarray,
    units_per_s: float,
) -> Timeline:
    """One rank's device-clock records (sorted by coll_seq), checked for the clock's
    anomalies and laid on one continuous timeline in device units from the first kept
    start: ``start``/``end`` int64 for the kept records, ``broken`` where the gap before a
    kept record is unknown, ``counts`` per reason (only records/gaps ``inside`` the window:
    the one before it belongs to the previous window). Per record, end before start is a
    counter wrap when a 64-bit or narrower wrap explains it (corrected), else ``reversed``
    (the record is left out of the timings). Between two records, a step back past
    ``BACK_S`` is a ``wrap`` when one explains it (corrected: the true gap is kept), else a
    ``reset`` (a GPU reset restarts the timer); a step forward ``JUMP_S`` past what the
    host clock (enqueue times) saw is a ``jump``. After a reset or a jump the times go on
    from the previous record's end, and that gap is ``broken`` (unknown), never a
    fabricated compute gap."""
    n = int(start.size)
    counts = dict.fromkeys(CLOCK_REASONS, 0)
    s = np.asarray(start, dtype=np.uint64)
    e = np.asarray(end, dtype=np.uint64)
    jump = int(JUMP_S * units_per_s)
    back = int(BACK_S * units_per_s)
    dur = (e - s).view(np.int64).copy()  # modulo 2**64: a 64-bit wrap comes out right
    keep = np.ones(n, dtype=bool)
    for i in np.flatnonzero(e < s).tolist():
        d = int(dur[i])
        fixed = d if 0 <= d <= jump else _wrap_fix(int(s[i]), int(e[i]), 0, jump)
        reason = "reversed" if fixed is None else "wrap"
        if fixed is None:
            keep[i] = False
        else:
            dur[i] = fixed
        counts[reason] += bool(inside[i])
    idx = np.flatnonzero(keep)
    s, e, dur = s[idx], e[idx], dur[idx]
    k = int(idx.size)
    gap = np.zeros(k, dtype=np.int64)
    broken = np.zeros(k, dtype=bool)
    if k > 1:
        gap[1:] = (s[1:] - e[:-1]).view(np.int64)
        enq = np.asarray(enqueue, dtype=np.uint64)[idx]
        host = np.zeros(k, dtype=np.float64)
        both = (enq[1:] > 0) & (enq[:-1] > 0)
        host[1:][both] = (enq[1:][both] - enq[:-1][both]).view(np.int64) * (units_per_s / 1e9)
        odd = (gap < -back) | ((gap > jump) & (gap > host + jump))
        # numerically back by more than `back` (a 64-bit wrap leaves a small modular gap)
        odd[1:] |= (e[:-1] > s[1:]) & ((e[:-1] - s[1:]) > np.uint64(back))
        odd[0] = False
        for i in np.flatnonzero(odd).tolist():
            g = int(gap[i])
            a, b = int(e[i - 1]), int(s[i])
            if b < a - back and -back <= g <= jump:
                counts["wrap"] += 1  # a 64-bit counter wrapped: g is the true gap
            elif g < -back:
                w = _wrap_fix(a, b, -back, jump)
                if w is None:
                    counts["reset"] += 1
                    gap[i], broken[i] = 0, True
                else:
                    counts["wrap"] += 1
                    gap[i] = w
            elif g > jump and g > host[i] + jump:
                counts["jump"] += 1
                gap[i], broken[i] = 0, True
    rel_s = np.zeros(k, dtype=np.int64)
    if k > 1:
        rel_s[1:] = np.cumsum(dur[:-1] + gap[1:])
    return Timeline(keep, rel_s, rel_s + dur, broken, counts)
