"""The detector: a pure state machine fed one assembled window at a time.

`Detector.score_window` takes the window summaries of one (job, window) as
columns (`WindowColumns`: one array per field) and returns every finding
report for that window. It holds baselines and persistence state between
windows and nothing else: no clock, no I/O, so the daemon, the simulator and
the in-process detector all drive the same code. Per-rank work is numpy over
the columns; Python runs per finding, never per rank. DETECTOR.md describes
the rules; the comments here say why the code does what it does.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
from artemis.detect import findings as F
from artemis.detect import scoring
from artemis.detect.diagnosis import diagnose, nic_evidence
from artemis.detect.findings import KINDS, RANK_KINDS, Finding
from artemis.detect.settings import Settings
from artemis.protocol.columns import (
    TELEMETRY_COLUMNS,
    WindowBatch,
    WindowColumns,
    from_wire,
    to_wire,
)
from artemis.protocol.records import NIC_FIELDS, RankWindow, Telemetry

DEFAULT_ISLAND = "default"
# Diagnosis compares a rank's telemetry with its peers' medians; past this many
# peers an evenly spaced sample of them gives the same medians for far less work.
DIAG_PEERS = 256

# The adaptive rank rule (settings.mode = "adaptive"; DETECTOR.md "The combined test").
# Peers: a rank is slow against its peers when it is at least PEER_MIN slower than
# their leave-one-out median and PEER_Z robust sds of their spread above it (or the
# seed's suspect_ratio, whatever the spread).
PEER_MIN = 0.05
PEER_Z = 5.0
# The peers' spread is a robust sd only with enough of them: the MAD of three
# peers (a 4-rank job) is luck, and a real job's noise then reads as z of 50. Smaller
# groups keep the fixed suspect_ratio (and the change test). PEER_MIN scales with
# suspect_ratio (5% at its default 1.10): a user who raises it says peers differ.
PEER_Z_MIN_GROUP = 8
# History: a CUSUM over the window's log peer ratio against the rank's own confirmed
# (warm-up) value, in units of the rank's own measured noise. It is tuned to a
# change of MIN_SHIFT: each window adds (deviation - MIN_SHIFT/2) / sd; a window is
# bad when the sum reaches CUSUM_H and the window itself is at least MIN_SHIFT/2 slow
# (so the sum's memory never makes a later healthy window bad).
MIN_SHIFT = 0.03
CUSUM_H = 6.0
CUSUM_CAP = 2 * CUSUM_H  # bounds how long a past excursion takes to forget
# A rank's noise sd: its own warm-up spread (robust), no less than the median of
# every rank's (five samples can be small by luck), no less than this floor.
SIGMA_FLOOR = 0.002
# Where the noise is large, the shift a window must show (and the CUSUM's
# reference) grows with it: at least CHANGE_Z sds, so the threshold adapts to
# each rank's noise and the baseline's own error never reads as a change.
CHANGE_Z = 3.0
# Island, collective and link kinds (adaptive): the limit is at least this many of
# the scalar's own robust sds above its baseline, in log units. The sd is that of
# its last SCALAR_HISTORY healthy windows (warm-up included), not of the five
# warm-up ones alone: a transfer time in short windows with common stalls has a
# wide body (a window median of 10 steps, a third of them stalled somewhere), and
# five samples can be tight by luck. It is widened by (1 + SCALAR_SMALL / sqrt(n))
# for the error of an sd from n samples, and floored at SCALAR_SD_FLOOR.
# A scalar whose window went over its limit in the last SCALAR_HISTORY windows has
# shown a tail (a 10-step window whose median landed in stalls): its next excursion
# is bad only from its second window in a row. Such windows come at random, a real
# slowdown is there in every window, so a fault loses one window and a tail needs
# four in a row (or five of six) to reach 3 of 4.
SCALAR_Z = 5.0
# The job's live noise (adaptive; DETECTOR.md "The combined test"): the robust sd,
# across ranks, of each rank's change in log gap from one window to the next against
# its group's (/sqrt 2: the noise of one window), pooled over the last NOISE_WINDOWS
# windows. It follows noise that every rank shares but that lands on one rank at a
# time and changes during a run (CPU jobs on a shared host: which rank the scheduler
# delays is luck), which a warm-up spread measured once, over five windows, misses.
# Both peer tests need a rank's log peer ratio to be at least NOISE_Z of it.
NOISE_WINDOWS = 8
NOISE_Z = 3.0
# ... or, where higher, that of the last NOISE_RECENT windows alone: the load can rise
# at once, and the longer pool would follow it windows late.
NOISE_RECENT = 3
SCALAR_HISTORY = 32
SCALAR_SMALL = 1.5
SCALAR_SD_FLOOR = 0.005
# Late summaries (DETECTOR.md "Late summaries"): a window scored with ranks missing
# keeps what its missing ranks need to be scored against their own window's peers
# when their summaries come after it (a partitioned node): for LATE_WINDOWS windows,
# each group's peers as at most LATE_PEERS rows at evenly spaced order statistics of
# its judged gap (every row in smaller groups), each standing for the ranks around it.
LATE_WINDOWS = 256
LATE_PEERS = 128

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
OBJ = npt.NDArray[np.object_]


@dataclass
class WindowResult:
    job: str
    window: int
    findings: list[Finding]  # every report of this window, all kinds and states
    ranks: I64  # the ranks that reported a usable summary, sorted
    pace_values: F64  # per rank of `ranks`: pace ratio (peers, else own history); NaN unknown
    island_labels: OBJ  # per rank of `ranks`: its island (str)
    step_ms: float  # median step time of the window (NaN when nobody reported)
    missing: list[int]  # ranks without a usable record in this window
    gpu_hours_lost: float  # job total so far, over every confirmed finding
    steps: list[int] = field(default_factory=list)  # [first step, one past the last]

    @property
    def pace(self) -> dict[int, float]:
        """rank -> pace ratio, for the ranks where it is known (tests, tools)."""
        ok = np.isfinite(self.pace_values)
        return {int(r): float(v) for r, v in zip(self.ranks[ok], self.pace_values[ok], strict=True)}

    @property
    def islands(self) -> dict[int, str]:
        labels = self.island_labels.tolist()
        return {int(r): str(lab) for r, lab in zip(self.ranks.tolist(), labels, strict=True)}


class _Track:
    """Persistence of one subject (a rank, an island, a link) for one kind.

    Suspect -> flagged after `flag_after` bad windows in the last `flag_window`;
    flagged -> ongoing while it lasts; cleared after `clear_after` good windows
    in a row. A suspicion that never reaches flagged simply fades.
    """

    __slots__ = (
        "active",
        "good_run",
        "hours",
        "intermittent",
        "long",
        "pending_hours",
        "recent",
        "since",
    )

    def __init__(self, flag_window: int) -> None:
        self.recent: deque[bool] = deque(maxlen=flag_window)
        # Twice as long: an intermittent fault (slow in half of its windows) rarely
        # makes flag_after of flag_window, but does make flag_window of these.
        self.long: deque[bool] = deque(maxlen=2 * flag_window)
        self.intermittent = False
        self.active = False
        self.since: int | None = None
        self.good_run = 0
        self.pending_hours = 0.0  # cost while suspect; counts once confirmed
        self.hours = 0.0  # confirmed cost of this finding

    def observe(
        self, window: int, bad: bool, s: Settings, intermittent_rule: bool = False
    ) -> str | None:
        # the streak (and `since`) lasts while the intermittent rule still remembers it
        streak = any(self.recent) or (intermittent_rule and any(self.long))
        self.long.append(bad)
        if self.active:
            if bad:
                self.good_run = 0
                return "ongoing"
            self.good_run += 1
            # An intermittent fault has good runs by nature: it clears only after
            # twice as many good windows.
            if self.good_run >= s.clear_after * (2 if self.intermittent else 1):
                self.active = False
                self.intermittent = False
                self.recent.clear()
                self.long.clear()
                return "cleared"
            return "ongoing"
        if bad:
            if not streak:
                self.since = window
                self.pending_hours = 0.0
            self.recent.append(True)
            if sum(self.recent) >= s.flag_after:
                self.active = True
                self.good_run = 0
                return "flagged"
            if intermittent_rule and sum(self.long) >= s.flag_window:
                self.active = True
                self.intermittent = True
                self.good_run = 0
                return "flagged"
            return "suspect"
        self.recent.append(False)
        if not any(self.recent) and not (intermittent_rule and any(self.long)):
            self.since = None
            self.pending_hours = 0.0
        return None

    @property
    def idle(self) -> bool:
        return not self.active and not any(self.recent) and not any(self.long)

    def resize(self, flag_window: int) -> None:
        self.recent = deque(self.recent, maxlen=flag_window)
        self.long = deque(self.long, maxlen=2 * flag_window)

    def snapshot(self) -> dict[str, Any]:
        return {
            "recent": list(self.recent),
            "long": list(self.long),
            "intermittent": self.intermittent,
            "active": self.active,
            "since": self.since,
            "good_run": self.good_run,
            "pending_hours": self.pending_hours,
            "hours": self.hours,
        }

    @classmethod
    def restore(cls, state: Mapping[str, Any], flag_window: int) -> _Track:
        t = cls(flag_window)
        t.recent.extend(bool(x) for x in state["recent"])
        t.long.extend(bool(x) for x in state.get("long", state["recent"]))
        t.intermittent = bool(state.get("intermittent", False))
        t.active = bool(state["active"])
        t.since = None if state["since"] is None else int(state["since"])
        t.good_run = int(state["good_run"])
        t.pending_hours = float(state["pending_hours"])
        t.hours = float(state["hours"])
        return t


class _Baseline:
    """Warm-up baseline of one scalar: median of its first healthy windows after window 0;
    `recent` holds its last SCALAR_HISTORY healthy values, for its noise (adaptive)."""

    __slots__ = ("last_above", "needs_two", "recent", "run_start", "samples")

    def __init__(
        self,
        samples: Sequence[float] = (),
        recent: Sequence[float] | None = None,
        tail: Sequence[int] = (-(10**9), -(10**9), 0),
    ) -> None:
        self.samples: list[float] = [float(x) for x in samples]
        self.recent: list[float] = [float(x) for x in (self.samples if recent is None else recent)]
        # the tail rule (adaptive): last window over the limit, start of the current
        # run of such windows, and whether that run needs a second window to be bad
        self.last_above, self.run_start, self.needs_two = (int(x) for x in tail)

    def tail(self) -> list[int]:
        return [self.last_above, self.run_start, self.needs_two]

    def excursion(self, window: int, above: bool) -> bool:
        """Whether an over-limit window is bad under the tail rule (see SCALAR_HISTORY)."""
        if not above:
            return False
        if self.last_above != window - 1:  # a new run: was there one recently?
            self.needs_two = int(window - self.last_above <= SCALAR_HISTORY)
            self.run_start = window
        self.last_above = window
        return not self.needs_two or window > self.run_start

    def log_sd(self, ref: float) -> float | None:
        """Robust sd of log(value / ref) over the recent healthy values, widened for
        their number (None with fewer than 3)."""
        n = len(self.recent)
        if n < 3:
            return None
        lg = np.log(np.asarray(self.recent) / ref) if ref > 0 else np.zeros(n)
        sd = scoring.MAD_SCALE * float(np.median(np.abs(lg - np.median(lg))))
        return max(SCALAR_SD_FLOOR, sd) * (1.0 + SCALAR_SMALL / math.sqrt(n))

    def value(self, window: int, s: Settings) -> float | None:
        n = len(self.samples)
        if n and (n >= s.warmup_windows or window > s.warmup_windows):
            return float(np.median(self.samples))
        return None

    def feed(self, window: int, x: float, s: Settings) -> None:
        if window >= 1 and math.isfinite(x):
            if len(self.samples) < s.warmup_windows:
                self.samples.append(x)
            if x > 0:
                self.recent.append(x)
                del self.recent[:-SCALAR_HISTORY]


@dataclass(frozen=True)
class _Ctx:
    window: int
    steps: list[int]
    step_ms: float
    hours_per_ms: float


@dataclass
class _LateRef:
    """What a window scored with ranks missing keeps for their late summaries."""

    ctx: _Ctx
    live: float  # the job's live noise when the window was judged (NaN: none yet)
    rows: WindowColumns  # the peers: a sample of its usable rows, then the late ones scored
    weight: I64  # per row of `rows`: how many of the window's ranks it stands for
    pending: I64  # sorted ranks still missing from the window (a late one may come)
    wire: bytes | None = None  # `rows` encoded for snapshots (saved after every window)

    def rows_wire(self) -> bytes:
        if self.wire is None:
            self.wire = msgspec.msgpack.encode(to_wire(self.rows))
        return self.wire


@dataclass
class LateResult:
    """`Detector.score_late`: what became of one window's late summaries."""

    result: WindowResult | None  # the late ranks' findings (None: nothing scored)
    scored: int = 0  # ranks scored now, against the window's own peers
    duplicate: int = 0  # ranks the window had already (scored then, or late before)
    expired: int = 0  # the window is older than LATE_WINDOWS, or kept nothing for them
    # `result` with the arrays over the late ranks and the kept peers (the incidents'
    # view of the window)
    union: WindowResult | None = None


@dataclass
class _View:
    """The usable rows of one window, as arrays aligned on `r` (sorted ranks)."""

    cols: WindowColumns
    row: I64  # row of each usable rank in `cols`
    r: I64
    gap: F64  # as judged: per sample under a plan (see score_window)
    actual: F64  # as measured
    coll: F64
    isl_labels: OBJ  # island name per rank
    isl_names: OBJ  # distinct islands, sorted
    isl_id: I64
    gid: I64  # scoring group: island, or island x class
    class_of: OBJ  # hardware class where classes apply, else None
    bridge: F64  # bridge time (island leaders), NaN elsewhere
    leaders: I64  # indices of the ranks with a usable bridge time


@dataclass
class _RankScores:
    """Per-rank verdicts of one window, aligned with `_View.r`."""

    peers: scoring.Scores  # on the judged gap
    cost: scoring.Scores  # on the measured gap (the cost)
    base: F64  # own warm-up baseline
    history: F64  # gap / baseline
    peers_ok: npt.NDArray[np.bool_]
    peer_bad: npt.NDArray[np.bool_]
    hist_bad: npt.NDArray[np.bool_]
    # adaptive mode: the change test on the peer ratio (NaN / False in seed mode)
    change_bad: npt.NDArray[np.bool_]
    shift: F64  # log peer ratio - its confirmed baseline
    noise: F64  # the rank's noise sd (log ratio units)
    cusum: F64


class Detector:
    """Scores windows of one job; see DETECTOR.md for the rules."""

    def __init__(
        self,
        settings: Settings,
        job: str,
        nranks: int,
        hosts: Mapping[int, str] | None = None,
        *,
        islands: Mapping[int, str] | None = None,
        classes: Mapping[int, str] | None = None,
        island_order: Sequence[str] | None = None,
    ) -> None:
        if nranks < 1:
            raise ValueError(f"nranks must be at least 1, got {nranks}")
        self.settings = settings
        self.job = job
        self.nranks = 0
        # Per rank, as object arrays (host, island from config, class from config,
        # last island seen) so a window updates them with one fancy assignment.
        self._host: OBJ = np.empty(0, dtype=object)
        self._hosts_seen: tuple[list[str], I64] | None = None  # (host column, ranks) learnt
        self._cfg_island: OBJ = np.empty(0, dtype=object)
        self._cfg_class: OBJ = np.empty(0, dtype=object)
        self._island_of: OBJ = np.empty(0, dtype=object)
        self._rank_samples: F64 = np.full((0, settings.warmup_windows), np.nan)
        self._rank_count: I64 = np.zeros(0, dtype=np.int64)
        # Adaptive mode: warm-up log peer ratios (fed with the gap samples) and the CUSUM.
        self._ratio_samples: F64 = np.full((0, settings.warmup_windows), np.nan)
        self._cusum: F64 = np.zeros(0)
        self._prev_lg: F64 = np.zeros(0)  # last judged window's log gap (NaN: none)
        # per recent window: each rank's change in log gap less its group's (see NOISE_WINDOWS)
        self._live_noise: deque[F64] = deque(maxlen=NOISE_WINDOWS)
        self._dcusum: F64 = np.zeros(0)  # the same test for `degraded` (own gap history)
        self._ratio_cache: tuple[tuple[int, bool], tuple[F64, F64]] | None = None
        self._gap_noise_cache: tuple[tuple[int, bool], F64] | None = None
        self.resize(nranks)
        for r, h in (hosts or {}).items():
            self._host[r] = h
        for r, lab in (islands or {}).items():
            self._cfg_island[r] = lab
        for r, c in (classes or {}).items():
            self._cfg_class[r] = c
        self._any_cfg_class = any(c is not None for c in (classes or {}).values())
        self._island_order: list[str] | None = list(island_order) if island_order else None
        self._samples_version = 0
        self._base_cache: tuple[tuple[int, bool], F64] | None = None
        self._baselines: dict[tuple[str, str], _Baseline] = {}
        self._tracks: dict[tuple[str, str], _Track] = {}
        self._gpu_hours = 0.0
        self._late: dict[int, _LateRef] = {}  # window -> its peers, for late summaries
        self._last_window = -1

    # -- size and settings --------------------------------------------------

    def resize(self, nranks: int) -> None:
        """Grow to `nranks` ranks, keeping every track and baseline (never shrinks)."""
        if nranks <= self.nranks:
            return
        cap = self._rank_count.size
        if nranks <= cap:
            self.nranks = nranks
            return
        # Capacity doubles: agents announce their ranks a few at a time, and growing
        # by exactly what each announces would copy every array once per agent.
        extra = max(nranks, 2 * cap) - cap

        def grow(a: OBJ) -> OBJ:
            return np.concatenate([a, np.full(extra, None, dtype=object)])

        self._host = grow(self._host)
        self._hosts_seen = None
        self._cfg_island = grow(self._cfg_island)
        self._cfg_class = grow(self._cfg_class)
        self._island_of = grow(self._island_of)
        w = self._rank_samples.shape[1]
        self._rank_samples = np.vstack([self._rank_samples, np.full((extra, w), np.nan)])
        self._ratio_samples = np.vstack([self._ratio_samples, np.full((extra, w), np.nan)])
        self._cusum = np.concatenate([self._cusum, np.zeros(extra)])
        self._prev_lg = np.concatenate([self._prev_lg, np.full(extra, np.nan)])
        self._dcusum = np.concatenate([self._dcusum, np.zeros(extra)])
        self._rank_count = np.concatenate([self._rank_count, np.zeros(extra, dtype=np.int64)])
        self.nranks = nranks
        self._samples_version = getattr(self, "_samples_version", 0) + 1

    def update_settings(self, settings: Settings) -> None:
        """New settings take effect from the next window; state is kept."""
        if settings.warmup_windows != self._rank_samples.shape[1]:
            w = settings.warmup_windows
            grown = np.full((self._rank_count.size, w), np.nan)
            keep = min(w, self._rank_samples.shape[1])
            grown[:, :keep] = self._rank_samples[:, :keep]
            self._rank_samples = grown
            grown_r = np.full((self._rank_count.size, w), np.nan)
            grown_r[:, :keep] = self._ratio_samples[:, :keep]
            self._ratio_samples = grown_r
            self._rank_count = np.minimum(self._rank_count, w)
            self._samples_version += 1
            for b in self._baselines.values():
                del b.samples[w:]
        if settings.flag_window != self.settings.flag_window:
            for t in self._tracks.values():
                t.resize(settings.flag_window)
        self.settings = settings

    @property
    def gpu_hours_lost(self) -> float:
        return self._gpu_hours

    def active(self) -> list[tuple[str, str]]:
        """(kind, subject) of every finding currently flagged (not yet cleared)."""
        return sorted(k for k, t in self._tracks.items() if t.active)

    def islands(self) -> dict[int, str]:
        """rank -> island, for every rank whose island is known (hang findings)."""
        known = np.flatnonzero(~_none(self._island_of))
        return {int(r): str(self._island_of[r]) for r in known}

    def hosts(self) -> dict[int, str]:
        known = np.flatnonzero(~_none(self._host))
        return {int(r): str(self._host[r]) for r in known}

    # -- state --------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole scoring state as plain data (msgpack-able: numbers as raw bytes)."""
        return {
            "nranks": self.nranks,
            "rank_samples": _pack(self._rank_samples[: self.nranks]),
            "rank_count": _pack(self._rank_count[: self.nranks]),
            "ratio_samples": _pack(self._ratio_samples[: self.nranks]),
            "cusum": _pack(self._cusum[: self.nranks]),
            "prev_lr": _pack(self._prev_lg[: self.nranks]),
            "live_noise": [_pack(d) for d in self._live_noise],
            "dcusum": _pack(self._dcusum[: self.nranks]),
            "host": self._host[: self.nranks].tolist(),
            "island_of": self._island_of[: self.nranks].tolist(),
            "baselines": [
                [k, s, b.samples, b.recent, b.tail()] for (k, s), b in self._baselines.items()
            ],
            "tracks": [[k, s, t.snapshot()] for (k, s), t in self._tracks.items()],
            "gpu_hours": self._gpu_hours,
            "last_window": self._last_window,
            "late": [
                [
                    w,
                    ref.ctx.steps,
                    ref.ctx.step_ms,
                    ref.ctx.hours_per_ms,
                    ref.live,
                    ref.rows_wire(),
                    _pack(ref.weight),
                    _pack(ref.pending),
                ]
                for w, ref in self._late.items()
            ],
        }

    def restore_state(self, state: Mapping[str, Any]) -> None:
        """Take back a `snapshot()`; config facts (islands, classes) stay the constructor's."""
        self.resize(int(state["nranks"]))
        n = int(state["nranks"])
        samples = _unpack(state["rank_samples"], np.float64).reshape(n, -1)
        count = _unpack(state["rank_count"], np.int64)
        w = self.settings.warmup_windows
        self._rank_samples[:n] = np.nan
        keep = min(w, samples.shape[1])
        self._rank_samples[:n, :keep] = samples[:, :keep]
        self._rank_count[:n] = np.minimum(count, w)
        self._ratio_samples[:n] = np.nan
        self._cusum[:n] = 0.0
        self._dcusum[:n] = 0.0
        if "dcusum" in state:  # (snapshots from before the adaptive degraded rule lack it)
            self._dcusum[:n] = _unpack(state["dcusum"], np.float64)
        if "ratio_samples" in state:  # snapshots from before the adaptive rule lack it
            rs = _unpack(state["ratio_samples"], np.float64).reshape(n, -1)
            self._ratio_samples[:n, : min(w, rs.shape[1])] = rs[:, : min(w, rs.shape[1])]
            self._cusum[:n] = _unpack(state["cusum"], np.float64)
        self._prev_lg[:n] = np.nan
        self._live_noise.clear()
        if "prev_lr" in state:  # snapshots from before the live noise lack it
            self._prev_lg[:n] = _unpack(state["prev_lr"], np.float64)
            self._live_noise.extend(_unpack(d, np.float64) for d in state["live_noise"])
        self._host[:n] = _objects(state["host"])
        self._hosts_seen = None
        self._island_of[:n] = _objects(state["island_of"])
        # (snapshots from before the scalar noise history have no `recent`)
        self._baselines = {(b[0], b[1]): _Baseline(b[2][:w], *b[3:5]) for b in state["baselines"]}
        fw = self.settings.flag_window
        self._tracks = {(k, s): _Track.restore(t, fw) for k, s, t in state["tracks"]}
        self._gpu_hours = float(state["gpu_hours"])
        self._samples_version += 1
        # (snapshots from before late scoring have neither: no late window is kept)
        self._last_window = int(state.get("last_window", -1))
        self._late = {
            int(w): _LateRef(
                ctx=_Ctx(int(w), [int(x) for x in steps], float(step_ms), float(hpm)),
                live=float(live),
                rows=from_wire(msgspec.msgpack.decode(rows, type=WindowBatch)),
                weight=_unpack(weight, np.int64),
                pending=_unpack(pending, np.int64),
                wire=bytes(rows),
            )
            for w, steps, step_ms, hpm, live, rows, weight, pending in state.get("late", [])
        }

    # -- one window ---------------------------------------------------------

    def score_window(
        self,
        window: int,
        ranks: WindowColumns | Sequence[RankWindow],
        missing: Sequence[int] = (),
    ) -> WindowResult:
        cols = ranks if isinstance(ranks, WindowColumns) else WindowColumns.from_records(ranks)
        v, unusable = self._view(cols)
        missing_out = sorted(set(missing) | set(unusable.tolist()))
        if v is None:
            self._keep_late(window, None, None, missing_out)
            empty = np.zeros(0, dtype=np.int64)
            return WindowResult(
                self.job,
                window,
                [],
                empty,
                np.zeros(0),
                _objects([]),
                math.nan,
                missing_out,
                self._gpu_hours,
            )
        ctx = self._context(window, v)
        sc = self._judge_ranks(window, v)
        findings, active = self._rank_findings(v, sc, ctx)
        self._feed_rank_baselines(window, v, sc, active)
        # With ranks missing, the last arrival may be among them: the transfer time
        # (and a bridge's) is then a wait for it, and a straggler there would read
        # as a slow collective or link. Those windows do not judge them (DETECTOR.md
        # "Late summaries").
        partial = bool(missing_out)
        findings += self._island_findings(ctx, v, judge_transfer=not partial)
        if not partial:
            findings += self._link_findings(ctx, v)
        findings.sort(key=lambda f: (KINDS.index(f.kind), f.subject))
        self._keep_late(window, v, ctx, missing_out)
        pace = np.where(sc.peers_ok | np.isnan(sc.history), sc.peers.ratio, sc.history)
        return WindowResult(
            job=self.job,
            window=window,
            findings=findings,
            ranks=v.r,
            pace_values=pace,
            island_labels=v.isl_labels,
            step_ms=ctx.step_ms,
            missing=missing_out,
            gpu_hours_lost=self._gpu_hours,
            steps=ctx.steps,
        )

    # -- late summaries -----------------------------------------------------

    def _keep_late(
        self, window: int, v: _View | None, ctx: _Ctx | None, missing: Sequence[int]
    ) -> None:
        """After a window is judged: keep its peers if ranks are missing from it (their
        summaries may still come, DETECTOR.md "Late summaries"); forget windows
        LATE_WINDOWS behind. A complete window keeps nothing: no rank can join it."""
        self._last_window = max(self._last_window, window)
        for w in [w for w in self._late if w <= self._last_window - LATE_WINDOWS]:
            del self._late[w]
        if not missing or v is None or ctx is None:
            return
        idx, weight = _order_sample(v.gap, v.gid, np.ones(v.r.size, dtype=np.int64))
        live = self._noise_now() if self.settings.mode == "adaptive" else math.nan
        self._late[window] = _LateRef(
            ctx=ctx,
            live=live,
            rows=v.cols.take(v.row[idx]),
            weight=weight,
            pending=np.unique(np.asarray(missing, dtype=np.int64)),
        )

    def late_columns(self, window: int) -> WindowColumns:
        """A kept window's rows: its peers' sample and the late rows scored since."""
        ref = self._late.get(window)
        return WindowColumns.empty() if ref is None else ref.rows

    def late_pending(self, window: int) -> I64 | None:
        """The ranks of a kept window still missing (None: nothing kept for it)."""
        ref = self._late.get(window)
        return None if ref is None else ref.pending

    def score_late(self, window: int, ranks: WindowColumns | Sequence[RankWindow]) -> LateResult:
        """Late summaries of a window already judged (its deadline passed with these
        ranks missing): each rank still missing from it is judged against the
        window's own peers (kept by `_keep_late`) and the other late ranks, with the
        window's context, and its state advances by this window. A rank the window
        had is not judged again (`duplicate`); a window no longer kept: `expired`.
        The caller gives a rank's late windows in window order (the agents send
        them so), before its next window is judged."""
        cols = ranks if isinstance(ranks, WindowColumns) else WindowColumns.from_records(ranks)
        ref = self._late.get(window)
        if cols.n == 0:
            return LateResult(None)
        r_all = cols.ints("rank")
        if ref is None:
            return LateResult(None, expired=int(np.unique(r_all).size))
        # the last row of each rank still missing from the window
        _, first_rev = np.unique(r_all[::-1], return_index=True)
        last = np.sort(r_all.size - 1 - first_rev)
        fresh = last[np.isin(r_all[last], ref.pending)]
        dup = int(last.size - fresh.size)
        if fresh.size == 0:
            return LateResult(None, duplicate=dup)
        late = cols.take(fresh)
        u = WindowColumns.concat([ref.rows, late])
        w_u = np.concatenate([ref.weight, np.ones(late.n, dtype=np.int64)])
        v, unusable = self._view(u)
        lr = late.ints("rank")
        ref.pending = np.setdiff1d(ref.pending, lr)
        if v is None:
            return LateResult(None, scored=int(fresh.size), duplicate=dup)
        only = v.row >= u.n - late.n
        rep = w_u[v.row]
        pre = (self._weighted(v.gap, v.gid, rep), self._weighted(v.actual, v.gid, rep))
        if not ref.pending.size:
            del self._late[window]  # nobody left to come: nothing to keep
        else:
            # the late rows are peers of the later late ones: kept in the sample, which
            # stays at most LATE_PEERS rows a group
            idx, weight = _order_sample(v.gap, v.gid, rep)
            ref.rows, ref.weight, ref.wire = u.take(v.row[idx]), weight, None
        ctx = ref.ctx
        sc = self._judge_ranks(window, v, pre=pre, live=ref.live, only=only)
        findings, active = self._rank_findings(v, sc, ctx, only=only)
        self._feed_rank_baselines(window, v, sc, active, only=only)
        findings.sort(key=lambda f: (KINDS.index(f.kind), f.subject))
        pace = np.where(sc.peers_ok | np.isnan(sc.history), sc.peers.ratio, sc.history)
        res = WindowResult(
            job=self.job,
            window=window,
            findings=findings,
            ranks=v.r[only],
            pace_values=pace[only],
            island_labels=v.isl_labels[only],
            step_ms=ctx.step_ms,
            missing=sorted(set(ref.pending.tolist()) | set(np.intersect1d(unusable, lr).tolist())),
            gpu_hours_lost=self._gpu_hours,
            steps=ctx.steps,
        )
        union = dataclasses.replace(res, ranks=v.r, pace_values=pace, island_labels=v.isl_labels)
        return LateResult(res, scored=int(fresh.size), duplicate=dup, union=union)

    @staticmethod
    def _weighted(values: F64, gid: I64, rep: I64) -> scoring.Scores:
        """Leave-one-out scores where entry i stands for rep[i] ranks (a kept window's
        peers): exact for the entries of weight 1 (the late ranks)."""
        if (rep == 1).all():
            return scoring.score(values, gid)
        big = np.repeat(np.arange(values.size), rep)
        sc = scoring.score(values[big], gid[big])
        first = np.cumsum(rep) - rep
        return scoring.Scores(
            sc.loo_median[first], sc.ratio[first], sc.z[first], sc.group_size[first]
        )

    # -- reading the columns ------------------------------------------------

    def _view(self, cols: WindowColumns) -> tuple[_View | None, I64]:
        """The usable rows (the last row of a rank wins) and the ranks whose last row is not
        usable (a non-finite or negative time: they count as missing)."""
        r_all = cols.ints("rank")
        if r_all.size and (r_all.min() < 0 or r_all.max() >= self.nranks):
            bad = int(r_all[(r_all < 0) | (r_all >= self.nranks)][0])
            raise ValueError(f"rank {bad} is outside the job's ranks 0..{self.nranks - 1}")
        times = np.stack([cols.floats("gap_ms"), cols.floats("coll_ms"), cols.floats("step_ms")])
        with np.errstate(invalid="ignore"):
            ok = (np.isfinite(times) & (times >= 0)).all(axis=0)
        if r_all.size < 2 or (r_all[1:] > r_all[:-1]).all():
            last = np.arange(r_all.size, dtype=np.int64)  # the assembly's order: one row each
        else:
            # Last row per rank: unique over the reversed ranks gives first-in-reverse.
            _, first_rev = np.unique(r_all[::-1], return_index=True)
            last = (r_all.size - 1 - first_rev).astype(np.int64)
        hosts = cols["host"]
        seen = self._hosts_seen
        # the same ranks on the same hosts as last window (the usual): nothing to learn
        if seen is None or not np.array_equal(seen[1], r_all) or hosts != seen[0]:
            host = _objects(hosts)
            if host.size:
                named = last[np.not_equal(host[last], "")]
                self._host[r_all[named]] = host[named]
            self._hosts_seen = (hosts, r_all.copy()) if isinstance(hosts, list) else None
        unusable = r_all[last[~ok[last]]]
        row = last[ok[last]]
        if row.size == 0:
            return None, unusable
        r = r_all[row]
        gap = cols.floats("gap_ms")[row]
        isl_labels = self._island_labels(cols, row, r)
        isl_names, isl_id = _factorize(isl_labels)
        gid, class_of = self._groups(cols, row, r, isl_id, len(isl_names))
        # Under a rebalance plan ranks run different sample counts: judge the
        # compute gap per sample (scaled to the mean split), so a slow rank that a
        # plan compensates stays flagged until it really recovers; the cost stays
        # what the job loses now, from the gaps as they are.
        scale = _per_sample_scale(cols.floats("samples")[row])
        bridge = cols.floats("bridge_ms")[row]
        bridge = np.where(np.isfinite(bridge), bridge, np.nan)  # inf is no bridge time
        view = _View(
            cols=cols,
            row=row,
            r=r,
            gap=gap if scale is None else gap * scale,
            actual=gap,
            coll=cols.floats("coll_ms")[row],
            isl_labels=isl_labels,
            isl_names=isl_names,
            isl_id=isl_id,
            gid=gid,
            class_of=class_of,
            bridge=bridge,
            leaders=np.flatnonzero(bridge >= 0).astype(np.int64),  # NaN compares False
        )
        return view, unusable

    def _island_labels(self, cols: WindowColumns, row: I64, r: I64) -> OBJ:
        """Island per rank: the summary's, else the telemetry's vendor, else the config,
        else the rank's last known island, else "default"."""
        lab = _objects(cols["island"])[row]
        if _none(lab).any():
            lab = self._fill_islands(cols, row, r, lab)
        self._island_of[r] = lab
        return lab

    def _fill_islands(self, cols: WindowColumns, row: I64, r: I64, lab: OBJ) -> OBJ:
        for fallback in (
            lambda m: _objects(cols["tel_vendor"])[row[m]],
            lambda m: self._cfg_island[r[m]],
            lambda m: self._island_of[r[m]],
        ):
            unknown = _none(lab)
            if not unknown.any():
                break
            lab[unknown] = fallback(unknown)
        lab[_none(lab)] = DEFAULT_ISLAND
        return lab

    def _groups(
        self, cols: WindowColumns, row: I64, r: I64, isl_id: I64, n_isl: int
    ) -> tuple[I64, OBJ]:
        """Group ids: the island, or island x class where hardware classes apply."""
        mode = self.settings.hardware_classes
        none: OBJ = np.full(r.size, None, dtype=object)
        if mode == "off":
            return isl_id, none
        absent = _all_none(cols["hw_class"]) and _all_none(cols["tel_gpu_model"])
        if absent and not self._any_cfg_class:
            return isl_id, none  # no class anywhere (the usual one-generation job)
        cls = _objects(cols["hw_class"])[row]
        unknown = _none(cls)
        for fallback in (
            lambda m: _objects(cols["tel_gpu_model"])[row[m]],
            lambda m: self._cfg_class[r[m]],
        ):
            if not unknown.any():
                break
            cls[unknown] = fallback(unknown)
            unknown = _none(cls)
        known = ~unknown
        if not known.any():
            return isl_id, none
        if mode == "auto":
            # Only islands whose known classes differ are split: an older
            # generation is slower by design, not faulty.
            split = np.array(
                [len(set(cls[known & (isl_id == k)].tolist())) > 1 for k in range(n_isl)]
            )
            cls = cls.copy()
            cls[~split[isl_id]] = None
            known = ~_none(cls)
        if not known.any():
            return isl_id, none
        labels = np.where(known, cls, "").astype(str)
        return scoring.group_ids(isl_id, labels), cls

    def _context(self, window: int, v: _View) -> _Ctx:
        lo = v.cols.ints("step_lo")[v.row]
        hi = v.cols.ints("step_hi")[v.row]
        step_ms = float(np.median(v.cols.floats("step_ms")[v.row]))
        gpus = self.settings.gpu_count or self.nranks
        # GPU-hours per ms of excess per step: every GPU waits that long each step.
        hours_per_ms = int(np.median(hi - lo)) * gpus / 3600.0 / 1000.0
        return _Ctx(window, [int(lo.min()), int(hi.max())], step_ms, hours_per_ms)

    # -- ranks --------------------------------------------------------------

    def _judge_ranks(
        self,
        window: int,
        v: _View,
        pre: tuple[scoring.Scores, scoring.Scores] | None = None,
        live: float | None = None,
        only: npt.NDArray[np.bool_] | None = None,
    ) -> _RankScores:
        """Every rank's verdicts. A late window (score_late) passes its peers' scores
        (`pre`), the live noise of its own time (`live`) and the ranks whose state
        may change (`only`: the late ones; the others are its peers, judged then)."""
        s = self.settings
        if pre is not None:
            peers, cost = pre
        else:
            peers = scoring.score(v.gap, v.gid)
            cost = peers if v.gap is v.actual else scoring.score(v.actual, v.gid)
        base = self._rank_baseline(window)[v.r]
        with np.errstate(divide="ignore", invalid="ignore"):
            history = np.where(base > 0, v.gap / base, np.nan)
        judging = window >= 1  # window 0 carries start-up work (compilation, warm caches)
        peers_ok = peers.group_size >= s.min_island_peers
        peer_bad = judging & peers_ok & (peers.ratio >= s.suspect_ratio)
        n = v.r.size
        nan = np.full(n, np.nan)
        change_bad = np.zeros(n, dtype=bool)
        shift, noise, cusum = nan, nan, nan
        if s.mode == "adaptive":
            with np.errstate(invalid="ignore", divide="ignore"):
                # noise-scaled peer test: a tight group is judged more finely
                peer_bad |= (
                    judging
                    & peers_ok
                    & (peers.group_size >= PEER_Z_MIN_GROUP)
                    & (peers.ratio - 1.0 >= PEER_MIN * (s.suspect_ratio - 1.0) / 0.10)
                    & (peers.z >= PEER_Z)
                )
                lr = np.log(peers.ratio)
                if only is not None:
                    # a late window feeds no live noise (that is the job's now), but
                    # the rank's last log gap is this one, as its windows come in order
                    self._prev_lg[v.r[only]] = np.log(v.gap[only])
                elif window >= 1:
                    self._observe_noise(v.r, np.log(v.gap), v.gid, peers_ok)
                if live is None:
                    live = self._noise_now()
                if math.isfinite(live):
                    # slower than its peers, but within what every rank's ratio moves
                    # by from window to window now: noise, whatever the ratio
                    peer_bad &= lr >= NOISE_Z * live
                rbase, rsd = self._ratio_baseline(window)
                shift = lr - rbase[v.r]
                noise = np.fmax(rsd[v.r], live) if math.isfinite(live) else rsd[v.r]
                ref = np.fmax(MIN_SHIFT / 2, CHANGE_Z * noise)
                step = (shift - ref) / noise
                ok = judging & peers_ok & np.isfinite(step)
                cusum = np.where(ok, np.clip(self._cusum[v.r] + step, 0.0, CUSUM_CAP), 0.0)
                change_bad = ok & (cusum >= CUSUM_H) & (shift >= ref)
            w_ok = ok if only is None else ok & only
            self._cusum[v.r[w_ok]] = cusum[w_ok]
            # `degraded` (no peers): the same change test on the rank's own gap against
            # its warm-up median, in the noise of its warm-up gaps. Nothing shared is
            # taken out here (no peers), so that noise includes the job's jitter.
            no_peers = judging & ~peers_ok
            with np.errstate(invalid="ignore", divide="ignore"):
                dsd = self._gap_noise(window)[v.r] if no_peers.any() else nan
                dshift = np.log(history)
                dref = np.fmax(MIN_SHIFT / 2, CHANGE_Z * dsd)
                dstep = (dshift - dref) / dsd
                dok = judging & ~peers_ok & np.isfinite(dstep)
                dc = np.where(dok, np.clip(self._dcusum[v.r] + dstep, 0.0, CUSUM_CAP), 0.0)
                hist_bad = dok & (dc >= CUSUM_H) & (dshift >= dref)
                # and the seed's fixed ratio, where it is at least PEER_Z of that noise
                hist_bad |= dok & (history >= s.suspect_ratio) & (dshift >= PEER_Z * dsd)
            w_dok = dok if only is None else dok & only
            self._dcusum[v.r[w_dok]] = dc[w_dok]
            shift, noise, cusum = (
                np.where(peers_ok, a, b) for a, b in ((shift, dshift), (noise, dsd), (cusum, dc))
            )
        else:
            hist_bad = judging & ~peers_ok & (history >= s.suspect_ratio)
        return _RankScores(
            peers=peers,
            cost=cost,
            base=base,
            history=history,
            peers_ok=peers_ok,
            peer_bad=peer_bad,
            hist_bad=hist_bad,
            change_bad=change_bad,
            shift=shift,
            noise=noise,
            cusum=cusum,
        )

    def _noise_now(self) -> float:
        """The job's live noise sd of one window's log peer ratio (NaN until measured)."""
        if not self._live_noise:
            return math.nan
        recent = list(self._live_noise)[-NOISE_RECENT:]
        return max(_noise_sd(np.concatenate(self._live_noise)), _noise_sd(np.concatenate(recent)))

    def _observe_noise(self, r: I64, lg: F64, gid: I64, peers_ok: npt.NDArray[np.bool_]) -> None:
        """Feed this window's log gaps to the live noise: each rank's change since the
        last window against its group's (what every rank shares, e.g. a data-dependent
        step length, cancels)."""
        with np.errstate(invalid="ignore"):
            d = lg - self._prev_lg[r]
        self._prev_lg[r] = lg
        idx = np.flatnonzero(peers_ok & np.isfinite(d))
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
            self._live_noise.append(d)

    def _gap_noise(self, window: int) -> F64:
        """Per rank: the robust sd of its warm-up log gaps around their median, no less
        than the median of every rank's (five samples can be small by luck) and
        SIGMA_FLOOR; NaN until its baseline is in use."""
        s = self.settings
        key = (self._samples_version, window > s.warmup_windows)
        if self._gap_noise_cache is not None and self._gap_noise_cache[0] == key:
            return self._gap_noise_cache[1]
        cnt = self._rank_count
        ready = (cnt > 0) & ((cnt >= s.warmup_windows) | (window > s.warmup_windows))
        sd = np.full(cnt.size, np.nan)
        if ready.any():
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                x = np.log(self._rank_samples[ready])
                med = np.nanmedian(x, axis=1)
                own = scoring.MAD_SCALE * np.nanmedian(np.abs(x - med[:, None]), axis=1)
                own = np.where(np.sum(np.isfinite(x), axis=1) >= 3, own, np.nan)
                pooled = np.nanmedian(own) if np.isfinite(own).any() else SIGMA_FLOOR
            sd[ready] = np.fmax(np.fmax(own, pooled), SIGMA_FLOOR)
        self._gap_noise_cache = (key, sd)
        return sd

    def _ratio_baseline(self, window: int) -> tuple[F64, F64]:
        """Per rank: the confirmed log peer ratio (median of its warm-up) and its noise sd."""
        s = self.settings
        key = (self._samples_version, window > s.warmup_windows)
        if self._ratio_cache is not None and self._ratio_cache[0] == key:
            return self._ratio_cache[1]
        cnt = self._rank_count
        ready = (cnt > 0) & ((cnt >= s.warmup_windows) | (window > s.warmup_windows))
        base = np.full(cnt.size, np.nan)
        sd = np.full(cnt.size, np.nan)
        if ready.any():
            x = self._ratio_samples[ready]
            with np.errstate(all="ignore"), warnings.catch_warnings():
                # nanmedian of an all-NaN row warns; that row's NaN is the answer here
                warnings.simplefilter("ignore", RuntimeWarning)
                med = np.nanmedian(x, axis=1)
                own = scoring.MAD_SCALE * np.nanmedian(np.abs(x - med[:, None]), axis=1)
                own = np.where(np.sum(np.isfinite(x), axis=1) >= 3, own, np.nan)
                pooled = np.nanmedian(own) if np.isfinite(own).any() else SIGMA_FLOOR
            base[ready] = med
            sd[ready] = np.fmax(np.fmax(own, pooled), SIGMA_FLOOR)
        self._ratio_cache = (key, (base, sd))
        return base, sd

    def _rank_findings(
        self,
        v: _View,
        sc: _RankScores,
        ctx: _Ctx,
        only: npt.NDArray[np.bool_] | None = None,
    ) -> tuple[list[Finding], npt.NDArray[np.bool_]]:
        """Advance the track of every bad or tracked rank (of `only`, where given);
        (findings, ranks held out of their baseline because they are bad or flagged)."""
        s = self.settings
        bad = sc.peer_bad | sc.hist_bad | sc.change_bad
        if only is not None:
            bad = bad & only
        todo = set(np.flatnonzero(bad).tolist())
        tracked = np.array(
            sorted({int(k[1]) for k in self._tracks if k[0] in RANK_KINDS}),
            dtype=np.int64,
        )
        if tracked.size:
            pos = np.minimum(np.searchsorted(v.r, tracked), v.r.size - 1)
            hit = pos[v.r[pos] == tracked]
            if only is not None:
                hit = hit[only[hit]]
            todo.update(hit.tolist())
        out: list[Finding] = []
        held = np.zeros(v.r.size, dtype=bool)
        for i in sorted(todo):
            kind = "rank" if sc.peers_ok[i] else "degraded"
            key = (kind, str(int(v.r[i])))
            if key not in self._tracks and not bad[i]:
                continue
            track = self._tracks.setdefault(key, _Track(s.flag_window))
            if kind == "rank":
                excess = max(0.0, float(v.actual[i] - sc.cost.loo_median[i]))
            else:
                excess = max(0.0, float(v.actual[i] - sc.base[i])) if sc.base[i] > 0 else 0.0
            if kind == "rank" and sc.change_bad[i] and not sc.peer_bad[i]:
                # slow against its own baseline but within its peers' spread: the
                # peers' median is not the cost, its own confirmed pace is
                excess = max(0.0, float(v.actual[i] * (1.0 - math.exp(-sc.shift[i]))))
            state = self._advance(track, ctx.window, bool(bad[i]), excess, ctx, rank=True)
            held[i] = track.active or bool(bad[i])
            if state is not None:
                out.append(self._rank_finding(kind, state, i, v, sc, excess, track, ctx))
            if track.idle:
                del self._tracks[key]
        return out, held

    def _feed_rank_baselines(
        self,
        window: int,
        v: _View,
        sc: _RankScores,
        held: npt.NDArray[np.bool_],
        only: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        # An unconfirmed regression never becomes a baseline: only healthy windows feed.
        s = self.settings
        feed = (window >= 1) & ~sc.peer_bad & ~sc.hist_bad & ~sc.change_bad & ~held
        if only is not None:
            feed &= only
        feed &= self._rank_count[v.r] < s.warmup_windows
        fr = v.r[feed]
        if fr.size:
            self._rank_samples[fr, self._rank_count[fr]] = v.gap[feed]
            with np.errstate(divide="ignore", invalid="ignore"):
                lr = np.log(sc.peers.ratio[feed])
            self._ratio_samples[fr, self._rank_count[fr]] = np.where(
                sc.peers_ok[feed] & np.isfinite(lr), lr, np.nan
            )
            self._rank_count[fr] += 1
            self._samples_version += 1

    def _rank_baseline(self, window: int) -> F64:
        s = self.settings
        # Baselines change only while warm-up samples are fed: reuse the medians
        # (a nanmedian over every rank was a third of a window's scoring).
        key = (self._samples_version, window > s.warmup_windows)
        if self._base_cache is not None and self._base_cache[0] == key:
            return self._base_cache[1]
        cnt = self._rank_count
        ready = (cnt > 0) & ((cnt >= s.warmup_windows) | (window > s.warmup_windows))
        out = np.full(cnt.size, np.nan)
        if ready.any():
            with np.errstate(all="ignore"):
                med = np.nanmedian(self._rank_samples[ready], axis=1)
            out[ready] = med
        self._base_cache = (key, out)
        return out

    def _advance(
        self, track: _Track, window: int, bad: bool, excess: float, ctx: _Ctx, rank: bool = False
    ) -> str | None:
        # the intermittent rule is for ranks (a GPU that comes and goes), not scalars
        state = track.observe(window, bad, self.settings, rank and self.settings.mode == "adaptive")
        hours = excess * ctx.hours_per_ms
        if state == "suspect":
            track.pending_hours += hours
        elif state == "flagged":
            # The streak's cost since `since` becomes real once confirmed.
            track.hours += track.pending_hours + hours
            self._gpu_hours += track.pending_hours + hours
            track.pending_hours = 0.0
        elif state == "ongoing":
            track.hours += hours
            self._gpu_hours += hours
        return state

    def _rank_finding(
        self,
        kind: str,
        state: str,
        i: int,
        v: _View,
        sc: _RankScores,
        excess: float,
        track: _Track,
        ctx: _Ctx,
    ) -> Finding:
        rank = int(v.r[i])
        cause: dict[str, Any] | None = None
        missing: list[str] = []
        if state != "cleared":
            # The slowdown the cause must explain: against its peers (whose clocks
            # are the reference), else its own pace; where the change test judged it,
            # the change from its own confirmed pace (a rank always 2% slow for
            # reasons its clock does not show keeps that offset out of it).
            slow = sc.peers.ratio[i] - 1.0 if kind == "rank" else sc.history[i] - 1.0
            if kind == "rank" and sc.change_bad[i]:
                slow = math.expm1(sc.shift[i])
            c = self._diagnose(kind, i, v, float(slow) if math.isfinite(slow) else None)
            cause, missing = c.to_json(), list(c.missing)
        evidence: dict[str, Any] = {
            "gpu_hours": track.pending_hours if state == "suspect" else track.hours,
            "gap_ms": float(v.gap[i]),
            "peers": int(sc.peers.group_size[i]) - 1,
        }
        samples = float(v.cols.floats("samples")[v.row[i]])
        if math.isfinite(samples):
            evidence["samples"] = int(samples)
        if kind == "rank":
            evidence["peers_gap_ms"] = _f(sc.peers.loo_median[i])
        else:
            evidence["baseline_gap_ms"] = _f(sc.base[i])
        if v.class_of[i] is not None:
            evidence["hw_class"] = v.class_of[i]
        basis = "peers"
        if self.settings.mode == "adaptive":
            if kind == "rank":
                pb, cb = bool(sc.peer_bad[i]), bool(sc.change_bad[i])
                basis = "both" if pb and cb else "history" if cb else "peers"
            if math.isfinite(sc.shift[i]):
                # the change test: shift from its own confirmed pace, in its own noise
                evidence["shift"] = round(float(math.expm1(sc.shift[i])), 4)
                evidence["noise"] = round(float(sc.noise[i]), 5)
                evidence["cusum"] = round(float(sc.cusum[i]), 2)
            evidence["intermittent"] = track.intermittent
        common: dict[str, Any] = {
            "job": self.job,
            "state": state,
            "window": ctx.window,
            "steps": ctx.steps,
            "rank": rank,
            "island": str(v.isl_labels[i]),
            "hosts": [] if self._host[rank] is None else [str(self._host[rank])],
            "since": track.since,
            "ratio": _f(sc.peers.ratio[i]),
            "history": _f(sc.history[i]),
            "excess_ms": excess,
            "loss_pct": _pct(excess, ctx.step_ms),
            "missing": missing,
            "evidence": evidence,
            "cause": cause,
        }
        if kind == "rank":
            return F.rank_finding(z=_f(sc.peers.z[i]), basis=basis, **common)
        return F.degraded_finding(**common)

    def _diagnose(self, kind: str, i: int, v: _View, slowdown: float | None) -> Any:
        """Why rank i is slow: its telemetry against its group's (rank) or island's (degraded)."""
        peers = np.flatnonzero(v.gid == v.gid[i] if kind == "rank" else v.isl_id == v.isl_id[i])
        peers = peers[peers != i]
        if peers.size > DIAG_PEERS:
            peers = peers[np.linspace(0, peers.size - 1, DIAG_PEERS).astype(np.int64)]
        own, *others = _telemetry(v.cols, [int(v.row[i]), *v.row[peers].tolist()])
        return diagnose(own, others, slowdown)

    # -- islands, collectives, links ------------------------------------------

    def _subject_step(
        self, kind: str, subject: str, value: float, ratio_limit: float, ctx: _Ctx
    ) -> tuple[str | None, float | None, float, _Track | None]:
        """Judge a scalar against its warm-up baseline: (state, ratio, excess, track)."""
        s = self.settings
        b = self._baselines.setdefault((kind, subject), _Baseline())
        ref = b.value(ctx.window, s)
        key = (kind, subject)
        if ref is None or not ref > 0:
            b.feed(ctx.window, value, s)
            return None, None, 0.0, None
        ratio = value / ref
        sd = b.log_sd(ref) if s.mode == "adaptive" else None
        if sd is not None:
            # A scalar that is noisy by nature (the transfer time of short windows:
            # a minimum of per-rank medians) gets a limit above its own spread; the
            # seed's ratio stays the floor, so this never flags more.
            ratio_limit = max(ratio_limit, math.exp(SCALAR_Z * sd))
        above = ratio >= ratio_limit
        bad = b.excursion(ctx.window, above) if s.mode == "adaptive" else above
        track = self._tracks.get(key)
        if track is None and not bad:
            if not above:  # (an excursion the tail rule let pass is no healthy sample)
                b.feed(ctx.window, value, s)
            return None, ratio, 0.0, None
        track = self._tracks.setdefault(key, _Track(s.flag_window))
        excess = max(0.0, value - ref)
        state = self._advance(track, ctx.window, bad, excess, ctx)
        if not above and not track.active:
            b.feed(ctx.window, value, s)
        if track.idle:
            del self._tracks[key]
        return state, ratio, excess, track

    def _scalar(
        self,
        kind: str,
        state: str,
        subject: str,
        members: npt.NDArray[np.bool_] | I64,
        v: _View,
        track: _Track,
        ctx: _Ctx,
        excess: float,
        **kw: Any,
    ) -> Finding:
        ranks = sorted(int(x) for x in v.r[members])
        hosts = sorted({str(h) for h in self._host[ranks] if h is not None}) if ranks else []
        ev = {"gpu_hours": track.pending_hours if state == "suspect" else track.hours}
        ev.update(kw.pop("evidence"))
        return F.scalar_finding(
            kind,
            job=self.job,
            state=state,
            window=ctx.window,
            steps=ctx.steps,
            subject=subject,
            ranks=ranks,
            hosts=hosts,
            since=track.since,
            excess_ms=excess,
            loss_pct=_pct(excess, ctx.step_ms),
            evidence=ev,
            **kw,
        )

    def _island_findings(self, ctx: _Ctx, v: _View, judge_transfer: bool = True) -> list[Finding]:
        """Island drift, and (`judge_transfer`) the island's transfer time (collective)."""
        s = self.settings
        out: list[Finding] = []
        n_isl = len(v.isl_names)
        gap, coll = v.actual, v.coll
        medians = np.array([np.median(gap[v.isl_id == k]) for k in range(n_isl)])
        maxgap = np.array([gap[v.isl_id == k].max() for k in range(n_isl)])
        drifts: dict[int, float] = {}
        # Islands on separate communicators meet at a bridge between their leaders;
        # every rank of an island waits inside a collective while its leader is on
        # the bridge (waiting for the other islands, then the transfer). That time
        # is the link's signal, not the island's transfer: it is taken off, so a
        # slow link is a `link` finding and not a `collective` one as well.
        bridge_of: dict[int, float] = {}
        bridge = v.bridge
        for i in v.leaders.tolist():
            k = int(v.isl_id[i])
            bridge_of[k] = min(bridge_of.get(k, math.inf), float(bridge[i]))
        bridged = len(bridge_of) > 1
        for k in range(n_isl):
            name = str(v.isl_names[k])
            members = v.isl_id == k
            state, drift, excess, track = self._subject_step(
                "island", name, float(medians[k]), s.drift_ratio, ctx
            )
            if drift is not None:
                drifts[k] = drift
            if state is not None and track is not None:
                ref = self._baselines[("island", name)].value(ctx.window, s)
                ev = {"median_gap_ms": float(medians[k]), "baseline_gap_ms": ref}
                out.append(
                    self._scalar(
                        "island",
                        state,
                        name,
                        members,
                        v,
                        track,
                        ctx,
                        excess,
                        drift=drift,
                        evidence=ev,
                    )
                )

            if not judge_transfer:
                continue
            # Transfer time of the island: the last rank to arrive waits least, so
            # its time in collectives is the transfer itself. Where other islands
            # share the communicator, a rank also waits for their slowest rank by
            # (their max gap - its gap); that wait is taken off first.
            others = np.delete(maxgap, k)
            wait = np.maximum(0.0, others.max() - gap[members]) if others.size else 0.0
            transfer = float(np.min(np.maximum(0.0, coll[members] - wait)))
            if bridged and k in bridge_of:
                transfer = max(0.0, transfer - bridge_of[k])
            state, cratio, excess, track = self._subject_step(
                "collective", name, transfer, s.collective_ratio, ctx
            )
            if state is not None and track is not None:
                ref = self._baselines[("collective", name)].value(ctx.window, s)
                ev = {"transfer_ms": transfer, "baseline_transfer_ms": ref}
                ev.update(_nic(v, members))
                out.append(
                    self._scalar(
                        "collective",
                        state,
                        name,
                        members,
                        v,
                        track,
                        ctx,
                        excess,
                        ratio=cratio,
                        evidence=ev,
                    )
                )
        # An island's drift against the others' drift, when there are others.
        for n, f in enumerate(out):
            if f.kind == "island":
                k = int(np.flatnonzero(v.isl_names == f.island)[0])
                rest = [d for j, d in drifts.items() if j != k]
                if rest and f.drift is not None:
                    out[n] = dataclasses.replace(f, ratio=f.drift / float(np.median(rest)))
        return out

    def _link_findings(self, ctx: _Ctx, v: _View) -> list[Finding]:
        s = self.settings
        rows = v.leaders
        if rows.size == 0:
            return []
        bridge = v.bridge
        peer = v.cols.floats("bridge_peer")[v.row]
        links: dict[str, list[int]] = {}
        for i in rows.tolist():
            p = peer[i]
            other = self._peer_island(None if math.isnan(p) else int(p))
            a, b = sorted((str(v.isl_labels[i]), other))
            links.setdefault(f"{a}<->{b}", []).append(i)
        out: list[Finding] = []
        for name in sorted(links):
            members = np.array(links[name], dtype=np.int64)
            # Like the collective signal: the leader that arrives last waits least.
            value = float(bridge[members].min())
            state, ratio, excess, track = self._subject_step("link", name, value, s.link_ratio, ctx)
            if state is not None and track is not None:
                ref = self._baselines[("link", name)].value(ctx.window, s)
                ev = {"bridge_ms": value, "baseline_bridge_ms": ref}
                ev.update(_nic(v, members))
                out.append(
                    self._scalar(
                        "link",
                        state,
                        name,
                        members,
                        v,
                        track,
                        ctx,
                        excess,
                        ratio=ratio,
                        evidence=ev,
                    )
                )
        return out

    def _peer_island(self, index: int | None) -> str:
        """Island name of a bridge peer index: config order, else order of lowest rank."""
        order = self._island_order
        if order is None:
            known = np.flatnonzero(~_none(self._island_of))
            first: dict[str, int] = {}
            for rk in known.tolist():
                first.setdefault(str(self._island_of[rk]), rk)
            order = sorted(first, key=lambda lab: first[lab])
        if index is not None and 0 <= index < len(order):
            return order[index]
        return f"island#{index}"


# --------------------------------------------------------------------------- helpers


def _factorize(labels: OBJ) -> tuple[OBJ, I64]:
    """Distinct labels (sorted) and each one's index, for a few distinct strings in
    many rows: a set and one comparison pass per label, where np.unique would sort
    every row's string."""
    if labels.size == 0:
        return labels[:0].copy(), np.zeros(0, dtype=np.int64)
    names = sorted(set(labels.tolist()))
    if len(names) > 64:
        uniq, inv = np.unique(labels, return_inverse=True)
        return uniq, inv.ravel().astype(np.int64)
    out: OBJ = np.empty(len(names), dtype=object)
    out[:] = names
    ids = np.zeros(labels.size, dtype=np.int64)
    for k, name in enumerate(names[1:], start=1):
        ids[labels == name] = k
    return out, ids


def _all_none(col: Any) -> bool:
    """A column that is absent in every row (identity checks only: cheap)."""
    return isinstance(col, list) and (not col or (col[0] is None and col.count(None) == len(col)))


def _none(a: OBJ) -> npt.NDArray[np.bool_]:
    """Elementwise `is None` of an object array. Truth is a cheap C call per element,
    a comparison with None a slow one: only the falsy ones ("" or None) are compared."""
    out = ~a.astype(bool)
    if out.any():
        out[out] = np.asarray(a[out] == None, dtype=bool)  # noqa: E711 - elementwise
    return out


def _objects(values: Any) -> OBJ:
    """A string column as an object array (None kept), without a per-row Python loop."""
    out: OBJ = np.empty(len(values), dtype=object)
    if (
        isinstance(values, list)
        and values
        and values[0] is None
        and values.count(None) == len(values)
    ):
        return out  # an absent column (no island, no class): already all None
    out[:] = values
    return out


_TEL_FIELDS = tuple(f.name for f in dataclass_fields(Telemetry))  # positional order


def _nic(v: _View, members: npt.NDArray[np.bool_] | I64) -> dict[str, Any]:
    """NIC port error counters of a link or collective finding's ranks (per finding,
    never per rank): the evidence that points at a port (diagnosis.nic_evidence)."""
    rows = v.row[members]
    cols = {n: v.cols.floats(f"tel_{n}")[rows] for n in NIC_FIELDS}
    have = np.zeros(rows.size, dtype=bool)
    for a in cols.values():
        have |= np.isfinite(a)
    if not have.any():
        return {}
    hosts = v.cols["host"]
    members_tel = [
        (
            str(hosts[int(rows[i])]),
            Telemetry(**{n: int(a[i]) for n, a in cols.items() if a[i] == a[i]}),
        )
        for i in np.flatnonzero(have).tolist()
    ]
    return nic_evidence(members_tel)


def _telemetry(cols: WindowColumns, rows: Sequence[int]) -> list[Telemetry]:
    """The telemetry of some rows as records, for diagnosis (per finding, never per
    rank): one fancy index per column, then one record per row."""
    idx = np.asarray(rows, dtype=np.intp)
    fields: dict[str, list[Any]] = {}
    for name, kind in TELEMETRY_COLUMNS.items():
        col = cols[f"tel_{name}"]
        if kind in ("of", "oi"):
            v: F64 = col[idx]
            conv = int if kind == "oi" else float
            fields[name] = [None if x != x else conv(x) for x in v.tolist()]  # NaN: absent
        elif kind == "m":
            fields[name] = [tuple(col[i]) for i in idx.tolist()]
        else:
            fields[name] = [col[i] for i in idx.tolist()]
    names = list(fields)
    return [
        Telemetry(**dict(zip(names, vals, strict=True)))
        for vals in zip(*fields.values(), strict=True)
    ]


def _pack(a: npt.NDArray[Any]) -> bytes:
    return np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()


def _unpack(b: bytes, dtype: Any) -> npt.NDArray[Any]:
    return np.frombuffer(b, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)


def _f(v: Any) -> float | None:
    x = float(v)
    return x if math.isfinite(x) else None


def _pct(excess: float, step_ms: float) -> float | None:
    return 100.0 * excess / step_ms if step_ms > 0 else None


def _order_sample(values: F64, gid: I64, weight: I64) -> tuple[I64, I64]:
    """A bounded sample of each group's order statistics: (indices, weights). A group
    of at most LATE_PEERS entries is kept whole; a larger one is cut, in order of
    value, into LATE_PEERS runs of about equal weight, and the middle entry of each
    run stands for the run (its weight: the run's)."""
    order = np.lexsort((values, gid))
    g = gid[order]
    w = weight[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    ends = np.r_[starts[1:], g.size]
    pick: list[I64] = []
    out_w: list[I64] = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if b - a <= LATE_PEERS:
            pick.append(order[a:b])
            out_w.append(w[a:b])
            continue
        cum = np.cumsum(w[a:b])
        total = int(cum[-1])
        # the run of each entry: by the cumulative weight reached at its middle
        run = np.minimum(
            ((cum - w[a:b] / 2) * LATE_PEERS // total).astype(np.int64), LATE_PEERS - 1
        )
        edges = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
        stop = np.r_[edges[1:], run.size]
        sums = np.add.reduceat(w[a:b], edges)
        mid = edges + (stop - edges - 1) // 2
        pick.append(order[a:b][mid])
        out_w.append(sums.astype(np.int64))
    return np.concatenate(pick), np.concatenate(out_w)


def _noise_sd(d: F64) -> float:
    """One window's noise sd from pooled changes of log gap (robust: a rank's real
    change, a stall starting, is an outlier among them)."""
    return scoring.MAD_SCALE * float(np.median(np.abs(d))) / math.sqrt(2.0)


def _per_sample_scale(samples: F64) -> F64 | None:
    """mean(samples) / samples per rank when every rank reported its samples and
    they differ (a rebalance plan is in force); None otherwise."""
    if samples.size == 0 or not (samples > 0).all() or samples.min() == samples.max():
        return None
    return np.asarray(samples.mean() / samples, dtype=np.float64)
