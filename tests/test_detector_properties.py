"""Properties of the detector over generated jobs (hypothesis, vectorised numpy)."""

from __future__ import annotations

import numpy as np
import pytest
from artemis.detect.detector import Detector, WindowResult
from artemis.detect.findings import Finding
from artemis.detect.settings import Settings
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_detector_support import WINDOW_STEPS, make_window


def prop(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run_job(
    gap: np.ndarray,
    coll: np.ndarray,
    islands: list[str],
    *,
    order: np.ndarray | None = None,
    scale: float = 1.0,
    s: Settings | None = None,
) -> list[WindowResult]:
    """Run a detector over (windows, ranks) arrays. `order[i]` is the label given
    to rank i (a relabelling); `scale` multiplies every time."""
    n = gap.shape[1]
    lab = np.arange(n) if order is None else order
    hosts = [f"host-{i}" for i in range(n)]  # hosts travel with the rank, not the label
    det = Detector(s or Settings(), "job", n)
    out = []
    for w in range(gap.shape[0]):
        recs = make_window(
            w,
            gap[w] * scale,
            coll=coll[w] * scale,
            islands=islands,
            hosts=hosts,
            ranks=lab.tolist(),
        )
        out.append(det.score_window(w, recs))
    return out


def consistent_coll(gap: np.ndarray, transfer: np.ndarray) -> np.ndarray:
    """Time in collectives = own transfer + the wait for the last rank to arrive."""
    return transfer + (gap.max(axis=1, keepdims=True) - gap)


@st.composite
def jobs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, list[str]]:
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(3, 24))
    windows = draw(st.integers(8, 24))
    rng = np.random.default_rng(seed)
    two = draw(st.booleans())
    islands = ["a" if (not two or rng.random() < 0.6) else "b" for _ in range(n)]
    speed = np.where(np.array(islands) == "a", 1.0, draw(st.floats(0.5, 2.0)))
    gap = 100.0 * speed * (1 + 0.01 * rng.standard_normal((windows, n)))
    # A few slowdowns of ranks or of a whole island, of random size and length.
    for _ in range(draw(st.integers(0, 3))):
        w0 = int(rng.integers(0, windows))
        w1 = int(rng.integers(w0 + 1, windows + 1))
        f = draw(st.floats(1.05, 1.6))
        if draw(st.booleans()):
            gap[w0:w1, int(rng.integers(0, n))] *= f
        else:
            gap[w0:w1, np.array(islands) == "a"] *= f
    transfer = 10.0 * (1 + 0.01 * rng.standard_normal((windows, n)))
    return gap, consistent_coll(gap, transfer), islands


def close(a: float | None, b: float | None, rel: float) -> None:
    """Equal up to rounding; None only where the other is None too."""
    assert (a is None) == (b is None), (a, b)
    if a is not None and b is not None:
        assert a == pytest.approx(b, rel=rel, abs=1e-9)


def _key(f: Finding, label: dict[int, int]) -> tuple[object, ...]:
    rank = None if f.rank is None else label[f.rank]
    return (f.window, f.kind, f.state, f.island, rank, tuple(sorted(label[r] for r in f.ranks)))


@given(jobs(), st.integers(0, 2**32 - 1))
@prop(15)
def test_relabelling_ranks_relabels_findings_and_nothing_else(
    job: tuple[np.ndarray, np.ndarray, list[str]], seed: int
) -> None:
    gap, coll, islands = job
    n = gap.shape[1]
    perm = np.random.default_rng(seed).permutation(n)
    plain = run_job(gap, coll, islands)
    relab = run_job(gap, coll, islands, order=perm)
    event("findings" if any(r.findings for r in plain) else "no findings")
    ident = {i: i for i in range(n)}
    to_new = {i: int(perm[i]) for i in range(n)}
    for a, b in zip(plain, relab, strict=True):
        assert {to_new[r]: v for r, v in a.pace.items()} == pytest.approx(b.pace)
        assert {to_new[r]: v for r, v in a.islands.items()} == b.islands
        assert a.step_ms == b.step_ms and a.gpu_hours_lost == pytest.approx(b.gpu_hours_lost)
        fa = sorted(a.findings, key=lambda f: _key(f, to_new))
        fb = sorted(b.findings, key=lambda f: _key(f, ident))
        assert [_key(f, to_new) for f in fa] == [_key(f, ident) for f in fb]
        for x, y in zip(fa, fb, strict=True):
            for name in ("since", "ratio", "z", "history", "drift", "excess_ms", "loss_pct"):
                close(getattr(x, name), getattr(y, name), 1e-9)
            # Hosts travel with the rank.
            assert x.hosts == y.hosts


@given(jobs(), st.sampled_from([1e-3, 0.37, 3.0, 1e4]))
@prop(15)
def test_scaling_every_time_changes_nothing_but_costs(
    job: tuple[np.ndarray, np.ndarray, list[str]], c: float
) -> None:
    gap, coll, islands = job
    a_res = run_job(gap, coll, islands)
    b_res = run_job(gap, coll, islands, scale=c)
    ident = {i: i for i in range(gap.shape[1])}
    for a, b in zip(a_res, b_res, strict=True):
        assert a.pace == pytest.approx(b.pace, rel=1e-9)
        assert [_key(f, ident) for f in a.findings] == [_key(f, ident) for f in b.findings]
        for x, y in zip(a.findings, b.findings, strict=True):
            for name in ("ratio", "z", "history", "drift", "loss_pct"):
                close(getattr(x, name), getattr(y, name), 1e-6)
            assert x.excess_ms is not None and y.excess_ms is not None
            assert y.excess_ms == pytest.approx(c * x.excess_ms, rel=1e-6, abs=1e-9 * c)
        assert b.gpu_hours_lost == pytest.approx(c * a.gpu_hours_lost, rel=1e-6)


@given(st.integers(0, 2**32 - 1), st.floats(0.0, 0.03), st.booleans())
@prop(3)
def test_noise_of_at_most_3_percent_flags_nothing(seed: int, noise: float, two: bool) -> None:
    # 64 ranks x 160 windows = 10,240 rank-windows per example.
    rng = np.random.default_rng(seed)
    n, windows = 64, 160
    islands = ["a"] * 32 + (["b"] * 32 if two else ["a"] * 32)
    speed = np.where(np.array(islands) == "a", 1.0, 0.7)
    gap = 100.0 * speed * (1 + rng.uniform(-noise, noise, (windows, n)))
    transfer = 10.0 * (1 + rng.uniform(-noise, noise, (windows, n)))
    res = run_job(gap, consistent_coll(gap, transfer), islands)
    assert [f for r in res for f in r.findings] == []


def step_medians(rng: np.random.Generator, shape: tuple[int, int], noise: float) -> np.ndarray:
    """Window gap = median over the window's steps of per-step gaps with noise."""
    per_step = 1 + rng.uniform(-noise, noise, (*shape, WINDOW_STEPS))
    return np.median(per_step, axis=2)


@given(
    st.integers(0, 2**32 - 1),
    st.integers(4, 64),
    st.floats(1.12, 1.6),
    st.integers(1, 12),
    st.floats(0.0, 0.03),
)
@prop(25)
def test_a_rank_slowed_12_percent_is_flagged_within_3_windows(
    seed: int, n: int, slow: float, start: int, noise: float
) -> None:
    rng = np.random.default_rng(seed)
    windows = start + 3
    gap = 100.0 * step_medians(rng, (windows, n), noise)
    victim = int(rng.integers(0, n))
    gap[start:, victim] *= slow
    transfer = 10.0 * step_medians(rng, (windows, n), noise)
    res = run_job(gap, consistent_coll(gap, transfer), ["a"] * n)
    flagged = [(f.window, f.kind, f.rank) for r in res for f in r.findings if f.state == "flagged"]
    assert flagged == [(start + 2, "rank", victim)]


@given(
    st.integers(0, 2**32 - 1),
    st.integers(3, 32),
    st.floats(1.12, 3.0),
    st.integers(0, 10),
    st.booleans(),
)
@prop(25)
def test_a_two_window_blip_is_never_flagged(
    seed: int, n: int, slow: float, start: int, whole_island: bool
) -> None:
    rng = np.random.default_rng(seed)
    windows = start + 8
    gap = 100.0 * step_medians(rng, (windows, n), 0.03)
    if whole_island:
        gap[start : start + 2] *= slow
    else:
        gap[start : start + 2, int(rng.integers(0, n))] *= slow
    transfer = 10.0 * step_medians(rng, (windows, n), 0.03)
    transfer[start : start + 2] *= slow  # collectives blip too
    res = run_job(gap, consistent_coll(gap, transfer), ["a"] * n)
    assert not [f for r in res for f in r.findings if f.state in ("flagged", "ongoing")]
