"""Incidents: one record per episode of a finding, from its flag to its clear or the job's end.

`IncidentBook` is the pure core (no clocks, files or sockets) that `JobMonitor`
owns, one per job. Each window it gets the window's findings, its plan events,
its columns and a wall time the shell passes in, and it returns every incident
record that changed (the whole record, docs/DESIGN.md "Incidents") and the
per-window rows that let a report redraw an incident's plots.

- An incident opens at a finding's `flagged` (a `suspect` that never flags
  makes none), follows its `ongoing` lines and closes at `cleared` or at the end
  of the job (`close_all`).
- Confirmation (detect/DETECTOR.md "Incidents: confirm before acting"): a
  `rank` incident is confirmed when the rank's lower quartile of per-step compute
  gap is above the median of its peers' (the other ranks of its island, of its
  class where classes split the island), in the flag window or any of the
  `flag_window` windows after it. Not confirmed by then, or cleared first: it is
  `dismissed`, with the numbers that say why. Kinds without per-rank quartiles
  (island, link, collective, hang, missing, and change and regression, whose flag
  already is the quartile rule against the stored baseline: detect/baselines.py)
  are confirmed by their flag.
- Only confirmed incidents reach the rebalance policy (`JobMonitor`).
- Closed incidents leave the book once their last record is out: memory is
  bounded by the incidents open at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from artemis.detect.escalation import escalation
from artemis.detect.findings import BASELINE_KINDS, Finding
from artemis.protocol.columns import WindowColumns

VERDICTS = ("recovered", "mitigated", "escalated", "unresolved", "dismissed")
CHANGES = ("opened", "confirmed", "action", "updated", "closed")
# The `change` a line names when several happened at once (its `changes` lists them all).
_PRIMARY = ("closed", "opened", "action", "confirmed", "updated")
MARKERS = ("onset", "flagged", "confirmed", "applied", "verified", "rolled_back", "cleared")
# The confirm rule (detect/DETECTOR.md "Incidents"): the lower quartile's shift
# against the peers' must be at least this share of the median's (and the lower
# quartile above the peers' median).
CONFIRM_Q1_SHARE = 0.5
# Kinds confirmed by the per-step gap quartiles; the others by their flag.
QUARTILE_KINDS = frozenset({"rank", "degraded"})
# Peers whose telemetry median is taken per window (an even sample beyond this).
TELEMETRY_PEERS = 256
# Telemetry whose episode means (rank vs its peers) go into `evidence.telemetry`.
TELEMETRY_MEANS = (
    "sm_mhz",
    "sm_mhz_max",
    "temp_c",
    "power_w",
    "power_limit_w",
    "pcie_gen",
    "pcie_gen_max",
    "pcie_width",
    "pcie_width_max",
    "cpu_pct",
    "steal_pct",
    "proc_cpu_pct",
    "gap_busy_pct",
)
_PREFIX = {
    "rank": "r",
    "degraded": "d",
    "island": "island-",
    "collective": "coll-",
    "link": "link-",
    "hang": "hang",
    "missing": "missing",
    "change": "change-",
    "regression": "regression-",
}
_CONFIRM_AT_FLAG = {
    "island": "flag: an island is judged against its own warm-up baseline; "
    "flag_after of flag_window slow windows confirm it",
    "collective": "flag: a collective time is judged against its warm-up baseline; "
    "flag_after of flag_window slow windows confirm it",
    "link": "flag: a bridge link is judged against its warm-up baseline; "
    "flag_after of flag_window slow windows confirm it",
    "hang": "flag: no progress past the hang bound, with the dumps",
    "missing": "flag: no window summary within the assembly deadline",
    "change": "flag: the class's gap quartiles shifted against the stored baseline of its "
    "workload (q1 with the median) in flag_after of flag_window windows",
    "regression": "flag: the class's gap quartiles shifted against the stored baseline of its "
    "workload (q1 with the median) in flag_after of flag_window windows",
}


def _key(f: Finding) -> tuple[str, str]:
    # One hang and one missing-ranks episode at a time per job: their subject (the
    # ranks) changes while they last.
    return (f.kind, "" if f.kind in ("hang", "missing") else f.subject)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    x = float(v)
    return x if math.isfinite(x) else None


def _r(v: float | None, digits: int = 3) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, digits)


class _Mean:
    """A running mean that ignores absent values."""

    __slots__ = ("n", "total")

    def __init__(self, total: float = 0.0, n: int = 0) -> None:
        self.total, self.n = total, n

    def add(self, v: float | None) -> None:
        if v is not None and math.isfinite(v):
            self.total += v
            self.n += 1

    @property
    def value(self) -> float | None:
        return self.total / self.n if self.n else None


@dataclass
class _Incident:
    id: str
    kind: str
    subject: str
    rank: int | None
    ranks: list[int]
    island: str | None
    hosts: list[str]
    opened: dict[str, Any]
    since: int | None
    confirmed: dict[str, Any] | None = None
    closed: dict[str, Any] | None = None
    cause: dict[str, Any] | None = None
    finding_evidence: dict[str, Any] | None = None
    means: dict[str, _Mean] = field(default_factory=dict)
    windows: int = 0
    gpu_hours: float | None = None
    actions: dict[str, dict[str, Any]] = field(default_factory=dict)
    markers: list[dict[str, Any]] = field(default_factory=list)
    wait_left: int = 0
    last_check: dict[str, Any] | None = None  # the latest confirm test that failed
    checks: list[bool] = field(default_factory=list)  # the confirm test, window by window
    verdict: str | None = None
    reason: str = ""
    recovery: dict[str, Any] | None = None
    changes: list[str] = field(default_factory=list)  # since the last record out

    def mean(self, name: str) -> float | None:
        m = self.means.get(name)
        return None if m is None else m.value

    def add(self, name: str, v: float | None) -> None:
        self.means.setdefault(name, _Mean()).add(v)

    def mark(self, marker: str, window: int | None, time: float | None) -> None:
        if window is None:
            return
        self.markers.append({"marker": marker, "window": int(window), "time": time})
        self.markers.sort(key=lambda m: (m["window"], MARKERS.index(m["marker"])))

    def change(self, what: str) -> None:
        if what not in self.changes:
            self.changes.append(what)


@dataclass
class WindowView:
    """What the book reads of one scored window: the columns and the detector's result."""

    window: int
    time: float | None
    cols: WindowColumns
    ranks: np.ndarray  # result.ranks (sorted)
    pace: np.ndarray  # result.pace_values, aligned on ranks
    islands: np.ndarray  # result.island_labels, aligned on ranks
    step_ms: float | None
    samples_per_s: float | None
    gpus: int
    # rows of each island (and class) in `cols`, found once per window
    peers: dict[tuple[int, str, str | None], np.ndarray] = field(default_factory=dict)


class IncidentBook:
    """The open incidents of one job (one run of it) and the rules that move them."""

    def __init__(self, job: str, *, run: str = "", flag_window: int = 4) -> None:
        self.job = job
        self.run = run
        self.flag_window = max(1, int(flag_window))
        self._open: dict[tuple[str, str], _Incident] = {}
        # Episodes dismissed while their finding goes on: ignored until it clears.
        self._ignored: set[tuple[str, str]] = set()
        self._out: list[_Incident] = []  # changed since the last take(), in order
        self._rows: list[dict[str, Any]] = []
        self._gpus = 1
        self._window_steps = 0  # steps per window, learned from the columns
        self._last: tuple[int, float | None] = (-1, None)  # latest (window, time) seen
        # The confirm test in the suspect windows before a flag (the windows that flag
        # it): key -> [(window, passed)], kept for the last 2 x flag_window windows.
        self._pre: dict[tuple[str, str], list[tuple[int, bool]]] = {}

    # ------------------------------------------------------------------ queries

    def confirmed(self, kind: str, subject: str) -> bool:
        inc = self._open.get((kind, subject))
        return inc is not None and inc.confirmed is not None

    def allows(self, f: Finding) -> bool:
        """Whether the rebalance policy may see finding `f`: a flagged or ongoing line
        only when its incident is confirmed (issue 12: the policy acts only on
        confirmed incidents); every other line as it is."""
        if f.state not in ("flagged", "ongoing"):
            return True
        inc = self._open.get(_key(f))
        return inc is not None and inc.confirmed is not None

    def open_ranks(self) -> set[int]:
        """The ranks of the open rank and degraded incidents."""
        return {
            int(i.rank)
            for i in self._open.values()
            if i.kind in QUARTILE_KINDS and i.rank is not None
        }

    def any_open(self) -> bool:
        """Whether an incident of any kind is open (a window then is not healthy)."""
        return bool(self._open)

    @property
    def open_incidents(self) -> list[dict[str, Any]]:
        return [self._record(inc, None) for inc in self._open.values()]

    # ------------------------------------------------------------------ inputs

    def on_window(self, view: WindowView, findings: Iterable[Finding]) -> None:
        """One scored window's findings (all kinds), in the detector's order."""
        self._gpus = max(1, view.gpus)
        self._last = (view.window, view.time)
        if view.cols.n:
            span = view.cols.ints("step_hi") - view.cols.ints("step_lo")
            self._window_steps = max(1, int(np.median(span)))
        findings = list(findings)
        # The bands are the peers': ranks this window finds slow (suspect on) or that an
        # open incident is about are left out, so a straggler does not lift its own band.
        slow = {
            int(f.rank)
            for f in findings
            if f.kind in QUARTILE_KINDS and f.rank is not None and f.state != "cleared"
        }
        slow.update(
            inc.rank
            for inc in self._open.values()
            if inc.kind in QUARTILE_KINDS and inc.rank is not None
        )
        self._job_row(view, slow)
        seen: set[tuple[str, str]] = set()
        for f in findings:
            key = _key(f)
            seen.add(key)
            self.on_finding(f, view)
        for key, inc in list(self._open.items()):
            if key not in seen:
                self._subject_row(inc, view, None)
        horizon = view.window - 2 * self.flag_window
        for key in list(self._pre):
            kept = [(w, ok) for w, ok in self._pre[key] if w > horizon]
            if kept:
                self._pre[key] = kept
            else:
                del self._pre[key]

    def on_finding(self, f: Finding, view: WindowView | None = None) -> None:
        """One finding line (a window's, or a hang reported from the tick)."""
        key = _key(f)
        window = f.window
        t = view.time if view is not None else self._last[1]
        if f.state == "suspect":
            if f.kind in QUARTILE_KINDS and key not in self._open:
                check = self._quartile_check(f, view)
                if check is not None:
                    self._pre.setdefault(key, []).append((f.window, bool(check["passed"])))
            return
        if f.state == "cleared":
            self._ignored.discard(key)
            inc = self._open.get(key)
            if inc is None:
                return
            self._observe(inc, f, view)
            inc.mark("cleared", window, t)
            self._close(inc, window, t, "cleared", view)
            return
        if key in self._ignored:
            return
        inc = self._open.get(key)
        if inc is None:
            inc = self._open_incident(f, t)
        self._observe(inc, f, view)
        if view is not None:
            self._subject_row(inc, view, f)
        if inc.confirmed is None:
            self._try_confirm(inc, f, view)

    def on_plans(self, events: Iterable[Any], window: int | None = None) -> None:
        """Plan events (rebalance/policy.PlanEvent): each joins the open incident of
        its rank, with its status history and measured throughput."""
        t = self._last[1]
        for ev in events:
            inc = self._open.get(("rank", str(ev.rank))) or self._open.get(
                ("degraded", str(ev.rank))
            )
            if inc is None:
                continue  # e.g. the restore of the uniform split after the incident closed
            w = int(ev.window if window is None else window)
            a = inc.actions.setdefault(
                ev.id,
                {
                    "plan": ev.id,
                    "status": ev.status,
                    "history": [],
                    "throughput_before": None,
                    "throughput_after": None,
                    "gain_pct": None,
                    "escalate": False,
                    "after": list(ev.after),
                },
            )
            last = a["history"][-1]["status"] if a["history"] else None
            if last != ev.status:
                a["history"].append({"status": ev.status, "window": w, "time": t})
                if ev.status == "applied" and ev.apply_at_step is not None:
                    # Acknowledged in window w, but the split changes at its step: the
                    # marker goes where the job's step time can move.
                    a["apply_at_step"] = int(ev.apply_at_step)
                    at = int(ev.apply_at_step) // self._window_steps if self._window_steps else w
                    inc.mark("applied", max(w, at), t)
                elif ev.status in ("applied", "verified", "rolled_back"):
                    inc.mark(ev.status, w, t)
            a["status"] = ev.status
            a["escalate"] = bool(ev.escalate) or a["escalate"]
            a["reason"] = ev.reason
            if ev.throughput_before is not None:
                a["throughput_before"] = _r(ev.throughput_before, 3)
            if ev.throughput_after is not None:
                a["throughput_after"] = _r(ev.throughput_after, 3)
            b, aft = a["throughput_before"], a["throughput_after"]
            if b and aft is not None:
                a["gain_pct"] = _r((aft / b - 1.0) * 100.0, 2)
            inc.change("action")
            self._touch(inc)

    def close_all(self, window: int | None = None, time: float | None = None) -> None:
        """The job ended: every open incident closes (`job_end`) with its verdict."""
        w = self._last[0] if window is None else window
        t = self._last[1] if time is None else time
        for inc in list(self._open.values()):
            self._close(inc, w, t, "job_end", None)
        self._ignored.clear()

    def take(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(changed records, per-window rows) since the last call; closed incidents
        leave the book here."""
        recs = []
        for inc in self._out:
            recs.append(self._record(inc, inc.changes))
            inc.changes = []
        self._out = []
        rows, self._rows = self._rows, []
        return recs, rows

    # ------------------------------------------------------------------ rules

    def _touch(self, inc: _Incident) -> None:
        if inc not in self._out:
            self._out.append(inc)

    def _open_incident(self, f: Finding, t: float | None) -> _Incident:
        kind, subject = _key(f)
        run = f"-{self.run[:8]}" if self.run else ""
        ident = f"{self.job}-{_PREFIX[kind]}{subject}-w{f.window}{run}"
        ident = re.sub(r"[^A-Za-z0-9._-]+", "_", ident)
        inc = _Incident(
            id=ident,
            kind=f.kind,
            subject=f.subject,
            rank=f.rank,
            ranks=list(f.ranks),
            island=f.island,
            hosts=list(f.hosts),
            opened={"window": f.window, "time": t},
            since=f.since,
            wait_left=self.flag_window,
        )
        inc.mark("onset", f.since if f.since is not None else f.window, None)
        inc.mark("flagged", f.window, t)
        if f.state == "ongoing":
            # the flag was seen by an earlier life of the coordinator (its state was not
            # restored): the episode is picked up where it stands
            inc.reason = "opened from an ongoing finding"
        self._open[(kind, subject)] = inc
        inc.change("opened")
        self._touch(inc)
        if kind not in QUARTILE_KINDS:
            self._confirm(inc, f.window, t, {"rule": _CONFIRM_AT_FLAG[kind]})
        return inc

    def _observe(self, inc: _Incident, f: Finding, view: WindowView | None) -> None:
        """Fold one finding line into the episode's means."""
        if f.state != "cleared":
            inc.windows += 1
            inc.add("ratio", _num(f.ratio))
            inc.add("excess_ms", _num(f.excess_ms))
            inc.add("loss_pct", _num(f.loss_pct))
            if f.ranks and f.kind not in ("hang", "missing"):
                inc.ranks = sorted(set(inc.ranks) | set(f.ranks))
            elif f.ranks:
                inc.ranks = list(f.ranks)
                inc.subject = f.subject
            inc.hosts = sorted(set(inc.hosts) | set(f.hosts))
            if f.cause is not None:
                old = (inc.cause or {}).get("kind")
                inc.cause = f.cause
                if old is not None and old != f.cause.get("kind"):
                    inc.change("updated")
                    self._touch(inc)
            ev = f.evidence or {}
            inc.finding_evidence = dict(ev)
            for k, v in ev.items():
                if k in ("gpu_hours", "gap_ms", "peers_gap_ms", "peers", "samples"):
                    continue
                x = _num(v)
                if x is not None:
                    inc.add(f"ev:{k}", x)
            if f.kind in QUARTILE_KINDS:
                inc.add("gap_ms", _num(ev.get("gap_ms")))
                inc.add("peers_gap_ms", _num(ev.get("peers_gap_ms") or ev.get("baseline_gap_ms")))
            elif f.kind in BASELINE_KINDS:
                # the class's median gap against its workload's stored baseline
                inc.add("gap_ms", _num(ev.get("gap_q2_ms")))
                inc.add("peers_gap_ms", _num(ev.get("baseline_gap_q2_ms")))
            if view is not None and f.kind in QUARTILE_KINDS and f.rank is not None:
                self._telemetry(inc, f, view)
        hours = _num((f.evidence or {}).get("gpu_hours"))
        if hours is not None:
            inc.gpu_hours = hours  # the detector's running total of this finding

    def _telemetry(self, inc: _Incident, f: Finding, view: WindowView) -> None:
        row, peers = self._rows_of(f, view)
        if row is None:
            return
        if peers.size > TELEMETRY_PEERS:
            # a bounded, evenly spread sample of the peers (as the diagnosis reads them)
            peers = peers[np.linspace(0, peers.size - 1, TELEMETRY_PEERS).astype(np.int64)]
        for name in TELEMETRY_MEANS:
            a = view.cols.floats(f"tel_{name}")
            inc.add(f"tel:{name}", _num(a[row]))
            if peers.size:
                p = a[peers]
                p = p[np.isfinite(p)]
                if p.size:
                    inc.add(f"tel_peers:{name}", float(np.median(p)))

    def _rows_of(self, f: Finding, view: WindowView) -> tuple[int | None, np.ndarray]:
        """The subject's row in the window's columns and its peers' rows: the other
        ranks of its island, and of its hardware class when the finding names one
        (the detector's scoring group, detect/DETECTOR.md)."""
        cols = view.cols
        ranks = cols.ints("rank")
        mine = np.flatnonzero(ranks == f.rank)
        if not mine.size:
            return None, np.zeros(0, dtype=np.int64)
        row = int(mine[-1])
        cls = (f.evidence or {}).get("hw_class")
        key = (view.window, str(f.island), None if cls is None else str(cls))
        cached = view.peers.get(key)
        if cached is not None:
            return row, cached[ranks[cached] != f.rank]
        # island labels per row as the detector assigned them (the result's, by rank):
        # arrays only, and once per island and window (this runs per finding)
        pos = np.minimum(np.searchsorted(view.ranks, ranks), max(view.ranks.size - 1, 0))
        known = view.ranks.size > 0
        ok = (view.ranks[pos] == ranks) if known else np.zeros(ranks.size, dtype=bool)
        labels = np.where(ok, view.islands[pos], None) if known else ok.astype(object)
        same = ok & (labels == f.island)
        if cls is not None:
            hw = np.asarray(cols["hw_class"], dtype=object)
            model = np.asarray(cols["tel_gpu_model"], dtype=object)
            hw = np.where(hw == np.array(None, dtype=object), model, hw)
            same &= hw == cls
        # the last row of each rank (a rank may report on two communicators)
        members = np.flatnonzero(same)
        # (more rows than usable ranks is the only way to have a rank twice: test cheaply)
        if (
            members.size
            and cols.n > view.ranks.size
            and np.unique(ranks[members]).size < members.size
        ):
            _, last = np.unique(ranks[members][::-1], return_index=True)
            members = np.sort(members[::-1][last])
        view.peers[key] = members
        mine_last = np.flatnonzero(ranks[members] == f.rank)
        if mine_last.size:
            row = int(members[mine_last[-1]])
        return row, members[ranks[members] != f.rank]

    def _try_confirm(self, inc: _Incident, f: Finding, view: WindowView | None) -> None:
        t = view.time if view is not None else self._last[1]
        check = self._quartile_check(f, view)
        if check is None:
            self._confirm(
                inc,
                f.window,
                t,
                {"rule": "flag: no per-step gap quartiles for this rank (an older agent)"},
            )
            return
        if not inc.checks:
            # the suspect windows of this streak count with the flag window
            since = f.since if f.since is not None else f.window
            inc.checks = [ok for w, ok in self._pre.pop(_key(f), []) if w >= since]
        inc.checks.append(bool(check["passed"]))
        # Confirmed when the test passes now and in at least half of the windows checked
        # (from the streak's first suspect window): one lucky window among stalls is
        # not a shifted distribution.
        if check["passed"] and 2 * sum(inc.checks) >= len(inc.checks):
            how = {k: v for k, v in check.items() if k != "passed"}
            how["windows_passed"] = f"{sum(inc.checks)}/{len(inc.checks)}"
            self._confirm(inc, f.window, t, how)
            return
        inc.last_check = check
        inc.wait_left -= 1
        if inc.wait_left <= 0:
            inc.reason = (
                f"not confirmed within {self.flag_window} windows of the flag (the test "
                f"passed in {sum(inc.checks)} of {len(inc.checks)} windows): "
                + self._not_shifted(check)
            )
            self._ignored.add(_key(f))
            self._close(inc, f.window, t, "dismissed", view)

    def _quartile_check(self, f: Finding, view: WindowView | None) -> dict[str, Any] | None:
        """The confirm test on this window (detect/DETECTOR.md "Incidents"): the
        subject's lower quartile of per-step gap must be shifted against its peers'
        lower quartiles (their median) by at least half as much as its median is
        against theirs, and above their median (`CONFIRM_Q1_SHARE`). A whole
        distribution that moved passes (every quantile moves together); a rank slowed
        by stalls in some of its steps does not (its median moves by the stall, its
        lower quartile by a fraction of its noise). Per sample where the ranks run
        different batch shares, as the detector judges them; a rank judged on its own
        history is compared against its own confirmed pace; one without peers
        (`degraded`) against its own warm-up baseline. None: nothing to test with."""
        if view is None or f.rank is None:
            return None
        row, peers = self._rows_of(f, view)
        if row is None:
            return None
        cols = view.cols
        q1 = float(cols.floats("gap_q1_ms")[row])
        q2 = float(cols.floats("gap_q2_ms")[row])
        if not math.isfinite(q1):
            return None
        if not math.isfinite(q2):
            q2 = float(cols.floats("gap_ms")[row])
        samples = cols.floats("samples")
        scale = samples if np.isfinite(samples).all() and (samples > 0).all() else None
        if scale is not None:
            # a rank under a plan does less work: compare per sample (as the detector does)
            k = float(np.median(scale))
            q1, q2 = q1 / scale[row] * k, q2 / scale[row] * k
        ev = f.evidence or {}
        if f.kind == "degraded" or not peers.size:
            base = _num(ev.get("baseline_gap_ms"))
            if base is None or not base > 0:
                return None
            ref1 = ref2 = base
            out: dict[str, Any] = {"rule": "q1_shift>=half_median_shift vs baseline"}
            out.update(q1_ms=_r(q1, 3), median_ms=_r(q2, 3), baseline_ms=_r(base, 3))
        else:
            p1 = cols.floats("gap_q1_ms")[peers]
            p2 = cols.floats("gap_q2_ms")[peers]
            p2 = np.where(np.isfinite(p2), p2, cols.floats("gap_ms")[peers])
            if scale is not None:
                k = float(np.median(scale))
                p1, p2 = p1 / scale[peers] * k, p2 / scale[peers] * k
            p1, p2 = p1[np.isfinite(p1)], p2[np.isfinite(p2)]
            if not p1.size or not p2.size:
                return None
            ref1, ref2 = float(np.median(p1)), float(np.median(p2))
            pace = 1.0
            shift = _num(ev.get("shift"))
            ratio = _num(f.ratio)
            if f.basis == "history" and shift is not None and ratio is not None and shift > -1:
                # judged against its own confirmed pace (a rank always a little off its
                # peers): the shift is measured from that pace
                pace = ratio / (1.0 + shift)
                ref1, ref2 = ref1 * pace, ref2 * pace
            out = {"rule": "q1>peers_median" if pace == 1.0 else "q1>peers_median*pace"}
            out.update(
                q1_ms=_r(q1, 3),
                median_ms=_r(q2, 3),
                peers_q1_ms=_r(ref1, 3),
                peers_median_ms=_r(ref2, 3),
                peers=int(p2.size),
            )
            if pace != 1.0:
                out["pace"] = _r(pace, 4)
        s1, s2 = q1 / ref1 - 1.0, q2 / ref2 - 1.0
        out["q1_shift"], out["median_shift"] = _r(s1, 4), _r(s2, 4)
        # like with like: the lower quartile against the peers' lower quartiles (a
        # step-length jitter every rank shares moves both alike)
        out["passed"] = bool(s2 > 0 and s1 >= CONFIRM_Q1_SHARE * s2)
        return out

    @staticmethod
    def _not_shifted(check: Mapping[str, Any]) -> str:
        ref = check.get("peers_median_ms", check.get("baseline_ms"))
        what = "its peers' median" if "peers_median_ms" in check else "its own baseline"
        s1, s2 = check.get("q1_shift") or 0.0, check.get("median_shift") or 0.0
        return (
            f"its lower quartile of per-step compute gap ({check.get('q1_ms')} ms, "
            f"{100 * s1:+.1f}%) did not move with its median ({check.get('median_ms')} ms, "
            f"{100 * s2:+.1f}%) against {what} ({ref} ms): a tail of long steps (stalls), "
            "not a slower rank"
        )

    def _confirm(self, inc: _Incident, window: int, t: float | None, how: dict[str, Any]) -> None:
        inc.confirmed = {"window": window, "time": t, **how}
        inc.mark("confirmed", window, t)
        inc.change("confirmed")
        self._touch(inc)

    def _close(
        self, inc: _Incident, window: int, t: float | None, why: str, view: WindowView | None
    ) -> None:
        inc.closed = {"window": window, "time": t, "why": why}
        if why == "dismissed":  # not confirmed within the wait, its finding going on
            inc.verdict = "dismissed"
        elif inc.confirmed is None:
            inc.verdict = "dismissed"
            check = inc.last_check
            head = "cleared" if why == "cleared" else "the job ended"
            inc.reason = f"{head} before it was confirmed" + (
                f": {self._not_shifted(check)}" if check is not None else ""
            )
        elif why == "cleared":
            inc.verdict = "recovered"
            ratio = inc.mean("ratio")
            rec: dict[str, Any] = {"window": window, "ratio_episode": _r(ratio, 4)}
            if view is not None:
                rec["samples_per_s"] = _r(view.samples_per_s, 3)
                if inc.kind in QUARTILE_KINDS and inc.rank is not None:
                    ok = view.ranks == inc.rank
                    if ok.any():
                        rec["ratio"] = _r(float(view.pace[ok][0]), 4)
            inc.recovery = rec
            after = ""
            if "ratio" in rec:
                after = f" (pace {rec['ratio']} vs {rec['ratio_episode']} over the episode)"
            inc.reason = f"cleared at window {window}{after}"
        else:
            verified = [a for a in inc.actions.values() if a["status"] == "verified"]
            failed = [a for a in inc.actions.values() if a["status"] == "rolled_back"]
            if verified and (verified[-1]["gain_pct"] or 0) > 0:
                a = verified[-1]
                inc.verdict = "mitigated"
                inc.reason = (
                    f"plan {a['plan']} in force: {a['throughput_before']} -> "
                    f"{a['throughput_after']} samples/s ({a['gain_pct']:+.1f}%); still slow "
                    "at the end of the job"
                )
            elif failed:
                a = failed[-1]
                inc.verdict = "escalated"
                inc.reason = (
                    f"plan {a['plan']} was rolled back ({a.get('reason', '')}): rebalancing "
                    "did not restore throughput, an engineer must act"
                )
            else:
                inc.verdict = "unresolved"
                inc.reason = "still slow at the end of the job" + (
                    ", no rebalancing action allowed" if not inc.actions else ""
                )
        inc.change("closed")
        self._touch(inc)
        self._open.pop((inc.kind, _k(inc)), None)

    # ------------------------------------------------------------------ rows

    def _job_row(self, view: WindowView, slow: set[int]) -> None:
        keep = np.isfinite(view.pace)
        if slow:
            keep &= ~np.isin(view.ranks, np.fromiter(slow, dtype=np.int64, count=len(slow)))
        p = view.pace[keep]
        q = np.quantile(p, (0.1, 0.5, 0.9)).tolist() if p.size else [None, None, None]
        self._rows.append(
            {
                "row": "job",
                "job": self.job,
                "run": self.run,
                "window": view.window,
                "time": view.time,
                "step_ms": _r(view.step_ms, 3),
                "samples_per_s": _r(view.samples_per_s, 3),
                "ratio_p10": _r(q[0], 4),
                "ratio_p50": _r(q[1], 4),
                "ratio_p90": _r(q[2], 4),
            }
        )

    def _subject_row(self, inc: _Incident, view: WindowView, f: Finding | None) -> None:
        ratio = gap = peers_gap = None
        if f is not None:
            ratio = _num(f.ratio)
            ev = f.evidence or {}
            if f.kind in QUARTILE_KINDS:
                gap = _num(ev.get("gap_ms"))
                peers_gap = _num(ev.get("peers_gap_ms") or ev.get("baseline_gap_ms"))
            else:
                for a, b in (
                    ("gap_q2_ms", "baseline_gap_q2_ms"),
                    ("median_gap_ms", "baseline_gap_ms"),
                    ("transfer_ms", "baseline_transfer_ms"),
                    ("bridge_ms", "baseline_bridge_ms"),
                ):
                    if a in ev:
                        gap, peers_gap = _num(ev.get(a)), _num(ev.get(b))
        if ratio is None and inc.rank is not None:
            ok = view.ranks == inc.rank
            if ok.any():
                ratio = _num(float(view.pace[ok][0]))
        self._rows.append(
            {
                "row": "subject",
                "incident": inc.id,
                "job": self.job,
                "window": view.window,
                "time": view.time,
                "ratio": _r(ratio, 4),
                "gap_ms": _r(gap, 3),
                "peers_gap_ms": _r(peers_gap, 3),
                "gpu_hours": _r(inc.gpu_hours, 6),
            }
        )

    # ------------------------------------------------------------------ records

    def _record(self, inc: _Incident, changes: Sequence[str] | None) -> dict[str, Any]:
        changes = list(changes or [])
        primary = next((c for c in _PRIMARY if c in changes), "updated")
        loss = inc.mean("loss_pct")
        hours = inc.gpu_hours
        if inc.kind == "hang" and hours is None:
            t0, t1 = inc.opened.get("time"), (inc.closed or {}).get("time")
            if t0 is not None and t1 is not None:
                hours = max(0.0, t1 - t0) / 3600.0 * self._gpus
        evidence: dict[str, Any] = {
            "windows": inc.windows,
            "gap_ms": _r(inc.mean("gap_ms")),
            "peers_gap_ms": _r(inc.mean("peers_gap_ms")),
            "ratio": _r(inc.mean("ratio"), 4),
        }
        tel = {}
        for name in TELEMETRY_MEANS:
            a, b = inc.mean(f"tel:{name}"), inc.mean(f"tel_peers:{name}")
            if a is not None or b is not None:
                tel[name] = {"rank": _r(a, 2), "peers": _r(b, 2)}
        evidence["telemetry"] = tel
        fmeans = {
            k[3:]: _r(m.value, 4)
            for k, m in inc.means.items()
            if k.startswith("ev:") and m.value is not None
        }
        if fmeans:
            evidence["finding"] = fmeans
        esc = None
        if inc.verdict != "dismissed":
            esc = escalation(
                inc.kind,
                inc.cause,
                evidence,
                rank=inc.rank,
                hosts=inc.hosts,
                subject=inc.subject,
                finding_evidence=inc.finding_evidence,
            )
        actions = [{k: v for k, v in act.items() if k != "after"} for act in inc.actions.values()]
        return {
            "id": inc.id,
            "job": self.job,
            "run": self.run,
            "kind": inc.kind,
            "subject": inc.subject,
            "rank": inc.rank,
            "ranks": list(inc.ranks),
            "island": inc.island,
            "hosts": list(inc.hosts),
            "change": primary,
            "changes": changes,
            "status": "closed" if inc.closed is not None else "open",
            "opened": dict(inc.opened),
            "confirmed": None if inc.confirmed is None else dict(inc.confirmed),
            "closed": None if inc.closed is None else dict(inc.closed),
            "since": inc.since,
            "cause": inc.cause,
            "evidence": evidence,
            "cost": {
                "excess_ms": _r(inc.mean("excess_ms")),
                "loss_pct": _r(loss),
                "gpu_hours": _r(hours, 6),
                "gpu_hours_per_day": None
                if loss is None
                else _r(loss / 100.0 * self._gpus * 24.0, 4),
            },
            "actions": actions,
            "escalation": esc,
            "verdict": inc.verdict,
            "reason": inc.reason,
            "recovery": inc.recovery,
            "markers": [dict(m) for m in inc.markers],
        }

    # ------------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        """The open incidents as plain data (msgpack-able)."""
        return {
            "job": self.job,
            "run": self.run,
            "flag_window": self.flag_window,
            "gpus": self._gpus,
            "last": list(self._last),
            "ignored": sorted([list(k) for k in self._ignored]),
            "pre": [[k, sub, [[w, ok] for w, ok in v]] for (k, sub), v in self._pre.items()],
            "open": [_inc_state(inc) for inc in self._open.values()],
        }

    @classmethod
    def restore(cls, state: Mapping[str, Any], *, flag_window: int | None = None) -> IncidentBook:
        b = cls(
            str(state["job"]),
            run=str(state.get("run", "")),
            flag_window=int(flag_window if flag_window is not None else state["flag_window"]),
        )
        b._gpus = int(state.get("gpus", 1))
        last = state.get("last") or [-1, None]
        b._last = (int(last[0]), last[1])
        b._ignored = {(str(k), str(s)) for k, s in state.get("ignored", [])}
        b._pre = {
            (str(k), str(sub)): [(int(w), bool(ok)) for w, ok in v]
            for k, sub, v in state.get("pre", [])
        }
        for d in state.get("open", []):
            inc = _inc_from_state(d)
            b._open[(inc.kind, _k(inc))] = inc
        return b


def _k(inc: _Incident) -> str:
    return "" if inc.kind in ("hang", "missing") else inc.subject


_PLAIN = (
    "id",
    "kind",
    "subject",
    "rank",
    "ranks",
    "island",
    "hosts",
    "opened",
    "since",
    "confirmed",
    "cause",
    "finding_evidence",
    "windows",
    "gpu_hours",
    "actions",
    "markers",
    "wait_left",
    "last_check",
    "checks",
    "reason",
)


def _inc_state(inc: _Incident) -> dict[str, Any]:
    d = {k: getattr(inc, k) for k in _PLAIN}
    d["means"] = {k: [m.total, m.n] for k, m in inc.means.items()}
    return d


def _inc_from_state(d: Mapping[str, Any]) -> _Incident:
    inc = _Incident(**{k: d[k] for k in _PLAIN if k in d})
    inc.means = {str(k): _Mean(float(v[0]), int(v[1])) for k, v in d.get("means", {}).items()}
    return inc
