"""Baselines across jobs: a job against the stored baseline of its workload.

`BaselineBook` is the pure core (no files, sockets or clocks) that `JobMonitor`
owns, one per job. Per hardware class of the job it

- accumulates the distribution of step time and of per-rank compute gap over
  the job's confirmed healthy windows: after warm-up, with no finding line of
  any kind in the window and no incident open, matched by the stored baseline
  when there is one, and confirmed by `flag_window` more windows with none of
  that (a window just before a flag may be its onset). An unconfirmed
  regression never becomes a baseline;
- compares every window after warm-up with the baseline stored for (workload
  fingerprint, hardware class), the latest one whatever its software, with the
  matched-comparison rule of incident confirmation (detect/incidents.py,
  `CONFIRM_Q1_SHARE`): the class's lower quartile of per-step gap must move
  with its median, so stalls in some steps do not make a slower job;
- reports a difference in `flag_after` of the last `flag_window` windows as a
  `change` finding when the software fingerprint differs from the baseline's
  (`evidence.changed`: component -> [old, new]), else as `regression` with
  cause `unknown` (detect/findings.py).

The shell reads the store when the job's fingerprint is known (`wanted`, then
`settle`) and writes `records()` at the job's end (docs/DESIGN.md "The store"),
never on the scoring path. These findings never reach the rebalance policy: a
whole class slower has no faster rank to move work to.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from artemis.detect import findings as F
from artemis.detect.arrays import all_none, factorize, none_mask, objects
from artemis.detect.findings import Finding
from artemis.detect.fingerprint import diff, flatten
from artemis.detect.incidents import CONFIRM_Q1_SHARE
from artemis.detect.settings import Settings
from artemis.detect.state import (
    BaselineBookState,
    BaselineClassState,
    StatsRow,
    plain,
    read,
)
from artemis.protocol.columns import WindowColumns

# Per-window values a baseline keeps (the latest): about 40 B each, so a baseline
# row stays small however many jobs fed it.
MAX_WINDOWS = 256
MAX_JOBS = 16  # the latest jobs that fed a baseline, for the evidence
MAX_PENDING = 256  # windows waiting for their confirmation (or for the store read)
# The noise floor of the comparison: this many robust sd of the baseline's
# per-window log median gap (the windows of a job differ a little from each other).
NOISE_K = 4.0
DIST_KEYS = ("step_ms", "gap_q1_ms", "gap_q2_ms", "gap_p10_ms", "gap_p90_ms")
UNKNOWN_CLASS = "unknown"  # ranks that report no GPU class


def software_hash(software: Mapping[str, Any]) -> str:
    """The key of a software fingerprint in the store: its canonical JSON, hashed."""
    text = json.dumps(dict(software), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _f(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    x = float(v)
    return x if math.isfinite(x) else None


def _r(v: float | None, digits: int = 4) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, digits)


@dataclass(frozen=True)
class WindowStats:
    """One window of one hardware class: its job-level values (a few floats, whatever
    the job's size: pending and committed windows keep only these)."""

    window: int
    step_ms: float | None
    gap_q1_ms: float  # median over the class's ranks of their lower quartile of per-step gap
    gap_q2_ms: float  # median over the ranks of their median per-step gap
    gap_p10_ms: float  # the spread of the ranks' median gaps
    gap_p90_ms: float

    def values(self) -> list[float | None]:
        return [self.step_ms, self.gap_q1_ms, self.gap_q2_ms, self.gap_p10_ms, self.gap_p90_ms]


@dataclass
class ClassRows:
    """The rows of one class in a window's columns: who a finding names, found only
    when there is a finding (a pass over every row)."""

    cols: WindowColumns
    rows: np.ndarray  # the window's usable rows (every class)
    name: str
    single: bool  # the only class of the window: every row is its

    def _mine(self) -> np.ndarray:
        if self.single:
            return self.rows
        return self.rows[_classes(self.cols, self.rows) == self.name]

    def ranks(self) -> list[int]:
        return sorted(int(r) for r in self.cols.ints("rank")[self._mine()])

    def hosts(self) -> list[str]:
        h = self.cols["host"]
        return sorted({str(h[i]) for i in self._mine().tolist()})


# The class medians come from an even sample of at most this many rows: their
# error (about the ranks' spread / sqrt(SAMPLE)) is far below the change
# threshold, and a window costs the same at any size. A class of fewer than
# one in (rows / SAMPLE) consecutive ranks may go unsampled in a big job.
SAMPLE = 16384


def _classes(cols: WindowColumns, rows: np.ndarray) -> np.ndarray:
    """Each row's class: its `hw_class`, else its GPU model, else UNKNOWN_CLASS."""
    cls = objects(cols["hw_class"])[rows]
    unknown = none_mask(cls)
    if unknown.any():
        cls[unknown] = objects(cols["tel_gpu_model"])[rows[unknown]]
        unknown = none_mask(cls)
        cls[unknown] = UNKNOWN_CLASS
    return cls


def window_stats(
    window: int, cols: WindowColumns, step_ms: float | None, exclude: Iterable[int] = ()
) -> dict[str, tuple[WindowStats, ClassRows]]:
    """Per hardware class (a rank's `hw_class`, else its GPU model), the window's values,
    without the ranks in `exclude` (those a finding is about: a straggler does not move
    the class's medians). Per sample where the ranks run different batch shares, as the
    detector judges them. A rank reporting on two communicators counts once (its last
    row). From at most `SAMPLE` rows, evenly spread (bench/README.md "Baselines")."""
    if not cols.n:
        return {}
    ranks = cols.ints("rank")
    rows = np.arange(cols.n)
    if ranks.size and ranks.min() >= 0 and (np.bincount(ranks) > 1).any():
        _, last = np.unique(ranks[::-1], return_index=True)
        rows = np.sort(cols.n - 1 - last)
    ex = [int(r) for r in exclude]
    if ex:
        rows = rows[~np.isin(ranks[rows], np.asarray(ex, dtype=np.int64))]
    if not rows.size:
        return {}
    hw, model = cols["hw_class"], cols["tel_gpu_model"]
    single: str | None = None
    if all_none(hw) and all_none(model):
        single = UNKNOWN_CLASS
    elif _all_same(hw):  # one class in every row (the usual job): no pass per row
        single = str(hw[0])
    picked = rows
    if rows.size > SAMPLE:
        picked = rows[np.linspace(0, rows.size - 1, SAMPLE).astype(np.int64)]
    q1 = cols.floats("gap_q1_ms")[picked]
    q2 = cols.floats("gap_q2_ms")[picked]
    gap = cols.floats("gap_ms")[picked]
    q2 = np.where(np.isfinite(q2), q2, gap)
    samples = cols.floats("samples")[picked]
    if np.isfinite(samples).all() and (samples > 0).all():
        scale = samples.mean() / samples
        q1, q2, gap = q1 * scale, q2 * scale, gap * scale
    if single is not None:
        names, ids = np.array([single], dtype=object), np.zeros(picked.size, np.int64)
    else:
        names, ids = factorize(_classes(cols, picked))
    ok = np.isfinite(q1) & np.isfinite(q2) & (q2 > 0)
    one = len(names) == 1
    out: dict[str, tuple[WindowStats, ClassRows]] = {}
    for k, name in enumerate(names.tolist()):
        mine = ok if one else ok & (ids == k)
        if not mine.any():
            continue  # an older agent (no quartiles): nothing to compare like with like
        g = gap[mine]
        p10, p90 = np.quantile(g[np.isfinite(g)], (0.1, 0.9)).tolist()
        st = WindowStats(
            window=window,
            step_ms=step_ms if step_ms is not None and math.isfinite(step_ms) else None,
            gap_q1_ms=float(np.median(q1[mine])),
            gap_q2_ms=float(np.median(q2[mine])),
            gap_p10_ms=float(p10),
            gap_p90_ms=float(p90),
        )
        out[str(name)] = (st, ClassRows(cols, rows, str(name), single is not None))
    return out


def _all_same(col: object) -> bool:
    """A string column with one value, not None, in every row (a C-level count)."""
    return (
        isinstance(col, list) and bool(col) and col[0] is not None and col.count(col[0]) == len(col)
    )


@dataclass
class Baseline:
    """The distribution of one (workload, hardware class, software fingerprint): the
    latest `MAX_WINDOWS` healthy windows' values, and the jobs they came from."""

    workload: str
    hw_class: str
    software: dict[str, Any]
    software_hash: str
    dist: dict[str, list[float | None]] = field(default_factory=lambda: {k: [] for k in DIST_KEYS})
    windows: int = 0  # every window that ever fed it (the kept ones are the latest)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    updated: float | None = None

    def _median(self, key: str) -> float | None:
        v = np.array([x for x in self.dist.get(key, []) if x is not None], dtype=float)
        v = v[np.isfinite(v)]
        return float(np.median(v)) if v.size else None

    @property
    def step_ms(self) -> float | None:
        return self._median("step_ms")

    @property
    def gap_q1_ms(self) -> float | None:
        return self._median("gap_q1_ms")

    @property
    def gap_q2_ms(self) -> float | None:
        return self._median("gap_q2_ms")

    def noise(self) -> float:
        """The robust sd of its per-window log median gap (0 with fewer than 3)."""
        v = np.array([x for x in self.dist.get("gap_q2_ms", []) if x], dtype=float)
        v = v[np.isfinite(v) & (v > 0)]
        if v.size < 3:
            return 0.0
        lv = np.log(v)
        return float(1.4826 * np.median(np.abs(lv - np.median(lv))))

    def add(self, stats: Sequence[WindowStats], job: str, run: str) -> None:
        if not stats:
            return
        for s in stats:
            for k, x in zip(DIST_KEYS, s.values(), strict=True):
                self.dist.setdefault(k, []).append(x)
        for k in DIST_KEYS:
            self.dist[k] = self.dist[k][-MAX_WINDOWS:]
        self.windows += len(stats)
        ws = [s.window for s in stats]
        entry = next((j for j in self.jobs if j["job"] == job and j["run"] == run), None)
        if entry is None:
            entry = {"job": job, "run": run, "windows": 0, "first": min(ws), "last": max(ws)}
            self.jobs.append(entry)
        entry["windows"] += len(stats)
        entry["first"], entry["last"] = min(entry["first"], *ws), max(entry["last"], *ws)
        self.jobs = self.jobs[-MAX_JOBS:]

    def to_record(self) -> dict[str, Any]:
        """The store's shape (docs/DESIGN.md "The store"): the key, the reference values
        a listing shows, and the whole distribution."""
        return {
            "workload": self.workload,
            "hw_class": self.hw_class,
            "software_hash": self.software_hash,
            "software": dict(self.software),
            "windows": self.windows,
            "step_ms": _r(self.step_ms, 4),
            "gap_q1_ms": _r(self.gap_q1_ms, 4),
            "gap_q2_ms": _r(self.gap_q2_ms, 4),
            "dist": {k: [_r(x, 4) for x in v] for k, v in self.dist.items()},
            "jobs": [dict(j) for j in self.jobs],
            "updated": self.updated,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Baseline:
        dist = rec.get("dist") or {}
        return cls(
            workload=str(rec["workload"]),
            hw_class=str(rec["hw_class"]),
            software=dict(rec.get("software") or {}),
            software_hash=str(rec["software_hash"]),
            dist={k: [_f(x) for x in dist.get(k, [])] for k in DIST_KEYS},
            windows=int(rec.get("windows") or 0),
            jobs=[dict(j) for j in rec.get("jobs") or []],
            updated=_f(rec.get("updated")),
        )


@dataclass
class _Class:
    """One hardware class of the job: its comparison and its healthy windows."""

    settled: bool = False  # the store was read for it (with or without a baseline)
    baseline: Baseline | None = None  # the latest for (workload, class): what it is judged by
    own: Baseline | None = None  # the stored one of the job's own fingerprint: merged into
    changed: dict[str, list[Any]] = field(default_factory=dict)
    recent: list[bool] = field(default_factory=list)  # differs, the last flag_window windows
    streak: list[WindowStats] = field(default_factory=list)  # the differing ones in view
    state: str | None = None  # None | flagged | ongoing (an open finding)
    since: int | None = None
    healthy_run: int = 0  # windows in a row that matched, while open
    pending: list[tuple[WindowStats, bool]] = field(default_factory=list)  # (stats, judged)
    committed: list[WindowStats] = field(default_factory=list)
    last: WindowStats | None = None


class BaselineBook:
    """The job's classes against their stored baselines, and its healthy windows."""

    def __init__(self, job: str, settings: Settings, *, run: str = "") -> None:
        self.job = job
        self.run = run
        self.settings = settings
        self.workload: str | None = None
        self.software: dict[str, Any] | None = None
        self.classes: dict[str, _Class] = {}
        # Off where no store is kept (the shell says so: the in-process detector, a
        # coordinator with store = "off"): nothing to compare with or to write, so
        # the windows are not even summarised.
        self.enabled = True

    # ------------------------------------------------------------------ identity

    def identify(self, workload: str, software: Mapping[str, Any]) -> None:
        """The job's fingerprint (JobMonitor.fingerprint): a new one (a rank's software
        changed) starts the comparison over, with the store read again."""
        sw = dict(software)
        if workload == self.workload and sw == self.software:
            return
        known = self.workload is not None
        self.workload, self.software = workload, sw
        for c in self.classes.values():
            c.settled, c.baseline, c.own, c.changed = False, None, None, {}
            c.recent, c.streak = [], []
            if known:
                # windows of another fingerprint are not this one's baseline (the first
                # identity keeps the windows seen before it: they are judged when the
                # store answers)
                c.committed, c.pending = [], []

    @property
    def software_hash(self) -> str | None:
        return None if self.software is None else software_hash(self.software)

    def wanted(self) -> list[tuple[str, str]]:
        """(workload, class) pairs whose stored baseline the shell should read now."""
        if self.workload is None:
            return []
        return [(self.workload, k) for k, c in sorted(self.classes.items()) if not c.settled]

    def settle(
        self,
        hw_class: str,
        latest: Mapping[str, Any] | None,
        own: Mapping[str, Any] | None = None,
    ) -> None:
        """The store's answer for one class: `latest`, the newest baseline of (workload,
        class), what the job is judged by; `own`, the one of the job's own software
        fingerprint (merged with what this job adds), None when there is none."""
        c = self.classes.setdefault(hw_class, _Class())
        assert self.software is not None, "identify() first"
        c.settled = True
        c.baseline = Baseline.from_record(latest) if latest is not None else None
        c.own = Baseline.from_record(own) if own is not None else None
        c.changed = {}
        if c.baseline is not None and c.baseline.software_hash != self.software_hash:
            # detect/fingerprint.py: per component, env.NAME per variable
            c.changed = {k: list(v) for k, v in diff(c.baseline.software, self.software).items()}

    # ------------------------------------------------------------------ windows

    def on_window(
        self,
        window: int,
        cols: WindowColumns,
        step_ms: float | None,
        exclude: Iterable[int] = (),
    ) -> list[Finding]:
        """Judge one scored window against the baselines; the findings it makes."""
        out: list[Finding] = []
        if not self.enabled:
            return out
        steps = [int(cols.ints("step_lo").min()), int(cols.ints("step_hi").max())] if cols.n else []
        for name, (s, who) in window_stats(window, cols, step_ms, exclude).items():
            c = self.classes.setdefault(name, _Class())  # known from the first window on
            c.last = s
            if window <= self.settings.warmup_windows:
                continue  # window 0 is start-up, then the detector's own warm-up
            if not c.settled:
                c.pending.append((s, False))
                del c.pending[:-MAX_PENDING]
                continue
            # windows seen before the store answered are judged first, in order
            late = [self._judge(c, p) for p, judged in c.pending if not judged]
            c.pending = [] if any(late) else [(p, True) for p, _ in c.pending]
            differs = self._judge(c, s)
            # a differing window is not healthy, nor are the windows before it (its onset)
            c.pending = [] if differs else [*c.pending, (s, True)]
            f = self._finding(name, c, s, differs, steps, who)
            if f is not None:
                out.append(f)
        return out

    def after_window(self, window: int, healthy: bool) -> None:
        """Whether the window was healthy for the whole job (no finding line, no open
        incident, this book's included): its values wait `flag_window` windows for
        confirmation; an unhealthy window drops every one waiting."""
        for c in self.classes.values():
            if not healthy:
                c.pending = []
                continue
            keep: list[tuple[WindowStats, bool]] = []
            for s, judged in c.pending:
                if judged and window - s.window >= self.settings.flag_window:
                    c.committed.append(s)
                else:
                    keep.append((s, judged))
            c.pending = keep
            del c.committed[:-MAX_WINDOWS]

    def _judge(self, c: _Class, s: WindowStats) -> bool:
        """Whether `s` differs from the class's baseline (and the persistence window moves)."""
        b = c.baseline
        differs = False
        if b is not None:
            r1, r2 = b.gap_q1_ms, b.gap_q2_ms
            if r1 and r2:
                s1, s2 = s.gap_q1_ms / r1 - 1.0, s.gap_q2_ms / r2 - 1.0
                thr = max(self.settings.change_ratio - 1.0, math.expm1(NOISE_K * b.noise()))
                differs = bool(s2 > thr and s1 >= CONFIRM_Q1_SHARE * s2)
        c.recent.append(differs)
        del c.recent[: -self.settings.flag_window]
        if differs:
            c.streak.append(s)
        elif c.state is None and not any(c.recent):
            c.streak = []
        del c.streak[: -max(self.settings.flag_window, 64)]
        return differs

    def _finding(
        self,
        name: str,
        c: _Class,
        s: WindowStats,
        differs: bool,
        steps: list[int],
        who: ClassRows,
    ) -> Finding | None:
        st = self.settings
        if c.baseline is None:
            return None
        if c.state is None:
            if not differs:
                return None
            if sum(c.recent) >= st.flag_after:
                c.state = "flagged"
                c.since = c.streak[0].window if c.streak else s.window
                c.healthy_run = 0
                return self._make(name, c, s, "flagged", steps, who)
            return self._make(name, c, s, "suspect", steps, who)
        if differs:
            c.state, c.healthy_run = "ongoing", 0
            return self._make(name, c, s, "ongoing", steps, who)
        c.healthy_run += 1
        if c.healthy_run >= st.clear_after:
            f = self._make(name, c, s, "cleared", steps, who)
            c.state, c.since, c.streak, c.healthy_run = None, None, [], 0
            return f
        return self._make(name, c, s, "ongoing", steps, who)

    def _make(
        self,
        name: str,
        c: _Class,
        s: WindowStats,
        state: str,
        window_steps: list[int],
        who: ClassRows,
    ) -> Finding:
        b = c.baseline
        assert b is not None
        r1, r2, rstep = b.gap_q1_ms, b.gap_q2_ms, b.step_ms
        # how much slower: the job's step time over the differing windows in view
        steps = [x.step_ms for x in c.streak if x.step_ms is not None] or (
            [s.step_ms] if s.step_ms is not None else []
        )
        step = float(np.median(steps)) if steps else None
        slower = None if step is None or not rstep else (step / rstep - 1.0) * 100.0
        excess = None if step is None or rstep is None else step - rstep
        loss = None if excess is None or not step else max(0.0, excess) / step * 100.0
        w0 = s.window
        thr = max(self.settings.change_ratio - 1.0, math.expm1(NOISE_K * b.noise()))
        evidence: dict[str, Any] = {
            "hw_class": name,
            "workload": self.workload,
            "software": self.software_hash,
            "baseline": {
                "software": b.software_hash,
                "windows": b.windows,
                "jobs": [j["job"] for j in b.jobs[-4:]],
                "updated": b.updated,
            },
            "rule": "q1_shift>=half_median_shift vs baseline",
            "gap_q1_ms": _r(s.gap_q1_ms, 3),
            "gap_q2_ms": _r(s.gap_q2_ms, 3),
            "baseline_gap_q1_ms": _r(r1, 3),
            "baseline_gap_q2_ms": _r(r2, 3),
            "q1_shift": _r(s.gap_q1_ms / r1 - 1.0 if r1 else None, 4),
            "median_shift": _r(s.gap_q2_ms / r2 - 1.0 if r2 else None, 4),
            "threshold": _r(thr, 4),
            "step_ms": _r(step, 3),
            "baseline_step_ms": _r(rstep, 3),
            "slower_pct": _r(slower, 2),
            "windows_differing": f"{sum(c.recent)}/{len(c.recent)}",
        }
        kw: dict[str, Any] = {
            "job": self.job,
            "state": state,
            "window": w0,
            "steps": window_steps,
            "ranks": who.ranks(),
            "hosts": who.hosts(),
            "since": c.since if state != "suspect" else (c.streak[0].window if c.streak else w0),
            "ratio": _r(s.gap_q2_ms / r2 if r2 else None, 4),
            "drift": _r(None if step is None or not rstep else step / rstep, 4),
            "excess_ms": _r(excess, 3),
            "loss_pct": _r(loss, 3),
        }
        if c.changed:
            evidence["changed"] = {k: list(v) for k, v in c.changed.items()}
            return F.change_finding(**kw, evidence=evidence)
        evidence["checked"] = sorted(flatten(self.software or {}))
        return F.regression_finding(**kw, evidence=evidence)

    # ------------------------------------------------------------------ out

    def records(self, wall: float | None) -> list[dict[str, Any]]:
        """The baseline of the job's fingerprint per class, with this job's confirmed
        healthy windows added to the stored one (the store replaces it whole); none for
        a class without a confirmed window, nor for a job whose fingerprint is unknown."""
        if self.workload is None or self.software is None:
            return []
        h = software_hash(self.software)
        out = []
        for name, c in sorted(self.classes.items()):
            if not c.committed:
                continue
            own = c.own
            if own is None or own.software_hash != h:
                own = Baseline(self.workload, name, dict(self.software), h)
            mine = [s for s in c.committed if not _fed(own, self.job, self.run, s.window)]
            own.add(mine, self.job, self.run)
            own.updated = wall
            c.own, c.committed = own, []
            out.append(own.to_record())
        return out

    def any_open(self) -> bool:
        return any(c.state is not None for c in self.classes.values())

    # ------------------------------------------------------------------ state

    def state(self) -> BaselineBookState:
        return BaselineBookState(
            job=self.job,
            run=self.run,
            workload=self.workload,
            software=self.software,
            classes={k: _class_state(c) for k, c in self.classes.items()},
        )

    def snapshot(self) -> dict[str, Any]:
        return plain(self.state())

    @classmethod
    def restore(
        cls, state: Mapping[str, Any] | BaselineBookState, settings: Settings
    ) -> BaselineBook:
        st = read(state, BaselineBookState)
        b = cls(st.job, settings, run=st.run)
        b.workload = st.workload
        b.software = None if st.software is None else dict(st.software)
        b.classes = {k: _class_from(v) for k, v in (st.classes or {}).items()}
        return b


def _fed(b: Baseline, job: str, run: str, window: int) -> bool:
    """Whether `window` of this run already fed `b` (a restarted coordinator writes again)."""
    return any(
        j["job"] == job and j["run"] == run and j["first"] <= window <= j["last"] for j in b.jobs
    )


def _stats_state(s: WindowStats) -> StatsRow:
    return (s.window, s.step_ms, s.gap_q1_ms, s.gap_q2_ms, s.gap_p10_ms, s.gap_p90_ms)


def _stats_from(v: StatsRow) -> WindowStats:
    return WindowStats(
        window=v[0],
        step_ms=_f(v[1]),
        gap_q1_ms=v[2],
        gap_q2_ms=v[3],
        gap_p10_ms=v[4],
        gap_p90_ms=v[5],
    )


def _class_state(c: _Class) -> BaselineClassState:
    return BaselineClassState(
        settled=c.settled,
        baseline=None if c.baseline is None else c.baseline.to_record(),
        own=None if c.own is None else c.own.to_record(),
        changed=c.changed,
        recent=list(c.recent),
        streak=[_stats_state(s) for s in c.streak],
        state=c.state,
        since=c.since,
        healthy_run=c.healthy_run,
        pending=[(_stats_state(s), j) for s, j in c.pending],
        committed=[_stats_state(s) for s in c.committed],
    )


def _class_from(d: BaselineClassState) -> _Class:
    return _Class(
        settled=d.settled,
        baseline=None if d.baseline is None else Baseline.from_record(d.baseline),
        own=None if d.own is None else Baseline.from_record(d.own),
        changed=d.changed,
        recent=d.recent,
        streak=[_stats_from(s) for s in d.streak],
        state=d.state,
        since=d.since,
        healthy_run=d.healthy_run,
        pending=[(_stats_from(s), j) for s, j in d.pending],
        committed=[_stats_from(s) for s in d.committed],
    )
