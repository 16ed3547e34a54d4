"""Window summaries of one rank's collectives: the agent's pure core.

The ring reader hands over numpy structured arrays of DONE records in the ring's
slot dtype (``artemis.ring.format``: ``seq``, ``coll_seq``, ``kind``,
``func``, ``state``, ``clock``, ``peer``, ``bytes``, ``start``, ``end``, ...;
CPU slots add fields). Only the fields named in ``NEEDED_FIELDS`` are read, so
any array carrying them works.

Steps and windows
-----------------
A training step issues the same sequence of collectives on a communicator every
time (the same bucket sizes in the same order), and every rank issues the same
sequence, because collectives must match. So the number of collectives per step
``C`` is the period of the (function, bytes) sequence, inferred by
``infer_period`` (or set by config, ``colls_per_step``), the script's own rare
small collectives (a loss logged every few steps, a barrier) left out of it; they
still take collective indices, so a step's span shifts by one where one falls,
on every rank alike; steps longer than ``max_period`` are looked for, up to
``LONG_STEPS`` times it, where no shorter one fits. Window ``w`` covers
collective indices ``[w*W*C, (w+1)*W*C)`` with ``W`` = window_steps; step ``k``
covers ``[k*C, (k+1)*C)``. Every rank numbers the same collectives the same way
with no shared clock: all timings below are differences on the rank's own clock.
The phase is fixed at coll_seq 0 (a job's start-up collectives shift where a
"step" starts, but identically on every rank, so comparisons stay fair).

Per window (W steps, times in ms):

* ``gap_ms``: median over steps of the step's compute gap. The gap preceding
  collective ``i`` is ``start[i] - end[i-1]`` (clipped at 0: collectives that
  overlap leave no compute time between them); a step's gap is the sum of the
  gaps preceding each of its C collectives, so it includes the time from the
  previous step's last collective to this step's first (forward pass, data
  loading, ...).
* ``coll_ms``: median per-step sum of ``end - start``.
* ``step_ms``: median of ``end`` of the step's last collective minus ``end`` of
  the previous step's last collective.
* ``gap_q1_ms``/``gap_q2_ms``/``gap_q3_ms``: quartiles of the per-step gap over the
  whole steps (``gap_q2_ms`` is ``gap_ms``); None when no step is whole.
* ``gap_mean_ms``/``gap_max_ms``: mean and largest of the per-step gap over the
  same whole steps: the mean is the rank's average cost to its peers, which stalls
  in a fraction of the steps move while the median stays put; the mean without the
  largest step tells stalls that recur from one long step. None when no step is whole.

Medians are taken over the steps whose every needed record is present. When
records were lost so that no step is whole, ``gap_ms``/``coll_ms`` fall back to
the sum over the C positions of the per-position median (same value for a
steady rank); when nothing at all is measurable they are NaN. ``lost`` counts
the collective indices missing from the window plus losses the reader reported
(``add_lost``) that no gap in ``coll_seq`` explains (records of other kinds).

A window is emitted once a record ``settle`` collectives past its end has
arrived (default: one step), so collectives completing slightly out of order are
not counted as lost. ``take_windows(final=True)`` (or ``flush()``) also emits
the last, partial window; a window holding no record at all is never emitted
(the coordinator sees the rank as missing there). The period is locked once
inferred; until then records are buffered (at most ``_INFER_CAP``).

Clocks: a record's ``clock`` is 0 (host CLOCK_MONOTONIC ns) or 1 (device timer,
whose unit is the ring header's ``clock_kind``: ns, or ticks at ``tick_hz``).
A window uses the clock most of its records carry; records on the other clock
count as present but are left out of the timings. ``clock`` is ``"ticks"`` only
when device ticks come without a known ``tick_hz``; the ``*_ms`` fields then
carry ticks / 1e6 and are comparable only among ranks with the same tick rate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from artemis.agent.device_clock import CLOCK_REASONS, device_timeline
from artemis.protocol.records import RankWindow, Telemetry
from artemis.ring.format import (
    CLOCK_DEVICE_NS,
    CLOCK_DEVICE_TICKS,
    CLOCK_HOST,
    CLOCK_KINDS,
    KIND_BRIDGE,
    KIND_COLL,
    REC_DEVICE,
    REC_HOST,
    STATE_DONE,
)

NEEDED_FIELDS = ("coll_seq", "kind", "func", "clock", "peer", "bytes", "start", "end")

# Compact internal copies: only what the summary reads.
_COLL_DT = np.dtype(
    [
        ("coll_seq", "<i8"),
        ("func", "<i2"),
        ("clock", "u1"),
        ("bytes", "<u8"),
        ("start", "<u8"),
        ("end", "<u8"),
        ("cpu_start", "<u8"),  # process CPU time ns (CPU slots; 0 = not recorded)
        ("cpu_end", "<u8"),
        ("enqueue", "<u8"),  # host CLOCK_MONOTONIC ns at enqueue (0 = not recorded)
    ]
)
_BRIDGE_DT = np.dtype(
    [("coll_seq", "<i8"), ("peer", "<i4"), ("clock", "u1"), ("start", "<u8"), ("end", "<u8")]
)
_NESTED_DT = np.dtype([("clock", "u1"), ("start", "<u8"), ("end", "<u8")])
# Records kept while the period is still unknown (an irregular stream must not
# grow the buffer without bound).
_INFER_CAP = 16384


# A collective of at most this many bytes that is rare (below a quarter of the most
# common collective's count: a one-bucket job's loss logged every 4 steps or fewer) is
# a control one: a logged loss or metric all-reduced every few steps, a barrier at a
# checkpoint. It is not part of the step's pattern. (A step's own small reduction,
# every step or every other, stays in it: its count is at least the quarter.)
CONTROL_BYTES = 256
_RARE = 0.25
# Steps longer than the summariser's max_period are looked for up to this many times it.
LONG_STEPS = 8
MAX_PERIOD = 64  # the summariser's default max_period


def infer_period(
    funcs: np.ndarray,
    sizes: np.ndarray,
    max_period: int = MAX_PERIOD,
    min_periods: int = 3,
    tolerance: float | None = None,
) -> int | None:
    """Collectives per step: the smallest period of the (func, bytes) sequence, its
    control collectives (``CONTROL_BYTES``) left out where it has some.

    A training script's own reductions (a loss all-reduced every 10 steps, a barrier
    every 100) break the gradient buckets' period, or stretch it to ten steps: a job
    of one bucket a step, a loss every 10 and a barrier every 100 had no period of at
    most 64 and was never scored (docs/DESIGN.md "Ring"). Its steps are its buckets'
    pattern: the period of the sequence without them, where there is one. Every rank
    issues the same collectives, so the windows (cut by collective index, the control
    ones inside) stay the same collectives on every rank.
    """
    f = np.asarray(funcs, dtype=np.int64)
    s = np.asarray(sizes, dtype=np.int64)
    if f.shape != s.shape or f.ndim != 1:
        raise ValueError("funcs and sizes must be 1-d arrays of the same length")
    if max_period < 1 or min_periods < 2:
        raise ValueError("max_period must be >= 1 and min_periods >= 2")
    control = _control(f, s)
    if control.any():
        p = _period(f[~control], s[~control], max_period, min_periods, tolerance)
        if p != 0:
            return p  # found, or not yet enough data without them: not the coarser one
    return _period(f, s, max_period, min_periods, tolerance) or None


def _control(f: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Which entries are control collectives: small and rare (see CONTROL_BYTES)."""
    valid = f >= 0
    if not valid.any():
        return np.zeros(f.size, dtype=bool)
    keys = f * (1 << 40) + np.minimum(s, (1 << 40) - 1)
    uniq, inverse, counts = np.unique(keys[valid], return_inverse=True, return_counts=True)
    rare = (counts < _RARE * counts.max()) & (uniq % (1 << 40) <= CONTROL_BYTES)
    out = np.zeros(f.size, dtype=bool)
    out[np.flatnonzero(valid)] = rare[inverse]
    return out


def _period(
    f: np.ndarray, s: np.ndarray, max_period: int, min_periods: int, tolerance: float | None
) -> int | None:
    """The smallest period of the whole sequence (``infer_period`` without its filter);
    None while there is too little data to tell, 0 when no period up to ``max_period``
    explains it.

    ``f[i]``/``s[i]`` describe the collective with index ``first + i``;
    an entry with ``f[i] < 0`` is unknown (lost) and takes part in no
    comparison. Period ``p`` explains the sequence when at most ``tolerance``
    of the comparisons ``x[i]`` vs ``x[i-p]`` disagree (default
    ``0.5 / max_period``: any wrong period below a true one of at most
    ``max_period`` disagrees at least once per true period, so it fails).

    Returns None until there is enough data to rule out every longer period up
    to ``max_period``: ``len >= max(min_periods * p, p + 2 * max_period)``.
    A stream of identical collectives has period 1 (each collective is taken as
    a step) unless the caller configures ``colls_per_step``.
    """
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
    return 0


def _clock_kind(kind: int | str | None, tick_hz: float | None) -> int:
    """The ring header's clock kind (int or the reader's name); None: ticks iff tick_hz."""
    if kind is None:
        return CLOCK_DEVICE_TICKS if tick_hz else CLOCK_DEVICE_NS
    if isinstance(kind, str):
        if kind not in CLOCK_KINDS:
            raise ValueError(f"unknown clock kind {kind!r}; expected one of {sorted(CLOCK_KINDS)}")
        return CLOCK_KINDS[kind]
    return int(kind)


def is_done(records: np.ndarray) -> np.ndarray:
    """Which records are DONE (all of them in an array without a ``state`` field)."""
    if records.dtype.names is not None and "state" in records.dtype.names:
        return np.asarray(records["state"] == STATE_DONE)
    return np.ones(records.shape[0], dtype=bool)


def _as_int(a: np.ndarray, field: str, dtype: str) -> np.ndarray:
    return np.asarray(a[field]).astype(dtype, copy=False)


def _median_or_nan(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(np.median(x)) if x.size else float("nan")


def _per_step(values: np.ndarray) -> float:
    """Median over whole steps of the per-step sum; fallback per-position medians.

    ``values`` is (steps, C) with NaN where a record is missing.
    """
    whole = ~np.isnan(values).any(axis=1)
    if whole.any():
        return float(np.median(values[whole].sum(axis=1)))
    cols = ~np.isnan(values).all(axis=0)
    if values.size == 0 or not cols.all():
        return float("nan")
    return float(np.nanmedian(values, axis=0).sum())


def _gap_quartiles(gaps: np.ndarray) -> dict[str, float | None]:
    """Quartiles and mean over the whole steps of the per-step compute gap (``gaps`` is
    (steps, C), NaN where a record is missing); None when no step is whole. The
    coordinator reads the shape of a slowdown from them: a rank whose lower quartile
    moved with its median is slower in most of its steps; one whose mean moved while
    its quartiles did not stalls in some of them (DESIGN "Incidents")."""
    whole = ~np.isnan(gaps).any(axis=1)
    if not whole.any():
        return dict.fromkeys(("gap_q1_ms", "gap_q2_ms", "gap_q3_ms", "gap_mean_ms", "gap_max_ms"))
    per_step = gaps[whole].sum(axis=1)
    q1, q2, q3 = np.quantile(per_step, (0.25, 0.5, 0.75)).tolist()
    return {
        "gap_q1_ms": float(q1),
        "gap_q2_ms": float(q2),
        "gap_q3_ms": float(q3),
        "gap_mean_ms": float(per_step.mean()),
        "gap_max_ms": float(per_step.max()),
    }


class WindowSummarizer:
    """Turns one rank's collective records on one communicator into RankWindows.

    Feed it DONE records as the reader polls them (``feed``), tell it about
    records the reader lost (``add_lost``), and collect complete windows with
    ``take_windows``. Telemetry is attached by the daemon (``dataclasses.replace``).
    """

    def __init__(
        self,
        job: str,
        comm: str,
        rank: int,
        nranks: int,
        host: str,
        window_steps: int = 50,
        colls_per_step: int | None = None,
        *,
        clock_kind: int | str | None = None,
        tick_hz: float | None = None,
        max_period: int = MAX_PERIOD,
        settle: int | None = None,
        island: str | None = None,
        hw_class: str | None = None,
    ) -> None:
        if window_steps < 1:
            raise ValueError("window_steps must be >= 1")
        if colls_per_step is not None and colls_per_step < 1:
            raise ValueError("colls_per_step must be >= 1")
        self.job, self.comm, self.rank, self.nranks, self.host = job, comm, rank, nranks, host
        self.window_steps = window_steps
        self.tick_hz = tick_hz if tick_hz else None
        self.clock_kind = _clock_kind(clock_kind, self.tick_hz)
        self.max_period = max_period
        self.island, self.hw_class = island, hw_class
        self._settle = settle
        self._c: int | None = colls_per_step
        self._recs = np.empty(0, dtype=_COLL_DT)
        self._bridge = np.empty(0, dtype=_BRIDGE_DT)
        # The rank's collectives on its other communicators (feed_nested)
        self._nested = np.empty(0, dtype=_NESTED_DT)
        self._next_window: int | None = None
        self._floor = 0  # records below this coll_seq belong to emitted windows
        self._min_seq: int | None = None
        self._max_seq = -1
        self._n_seen = 0  # distinct collective records accepted
        self._reader_lost = 0
        self._extra_reported = 0
        self._pending: list[np.ndarray] = []
        self._infer_at = 0  # records seen before the next inference attempt
        self.late = 0  # records that arrived after their window was emitted
        # One steady step's (func, bytes) per collective, in order: the rank's workload
        # signature (agent/fingerprint.py); None until two whole steps agree.
        self.step_signature: tuple[tuple[int, int], ...] | None = None

    @property
    def seen(self) -> int:
        """Distinct collectives taken so far."""
        return self._n_seen

    @property
    def patternless(self) -> bool:
        """No period found in more collectives than any step of at most LONG_STEPS x
        ``max_period`` needs (4 x that): the ring gets no window unless configured."""
        return self.colls_per_step is None and self._n_seen >= 4 * LONG_STEPS * self.max_period

    @property
    def colls_per_step(self) -> int | None:
        """Collectives per step: configured, inferred from what was fed, or None yet."""
        self._infer()
        return self._c

    def add_lost(self, n: int) -> None:
        """Records the reader reports lost (overwritten before it read them, or dropped)."""
        if n > 0:
            self._reader_lost += int(n)

    def feed(self, records: np.ndarray) -> None:
        """Add polled records (any kinds, any order); p2p and in-flight ones are ignored."""
        if records.size == 0:
            return
        done = is_done(records)
        kind = np.asarray(records["kind"])
        is_coll = done & (kind == KIND_COLL)
        is_bridge = done & (kind == KIND_BRIDGE)
        coll = records if is_coll.all() else records[is_coll]
        if is_bridge.any():
            bridge = records[is_bridge]
            b = np.empty(bridge.size, dtype=_BRIDGE_DT)
            b["coll_seq"] = _as_int(bridge, "coll_seq", "<i8")
            b["peer"] = _as_int(bridge, "peer", "<i4")
            b["clock"] = bridge["clock"]
            b["start"], b["end"] = bridge["start"], bridge["end"]
            b = b[b["coll_seq"] >= self._floor]
            self._bridge = np.concatenate([self._bridge, b])
        if coll.size == 0:
            return
        c = np.empty(coll.size, dtype=_COLL_DT)
        c["coll_seq"] = _as_int(coll, "coll_seq", "<i8")
        c["func"] = _as_int(coll, "func", "<i2")
        c["clock"] = coll["clock"]
        c["bytes"], c["start"], c["end"] = coll["bytes"], coll["start"], coll["end"]
        if "cpu_start_ns" in (coll.dtype.names or ()):
            c["cpu_start"], c["cpu_end"] = coll["cpu_start_ns"], coll["cpu_end_ns"]
        else:
            c["cpu_start"] = c["cpu_end"] = 0
        c["enqueue"] = coll["enqueue_ns"] if "enqueue_ns" in (coll.dtype.names or ()) else 0
        # The record just below the floor is kept as the "previous" collective of
        # the next window, so only strictly older ones are late.
        keep = c["coll_seq"] >= self._floor - 1
        self.late += int((~keep).sum())
        c = c[keep]
        if c.size == 0:
            return
        # Merging into the sorted buffer is deferred until a window can be cut:
        # the agent polls many times per window and each merge sorts the buffer.
        self._pending.append(c)
        lo, hi = int(c["coll_seq"].min()), int(c["coll_seq"].max())
        self._min_seq = lo if self._min_seq is None else min(self._min_seq, lo)
        self._max_seq = max(self._max_seq, hi)

    def feed_nested(self, records: np.ndarray) -> None:
        """The same rank's collectives on its other communicators (tensor parallel inside
        this data-parallel one): time inside them is not compute, so `gap_ms` leaves it
        out (docs/DESIGN.md, "Protocol": a rank with several communicators)."""
        if records.size == 0:
            return
        keep = is_done(records) & (np.asarray(records["kind"]) == KIND_COLL)
        keep &= (records["start"] > 0) & (records["end"] >= records["start"])
        r = records[keep]
        if r.size == 0:
            return
        n = np.empty(r.size, dtype=_NESTED_DT)
        n["clock"], n["start"], n["end"] = r["clock"], r["start"], r["end"]
        self._nested = np.concatenate([self._nested, n])[-_INFER_CAP:]

    def _merge(self) -> None:
        if not self._pending:
            return
        merged = np.concatenate([self._recs, *self._pending])
        self._pending = []
        seqs, first = np.unique(merged["coll_seq"], return_index=True)  # sorted, deduped
        self._n_seen += int(seqs.size - self._recs.size)
        self._recs = merged[first]
        if self._c is None and self._recs.size > _INFER_CAP:
            self._recs = self._recs[-_INFER_CAP:]

    def _infer(self) -> None:
        if self._c is not None:
            return
        self._merge()
        # an irregular stream is retried at growing intervals, not at every poll
        if self._recs.size == 0 or self._n_seen < self._infer_at:
            return
        self._infer_at = self._n_seen + max(self.max_period, self._n_seen // 8)
        first = int(self._recs["coll_seq"][0])
        n = int(self._recs["coll_seq"][-1]) - first + 1
        funcs = np.full(n, -1, dtype=np.int64)
        sizes = np.zeros(n, dtype=np.int64)
        idx = self._recs["coll_seq"] - first
        funcs[idx] = self._recs["func"]
        sizes[idx] = self._recs["bytes"].astype(np.int64)
        # Steps of up to max_period collectives are found within 3 x max_period of them;
        # longer ones (FSDP over many layers: an all-gather and a reduce-scatter a layer,
        # 144 a step for 48 layers) only where none of those fits, with 8 x the data.
        for mp in (self.max_period, LONG_STEPS * self.max_period):
            self._c = infer_period(funcs, sizes, mp)
            if self._c is None and n > mp:
                # A real job's start-up collectives (DDP's parameter broadcast and
                # checks) precede the steady pattern: retry without them.
                self._c = infer_period(funcs[mp:], sizes[mp:], mp)
            if self._c is not None or n < 3 * mp:
                return

    def take_windows(self, final: bool = False) -> list[RankWindow]:
        """Windows complete since the last call; with ``final`` also the partial last one."""
        self._infer()
        c = self._c
        if c is None or self._min_seq is None:
            return []
        span = self.window_steps * c
        settle = c if self._settle is None else self._settle
        nxt = self._next_window
        if nxt is not None and not final and self._max_seq < (nxt + 1) * span - 1 + settle:
            return []  # nothing can be cut yet: skip the merge
        self._merge()
        self._learn_signature(c)
        if self._next_window is None:
            self._next_window = max(self._min_seq, 0) // span
        out: list[RankWindow] = []
        while True:
            w = self._next_window
            lo, hi = w * span, (w + 1) * span
            if lo > self._max_seq:
                break
            if not final and self._max_seq < hi - 1 + settle:
                break
            hi_eff = min(hi, self._max_seq + 1)
            seqs = self._recs["coll_seq"]
            a, b = np.searchsorted(seqs, [lo - 1, hi_eff])
            window_recs = self._recs[a:b]
            n_in = int((window_recs["coll_seq"] >= lo).sum())
            if n_in:
                out.append(self._summarize(w, lo, hi_eff, c, window_recs, n_in))
            self._floor = hi_eff
            # keep the window's last collective as the next one's "previous"
            self._recs = self._recs[np.searchsorted(seqs, hi_eff - 1) :]
            self._bridge = self._bridge[self._bridge["coll_seq"] >= hi_eff]
            if self._nested.size and self._recs.size:
                # what ends before the next window's first gap opens is not needed again
                self._nested = self._nested[self._nested["end"] > self._recs["end"][0]]
            # jump over windows with no records at all (agent restart, big loss)
            rest = self._recs["coll_seq"][self._recs["coll_seq"] >= hi_eff]
            self._next_window = max(w + 1, int(rest[0]) // span) if rest.size else w + 1
        return out

    def _learn_signature(self, c: int) -> None:
        """The last whole step that repeats the one before it, as (func, bytes) pairs: a
        steady step, not one of the start-up collectives. Runs once per window cut, over
        at most a few steps of the buffer."""
        seqs = self._recs["coll_seq"]
        if seqs.size < 2 * c:
            return
        k = (int(seqs[-1]) + 1) // c - 1  # the last step that can be whole
        for step in range(k, max(k - 4, 0), -1):
            lo = (step - 1) * c
            a, b = np.searchsorted(seqs, [lo, lo + 2 * c])
            if b - a != 2 * c:  # coll_seq is unique and sorted: all present iff 2c of them
                continue
            f = self._recs["func"][a:b].astype(np.int64)
            by = self._recs["bytes"][a:b].astype(np.int64)
            if np.array_equal(f[:c], f[c:]) and np.array_equal(by[:c], by[c:]):
                self.step_signature = tuple(zip(f[c:].tolist(), by[c:].tolist(), strict=True))
                return

    def flush(self) -> list[RankWindow]:
        """The ring is finished: every window left, including a partial last one."""
        return self.take_windows(final=True)

    def _scale(self, clock: int) -> tuple[float, str]:
        """ms per unit of the given record clock, and its label."""
        if clock == REC_HOST or self.clock_kind == CLOCK_HOST:
            return 1e-6, "host"
        if self.clock_kind == CLOCK_DEVICE_TICKS:
            if self.tick_hz:
                return 1e3 / self.tick_hz, "device"
            return 1e-6, "ticks"
        return 1e-6, "device"

    def _summarize(
        self, w: int, lo: int, hi: int, c: int, recs: np.ndarray, n_in: int
    ) -> RankWindow:
        inside = recs[recs["coll_seq"] >= lo]
        clocks = np.bincount(inside["clock"], minlength=2)
        chosen = int(np.argmax(clocks))
        scale, label = self._scale(chosen)
        steps = -(-(hi - lo) // c)
        n = steps * c + 1  # position 0 is collective lo-1
        start = np.full(n, np.nan)
        end = np.full(n, np.nan)
        broken = np.empty(0, dtype=np.int64)  # positions whose preceding gap is unknown
        anomalies = dict.fromkeys(CLOCK_REASONS, 0)
        if chosen == REC_DEVICE and self.clock_kind != CLOCK_HOST:
            cand = recs[(recs["clock"] == chosen) & (recs["start"] > 0) & (recs["end"] > 0)]
            tl = device_timeline(
                cand["start"], cand["end"], cand["enqueue"], cand["coll_seq"] >= lo, 1e3 / scale
            )
            timed = cand[tl.keep]
            anomalies = tl.counts
            if timed.size:
                base = int(timed["start"][0])
                pos = timed["coll_seq"] - (lo - 1)
                start[pos] = tl.start.astype(np.float64) * scale
                end[pos] = tl.end.astype(np.float64) * scale
                broken = pos[tl.broken]
        else:
            timed = recs[
                (recs["clock"] == chosen) & (recs["start"] > 0) & (recs["end"] >= recs["start"])
            ]
            if timed.size:
                base = min(int(timed["start"].min()), int(timed["end"].min()))
                pos = timed["coll_seq"] - (lo - 1)
                # subtract in integers first: device ns since the epoch lose precision as float
                start[pos] = (timed["start"] - np.uint64(base)).astype(np.float64) * scale
                end[pos] = (timed["end"] - np.uint64(base)).astype(np.float64) * scale
        gaps = np.maximum(start[1:] - end[:-1], 0.0)
        gaps[broken - 1] = np.nan  # a jump or a reset of the clock: that gap is not known
        fixed = any(anomalies.values())
        if self._nested.size and timed.size and not fixed:
            # (after a correction the raw nested times no longer share the timeline)
            # time spent inside the rank's other communicators' collectives within a gap
            nest = self._nested[self._nested["clock"] == chosen]
            if nest.size:
                ns = (nest["start"].astype(np.int64) - base).astype(np.float64) * scale
                ne = (nest["end"].astype(np.int64) - base).astype(np.float64) * scale
                covered = _covered(ns, ne, start[1:]) - _covered(ns, ne, end[:-1])
                gaps = np.maximum(gaps - np.maximum(covered, 0.0), 0.0)
        gaps = gaps.reshape(steps, c)
        durs = (end[1:] - start[1:]).reshape(steps, c)
        step_times = np.diff(end[0::c])
        step_times[(broken - 1) // c] = np.nan  # the steps that hold an unknown gap
        lost_here = (hi - lo) - n_in
        # reader losses not explained by any gap in coll_seq seen so far
        gaps_seen = (self._max_seq - (self._min_seq or 0) + 1) - self._n_seen
        extra = max(0, self._reader_lost - gaps_seen - self._extra_reported)
        self._extra_reported += extra
        return RankWindow(
            job=self.job,
            comm=self.comm,
            rank=self.rank,
            nranks=self.nranks,
            host=self.host,
            window=w,
            step_lo=lo // c,
            step_hi=lo // c + steps,
            coll_lo=lo,
            coll_hi=hi,
            gap_ms=_per_step(gaps),
            coll_ms=_per_step(durs),
            step_ms=_median_or_nan(step_times),
            collectives=n_in,
            bytes=int(inside["bytes"].sum()),
            lost=int(lost_here + extra),
            clock=label,
            island=self.island,
            hw_class=self.hw_class,
            telemetry=Telemetry(gap_busy_pct=_gap_busy_pct(timed, lo)),
            **self._bridge_stats(lo, hi, c),
            **_gap_quartiles(gaps),
            **{f"clock_{k}": v or None for k, v in anomalies.items()},
        )

    def _bridge_stats(self, lo: int, hi: int, c: int) -> dict[str, Any]:
        b = self._bridge[(self._bridge["coll_seq"] >= lo) & (self._bridge["coll_seq"] < hi)]
        b = b[(b["start"] > 0) & (b["end"] >= b["start"])]
        if b.size == 0:
            return {}
        scales = np.array([self._scale(REC_HOST)[0], self._scale(REC_DEVICE)[0]])
        dur = (b["end"] - b["start"]).astype(np.float64) * scales[np.minimum(b["clock"], 1)]
        step = b["coll_seq"] // c - lo // c
        per_step = np.bincount(step, weights=dur)
        has = np.bincount(step) > 0
        peers = b["peer"][b["peer"] >= 0]
        peer = int(np.bincount(peers).argmax()) if peers.size else None
        return {"bridge_ms": float(np.median(per_step[has])), "bridge_peer": peer}


def _covered(start: np.ndarray, end: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Length of the union of the intervals [start, end) below each time in `t`."""
    o = np.argsort(start, kind="stable")
    s, e = start[o], np.maximum.accumulate(end[o])
    # merge overlapping intervals: a new segment opens where a start passes every earlier end
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > e[:-1]
    seg_s = s[new]
    seg_e = np.append(e[np.flatnonzero(new)[1:] - 1], e[-1])
    before = np.concatenate([[0.0], np.cumsum(seg_e - seg_s)])
    j = np.searchsorted(seg_s, t, side="right") - 1  # the last segment opened by t
    k = np.maximum(j, 0)
    out = before[k] + np.clip(t - seg_s[k], 0.0, seg_e[k] - seg_s[k])
    return np.where(j >= 0, out, 0.0)


def _gap_busy_pct(timed: np.ndarray, lo: int) -> float | None:
    """CPU time the process spent in the window's compute gaps, % of the gaps' length.

    The gap before collective i runs from the end of i-1 to the start of i; the
    process CPU time over it is ``cpu_start[i] - cpu_end[i-1]`` (every thread of
    the process: it can pass 100 with several busy threads). None without CPU
    times or without a gap to measure. Host-clock records only: the CPU clock
    and a device clock do not share a time base.
    """
    t = timed[(timed["clock"] == REC_HOST) & (timed["cpu_start"] > 0) & (timed["cpu_end"] > 0)]
    if t.size < 2:
        return None
    seq = t["coll_seq"]
    follow = (np.diff(seq) == 1) & (seq[1:] >= lo)
    if not follow.any():
        return None
    prev, cur = t[:-1][follow], t[1:][follow]
    wall = cur["start"].astype(np.int64) - prev["end"].astype(np.int64)
    cpu = cur["cpu_start"].astype(np.int64) - prev["cpu_end"].astype(np.int64)
    keep = wall > 0
    total = int(wall[keep].sum())
    if total <= 0:
        return None
    return float(round(100.0 * max(0, int(cpu[keep].sum())) / total, 2))
