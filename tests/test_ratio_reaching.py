"""The recurring-stall test's bounded scoring (`scoring.ratio_reaching`, issue 28's
performance pass): every judged ratio that reaches the margin is `score`'s, bit for bit,
and only ratios that cannot reach it are left out."""

from __future__ import annotations

import numpy as np
from artemis.detect.scoring import ratio_reaching, score
from hypothesis import given, settings
from hypothesis import strategies as st


def _check(x: np.ndarray, g: np.ndarray, judged: np.ndarray, at_least: float) -> np.ndarray:
    got = ratio_reaching(x, g, judged, at_least)
    full = score(x, g).ratio
    # what the stall rule asks: the judged ranks at or past the margin, all of them
    reach = judged & (full >= at_least)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(judged & (got >= at_least), reach)
    # and every ratio given is score's, to the bit; none for an unjudged rank
    given_ = ~np.isnan(got)
    assert not (given_ & ~judged).any()
    assert np.array_equal(got[given_].view(np.int64), full[given_].view(np.int64))
    return got


def test_a_ratio_exactly_at_the_margin_is_kept() -> None:
    # rank 3's peers' median is 1.0: its ratio is exactly 1.5
    x = np.array([1.0, 1.0, 1.0, 1.5, 1.0, 0.9])
    g = np.zeros(6, dtype=np.int64)
    got = _check(x, g, np.ones(6, dtype=bool), 1.5)
    assert got[3] == 1.5
    assert np.isnan(got[[0, 1, 2, 4, 5]]).all()  # below any reach: not computed


def test_nothing_reaching_gives_no_ratio_at_all() -> None:
    x = np.array([1.0, 1.1, 0.9, 1.05])
    got = _check(x, np.zeros(4, dtype=np.int64), np.ones(4, dtype=bool), 1.2)
    assert np.isnan(got).all()


def test_unjudged_ranks_and_lone_ranks_have_no_ratio() -> None:
    x = np.array([1.0, 3.0, 1.0, 1.0, 5.0])
    g = np.array([0, 0, 0, 0, 1])
    judged = np.array([True, False, True, True, True])
    got = _check(x, g, judged, 1.2)
    assert np.isnan(got).all()  # rank 1 (3x) is not judged; rank 4 has no peer


_VALUES = st.lists(
    st.one_of(st.sampled_from([1.0, 1.2, 2.0]), st.floats(0.0, 1000.0, allow_nan=False)),
    min_size=1,
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(_VALUES, st.sampled_from([1, 2, 3, 40]), st.sampled_from([1.05, 1.2, 1.5, 2.0]))
def test_matches_score_where_it_matters(values: list[float], ngroups: int, at_least: float) -> None:
    """Ties, zeros, one group to many (40 groups take `score` itself)."""
    x = np.array(values)
    rng = np.random.default_rng(len(values) * 7 + ngroups)
    g = np.unique(rng.integers(0, ngroups, x.size), return_inverse=True)[1].astype(np.int64)
    judged = rng.random(x.size) < 0.8
    _check(x, g, judged, at_least)


def test_values_not_all_finite_take_score_itself() -> None:
    x = np.array([1.0, 1.0, np.nan, 1.0, 2.0])
    got = _check(x, np.zeros(5, dtype=np.int64), np.ones(5, dtype=bool), 1.5)
    assert got[4] == score(x, np.zeros(5, dtype=np.int64)).ratio[4]
