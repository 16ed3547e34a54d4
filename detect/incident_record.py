"""What the incident book writes: each incident's record, its verdict, and the per-window rows.

The record is the whole incident as docs/DESIGN.md "Incidents" fixes its keys;
the rows (one per window for the job, one per window and open incident for its
subject) let a report redraw an incident's plots. Pure: builds plain data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from artemis.detect.escalation import escalation
from artemis.detect.findings import RANK_KINDS, Finding
from artemis.detect.incident_confirm import WindowView, not_shifted
from artemis.detect.incident_state import Incident, IncidentState, num, rnd
from artemis.detect.node_kind import COST_UNITS

VERDICTS = ("recovered", "mitigated", "escalated", "unresolved", "dismissed")
CHANGES = ("opened", "confirmed", "action", "updated", "closed")
# The `change` a line names when several happened at once (its `changes` lists them all).
_PRIMARY = ("closed", "opened", "action", "confirmed", "updated")
# Kinds confirmed by the per-step gap quartiles; the others by their flag.
QUARTILE_KINDS = frozenset(RANK_KINDS)
# Causes no correction may ever fix (heat is not a setting: rebalance/corrections.py
# never fits one): a job that ends with one of them unmitigated is escalated, not
# left "unresolved", so the check for a person is what the verdict points to (issue 29).
PERSON_CAUSES = frozenset(("thermal",))
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


def no_action(policy: Any) -> str:
    """Why an unresolved incident had no rebalancing action, as its reason says it: the
    job's policy (rebalance/policy.py; None: not made yet) is off, has no sample counts
    to split (the job reports none), or made no plan."""
    if policy is None or policy.mode == "off":
        return "no action: rebalancing is off"
    if policy.global_batch is None:
        return (
            "no action: rebalancing is on but the job reports no sample counts, which a "
            "plan splits (the job's rebalance client, job/README.md)"
        )
    return "no action: the rebalance policy made no plan for it"


def judge(
    inc: Incident,
    window: int,
    why: str,
    view: WindowView | None,
    no_plan: str = "",
) -> None:
    """The verdict and its reason for an incident just closed (by ``why``) at ``window``:
    docs/DESIGN.md "Incidents". ``no_plan``: why no plan (`no_action`), for one that
    ends unresolved at the job's end without an action."""
    if inc.state is IncidentState.DISMISSED:
        # (dismissed by the wait: the book wrote the reason, with its last test's numbers)
        if why != "dismissed":
            check = inc.last_check
            head = "cleared" if why == "cleared" else "the job ended"
            inc.reason = f"{head} before it was confirmed" + (
                f": {not_shifted(check)}" if check is not None else ""
            )
    elif why == "cleared":
        inc.verdict = "recovered"
        ratio = inc.mean("ratio")
        rec: dict[str, Any] = {"window": window, "ratio_episode": rnd(ratio, 4)}
        if view is not None:
            rec["samples_per_s"] = rnd(view.samples_per_s, 3)
            if inc.kind in QUARTILE_KINDS and inc.rank is not None:
                ok = view.ranks == inc.rank
                if ok.any():
                    rec["ratio"] = rnd(float(view.pace[ok][0]), 4)
        inc.recovery = rec
        after = ""
        if "ratio" in rec:
            after = f" (pace {rec['ratio']} vs {rec['ratio_episode']} over the episode)"
        fixed = [
            a
            for a in inc.actions.values()
            if a.get("type") == "correction" and a["status"] in ("verified", "applied")
        ]
        if fixed:
            after += f", after correction {fixed[-1]['action']} ({fixed[-1]['id']})"
        inc.reason = f"cleared at window {window}{after}"
    else:
        corr = [a for a in inc.actions.values() if a.get("type") == "correction"]
        plans = [a for a in inc.actions.values() if a.get("type") != "correction"]
        fixed = [a for a in corr if a["status"] == "verified"]
        verified = [a for a in plans if a["status"] == "verified"]
        undone = [a for a in corr if a["status"] in ("rolled_back", "failed")]
        failed = [a for a in plans if a["status"] == "rolled_back"]
        if fixed:
            a = fixed[-1]
            inc.verdict = "mitigated"
            inc.reason = (
                f"correction {a['action']} ({a['id']}) verified ({a.get('reason', '')}); "
                "still slow at the end of the job"
            )
        elif verified and (verified[-1]["gain_pct"] or 0) > 0:
            a = verified[-1]
            inc.verdict = "mitigated"
            inc.reason = (
                f"plan {a['plan']} in force: {a['throughput_before']} -> "
                f"{a['throughput_after']} samples/s ({a['gain_pct']:+.1f}%); still slow "
                "at the end of the job"
            )
        elif undone:
            a = undone[-1]
            inc.verdict = "escalated"
            inc.reason = (
                f"correction {a['action']} ({a['id']}) {a['status']} ({a.get('reason', '')}):"
                " an engineer must act"
            )
        elif failed:
            a = failed[-1]
            inc.verdict = "escalated"
            inc.reason = (
                f"plan {a['plan']} was rolled back ({a.get('reason', '')}): rebalancing "
                "did not restore throughput, an engineer must act"
            )
        elif (kind := (inc.cause or {}).get("kind")) in PERSON_CAUSES:
            inc.verdict = "escalated"
            inc.reason = (
                f"still slow at the end of the job; cause {kind}: no correction can be"
                " applied for it, an engineer must act (escalation.check)"
            )
        else:
            inc.verdict = "unresolved"
            inc.reason = "still slow at the end of the job" + (
                f", {no_plan or no_action(None)}" if not inc.actions else ""
            )


def stall_escalation(
    esc: dict[str, Any], inc: Incident, fmeans: dict[str, float | None]
) -> dict[str, Any]:
    """The check of an incident confirmed as recurring stalls (docs/DESIGN.md
    "Incidents"): the policy does not rebalance them (fewer samples do not shorten a
    fixed stall), so it escalates with the host check where the cause is the host,
    else with the input and host checks together."""
    who = f"rank {inc.rank}" + (f" on {', '.join(inc.hosts)}" if inc.hosts else "")
    mean, peers = fmeans.get("gap_mean_ms"), fmeans.get("peers_gap_mean_ms")
    cost = ""
    if mean is not None and peers is not None:
        cost = f" (mean per-step compute gap {mean:.1f} ms vs {peers:.1f} ms on its peers)"
    head = (
        f"recurring stalls on {who}{cost}: it makes its peers wait in a fraction of its "
        "steps, the rest on pace; not rebalanced, as fewer samples do not shorten a fixed "
        "stall. "
    )
    if esc.get("cause") == "host":
        return {"cause": "host", "check": head + str(esc.get("check") or "")}
    return {
        "cause": esc.get("cause"),
        "check": head
        + (
            "Check its input (the data loader's workers and prefetch, the storage or "
            "network filesystem it reads, that rank's data shard) and its host: what stops "
            "or preempts the process in some steps (a CPU quota and its throttling, a noisy "
            "neighbour, a scheduler that suspends it, long GC pauses)"
        ),
    }


def job_row(job: str, run: str, view: WindowView, slow: set[int]) -> dict[str, Any]:
    """The job's row of a window: its pace quantiles over the ranks not in ``slow``."""
    keep = np.isfinite(view.pace)
    if slow:
        keep &= ~np.isin(view.ranks, np.fromiter(slow, dtype=np.int64, count=len(slow)))
    p = view.pace[keep]
    q = np.quantile(p, (0.1, 0.5, 0.9)).tolist() if p.size else [None, None, None]
    return {
        "row": "job",
        "job": job,
        "run": run,
        "window": view.window,
        "time": view.time,
        "step_ms": rnd(view.step_ms, 3),
        "samples_per_s": rnd(view.samples_per_s, 3),
        "ratio_p10": rnd(q[0], 4),
        "ratio_p50": rnd(q[1], 4),
        "ratio_p90": rnd(q[2], 4),
    }


def _subject_values(view: WindowView, f: Finding | None, rank: int | None) -> dict[str, Any]:
    """A subject's window, time, ratio and gaps (from ``f``, its line; else its pace)."""
    ratio = gap = peers_gap = None
    if f is not None:
        ratio = num(f.ratio)
        ev = f.evidence or {}
        if f.kind in QUARTILE_KINDS:
            gap = num(ev.get("gap_ms"))
            peers_gap = num(ev.get("peers_gap_ms") or ev.get("baseline_gap_ms"))
        else:
            for a, b in (
                ("gap_q2_ms", "baseline_gap_q2_ms"),
                ("median_gap_ms", "baseline_gap_ms"),
                ("transfer_ms", "baseline_transfer_ms"),
                ("bridge_ms", "baseline_bridge_ms"),
            ):
                if a in ev:
                    gap, peers_gap = num(ev.get(a)), num(ev.get(b))
    if ratio is None and rank is not None:
        ok = view.ranks == rank
        if ok.any():
            ratio = num(float(view.pace[ok][0]))
    return {
        "window": view.window,
        "time": view.time,
        "ratio": rnd(ratio, 4),
        "gap_ms": rnd(gap, 3),
        "peers_gap_ms": rnd(peers_gap, 3),
    }


def subject_row(job: str, inc: Incident, view: WindowView, f: Finding | None) -> dict[str, Any]:
    """An incident's row of a window: its subject's ratio and gaps (from ``f``, its line)."""
    return {
        "row": "subject",
        "incident": inc.id,
        "job": job,
        **_subject_values(view, f, inc.rank),
        "gpu_hours": rnd(inc.gpu_hours, 6),
    }


class OnsetRows:
    """A subject's rows from its first suspect window, kept until its incident opens,
    so its pace is drawn from onset (the finding's `since`), not from the flag: its
    suspect windows' lines, and in a window of the streak without a line (the flag
    rule needs 3 suspect windows of 4) its pace from the window. Kept for 2 x
    `flag_window` windows (the book's trim); an episode that never opens leaves
    nothing. Not in the book's snapshot: a restart in a streak draws that incident
    from its flag."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._rank: dict[tuple[str, str], int | None] = {}

    def add(self, key: tuple[str, str], f: Finding, view: WindowView) -> None:
        self._rows.setdefault(key, []).append(_subject_values(view, f, f.rank))
        self._rank[key] = f.rank

    def fill(self, view: WindowView, seen: set[tuple[str, str]]) -> None:
        """The window's pace of each kept rank subject that had no line in it."""
        for key, rows in self._rows.items():
            rank = self._rank.get(key)
            if key not in seen and rank is not None and rows[-1]["window"] < view.window:
                rows.append(_subject_values(view, None, rank))

    def take(self, key: tuple[str, str], job: str, inc: Incident) -> list[dict[str, Any]]:
        """The rows of the opened incident's windows from its onset, before its flag
        (hours null: a suspect window's cost is not yet the incident's)."""
        lo = inc.since if inc.since is not None else window_of(inc.opened)
        flag = window_of(inc.opened)
        self._rank.pop(key, None)
        return [
            {"row": "subject", "incident": inc.id, "job": job, **v, "gpu_hours": None}
            for v in self._rows.pop(key, [])
            if lo is not None and flag is not None and lo <= v["window"] < flag
        ]

    def drop(self, key: tuple[str, str]) -> None:
        self._rows.pop(key, None)
        self._rank.pop(key, None)

    def trim(self, horizon: int) -> None:
        """Forget rows of windows at or before `horizon`."""
        for key in list(self._rows):
            kept = [v for v in self._rows[key] if v["window"] > horizon]
            if kept:
                self._rows[key] = kept
            else:
                self.drop(key)


def window_of(point: Any) -> int | None:
    w = (point or {}).get("window") if isinstance(point, dict) else None
    return int(w) if isinstance(w, int) else None


def record(
    inc: Incident,
    job: str,
    run: str,
    gpus: int,
    changes: Sequence[str] | None,
    unit: str = "gpu",
) -> dict[str, Any]:
    """The whole incident record (docs/DESIGN.md "Incidents"), naming ``changes``.
    ``unit`` is what the job's hours count (`cost.unit`, detect/node_kind.py)."""
    if unit not in COST_UNITS:
        raise ValueError(f"cost unit {unit!r} is not one of {', '.join(COST_UNITS)}")
    changes = list(changes or [])
    primary = next((c for c in _PRIMARY if c in changes), "updated")
    loss = inc.mean("loss_pct")
    hours = inc.gpu_hours
    if inc.kind == "hang" and hours is None:
        t0, t1 = inc.opened.get("time"), (inc.closed or {}).get("time")
        if t0 is not None and t1 is not None:
            hours = max(0.0, t1 - t0) / 3600.0 * gpus
    evidence: dict[str, Any] = {
        "windows": inc.windows,
        "gap_ms": rnd(inc.mean("gap_ms")),
        "peers_gap_ms": rnd(inc.mean("peers_gap_ms")),
        "ratio": rnd(inc.mean("ratio"), 4),
    }
    tel = {}
    for name in TELEMETRY_MEANS:
        a, b = inc.mean(f"tel:{name}"), inc.mean(f"tel_peers:{name}")
        if a is not None or b is not None:
            tel[name] = {"rank": rnd(a, 2), "peers": rnd(b, 2)}
    evidence["telemetry"] = tel
    fmeans = {
        k[3:]: rnd(m.value, 4)
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
            unit=unit,
        )
        if (inc.confirmed or {}).get("shape") == "stalls":
            esc = stall_escalation(esc, inc, fmeans)
    # A plan's `after` (its split) stays out of the record; a correction's is the state read.
    actions = [
        {k: v for k, v in act.items() if k != "after" or act.get("type") == "correction"}
        for act in inc.actions.values()
    ]
    return {
        "id": inc.id,
        "job": job,
        "run": run,
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
            "excess_ms": rnd(inc.mean("excess_ms")),
            "loss_pct": rnd(loss),
            "gpu_hours": rnd(hours, 6),
            "gpu_hours_per_day": None if loss is None else rnd(loss / 100.0 * gpus * 24.0, 4),
            "unit": unit,  # what the hours count: "gpu", or "cpu" for a CPU job
        },
        "actions": actions,
        "escalation": esc,
        "verdict": inc.verdict,
        "reason": inc.reason,
        "recovery": inc.recovery,
        "markers": [dict(m) for m in inc.markers],
    }
