"""bench/_interleave.py: the step-interleaved timing's orders and statistics."""

from __future__ import annotations

import itertools
from collections import Counter

from bench._interleave import median_ci, orders, ratios

ARMS = ("a", "b", "c", "d")


def test_orders_are_whole_shuffled_blocks_of_every_permutation() -> None:
    plan = orders(ARMS, 24 * 5, seed=3)
    perms = set(itertools.permutations(ARMS))
    for k in range(5):
        block = plan[24 * k : 24 * (k + 1)]
        assert set(block) == perms  # every order once per block
    # so every arm is in every position, and follows every other arm, equally often
    pos = Counter((i, arm) for order in plan for i, arm in enumerate(order))
    assert set(pos.values()) == {30}
    follows = Counter((o[i], o[i + 1]) for o in plan for i in range(3))
    assert set(follows.values()) == {30}
    assert plan[:24] != plan[24:48]  # shuffled, not repeated


def test_orders_are_the_same_for_the_same_seed() -> None:
    # every rank must run the same collectives in the same order
    assert orders(ARMS, 100, seed=7) == orders(ARMS, 100, seed=7)
    assert orders(ARMS, 100, seed=7) != orders(ARMS, 100, seed=8)
    assert len(orders(ARMS, 100, seed=7)) == 100


def test_median_ci_brackets_the_median_and_narrows_with_more_data() -> None:
    few = [1.0 + ((i * 37) % 101 - 50) / 500 for i in range(101)]
    many = few * 16
    med, lo, hi = median_ci(few, boot=400)
    assert lo <= med <= hi and lo < hi
    med2, lo2, hi2 = median_ci(many, boot=400)
    assert med2 == med
    assert hi2 - lo2 < (hi - lo) / 2  # 16x the data: about a quarter of the width
    assert ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
