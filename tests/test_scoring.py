"""Leave-one-out scoring against a brute-force reference and by hand."""

from __future__ import annotations

import numpy as np
import pytest
from artemis.detect.scoring import MAD_SCALE, group_ids, score, score_reference
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


def _same(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=0, equal_nan=True)


def test_hand_computed_small_group() -> None:
    x = np.array([10.0, 11.0, 12.0, 20.0])
    s = score(x, np.zeros(4, dtype=np.int64))
    # Median of the others, written out by hand.
    others = [[11, 12, 20], [10, 12, 20], [10, 11, 20], [10, 11, 12]]
    expect_loo = np.array([np.median(o) for o in others])
    _same(s.loo_median, expect_loo)
    _same(s.ratio, x / expect_loo)
    # Rank 3: others 10, 11, 12 -> median 11, MAD 1.
    assert s.z[3] == pytest.approx((20.0 - 11.0) / (MAD_SCALE * 1.0))
    assert list(s.group_size) == [4, 4, 4, 4]


def test_groups_are_scored_separately_and_singletons_are_nan() -> None:
    x = np.array([1.0, 2.0, 100.0, 200.0, 5.0])
    g = np.array([0, 0, 1, 1, 2])
    s = score(x, g)
    _same(s.loo_median, np.array([2.0, 1.0, 200.0, 100.0, np.nan]))
    assert np.isnan(s.ratio[4]) and np.isnan(s.z[4])
    assert list(s.group_size) == [2, 2, 2, 2, 1]


def test_identical_peers_use_the_relative_mad_floor() -> None:
    x = np.array([100.0, 100.0, 100.0, 110.0])
    s = score(x, np.zeros(4, dtype=np.int64))
    # MAD of the others is 0; the floor is 1e-3 x median = 0.1.
    assert s.z[3] == pytest.approx(10.0 / (MAD_SCALE * 0.1))
    assert s.z[0] == 0.0


def test_empty_and_bad_shapes() -> None:
    s = score(np.array([]), np.array([], dtype=np.int64))
    assert s.ratio.size == 0
    with pytest.raises(ValueError, match="equal length"):
        score(np.ones(3), np.zeros(2, dtype=np.int64))


def test_group_ids_combine_labels() -> None:
    g = group_ids(np.array(["a", "a", "b", "b"]), np.array(["x", "y", "x", "x"]))
    assert g[2] == g[3] and len({int(g[0]), int(g[1]), int(g[2])}) == 3


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.integers(1, 40),
        elements=st.one_of(
            st.sampled_from([1.0, 2.0, 3.0]), st.floats(0.1, 1000.0, allow_nan=False)
        ),
    ),
    st.integers(1, 4),
    st.integers(0, 2**31 - 1),
)
def test_matches_brute_force(x: np.ndarray, ngroups: int, seed: int) -> None:
    raw = np.random.default_rng(seed).integers(0, ngroups, x.size)
    g = np.unique(raw, return_inverse=True)[1].astype(np.int64)
    a, b = score(x, g), score_reference(x, g)
    for name in ("loo_median", "ratio", "z"):
        _same(getattr(a, name), getattr(b, name))
    assert np.array_equal(a.group_size, b.group_size)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 60), st.floats(1e-3, 1e4), st.integers(0, 2**31 - 1))
def test_scale_and_permutation_invariance(n: int, c: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.uniform(50, 150, n)
    g = rng.integers(0, 2, n)
    g = np.unique(g, return_inverse=True)[1].astype(np.int64)
    base = score(x, g)
    scaled = score(x * c, g)
    np.testing.assert_allclose(scaled.ratio, base.ratio, rtol=1e-9, equal_nan=True)
    np.testing.assert_allclose(scaled.z, base.z, rtol=1e-7, atol=1e-9, equal_nan=True)
    perm = rng.permutation(n)
    shuffled = score(x[perm], g[perm])
    _same(shuffled.ratio, base.ratio[perm])
    _same(shuffled.z, base.z[perm])


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.integers(1, 80),
        elements=st.one_of(st.sampled_from([1.0, 2.0]), st.floats(0.1, 1000.0, allow_nan=False)),
    ),
    st.sampled_from([1, 3, 40]),
    st.integers(0, 2**31 - 1),
)
def test_partitioned_and_sorted_paths_agree(x: np.ndarray, ngroups: int, seed: int) -> None:
    """Few groups are partitioned around their middle, many are sorted (scoring.FEW_GROUPS):
    the same numbers either way, ties included."""
    import artemis.detect.scoring as scoring

    raw = np.random.default_rng(seed).integers(0, ngroups, x.size)
    g = np.unique(raw, return_inverse=True)[1].astype(np.int64)
    few = scoring.score(x, g)
    saved = scoring.FEW_GROUPS
    scoring.FEW_GROUPS = 0
    try:
        many = scoring.score(x, g)
    finally:
        scoring.FEW_GROUPS = saved
    ref = score_reference(x, g)
    for name in ("loo_median", "ratio", "z"):
        _same(getattr(few, name), getattr(many, name))
        _same(getattr(many, name), getattr(ref, name))
    assert np.array_equal(few.group_size, many.group_size)
