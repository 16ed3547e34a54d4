"""The maths of a split: samples per rank of one step's global batch. Pure, no state.

One definition each of the uniform split, a rank's slice, the bounds a rank's
share must stay in, and the proportional split within them (rebalance/README.md
"The split"). The policy, the agent, the job's client and the simulator all use
these, so a uniform split means the same thing everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "proportional_split",
    "rank_slice",
    "split_bounds",
    "step_compute_ms",
    "uniform_split",
]


def uniform_split(global_batch: int, nranks: int) -> list[int]:
    """The even split; the first ``global_batch % nranks`` ranks take one sample more."""
    if nranks < 1 or global_batch < 0:
        raise ValueError("need nranks >= 1 and global_batch >= 0")
    q, r = divmod(global_batch, nranks)
    return [q + 1 if i < r else q for i in range(nranks)]


def rank_slice(sizes: Sequence[int], rank: int) -> tuple[int, int]:
    """[lo, hi) of ``rank``'s samples inside a global batch split into ``sizes``."""
    lo = sum(sizes[:rank])
    return lo, lo + sizes[rank]


def split_bounds(
    global_batch: int, nranks: int, max_shift_frac: float, min_samples: int
) -> tuple[int, int]:
    """Whole-sample bounds (lo, hi) every rank's share must stay within.

    They are widened to the integer uniform shares (floor/ceil of G/n) so that
    the uniform split is always inside them and n*lo <= G <= n*hi always holds.
    """
    u = global_batch / nranks
    eps = 1e-9
    lo = max(min_samples, math.ceil(u * (1.0 - max_shift_frac) - eps))
    hi = math.floor(u * (1.0 + max_shift_frac) + eps)
    return min(lo, global_batch // nranks), max(hi, -(-global_batch // nranks))


def proportional_split(
    speeds: Sequence[float] | np.ndarray,
    global_batch: int,
    max_shift_frac: float,
    min_samples: int,
) -> list[int]:
    """Samples per rank proportional to ``speeds``, clamped to the bounds, in whole samples.

    The continuous solution is x_i = clamp(lambda * s_i, lo, hi) with lambda chosen so
    that sum x_i = G (found by bisection: the sum is monotone in lambda). It is then
    rounded by largest remainder, which keeps the sum exactly G and every share
    within [lo, hi] because lo and hi are whole numbers. Vectorised: a plan for a
    100k-rank job is computed inside one window.
    """
    s = np.asarray(speeds, dtype=np.float64)
    n = int(s.size)
    if n < 1:
        raise ValueError("no ranks")
    if not bool(np.all(np.isfinite(s) & (s > 0.0))):
        raise ValueError(f"speeds must be positive and finite: {s.tolist()}")
    if global_batch < n * min_samples:
        raise ValueError(f"global batch {global_batch} cannot give {n} ranks {min_samples} each")
    lo, hi = split_bounds(global_batch, n, max_shift_frac, min_samples)
    a, b = 0.0, hi / float(s.min())  # total(a) = n*lo <= G <= n*hi = total(b)
    for _ in range(200):
        m = 0.5 * (a + b)
        if not a < m < b:
            break  # a and b are neighbouring floats: no further step changes them
        if float(np.clip(m * s, lo, hi).sum()) < global_batch:
            a = m
        else:
            b = m
    x = np.clip(b * s, lo, hi)
    base = np.minimum(hi, np.floor(x + 1e-9)).astype(np.int64)
    left = global_batch - int(base.sum())
    # Largest remainder first; ties go to the faster rank, then the lower rank index.
    order = np.lexsort((np.arange(n), -s, -(x - base)))
    if left > 0:
        room = order[base[order] < hi][:left]
        base[room] += 1
        left -= int(room.size)
    # Bisection leaves x a hair off; settle any remaining sample on a rank with room.
    while left != 0:
        step = 1 if left > 0 else -1
        ok = order[(base[order] + step >= lo) & (base[order] + step <= hi)]
        base[ok[0]] += step
        left -= step
    return [int(v) for v in base]


def step_compute_ms(split: Sequence[int], speeds: Sequence[float] | np.ndarray) -> float:
    """Predicted compute time of a step: the slowest rank's samples / speed (speeds in samples/s)."""
    n = np.asarray(split, dtype=np.float64)
    s = np.asarray(speeds, dtype=np.float64)
    if n.shape != s.shape:
        raise ValueError(f"{n.size} shares for {s.size} speeds")
    return float(np.max(1000.0 * n / s))
