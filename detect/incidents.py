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

This module holds the book and its rules; one incident's life (the transition
table) is detect/incident_state.py, the confirm test detect/incident_confirm.py,
the record, verdict and rows it writes detect/incident_record.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from artemis.detect.findings import ACTIVE_STATES, BASELINE_KINDS, Finding
from artemis.detect.incident_confirm import (
    CONFIRM_Q1_SHARE,
    WindowView,
    not_shifted,
    peer_rows,
    quartile_check,
)
from artemis.detect.incident_record import (
    CHANGES,
    QUARTILE_KINDS,
    TELEMETRY_MEANS,
    VERDICTS,
    OnsetRows,
    job_row,
    judge,
    record,
    subject_row,
)
from artemis.detect.incident_state import (
    MARKERS,
    Incident,
    episode_key,
    incident_from_state,
    incident_state,
    num,
    rnd,
)
from artemis.detect.node_kind import cost_unit
from artemis.detect.state import IncidentBookState, plain, read

# The names this module gives its users (detect/monitor.py, baselines.py, the report).
__all__ = [
    "CHANGES",
    "CONFIRM_Q1_SHARE",
    "MARKERS",
    "QUARTILE_KINDS",
    "TELEMETRY_MEANS",
    "TELEMETRY_PEERS",
    "VERDICTS",
    "IncidentBook",
    "WindowView",
]

# Peers whose telemetry median is taken per window (an even sample beyond this).
TELEMETRY_PEERS = 256
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
    return episode_key(f.kind, f.subject)


class IncidentBook:
    """The open incidents of one job (one run of it) and the rules that move them."""

    def __init__(self, job: str, *, run: str = "", flag_window: int = 4) -> None:
        self.job = job
        self.run = run
        self.flag_window = max(1, int(flag_window))
        self._open: dict[tuple[str, str], Incident] = {}
        # Episodes dismissed while their finding goes on: ignored until it clears.
        self._ignored: set[tuple[str, str]] = set()
        self._out: list[Incident] = []  # changed since the last take(), in order
        self._rows: list[dict[str, Any]] = []
        self._gpus = 1
        self._unit = "gpu"  # cost.unit: the latest window's (detect/node_kind.py)
        self._window_steps = 0  # steps per window, learned from the columns
        self._last: tuple[int, float | None] = (-1, None)  # latest (window, time) seen
        # The confirm test in the suspect windows before a flag (the windows that flag
        # it): key -> [(window, passed)], kept for the last 2 x flag_window windows.
        self._pre: dict[tuple[str, str], list[tuple[int, bool]]] = {}
        self._onset = OnsetRows()  # the suspect windows' rows: the pace from onset

    # ------------------------------------------------------------------ queries

    def confirmed(self, kind: str, subject: str) -> bool:
        inc = self._open.get((kind, subject))
        return inc is not None and inc.confirmed is not None

    def allows(self, f: Finding) -> bool:
        """Whether the rebalance policy may see finding `f`: a flagged or ongoing line
        only when its incident is confirmed (issue 12: the policy acts only on
        confirmed incidents); every other line as it is."""
        if f.state not in ACTIVE_STATES:
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
        return [
            record(inc, self.job, self.run, self._gpus, None, self._unit)
            for inc in self._open.values()
        ]

    # ------------------------------------------------------------------ inputs

    def on_window(self, view: WindowView, findings: Iterable[Finding]) -> None:
        """One scored window's findings (all kinds), in the detector's order."""
        self._gpus = max(1, view.gpus)
        if view.cols.n:
            self._unit = cost_unit(view.cols)
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
        self._rows.append(job_row(self.job, self.run, view, slow))
        seen: set[tuple[str, str]] = set()
        for f in findings:
            key = _key(f)
            seen.add(key)
            self.on_finding(f, view)
        for key, inc in list(self._open.items()):
            if key not in seen:
                self._rows.append(subject_row(self.job, inc, view, None))
        self._onset.fill(view, seen)
        horizon = view.window - 2 * self.flag_window
        self._onset.trim(horizon)
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
            if view is not None and key not in self._open:
                self._onset.add(key, f, view)
            if f.kind in QUARTILE_KINDS and key not in self._open:
                check = quartile_check(f, view)
                if check is not None:
                    self._pre.setdefault(key, []).append((f.window, bool(check["passed"])))
            return
        if f.state == "cleared":
            self._ignored.discard(key)
            self._onset.drop(key)
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
            self._rows.extend(self._onset.take(key, self.job, inc))
        self._observe(inc, f, view)
        if view is not None:
            self._rows.append(subject_row(self.job, inc, view, f))
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
                    "type": "plan",
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
                a["throughput_before"] = rnd(ev.throughput_before, 3)
            if ev.throughput_after is not None:
                a["throughput_after"] = rnd(ev.throughput_after, 3)
            b, aft = a["throughput_before"], a["throughput_after"]
            if b and aft is not None:
                a["gain_pct"] = rnd((aft / b - 1.0) * 100.0, 2)
            inc.change("action")
            self._touch(inc)

    def on_corrections(self, entries: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Correction entries (rebalance/corrections.py), each into its open incident's
        `actions` by its id, replacing its previous state; markers as plans set them."""
        by_id = {inc.id: inc for inc in self._open.values()}
        w, t = self._last
        for incident, entry in entries:
            inc = by_id.get(incident)
            if inc is None:
                continue  # closed meanwhile: the shell puts the entry in its last record
            old = inc.actions.get(entry["id"], {}).get("status")
            inc.actions[entry["id"]] = dict(entry)
            if entry["status"] != old and entry["status"] in ("applied", "verified", "rolled_back"):
                inc.mark(entry["status"], w, t)
            inc.change("action")
            self._touch(inc)

    def close_all(
        self, window: int | None = None, time: float | None = None, no_plan: str = ""
    ) -> None:
        """The job ended: every open incident closes (`job_end`) with its verdict;
        ``no_plan``: why one without an action had no plan (`no_action`)."""
        w = self._last[0] if window is None else window
        t = self._last[1] if time is None else time
        for inc in list(self._open.values()):
            self._close(inc, w, t, "job_end", None, no_plan)
        self._ignored.clear()

    def take(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(changed records, per-window rows) since the last call; closed incidents
        leave the book here."""
        recs = []
        for inc in self._out:
            recs.append(record(inc, self.job, self.run, self._gpus, inc.changes, self._unit))
            inc.changes = []
        self._out = []
        rows, self._rows = self._rows, []
        return recs, rows

    # ------------------------------------------------------------------ rules

    def _touch(self, inc: Incident) -> None:
        if inc not in self._out:
            self._out.append(inc)

    def _open_incident(self, f: Finding, t: float | None) -> Incident:
        kind, subject = _key(f)
        run = f"-{self.run[:8]}" if self.run else ""
        ident = f"{self.job}-{_PREFIX[kind]}{subject}-w{f.window}{run}"
        ident = re.sub(r"[^A-Za-z0-9._-]+", "_", ident)
        inc = Incident(
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

    def _observe(self, inc: Incident, f: Finding, view: WindowView | None) -> None:
        """Fold one finding line into the episode's means."""
        if f.state != "cleared":
            inc.windows += 1
            inc.add("ratio", num(f.ratio))
            inc.add("excess_ms", num(f.excess_ms))
            inc.add("loss_pct", num(f.loss_pct))
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
                x = num(v)
                if x is not None:
                    inc.add(f"ev:{k}", x)
            if f.kind in QUARTILE_KINDS:
                inc.add("gap_ms", num(ev.get("gap_ms")))
                inc.add("peers_gap_ms", num(ev.get("peers_gap_ms") or ev.get("baseline_gap_ms")))
            elif f.kind in BASELINE_KINDS:
                # the class's median gap against its workload's stored baseline
                inc.add("gap_ms", num(ev.get("gap_q2_ms")))
                inc.add("peers_gap_ms", num(ev.get("baseline_gap_q2_ms")))
            if view is not None and f.kind in QUARTILE_KINDS and f.rank is not None:
                self._telemetry(inc, f, view)
        hours = num((f.evidence or {}).get("gpu_hours"))
        if hours is not None:
            inc.gpu_hours = hours  # the detector's running total of this finding

    def _telemetry(self, inc: Incident, f: Finding, view: WindowView) -> None:
        row, peers = self._rows_of(f, view)
        if row is None:
            return
        if peers.size > TELEMETRY_PEERS:
            # a bounded, evenly spread sample of the peers (as the diagnosis reads them)
            peers = peers[np.linspace(0, peers.size - 1, TELEMETRY_PEERS).astype(np.int64)]
        for name in TELEMETRY_MEANS:
            a = view.cols.floats(f"tel_{name}")
            inc.add(f"tel:{name}", num(a[row]))
            if peers.size:
                p = a[peers]
                p = p[np.isfinite(p)]
                if p.size:
                    inc.add(f"tel_peers:{name}", float(np.median(p)))

    def _rows_of(self, f: Finding, view: WindowView) -> tuple[int | None, np.ndarray]:
        """The subject's row in the window's columns and its peers' rows (incident_confirm)."""
        return peer_rows(f, view)

    def _try_confirm(self, inc: Incident, f: Finding, view: WindowView | None) -> None:
        t = view.time if view is not None else self._last[1]
        check = quartile_check(f, view)
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
                f"passed in {sum(inc.checks)} of {len(inc.checks)} windows): " + not_shifted(check)
            )
            self._ignored.add(_key(f))
            self._close(inc, f.window, t, "dismissed", view)

    def _confirm(self, inc: Incident, window: int, t: float | None, how: dict[str, Any]) -> None:
        inc.move("confirm", window, t, **how)
        inc.mark("confirmed", window, t)
        inc.change("confirmed")
        self._touch(inc)

    def _close(
        self,
        inc: Incident,
        window: int,
        t: float | None,
        why: str,
        view: WindowView | None,
        no_plan: str = "",
    ) -> None:
        inc.move(why, window, t)
        judge(inc, window, why, view, no_plan)
        inc.change("closed")
        self._touch(inc)
        self._open.pop(inc.key, None)

    # ------------------------------------------------------------------ state

    def state(self) -> IncidentBookState:
        return IncidentBookState(
            job=self.job,
            run=self.run,
            flag_window=self.flag_window,
            gpus=self._gpus,
            last=self._last,
            ignored=sorted(self._ignored),
            pre=[(k, sub, list(v)) for (k, sub), v in self._pre.items()],
            open=[incident_state(inc) for inc in self._open.values()],
        )

    def snapshot(self) -> dict[str, Any]:
        """The open incidents as plain data (msgpack-able)."""
        return plain(self.state())

    @classmethod
    def restore(
        cls, state: Mapping[str, Any] | IncidentBookState, *, flag_window: int | None = None
    ) -> IncidentBook:
        st = read(state, IncidentBookState)
        fw = flag_window if flag_window is not None else st.flag_window
        if fw is None:
            raise KeyError("flag_window")
        b = cls(st.job, run=st.run, flag_window=fw)
        b._gpus = st.gpus
        b._last = (-1, None) if st.last is None else st.last
        b._ignored = set(st.ignored)
        b._pre = {(k, sub): list(v) for k, sub, v in st.pre}
        for d in st.open:
            inc = incident_from_state(d)
            b._open[inc.key] = inc
        return b
