"""Collectives per step: the period of a rank's (function, bytes) sequence (agent/summary.py
"Steps and windows"). Pure."""

from __future__ import annotations

import numpy as np


def infer_period(
    funcs: np.ndarray,
    sizes: np.ndarray,
    max_period: int = 64,
    min_periods: int = 3,
    tolerance: float | None = None,
) -> int | None:
    """Collectives per step: the smallest period of the (func, bytes) sequence.

    ``funcs[i]``/``sizes[i]`` describe the collective with index ``first + i``;
    an entry with ``funcs[i] < 0`` is unknown (lost) and takes part in no
    comparison. Period ``p`` explains the sequence when at most ``tolerance``
    of the comparisons ``x[i]`` vs ``x[i-p]`` disagree (default
    ``0.5 / max_period``: any wrong period below a true one of at most
    ``max_period`` disagrees at least once per true period, so it fails).

    Returns None until there is enough data to rule out every longer period up
    to ``max_period``: ``len >= max(min_periods * p, p + 2 * max_period)``.
    A stream of identical collectives has period 1 (each collective is taken as
    a step) unless the caller configures ``colls_per_step``.
    """
    f = np.asarray(funcs, dtype=np.int64)
    s = np.asarray(sizes, dtype=np.int64)
    if f.shape != s.shape or f.ndim != 1:
        raise ValueError("funcs and sizes must be 1-d arrays of the same length")
    if max_period < 1 or min_periods < 2:
        raise ValueError("max_period must be >= 1 and min_periods >= 2")
    tol = 0.5 / max_period if tolerance is None else tolerance
    n = f.size
    valid = f >= 0
    for p in range(1, max_period + 1):
        if n < max(min_periods * p, p + 2 * max_period):
            return None  # the requirement only grows with p
        both = valid[p:] & valid[:-p]
        m = int(both.sum())
        if m < (min_periods - 1) * p:
            continue
        differ = both & ((f[p:] != f[:-p]) | (s[p:] != s[:-p]))
        if int(differ.sum()) <= tol * m:
            return p
    return None
