"""An incident and its job in words: the headline numbers, the one-paragraph story,
and the number formats the page shares. Pure (report/README.md)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from html import escape
from typing import Any

from artemis.detect.findings import RANK_KINDS
from artemis.detect.node_kind import unit_hours


def fmt_num(v: Any, digits: int = 1, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        s = f"{v:,}"
    elif isinstance(v, float):
        s = f"{v:,.{digits}f}"
    else:
        return escape(str(v))
    return f"{s} {unit}".strip() if unit else s


def fmt_hours(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "—"
    if v == 0:
        return "0"
    if abs(v) < 0.01:
        return f"{v:.2g}"
    if abs(v) < 10:
        return f"{v:.2f}"
    return f"{v:,.1f}"


def fmt_when(t: Any) -> str:
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return ""
    return datetime.fromtimestamp(float(t), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def window_of(point: Any) -> int | None:
    if isinstance(point, Mapping):
        w = point.get("window")
        return int(w) if isinstance(w, (int, float)) and not isinstance(w, bool) else None
    return None


def fmt_signed(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "—"
    return f"{v:+.1f}%"


def subject_name(inc: Mapping[str, Any]) -> str:
    """How the page names an incident's subject: rank 2, ranks 2, 3, island amd, link a-b."""
    kind = inc.get("kind")
    ranks = inc.get("ranks") or []
    if kind in RANK_KINDS and inc.get("rank") is not None:
        return f"rank {inc['rank']}"
    if kind == "island":
        return f"island {inc.get('island') or inc.get('subject')}"
    if kind == "link":
        return f"link {inc.get('subject')}"
    if kind == "collective":
        return f"the collectives of island {inc.get('island') or inc.get('subject')}"
    if len(ranks) > 1:
        return "ranks " + ", ".join(str(r) for r in ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return str(inc.get("subject", "?"))


def job_unit(incidents: Sequence[Any]) -> str:
    """What the job's hours count, as the page words it: its incidents' `cost.unit`
    (GPU-hours unless every incident says `cpu`: a record before the unit is a GPU's)."""
    units = {
        unit_hours((inc.get("cost") or {}).get("unit"))
        for inc in incidents
        if isinstance(inc, Mapping)
    }
    return units.pop() if len(units) == 1 else unit_hours("gpu")


def _train_wall(
    rows: Sequence[Mapping[str, Any]], steps: Any, job: Mapping[str, Any]
) -> tuple[float | None, float | None]:
    """(training time, wall time) of the job's windows, in seconds.

    Training time: the job's own step times over its windows. Wall time: from the
    windows' scoring times. A window's time is when it was scored, after the job ran
    it, and windows come in bursts (the in-process detector's first poll, or an agent
    attaching, reads the backlog of the ring: a real 4-rank CPU job had its first 11
    windows scored within 70 ms, then one a second), so the span of the times falls
    short of the job's time, and the old estimate (span x n / (n - 1)) read 4 s of
    wall time for 12 s of training. Window k was scored at t_k after windows 0..k
    ran, so the job started at the latest at t_k less their training time: the wall
    time is at least max over k of (t_last - t_k + training of 0..k), which is never
    less than the training time and keeps any idle time between windows (an
    evaluation, a checkpoint) that the times show. Without step times the first
    window's length is the mean interval, as before."""
    ordered = sorted(
        (r for r in rows if isinstance(r.get("window"), (int, float))), key=lambda r: r["window"]
    )
    ms = [r.get("step_ms") for r in ordered]
    known = bool(ms) and isinstance(steps, int) and len(ordered) == len(rows)
    known = known and all(isinstance(v, (int, float)) for v in ms)
    train_s = (
        sum(float(v) for v in ms if isinstance(v, (int, float))) * steps / 1e3 if known else None
    )
    times = [float(r["time"]) for r in ordered if isinstance(r.get("time"), (int, float))]
    wall_s = None
    if times and train_s is not None:
        t_last, cum = max(times), 0.0
        for r in ordered:
            cum += float(r["step_ms"]) * steps / 1e3
            if isinstance(r.get("time"), (int, float)):
                wall_s = max(wall_s or 0.0, t_last - float(r["time"]) + cum)
    elif len(times) >= 2:
        wall_s = (max(times) - min(times)) * len(times) / (len(times) - 1)
    elif isinstance(job.get("first_seen"), (int, float)) and isinstance(
        job.get("last_time"), (int, float)
    ):
        wall_s = float(job["last_time"]) - float(job["first_seen"])
    return train_s, wall_s


def job_summary(bundle: Mapping[str, Any]) -> dict[str, Any]:
    """The job's headline numbers, from its record, its window rows and its incidents."""
    job = dict(bundle.get("job") or {})
    incidents = list(bundle.get("incidents") or [])
    rows = list(bundle.get("windows") or [])
    by_verdict: Counter[str] = Counter(
        (inc.get("verdict") or "open") for inc in incidents if isinstance(inc, Mapping)
    )
    lost = sum(
        float((inc.get("cost") or {}).get("gpu_hours") or 0.0)
        for inc in incidents
        if isinstance(inc, Mapping)
    )
    windows = [r["window"] for r in rows if isinstance(r.get("window"), int)]
    times = [r["time"] for r in rows if isinstance(r.get("time"), (int, float))]
    ranks = job.get("ranks")
    gpus = job.get("gpu_count") or ranks  # the coordinator's gpu_count setting, else a GPU a rank
    gpu_hours = job.get("gpu_hours")
    # The job's own time: its step times over its windows, the measure the incidents'
    # costs use (a simulator's wall clock runs faster); else the wall time.
    train_s, wall_s = _train_wall(rows, job.get("window_steps"), job)
    if gpu_hours is None and isinstance(gpus, int):
        t = train_s if train_s is not None else wall_s
        if t is not None:
            gpu_hours = gpus * t / 3600.0
    hosts = job.get("hosts")
    if isinstance(hosts, Sequence) and not isinstance(hosts, str):
        hosts = len(hosts)
    islands = job.get("islands")
    if isinstance(islands, Mapping):
        island_text = ", ".join(f"{k} ({v})" for k, v in islands.items())
        n_islands = len(islands)
    elif isinstance(islands, Sequence) and not isinstance(islands, str):
        names = list(dict.fromkeys(str(i) for i in islands))
        island_text = ", ".join(names)
        n_islands = len(names)
    else:
        # Not in the job's record: say which islands its incidents name, no count.
        n_islands = None
        named = sorted({str(i["island"]) for i in incidents if i.get("island")})
        island_text = ("not recorded; incidents name " + ", ".join(named)) if named else ""
    return {
        "job": job.get("job") or bundle.get("job_id") or "?",
        "run": job.get("run"),
        "ranks": ranks,
        "hosts": hosts,
        "islands": n_islands,
        "island_text": island_text,
        "windows": (min(windows), max(windows)) if windows else None,
        "started": min(times) if times else job.get("started"),
        "ended": max(times) if times else job.get("ended"),
        "wall_s": wall_s,
        "train_s": train_s,
        "gpu_hours": gpu_hours,
        "lost_gpu_hours": lost,
        "lost_pct": (100.0 * lost / gpu_hours) if gpu_hours else None,
        "hours_unit": job_unit(incidents),
        "incidents": len(incidents),
        "by_verdict": dict(by_verdict),
    }


def story(inc: Mapping[str, Any]) -> str:
    """The incident in one paragraph of plain text, every number from the record."""
    who = subject_name(inc)
    where = []
    if inc.get("island") and inc.get("kind") in RANK_KINDS:
        where.append(f"island {inc['island']}")
    hosts = inc.get("hosts") or []
    if hosts:
        where.append(("host " if len(hosts) == 1 else "hosts ") + ", ".join(hosts))
    marks = {m.get("marker"): m.get("window") for m in inc.get("markers") or []}
    ev = inc.get("evidence") or {}
    cost = inc.get("cost") or {}
    parts: list[str] = []
    onset = marks.get("onset")
    head = who[0].upper() + who[1:]
    if where:
        head += f" ({'; '.join(where)})"
    verb = {"hang": "hung", "missing": "stopped reporting"}.get(str(inc.get("kind")), "slowed")
    slow = f"{head} {verb}"
    if onset is not None:
        slow += f" {'at' if verb != 'slowed' else 'from'} window {onset}"
    ratio = ev.get("ratio")
    if isinstance(ratio, (int, float)) and ev.get("gap_ms") is not None:
        slow += (
            f": its compute gap ran {100 * (ratio - 1):.0f}% over its peers' "
            f"({fmt_num(ev.get('gap_ms'))} ms against {fmt_num(ev.get('peers_gap_ms'))} ms"
            f" over {ev.get('windows', '?')} windows)"
        )
    parts.append(slow + ".")
    if cost.get("excess_ms") is not None:
        parts.append(
            f"That cost {fmt_num(cost.get('excess_ms'))} ms a step, {fmt_num(cost.get('loss_pct'))}% "
            f"of the job's throughput."
        )
    opened = window_of(inc.get("opened"))
    conf = inc.get("confirmed")
    if opened is not None:
        s = f"Artemis flagged it at window {opened}"
        if isinstance(conf, Mapping) and conf.get("window") is not None:
            s += f" and confirmed it at window {conf['window']}"
            if conf.get("q1_ms") is not None:
                s += (
                    f" (its lower quartile {fmt_num(conf.get('q1_ms'))} ms above the peers' "
                    f"median {fmt_num(conf.get('peers_median_ms'))} ms: the whole distribution moved)"
                )
        elif inc.get("verdict") == "dismissed":
            s += " but never confirmed it"
        parts.append(s + ".")
    cause = inc.get("cause") or {}
    if cause.get("kind"):
        text = cause.get("text") or ""
        parts.append(f"Cause ({cause['kind']}): {text or 'no telemetry explains it'}.")
    for act in inc.get("actions") or []:
        if act.get("type") == "correction":
            parts.append(correction_text(act))
            continue
        hist = act.get("history") or []
        applied = next((h for h in hist if h.get("status") == "applied"), None)
        s = f"Plan {act.get('plan')}"
        if applied is not None:
            # the marker's window: where the split changes (apply_at_step), which can
            # be a window or two after the acknowledgement in the history
            at = next(
                (m.get("window") for m in inc.get("markers") or [] if m.get("marker") == "applied"),
                applied.get("window"),
            )
            s += f" was applied at window {at}"
        else:
            s += f" was {act.get('status')}"
        end = next((h for h in hist if h.get("status") in ("verified", "rolled_back")), None)
        if end is not None:
            s += (
                f" and {'verified' if end['status'] == 'verified' else 'rolled back'}"
                f" at window {end.get('window')}"
            )
        if act.get("throughput_before") is not None and act.get("throughput_after") is not None:
            s += (
                f": throughput {fmt_num(act['throughput_before'])} → "
                f"{fmt_num(act['throughput_after'])} samples/s ({fmt_signed(act.get('gain_pct'))})"
            )
        parts.append(s + ".")
    closed = inc.get("closed")
    if isinstance(closed, Mapping):
        if closed.get("why") == "cleared":
            parts.append(f"It cleared at window {closed.get('window')}.")
        else:
            parts.append(f"The job ended at window {closed.get('window')} with it still open.")
    if cost.get("gpu_hours") is not None:
        s = f"Over the episode it cost {fmt_hours(cost['gpu_hours'])} {unit_hours(cost.get('unit'))}"
        if cost.get("gpu_hours_per_day") is not None and inc.get("verdict") not in (
            "recovered",
            "dismissed",
        ):
            s += f" ({fmt_hours(cost['gpu_hours_per_day'])} a day if left unresolved)"
        parts.append(s + ".")
    verdict = inc.get("verdict") or "open"
    v = f"Verdict: {verdict}"
    if inc.get("reason"):
        v += f", {inc['reason']}"
    parts.append(v + ".")
    return " ".join(parts)


def correction_text(act: Mapping[str, Any]) -> str:
    """One correction entry in words: the action, where, its status and what it measured."""
    where = f"GPU {act.get('gpu')} of {act.get('host')}" if act.get("host") else "its GPU"
    s = f"Correction {act.get('action')} on {where} was {str(act.get('status')).replace('_', ' ')}"
    if act.get("gain_pct") is not None:
        s += f": throughput {fmt_signed(act.get('gain_pct'))}"
    if act.get("reason"):
        s += f" ({act['reason']})"
    return s + "."
