"""Leave-one-out scoring of one window: pure, vectorised numpy.

Each rank is compared with the *other* ranks of its group (island, or island x
hardware class). Leaving the rank out matters in small groups: with 4 ranks a
straggler pulls the plain median towards itself and hides.

The leave-one-out median needs no per-rank work. Sort each group once; a group
of n values s[0..n-1] without the element at sorted position p has n-1 values,
and its median is one or two order statistics of s, shifted by one past p:

- n even (n-1 odd): s[n/2] when p < n/2, else s[n/2 - 1];
- n odd, k = (n-1)/2: (s[k] + s[k+1]) / 2 when p < k, (s[k-1] + s[k]) / 2 when
  p > k, (s[k-1] + s[k+1]) / 2 when p == k.

So a group has at most three distinct leave-one-out medians ("centres"). The
MAD of the others around the rank's own centre is computed the same way: for
each of the three centres, sort the absolute deviations once and take the
leave-one-out median by position. Four sorts in all, whatever the group count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

# 1.4826 x MAD estimates the standard deviation of normal data.
MAD_SCALE = 1.4826
# A MAD of zero (identical peers) would make z infinite for any difference; a
# floor relative to the median keeps z finite and scale-free.
MAD_FLOOR_REL = 1e-3
# Up to this many groups (islands x classes: a few), each group is partitioned
# around its middle (O(n), no sort); more groups take the sorted path below.
FEW_GROUPS = 32


@dataclass(frozen=True)
class Scores:
    """Per-rank scores of one window, aligned with the input arrays."""

    loo_median: F64  # median of the other ranks of the group (NaN: no other rank)
    ratio: F64  # value / loo_median (NaN when undefined)
    z: F64  # (value - loo_median) / (1.4826 * MAD of the others)
    group_size: I64  # ranks in the rank's group, itself included


def group_ids(*labels: npt.ArrayLike) -> I64:
    """Dense integer ids for the distinct combinations of the label arrays."""
    if not labels:
        raise ValueError("group_ids needs at least one label array")
    cols = [np.unique(np.asarray(lab), return_inverse=True)[1].ravel() for lab in labels]
    if len(cols) == 1:
        return cols[0].astype(np.int64)
    stacked = np.stack(cols, axis=1)
    return np.unique(stacked, axis=0, return_inverse=True)[1].ravel().astype(np.int64)


def _loo_positions(start: I64, n: I64, p: I64) -> tuple[I64, I64]:
    """Indices (into the sorted array) of the two order statistics whose mean is
    the leave-one-out median of the element at in-group position p."""
    m = n - 1
    # Index of the lower and upper middle of the remaining m values.
    lo = (m - 1) // 2
    hi = m // 2
    # Remaining index k maps back to sorted index k (k < p) or k + 1 (k >= p).
    lo_s = np.where(lo < p, lo, lo + 1)
    hi_s = np.where(hi < p, hi, hi + 1)
    return start + lo_s, start + hi_s


def _sorted_layout(values: F64, gid: I64) -> tuple[I64, I64, I64, I64]:
    """order, group start and size per sorted slot, position of each slot in its group."""
    order = np.lexsort((values, gid)).astype(np.int64)
    g_sorted = gid[order]
    counts = np.bincount(gid).astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    start = starts[g_sorted]
    n = counts[g_sorted]
    pos = np.arange(values.size, dtype=np.int64) - start
    return order, start, n, pos


def _loo_median_sorted(s: F64, start: I64, n: I64, pos: I64) -> F64:
    """Leave-one-out median for each slot of the group-sorted array `s`."""
    out = np.full(s.size, np.nan)
    ok = n >= 2
    a, b = _loo_positions(start[ok], n[ok], pos[ok])
    out[ok] = 0.5 * (s[a] + s[b])
    return out


def score(values: npt.ArrayLike, gid: npt.ArrayLike) -> Scores:
    """Leave-one-out ratio and robust z of `values` within groups `gid` (dense ints).

    Ranks alone in their group get NaN ratio and z (nobody to compare with).
    """
    x = np.ascontiguousarray(values, dtype=np.float64)
    g = np.ascontiguousarray(gid, dtype=np.int64)
    if x.shape != g.shape or x.ndim != 1:
        raise ValueError(f"values and gid must be 1-D of equal length, got {x.shape} and {g.shape}")
    size = x.size
    if size == 0:
        empty = np.empty(0)
        return Scores(empty, empty, empty, np.empty(0, dtype=np.int64))
    if g.min() < 0:
        raise ValueError("group ids must be non-negative")

    groups = int(g.max()) + 1
    if groups <= FEW_GROUPS and np.isfinite(x).all():
        loo, mad, group_size = _few_groups(x, g, groups)
        return _finish(x, loo, mad, group_size)

    order, start, n, pos = _sorted_layout(x, g)
    s = x[order]
    loo_sorted = _loo_median_sorted(s, start, n, pos)

    # The (up to) three centres of each group, per sorted slot, and which one
    # each slot uses (see the module docstring).
    k_lo = start + (n - 1) // 2 - (n % 2 == 1)  # s[k-1] for odd n, s[n/2-1] for even n
    k_mid = start + (n - 1) // 2  # s[k] odd / s[n/2 - 1] even
    k_hi = start + np.minimum(n // 2 + (n % 2 == 1), n - 1)  # s[k+1] odd / s[n/2] even
    k_lo = np.maximum(k_lo, start)
    odd = n % 2 == 1
    centre_before = np.where(odd, 0.5 * (s[k_mid] + s[k_hi]), s[k_hi])  # p below middle
    centre_after = np.where(odd, 0.5 * (s[k_lo] + s[k_mid]), s[k_lo])  # p above middle
    centre_at = 0.5 * (s[k_lo] + s[k_hi])  # odd n, p == k
    half = (n - 1) // 2
    which = np.where(
        odd,
        np.where(pos < half, 0, np.where(pos > half, 1, 2)),
        np.where(pos < n // 2, 0, 1),
    )

    mad_sorted = np.full(size, np.nan)
    g_sorted = g[order]
    for c_idx, centre in enumerate((centre_before, centre_after, centre_at)):
        use = which == c_idx
        if not use.any():
            continue
        dev = np.abs(s - centre)
        d_order = np.lexsort((dev, g_sorted)).astype(np.int64)
        d_sorted = dev[d_order]
        # Position of each slot within its group in deviation order.
        d_pos = np.empty(size, dtype=np.int64)
        d_pos[d_order] = np.arange(size, dtype=np.int64) - start[d_order]
        ok = use & (n >= 2)
        a, b = _loo_positions(start[ok], n[ok], d_pos[ok])
        mad_sorted[ok] = 0.5 * (d_sorted[a] + d_sorted[b])

    loo = np.empty(size)
    loo[order] = loo_sorted
    mad = np.empty(size)
    mad[order] = mad_sorted
    group_size = np.empty(size, dtype=np.int64)
    group_size[order] = n
    return _finish(x, loo, mad, group_size)


def _finish(x: F64, loo: F64, mad: F64, group_size: I64) -> Scores:
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(loo > 0, x / loo, np.nan)
        scale = MAD_SCALE * np.maximum(mad, MAD_FLOOR_REL * np.abs(loo))
        z = (x - loo) / scale
    z = np.where(scale > 0, z, np.nan)
    return Scores(loo_median=loo, ratio=ratio, z=z, group_size=group_size)


def _pick(v: F64, t: F64, k: int) -> F64:
    """Order statistic k of a group's n values once each slot's own value v is left
    out (t: the values partitioned at k and k + 1): t[k] when v lies above it (the slot
    sits above k), else t[k + 1]. A tie picks t[k + 1], which then equals t[k]."""
    return np.where(v > t[k], t[k], t[k + 1])


def _loo_median_partitioned(v: F64) -> tuple[F64, list[float]]:
    """Each slot's leave-one-out median of one group's values `v` (n >= 2), by two
    order statistics per slot, and the distinct values it can take (at most four)."""
    n = v.size
    lo, hi = (n - 2) // 2, (n - 1) // 2  # middle indices of the remaining n - 1
    t = np.partition(v, sorted({lo, lo + 1, hi, hi + 1}))
    loo = 0.5 * (_pick(v, t, lo) + _pick(v, t, hi))
    centres = {0.5 * (a + b) for a in (t[lo], t[lo + 1]) for b in (t[hi], t[hi + 1])}
    return loo, sorted(float(c) for c in centres)


def _few_groups(x: F64, g: I64, groups: int) -> tuple[F64, F64, I64]:
    """Leave-one-out median and MAD without sorting: per group, a partition around the
    middle gives both (O(n)), and the MAD needs one more per distinct centre (at most
    three in use). Same values as the sorted path, which serves many groups."""
    size = x.size
    loo = np.full(size, np.nan)
    mad = np.full(size, np.nan)
    group_size = np.empty(size, dtype=np.int64)
    for k in range(groups):
        idx: slice | I64 = slice(None) if groups == 1 else np.flatnonzero(g == k)
        v = x[idx]
        n = v.size
        group_size[idx] = n
        if n < 2:
            continue
        c, centres = _loo_median_partitioned(v)
        m = np.empty(n)
        for centre in centres:
            use = c == centre  # exact: c holds these very sums
            if not use.any():
                continue
            dev = np.abs(v - centre)
            m[use] = _loo_median_partitioned(dev)[0][use]
        loo[idx] = c
        mad[idx] = m
    return loo, mad, group_size


def ratio_reaching(
    values: npt.ArrayLike, gid: npt.ArrayLike, judged: npt.NDArray[np.bool_], at_least: float
) -> F64:
    """`score(values, gid).ratio` for every judged entry whose ratio can reach `at_least`,
    NaN for the rest (entries not judged, and those whose ratio is provably below it):
    the recurring-stall test's question, answered without the MAD or the unjudged ranks.

    A leave-one-out median of a group of n is at least the group's order statistic
    (n - 2) // 2 (leaving one value out lowers none), so an entry below `at_least` of
    it, with a relative margin far beyond rounding, cannot reach `at_least`; only the
    others get the exact median, from the same partition `score` uses (the same
    order statistics, the same arithmetic: equal bits). As before this existed, no
    ratio at all (all NaN) unless some judged entry reaches `at_least` of that bound.
    Many groups, or values that are not all finite, take `score` itself."""
    x = np.ascontiguousarray(values, dtype=np.float64)
    g = np.ascontiguousarray(gid, dtype=np.int64)
    out = np.full(x.size, np.nan)
    groups = np.unique(g[judged]).tolist()
    if not groups:
        return out
    fast = (
        len(groups) <= FEW_GROUPS
        and int(g.max()) + 1 <= FEW_GROUPS  # `score` partitions these too
        and at_least > 0
        and bool(np.isfinite(x).all())
    )
    if not fast:
        if len(groups) > FEW_GROUPS or any(
            (x[judged & (g == k)] >= at_least * _lower_bound(x[g == k])).any() for k in groups
        ):
            out[judged] = score(x, g).ratio[judged]
        return out
    reached = False
    for k in groups:
        idx = np.flatnonzero(g == k)
        v = x[idx]
        mine = judged[idx]
        n = v.size
        if n < 2:
            reached = reached or bool((v[mine] >= 0.0).any())
            continue  # no other rank: no ratio
        lo, hi = (n - 2) // 2, (n - 1) // 2
        t = np.partition(v, sorted({lo, lo + 1, hi, hi + 1}))
        low = float(t[lo])
        reached = reached or bool((v[mine] >= at_least * low).any())
        may = mine if low <= 0 else mine & (v >= at_least * low * (1.0 - 1e-9))
        vc = v[may]
        loo = 0.5 * (_pick(vc, t, lo) + _pick(vc, t, hi))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out[idx[may]] = np.where(loo > 0, vc / loo, np.nan)
    if not reached:
        out[:] = np.nan
    return out


def _lower_bound(vals: F64) -> float:
    """The order statistic (n - 2) // 2 of a group: no leave-one-out median is below it."""
    k = (vals.size - 2) // 2
    return float(np.partition(vals, k)[k]) if vals.size >= 2 else 0.0


def score_reference(values: npt.ArrayLike, gid: npt.ArrayLike) -> Scores:
    """The same scores by brute force (O(n^2) per group): for tests and docs only."""
    x = np.asarray(values, dtype=np.float64)
    g = np.asarray(gid, dtype=np.int64)
    loo = np.full(x.size, np.nan)
    mad = np.full(x.size, np.nan)
    size = np.zeros(x.size, dtype=np.int64)
    for i in range(x.size):
        others = x[(g == g[i]) & (np.arange(x.size) != i)]
        size[i] = others.size + 1
        if others.size:
            loo[i] = np.median(others)
            mad[i] = np.median(np.abs(others - loo[i]))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(loo > 0, x / loo, np.nan)
        scale = MAD_SCALE * np.maximum(mad, MAD_FLOOR_REL * np.abs(loo))
        z = np.where(scale > 0, (x - loo) / scale, np.nan)
    return Scores(loo_median=loo, ratio=ratio, z=z, group_size=size)
