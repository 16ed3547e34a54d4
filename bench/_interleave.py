"""Step-level interleaving for A/B timing on a noisy machine (pure: no clocks, no I/O).

Each iteration runs one step of every arm, in an order taken from blocks of all the
arms' permutations, each block shuffled: every arm is in every position, and follows
every other arm, equally often over a block, so position and carry-over effects
cancel. The comparison is paired: per iteration, the ratio of two arms' steps run
a few ms apart, whose load is nearly the same; the median of those ratios, with a
bootstrap interval, is the figure.
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Sequence


def orders(arms: Sequence[str], iters: int, seed: int) -> list[tuple[str, ...]]:
    """``iters`` orders of ``arms``: whole blocks of every permutation, each block
    shuffled with ``random.Random(seed)`` (the same on every rank, which must run the
    same collectives in the same order)."""
    rng = random.Random(seed)
    perms = list(itertools.permutations(arms))
    out: list[tuple[str, ...]] = []
    while len(out) < iters:
        block = perms[:]
        rng.shuffle(block)
        out.extend(block)
    return out[:iters]


def ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Per-iteration ratios ``num[i] / den[i]``."""
    return [a / b for a, b in zip(num, den, strict=True)]


def median_ci(
    values: Sequence[float], boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """The median of ``values`` and a percentile-bootstrap interval of it."""
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(boot))
    tail = (1.0 - level) / 2
    lo = meds[int(tail * (boot - 1))]
    hi = meds[int((1.0 - tail) * (boot - 1))]
    return statistics.median(values), lo, hi
