"""Each rank's own history and the noise model the rank rule judges in.

Per rank: its warm-up gaps and trimmed mean gaps (the baselines `degraded` is
judged against), its warm-up log peer ratios (the confirmed pace the change test
starts from), the change test's two sums. Per job: the live noise of two
statistics (`LiveNoise`), the log gap and the log trimmed mean gap (the stall
test's), each rank's change from one window to the next against its group's,
over the last NOISE_WINDOWS windows (DETECTOR.md "The combined test",
"Recurring stalls"). Arrays are indexed by rank and grow by doubling; the
medians are cached until a warm-up sample is fed.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt
from artemis.detect import scoring
from artemis.detect.arrays import F64, I64, pack, unpack
from artemis.detect.settings import Settings
from artemis.detect.state import DetectorState
from artemis.detect.tuning import (
    DIAG_PEERS,
    NOISE_RECENT,
    NOISE_SMALL,
    NOISE_WINDOWS,
    SIGMA_FLOOR,
)

T = TypeVar("T")
Ready = npt.NDArray[np.bool_]  # per rank: its baseline is in use


class LiveNoise:
    """A job's live noise of one per-rank statistic (a log gap, a log trimmed mean):
    each rank's change since the last window against its group's, pooled over the
    last NOISE_WINDOWS windows (DETECTOR.md "The combined test"). `prev` holds each
    rank's last value (NaN: none), indexed by rank."""

    def __init__(self, alone: bool = False) -> None:
        self.prev: F64 = np.zeros(0)
        self.pool: deque[F64] = deque(maxlen=NOISE_WINDOWS)
        # (`alone`) the ranks without a group of peers (`degraded`): each one's own
        # change, the job's shared jitter in it (nothing to take it out against)
        self.alone = alone
        self.own: deque[F64] = deque(maxlen=NOISE_WINDOWS)

    def grow(self, extra: int) -> None:
        self.prev = np.concatenate([self.prev, np.full(extra, np.nan)])

    def observe(self, r: I64, x: F64, gid: I64, ok: npt.NDArray[np.bool_]) -> None:
        """Feed this window's values (log units): each rank's change since the last
        window against its group's (what every rank shares, e.g. a data-dependent
        step length, cancels)."""
        with np.errstate(invalid="ignore"):
            d = x - self.prev[r]
        self.prev[r] = x
        if self.alone and not ok.all():  # (most jobs: every rank has peers)
            alone = d[~ok & np.isfinite(d)]
            if alone.size:
                self.own.append(alone)
        idx = np.flatnonzero(ok & np.isfinite(d))
        if idx.size < 3:
            return
        if idx.size > 4 * DIAG_PEERS:  # an evenly spaced sample says as much, for less
            idx = idx[np.linspace(0, idx.size - 1, 4 * DIAG_PEERS).astype(np.int64)]
        # each rank's change against the median change of the others of its group (the
        # leave-one-out median: in a group of four, centring on the median of all
        # would make two of the four near zero); the sd of that difference is the
        # rank's own times sqrt(1 + pi / (2 (n - 1))), the error of a median of n - 1
        sc = scoring.score(np.exp(d[idx]), gid[idx])
        with np.errstate(invalid="ignore", divide="ignore"):
            d = np.log(sc.ratio) / np.sqrt(1.0 + 0.5 * math.pi / np.maximum(1, sc.group_size - 1))
        d = d[np.isfinite(d) & (sc.group_size >= 3)]
        if d.size >= 3:
            self.pool.append(d)

    def now(self) -> float:
        """The live noise sd of one window (NaN until measured): pooled over the last
        NOISE_WINDOWS windows, or over the last NOISE_RECENT where that is higher."""
        return _pooled_sd(self.pool, recent=True)

    def own_now(self) -> float:
        """The same of the ranks without peers, over the last NOISE_WINDOWS windows
        only (a job has few such ranks: the last NOISE_RECENT windows of a pair gave
        6 changes, whose MAD swung 2-3x): `degraded`'s change test judges in it, as
        the peer tests do in `now()` (DETECTOR.md "Kinds")."""
        return _pooled_sd(self.own, recent=False)

    def restore(
        self, n: int, prev: bytes | None, pool: list[bytes], own: list[bytes] | None = None
    ) -> None:
        self.prev[:n] = np.nan
        self.pool.clear()
        self.own.clear()
        if prev is not None:  # snapshots from before this live noise lack it
            self.prev[:n] = unpack(prev, np.float64)
            self.pool.extend(unpack(d, np.float64) for d in pool)
            self.own.extend(unpack(d, np.float64) for d in own or [])


class RankHistory:
    def __init__(self, warmup_windows: int) -> None:
        self.rank_samples: F64 = np.full((0, warmup_windows), np.nan)
        self.rank_count: I64 = np.zeros(0, dtype=np.int64)
        # Adaptive mode: warm-up log peer ratios (fed with the gap samples) and the CUSUM.
        self.ratio_samples: F64 = np.full((0, warmup_windows), np.nan)
        self.cusum: F64 = np.zeros(0)
        # the live noise of the log gap (the peer and change tests judge in it), and of
        # the log trimmed mean (the stall test's statistic, judged in its own)
        self.live = LiveNoise(alone=True)
        self.live_mean = LiveNoise()
        self.dcusum: F64 = np.zeros(0)  # the same test for `degraded` (own gap history)
        # `degraded`'s stall test: warm-up trimmed means (NaN: the summary had none)
        self.mean_samples: F64 = np.full((0, warmup_windows), np.nan)
        # the most steps a window of the job has had (its window size; 0: none seen): a
        # shorter window (the job's last) has a noisier median (`step_scale`)
        self.window_steps = 0
        # the warm-up statistics by name, each with the key it was computed at (`_warm`)
        self._cache: dict[str, tuple[tuple[int, bool], Any]] = {}
        self.samples_version = 0

    @property
    def capacity(self) -> int:
        return int(self.rank_count.size)

    def grow(self, extra: int) -> None:
        w = self.rank_samples.shape[1]
        self.rank_samples = np.vstack([self.rank_samples, np.full((extra, w), np.nan)])
        self.ratio_samples = np.vstack([self.ratio_samples, np.full((extra, w), np.nan)])
        self.mean_samples = np.vstack([self.mean_samples, np.full((extra, w), np.nan)])
        self.cusum = np.concatenate([self.cusum, np.zeros(extra)])
        self.live.grow(extra)
        self.live_mean.grow(extra)
        self.dcusum = np.concatenate([self.dcusum, np.zeros(extra)])
        self.rank_count = np.concatenate([self.rank_count, np.zeros(extra, dtype=np.int64)])
        self.samples_version += 1

    def set_warmup(self, w: int) -> None:
        """A new warm-up length: samples beyond it are dropped, room made for more."""
        if w == self.rank_samples.shape[1]:
            return
        n = self.rank_count.size
        self.rank_samples = _fit(self.rank_samples, n, w)
        self.ratio_samples = _fit(self.ratio_samples, n, w)
        self.mean_samples = _fit(self.mean_samples, n, w)
        self.rank_count = np.minimum(self.rank_count, w)
        self.samples_version += 1

    def feed(
        self,
        r: I64,
        healthy: npt.NDArray[np.bool_],
        gap: F64,
        peer_ratio: F64,
        peers_ok: npt.NDArray[np.bool_],
        s: Settings,
        trimmed: F64 | None = None,
    ) -> None:
        """Warm-up samples of the `healthy` ones of ranks `r` (arrays aligned on `r`):
        their gaps, trimmed means (where summaries have them) and log peer ratios
        (where they have peers); a rank whose warm-up is full takes no more."""
        feed = healthy & (self.rank_count[r] < s.warmup_windows)
        fr = r[feed]
        if fr.size:
            self.rank_samples[fr, self.rank_count[fr]] = gap[feed]
            if trimmed is not None:
                self.mean_samples[fr, self.rank_count[fr]] = trimmed[feed]
            with np.errstate(divide="ignore", invalid="ignore"):
                lr = np.log(peer_ratio[feed])
            self.ratio_samples[fr, self.rank_count[fr]] = np.where(
                peers_ok[feed] & np.isfinite(lr), lr, np.nan
            )
            self.rank_count[fr] += 1
            self.samples_version += 1

    # -- baselines and noise --------------------------------------------------

    def _warm(self, name: str, window: int, s: Settings, compute: Callable[[Ready], T]) -> T:
        """A per-rank statistic of the warm-up samples, computed over the ranks whose
        baseline is in use (a full warm-up, or any once the warm-up windows are past).
        It changes only while warm-up samples are fed: cached until then (a nanmedian
        over every rank was a third of a window's scoring)."""
        key = (self.samples_version, window > s.warmup_windows)
        hit = self._cache.get(name)
        if hit is not None and hit[0] == key:
            return cast(T, hit[1])
        cnt = self.rank_count
        value = compute((cnt > 0) & ((cnt >= s.warmup_windows) | (window > s.warmup_windows)))
        self._cache[name] = (key, value)
        return value

    def baseline(self, window: int, s: Settings) -> F64:
        """Per rank: the median of its warm-up gaps (NaN until in use)."""
        return self._warm("baseline", window, s, lambda ready: _medians(self.rank_samples, ready))

    def gap_noise(self, window: int, s: Settings) -> F64:
        """Per rank: the robust sd of its warm-up log gaps around their median, no less
        than the median of every rank's (five samples can be small by luck) and
        SIGMA_FLOOR; NaN until its baseline is in use."""
        return self._warm("gap_noise", window, s, self._gap_sd)

    def _gap_sd(self, ready: Ready) -> F64:
        sd = np.full(ready.size, np.nan)
        if ready.any():
            with np.errstate(all="ignore"):
                x = np.log(self.rank_samples[ready])
            sd[ready] = _spread(x)[1]
        return sd

    def mean_baseline(self, window: int, s: Settings) -> F64:
        """Per rank: the median of its warm-up trimmed means (NaN until in use, or where
        its warm-up had none)."""
        return self._warm("mean", window, s, lambda ready: _medians(self.mean_samples, ready))

    def ratio_baseline(self, window: int, s: Settings) -> tuple[F64, F64]:
        """Per rank: the confirmed log peer ratio (median of its warm-up) and its noise sd."""
        return self._warm("ratio", window, s, self._ratio_spread)

    def _ratio_spread(self, ready: Ready) -> tuple[F64, F64]:
        base = np.full(ready.size, np.nan)
        sd = np.full(ready.size, np.nan)
        if ready.any():
            base[ready], sd[ready] = _spread(self.ratio_samples[ready])
        return base, sd

    def step_scale(self, steps: I64, row: I64) -> F64 | float:
        """Per rank, how much noisier its window is than a whole one: a median over n of
        the job's N steps a window errs sqrt(N / n) times as much (1 for a whole window;
        the job's last window is often a few steps: DETECTOR.md "The combined test").
        Takes this window's steps (per summary; `row`: each rank's) into the job's
        window size first. 1.0 (a scalar, no array over every rank) when every
        window is whole, the usual case."""
        if not steps.size:
            return 1.0
        lo, hi = int(steps.min()), int(steps.max())
        self.window_steps = max(self.window_steps, hi)
        if lo >= self.window_steps:
            return 1.0
        return np.sqrt(self.window_steps / np.clip(steps[row], 1, self.window_steps))

    # -- state ----------------------------------------------------------------

    def snapshot(self, n: int) -> dict[str, Any]:
        """The first `n` ranks' history, as raw little-endian bytes (the snapshot keys)."""
        return {
            "rank_samples": pack(self.rank_samples[:n]),
            "rank_count": pack(self.rank_count[:n]),
            "ratio_samples": pack(self.ratio_samples[:n]),
            "cusum": pack(self.cusum[:n]),
            "prev_lr": pack(self.live.prev[:n]),
            "live_noise": [pack(d) for d in self.live.pool],
            "live_noise_own": [pack(d) for d in self.live.own],
            "prev_lm": pack(self.live_mean.prev[:n]),
            "live_noise_mean": [pack(d) for d in self.live_mean.pool],
            "dcusum": pack(self.dcusum[:n]),
            "mean_samples": pack(self.mean_samples[:n]),
            "window_steps": self.window_steps,
        }

    def restore(self, state: DetectorState, n: int, w: int) -> None:
        """Take back `snapshot(n)`'s keys (already grown to `n` ranks), for warm-up `w`.
        Older snapshots lack the keys of later rules: those start afresh."""
        self.rank_samples[:n] = _fit(unpack(state.rank_samples, np.float64), n, w)
        self.rank_count[:n] = np.minimum(unpack(state.rank_count, np.int64), w)
        self.ratio_samples[:n] = np.nan
        self.cusum[:n] = 0.0
        self.dcusum[:n] = 0.0
        if state.dcusum is not None:  # (snapshots from before the adaptive degraded rule)
            self.dcusum[:n] = unpack(state.dcusum, np.float64)
        self.mean_samples[:n] = np.nan
        if state.mean_samples is not None:  # (snapshots from before degraded's stall test)
            self.mean_samples[:n] = _fit(unpack(state.mean_samples, np.float64), n, w)
        if state.ratio_samples is not None:  # snapshots from before the adaptive rule lack it
            self.ratio_samples[:n] = _fit(unpack(state.ratio_samples, np.float64), n, w)
            self.cusum[:n] = unpack(_needed(state.cusum, "cusum"), np.float64)
        self.window_steps = state.window_steps
        self.live.restore(n, state.prev_lr, state.live_noise, state.live_noise_own)
        self.live_mean.restore(n, state.prev_lm, state.live_noise_mean)
        self.samples_version += 1


def _fit(samples: F64, n: int, w: int) -> F64:
    """`n` ranks' warm-up samples (rows; a flat array is reshaped) in `w` columns:
    those beyond `w` dropped, NaN where there were fewer."""
    rows = samples.reshape(n, -1)
    out = np.full((n, w), np.nan)
    keep = min(w, rows.shape[1])
    out[:, :keep] = rows[:, :keep]
    return out


def _medians(samples: F64, ready: Ready) -> F64:
    """Per rank: the median of its warm-up row where `ready` (NaN elsewhere, and for a
    row with no sample)."""
    out = np.full(ready.size, np.nan)
    if ready.any():
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # nanmedian of an all-NaN row
            out[ready] = np.nanmedian(samples[ready], axis=1)
    return out


def _needed(value: bytes | None, key: str) -> bytes:
    """A key that a state with its rule's other keys must hold (KeyError as before)."""
    if value is None:
        raise KeyError(key)
    return value


def noise_sd(d: F64) -> float:
    """One window's noise sd from pooled changes of log gap (robust: a rank's real
    change, a stall starting, is an outlier among them)."""
    return scoring.MAD_SCALE * float(np.median(np.abs(d))) / math.sqrt(2.0)


def _pooled_sd(pool: deque[F64], recent: bool) -> float:
    """A live noise sd of one window (NaN until measured): pooled over the last
    NOISE_WINDOWS windows, or (`recent`) over the last NOISE_RECENT where higher."""
    if not pool:
        return math.nan
    pooled = list(pool)
    per_window = sum(d.size for d in pooled) / len(pooled)
    sd = _widened(pooled, NOISE_WINDOWS * per_window)
    if recent:
        sd = max(sd, _widened(pooled[-NOISE_RECENT:], NOISE_RECENT * per_window))
    return sd


def _widened(windows: list[F64], full: float) -> float:
    """`noise_sd` of some windows' changes, widened while they are fewer than a full
    pool of `full` values: NOISE_Z was fitted on full pools, and an sd from fewer
    values is less sure (a MAD's relative error is about 1.16 / sqrt(n)). At a
    job's start two ranks that share a CPU, slowed together for a few windows,
    met a gate of 1.05 measured on 8 values (bench/README.md "Real jobs")."""
    d = np.concatenate(windows)
    scale = (1.0 + NOISE_SMALL / math.sqrt(d.size)) / (1.0 + NOISE_SMALL / math.sqrt(full))
    return noise_sd(d) * max(1.0, scale)


def _spread(x: F64) -> tuple[F64, F64]:
    """Per row of warm-up samples (NaN: none): the median, and the robust sd around it,
    no less than the median of every row's (five samples can be small by luck) nor
    SIGMA_FLOOR; a row with fewer than three samples takes the pooled one."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        # nanmedian of an all-NaN row warns; that row's NaN is the answer here
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(x, axis=1)
        own = scoring.MAD_SCALE * np.nanmedian(np.abs(x - med[:, None]), axis=1)
        own = np.where(np.sum(np.isfinite(x), axis=1) >= 3, own, np.nan)
        pooled = np.nanmedian(own) if np.isfinite(own).any() else SIGMA_FLOOR
    return med, np.fmax(np.fmax(own, pooled), SIGMA_FLOOR)
