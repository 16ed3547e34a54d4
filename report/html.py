"""render(bundle) -> one self-contained HTML page for one job's incidents. Pure.

The bundle is plain data (report/README.md "The bundle"): the job's summary,
its incident records and per-window rows as docs/DESIGN.md "Incidents
(coordinator -> world)" defines them, and the plans. No file, clock or network
here: the loaders (``artemis.report.load``) build the bundle, the shell writes
the page. The page has no script and no external reference; a Content Security
Policy forbids any, so a slip shows as a console error in the browser test.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from html import escape
from typing import Any

from artemis.detect.findings import RANK_KINDS

from . import svg

VERDICTS = ("recovered", "mitigated", "escalated", "unresolved", "dismissed", "open")
VERDICT_TEXT = {
    "recovered": "recovered: cleared, the recovery measured",
    "mitigated": "mitigated: a plan in force with a measured gain",
    "escalated": "escalated: an action did not restore throughput; needs an engineer",
    "unresolved": "unresolved: still slow at the end, no action allowed",
    "dismissed": "dismissed: cleared before it was confirmed",
    "open": "open: the episode is still going on",
}
MARKER_TEXT = {
    "onset": "onset",
    "flagged": "flagged",
    "confirmed": "confirmed",
    "applied": "plan applied",
    "verified": "verified",
    "rolled_back": "rolled back",
    "cleared": "cleared",
}
# Telemetry names in evidence.telemetry and the finding's cause.evidence, and how to show them.
METRICS = {
    "sm_mhz": ("SM clock", "MHz"),
    "sm_mhz_max": ("SM clock, max", "MHz"),
    "mem_mhz": ("memory clock", "MHz"),
    "temp_c": ("GPU temperature", "°C"),
    "power_w": ("power draw", "W"),
    "power_limit_w": ("power limit", "W"),
    "power_frac": ("power / board limit", ""),
    "util_pct": ("GPU utilisation", "%"),
    "pcie_gen": ("PCIe generation", ""),
    "pcie_gen_max": ("PCIe generation, max", ""),
    "pcie_width": ("PCIe width", "lanes"),
    "pcie_width_max": ("PCIe width, max", "lanes"),
    "pcie_degraded": ("PCIe degraded", ""),
    "cpu_pct": ("host CPU busy", "%"),
    "steal_pct": ("host CPU steal", "%"),
    "proc_cpu_pct": ("rank's process CPU", "%"),
    "gap_busy_pct": ("GPU busy in the gap", "%"),
    "nic_xmit_wait": ("NIC xmit wait", ""),
}
# A telemetry bar is drawn for a metric this far (percent) from its peers' value.
BAR_MIN_PCT = 0.5
# Past this many windows on one axis a series is summarised per bucket (bands
# keep their extremes), so a page stays bounded for any episode length.
MAX_POINTS = 1200
CSS = """
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif;
       color: #222; background: #fff; margin: 0; line-height: 1.45; font-size: 14px; }
main { max-width: 960px; margin: 0 auto; padding: 24px 20px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 28px 0 6px; border-bottom: 2px solid #222; padding-bottom: 3px; }
h3 { font-size: 14px; margin: 16px 0 4px; text-transform: uppercase; letter-spacing: .04em; color: #444; }
.meta { color: #666; font-size: 12px; margin: 0 0 16px; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 13px; }
th, td { padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
th { color: #555; font-weight: 600; border-bottom: 1px solid #ccc; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.summary td { padding-right: 24px; }
.verdict { display: inline-block; padding: 1px 8px; border-radius: 3px; font-size: 12px;
           font-weight: 600; color: #fff; background: #666; }
.v-recovered { background: #27ae60; } .v-mitigated { background: #16a085; }
.v-escalated { background: #c0392b; } .v-unresolved { background: #d35400; }
.v-dismissed { background: #7f8c8d; } .v-open { background: #2c6fbb; }
.story { font-size: 15px; margin: 8px 0 10px; }
.check { border-left: 4px solid #d35400; background: #fdf3ea; padding: 8px 12px; margin: 6px 0; }
.note { color: #777; font-size: 12px; }
.incident { break-before: page; }
.incident:first-of-type { break-before: auto; }
svg.plot { display: block; max-width: 100%; height: auto; margin: 4px 0 8px; }
figure { margin: 0; break-inside: avoid; }
section.part { break-inside: avoid; }
@media print { main { max-width: none; padding: 0; } body { font-size: 12px; } }
"""


def anchor(s: str) -> str:
    """An incident id as an HTML id and URL fragment (``#incident-<anchor>``)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", s).strip("-") or "x"


_slug = anchor


def _num(v: Any, digits: int = 1, unit: str = "") -> str:
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


def _hours(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "—"
    if v == 0:
        return "0"
    if abs(v) < 0.01:
        return f"{v:.2g}"
    if abs(v) < 10:
        return f"{v:.2f}"
    return f"{v:,.1f}"


def _when(t: Any) -> str:
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return ""
    return datetime.fromtimestamp(float(t), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _win(point: Any) -> int | None:
    if isinstance(point, Mapping):
        w = point.get("window")
        return int(w) if isinstance(w, (int, float)) and not isinstance(w, bool) else None
    return None


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
    wall_s = None
    if len(times) >= 2:
        # The rows are window ends: n windows span n intervals, the first one's length
        # estimated as the mean interval.
        span = max(times) - min(times)
        wall_s = span * len(times) / (len(times) - 1)
    elif isinstance(job.get("first_seen"), (int, float)) and isinstance(
        job.get("last_time"), (int, float)
    ):
        wall_s = float(job["last_time"]) - float(job["first_seen"])
    # The job's own time: its step times over its windows, the measure the incidents'
    # costs use (a simulator's wall clock runs faster); else the wall time.
    steps = job.get("window_steps")
    step_ms = [float(r["step_ms"]) for r in rows if isinstance(r.get("step_ms"), (int, float))]
    train_s = None
    if isinstance(steps, int) and step_ms and len(step_ms) == len(rows):
        train_s = sum(step_ms) * steps / 1000.0
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
            f"({_num(ev.get('gap_ms'))} ms against {_num(ev.get('peers_gap_ms'))} ms"
            f" over {ev.get('windows', '?')} windows)"
        )
    parts.append(slow + ".")
    if cost.get("excess_ms") is not None:
        parts.append(
            f"That cost {_num(cost.get('excess_ms'))} ms a step, {_num(cost.get('loss_pct'))}% "
            f"of the job's throughput."
        )
    opened = _win(inc.get("opened"))
    conf = inc.get("confirmed")
    if opened is not None:
        s = f"Artemis flagged it at window {opened}"
        if isinstance(conf, Mapping) and conf.get("window") is not None:
            s += f" and confirmed it at window {conf['window']}"
            if conf.get("q1_ms") is not None:
                s += (
                    f" (its lower quartile {_num(conf.get('q1_ms'))} ms above the peers' "
                    f"median {_num(conf.get('peers_median_ms'))} ms: the whole distribution moved)"
                )
        elif inc.get("verdict") == "dismissed":
            s += " but never confirmed it"
        parts.append(s + ".")
    cause = inc.get("cause") or {}
    if cause.get("kind"):
        text = cause.get("text") or ""
        parts.append(f"Cause ({cause['kind']}): {text or 'no telemetry explains it'}.")
    for act in inc.get("actions") or []:
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
                f": throughput {_num(act['throughput_before'])} → "
                f"{_num(act['throughput_after'])} samples/s ({_signed(act.get('gain_pct'))})"
            )
        parts.append(s + ".")
    closed = inc.get("closed")
    if isinstance(closed, Mapping):
        if closed.get("why") == "cleared":
            parts.append(f"It cleared at window {closed.get('window')}.")
        else:
            parts.append(f"The job ended at window {closed.get('window')} with it still open.")
    if cost.get("gpu_hours") is not None:
        s = f"Over the episode it cost {_hours(cost['gpu_hours'])} GPU-hours"
        if cost.get("gpu_hours_per_day") is not None and inc.get("verdict") not in (
            "recovered",
            "dismissed",
        ):
            s += f" ({_hours(cost['gpu_hours_per_day'])} a day if left unresolved)"
        parts.append(s + ".")
    verdict = inc.get("verdict") or "open"
    v = f"Verdict: {verdict}"
    if inc.get("reason"):
        v += f", {inc['reason']}"
    parts.append(v + ".")
    return " ".join(parts)


def _signed(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "—"
    return f"{v:+.1f}%"


def _x_range(inc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """The windows an incident's plots show: its markers with context on both sides."""
    ws = [m.get("window") for m in inc.get("markers") or []]
    ws += [_win(inc.get(k)) for k in ("opened", "closed")]
    ws2 = [int(w) for w in ws if isinstance(w, (int, float))]
    have = [int(r["window"]) for r in rows if isinstance(r.get("window"), (int, float))]
    if not ws2:
        ws2 = have or [0]
    lo, hi = min(ws2), max(ws2)
    pad = max(4, (hi - lo) // 4)
    lo, hi = lo - pad, hi + pad
    if have:
        lo, hi = max(lo, min(have)), min(hi, max(have))
    if hi <= lo:
        hi = lo + 1
    return lo, hi


def _decimate_rows(
    rows: Sequence[Mapping[str, Any]],
    keys_min: Sequence[str],
    keys_max: Sequence[str],
    keys_mid: Sequence[str],
) -> list[dict[str, Any]]:
    """At most MAX_POINTS rows: per bucket the window of its middle, extremes for band edges."""
    if len(rows) <= MAX_POINTS:
        return [dict(r) for r in rows]
    k = math.ceil(len(rows) / MAX_POINTS)
    out: list[dict[str, Any]] = []
    for i in range(0, len(rows), k):
        chunk = rows[i : i + k]
        row: dict[str, Any] = {"window": chunk[len(chunk) // 2]["window"]}
        for keys, fn in ((keys_min, min), (keys_max, max), (keys_mid, statistics.median)):
            for key in keys:
                vals = [r.get(key) for r in chunk]
                fin = [float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
                row[key] = fn(fin) if fin else None
        out.append(row)
    return out


def _markers(inc: Mapping[str, Any]) -> list[svg.Marker]:
    out = []
    for m in inc.get("markers") or []:
        kind = str(m.get("marker"))
        w = m.get("window")
        if isinstance(w, (int, float)):
            out.append(svg.Marker(kind, float(w), f"{MARKER_TEXT.get(kind, kind)} {w}"))
    return out


def _in(rows: Sequence[Mapping[str, Any]], lo: int, hi: int) -> list[Mapping[str, Any]]:
    return sorted(
        (r for r in rows if isinstance(r.get("window"), (int, float)) and lo <= r["window"] <= hi),
        key=lambda r: r["window"],
    )


def _col(rows: Sequence[Mapping[str, Any]], key: str) -> list[float | None]:
    out: list[float | None] = []
    for r in rows:
        v = r.get(key)
        out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
    return out


def pace_title(inc: Mapping[str, Any]) -> str:
    """What the pace plot's subject line is measured against, by kind."""
    who = subject_name(inc)
    kind = inc.get("kind")
    if kind in ("island", "collective", "link"):
        return f"Pace: {who} against its warm-up baseline; the band is every rank against its peers"
    if kind == "degraded":
        return f"Pace: {who}'s compute gap against its own history; the band is every rank against its peers"
    return f"Pace: compute gap against the peers' median ({who} highlighted)"


def pace_chart(
    inc: Mapping[str, Any],
    job_rows: Sequence[Mapping[str, Any]],
    subj_rows: Sequence[Mapping[str, Any]],
    slug: str,
) -> str:
    lo, hi = _x_range(inc, list(job_rows) + list(subj_rows))
    jr = _decimate_rows(_in(job_rows, lo, hi), ["ratio_p10"], ["ratio_p90"], ["ratio_p50"])
    sr = _decimate_rows(_in(subj_rows, lo, hi), [], [], ["ratio"])
    bands = []
    if any(v is not None for v in _col(jr, "ratio_p50")):
        bands.append(
            svg.Band(
                "peers",
                "peers p10–p90, p50",
                [float(r["window"]) for r in jr],
                _col(jr, "ratio_p10"),
                _col(jr, "ratio_p90"),
                _col(jr, "ratio_p50"),
            )
        )
    lines = []
    if sr:
        lines.append(
            svg.Line(
                "subject",
                subject_name(inc),
                [float(r["window"]) for r in sr],
                _col(sr, "ratio"),
                color=svg.SUBJECT,
                width=2.2,
            )
        )
    note = "" if bands else "peer bands not recorded for these windows"
    return svg.line_chart(
        svg.Chart(
            f"pace-{slug}",
            "pace",
            pace_title(inc),
            "gap ratio",
            (lo, hi),
            lines=lines,
            bands=bands,
            markers=_markers(inc),
            ref_y=1.0,
            note=note,
        )
    )


def step_charts(
    inc: Mapping[str, Any],
    job_rows: Sequence[Mapping[str, Any]],
    subj_rows: Sequence[Mapping[str, Any]],
    slug: str,
) -> str:
    lo, hi = _x_range(inc, list(job_rows) + list(subj_rows))
    jr = _decimate_rows(_in(job_rows, lo, hi), [], [], ["step_ms", "samples_per_s"])
    xs = [float(r["window"]) for r in jr]
    step = _col(jr, "step_ms")
    tput = _col(jr, "samples_per_s")
    out = svg.line_chart(
        svg.Chart(
            f"step-{slug}",
            "step",
            "Step time (the whole job)",
            "ms",
            (lo, hi),
            lines=[svg.Line("step_ms", "step time", xs, step, color=svg.INK)] if jr else [],
            markers=_markers(inc),
            height=170,
            note="" if any(v is not None for v in step) else "step time not recorded",
        )
    )
    out += svg.line_chart(
        svg.Chart(
            f"tput-{slug}",
            "throughput",
            "Useful throughput (the whole job)",
            "samples/s",
            (lo, hi),
            lines=[svg.Line("samples_per_s", "samples/s", xs, tput, color=svg.PEERS)] if jr else [],
            markers=_markers(inc),
            height=170,
            note=""
            if any(v is not None for v in tput)
            else "useful throughput not measured (no global batch known)",
        )
    )
    return out


def telemetry_pairs(inc: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """(name, rank, peers) from evidence.telemetry, else from the cause's evidence pairs."""
    ev = (inc.get("evidence") or {}).get("telemetry") or {}
    out: list[tuple[str, float, float]] = []
    for k, v in ev.items():
        if isinstance(v, Mapping):
            r, p = v.get("rank"), v.get("peers")
            if isinstance(r, (int, float)) and isinstance(p, (int, float)):
                out.append((k, float(r), float(p)))
    if out:
        return out
    cev = (inc.get("cause") or {}).get("evidence") or {}
    for k, v in cev.items():
        p = cev.get(f"peers_{k}")
        if (
            isinstance(v, (int, float))
            and isinstance(p, (int, float))
            and not k.startswith("peers_")
        ):
            out.append((k, float(v), float(p)))
    return out


def _rel(r: float, p: float) -> float | None:
    if p == 0:
        return None
    return 100.0 * (r - p) / abs(p)


def evidence_part(inc: Mapping[str, Any], slug: str) -> str:
    pairs = telemetry_pairs(inc)
    if not pairs:
        return '<p class="note">No telemetry against peers in this record.</p>'
    rows = []
    bars = []
    for k, r, p in pairs:
        name, unit = METRICS.get(k, (k, ""))
        rel = _rel(r, p)
        rows.append(
            f'<tr data-metric="{escape(k)}"><td>{escape(name)}</td>'
            f'<td class="num">{_num(r, 2 if abs(r) < 10 else 0)} {escape(unit)}</td>'
            f'<td class="num">{_num(p, 2 if abs(p) < 10 else 0)} {escape(unit)}</td>'
            f'<td class="num">{_signed(rel)}</td></tr>'
        )
        # The plot shows what differs; the table keeps every metric.
        if rel is not None and abs(rel) >= BAR_MIN_PCT:
            bars.append(svg.Bar(_slug(k), name, rel, _signed(rel)))
    cause = inc.get("cause") or {}
    alts = cause.get("alternatives") or []
    alt = ""
    if alts:
        alt = (
            "<p>Alternatives considered: "
            + "; ".join(
                f"{escape(str(a.get('kind')))} ({escape(str(a.get('text', '')))})" for a in alts
            )
            + ".</p>"
        )
    expl = cause.get("explained")
    expl_text = (
        f" The SM clock deficit explains {100 * expl:.0f}% of the measured slowdown."
        if isinstance(expl, (int, float)) and "explains" not in str(cause.get("text", ""))
        else ""
    )
    table = (
        '<table class="telemetry"><thead><tr><th>telemetry (episode mean)</th>'
        '<th class="num">this rank</th><th class="num">peers</th><th class="num">difference</th>'
        "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )
    same = len(pairs) - len(bars)
    title = "Telemetry against peers" + (
        f" ({same} within {BAR_MIN_PCT:g}% of the peers not drawn)" if same else ""
    )
    chart = (
        svg.bar_chart(svg.BarChart(f"telemetry-{slug}", "telemetry", title, bars)) if bars else ""
    )
    return (
        f"<p>Cause <strong>{escape(str(cause.get('kind', 'unknown')))}</strong>: "
        f"{escape(str(cause.get('text', '')))}.{expl_text}</p>{alt}{table}<figure>{chart}</figure>"
    )


def cost_part(inc: Mapping[str, Any]) -> str:
    c = inc.get("cost") or {}
    return (
        '<table class="cost"><tbody>'
        f'<tr><td>extra time per step</td><td class="num">{_num(c.get("excess_ms"))} ms</td></tr>'
        f'<tr><td>job throughput lost</td><td class="num">{_num(c.get("loss_pct"))}%</td></tr>'
        f'<tr><td>GPU-hours lost over the episode</td><td class="num">{_hours(c.get("gpu_hours"))}</td></tr>'
        f'<tr><td>GPU-hours a day if unresolved</td><td class="num">{_hours(c.get("gpu_hours_per_day"))}</td></tr>'
        "</tbody></table>"
    )


def action_part(inc: Mapping[str, Any]) -> str:
    acts = inc.get("actions") or []
    if not acts:
        return '<p class="action-none">No action was taken (rebalancing off, not confirmed, or not possible for this kind).</p>'
    out = []
    for a in acts:
        hist = ", ".join(
            f"{escape(str(h.get('status')))} at window {h.get('window')}"
            for h in a.get("history") or []
        )
        out.append(
            f'<table class="action" data-plan="{escape(str(a.get("plan")))}"><tbody>'
            f"<tr><td>plan</td><td>{escape(str(a.get('plan')))} ({escape(str(a.get('status')))})</td></tr>"
            f"<tr><td>history</td><td>{hist or '—'}</td></tr>"
            f'<tr><td>throughput before</td><td class="num">{_num(a.get("throughput_before"))} samples/s</td></tr>'
            f'<tr><td>throughput after</td><td class="num">{_num(a.get("throughput_after"))} samples/s</td></tr>'
            f'<tr><td>measured gain</td><td class="num">{_signed(a.get("gain_pct"))}</td></tr>'
            "</tbody></table>"
        )
    return "".join(out)


def check_part(inc: Mapping[str, Any]) -> str:
    esc = inc.get("escalation")
    if isinstance(esc, Mapping) and esc.get("check"):
        return (
            f'<div class="check"><strong>{escape(str(esc.get("cause", "")))}</strong>: '
            f"{escape(str(esc['check']))}</div>"
        )
    if inc.get("verdict") == "dismissed":
        return '<p class="note">None: the incident was dismissed.</p>'
    return '<p class="note">No recommended check in the record.</p>'


def _part(name: str, title: str, body: str) -> str:
    return f'<section class="part part-{name}" data-part="{name}"><h3>{escape(title)}</h3>{body}</section>'


def incident_section(
    inc: Mapping[str, Any],
    job_rows: Sequence[Mapping[str, Any]],
    subj_rows: Sequence[Mapping[str, Any]],
) -> str:
    iid = str(inc.get("id"))
    slug = _slug(iid)
    verdict = inc.get("verdict") or "open"
    opened, closed = inc.get("opened") or {}, inc.get("closed") or {}
    when = _when(opened.get("time"))
    if closed:
        when += f" to {_when(closed.get('time'))}" if closed.get("time") else ""
    head = (
        f'<h2>{escape(iid)} <span class="verdict v-{escape(verdict)}">{escape(verdict)}</span></h2>'
        f'<p class="meta">{escape(str(inc.get("kind")))} incident on {escape(subject_name(inc))}'
        f" · windows {_win(opened)}–{_win(closed) if closed else 'now'}"
        f"{' · ' + escape(when) if when else ''}</p>"
    )
    parts = [
        _part("story", "What happened", f'<p class="story">{escape(story(inc))}</p>'),
        _part("pace", "Pace", f"<figure>{pace_chart(inc, job_rows, subj_rows, slug)}</figure>"),
        _part(
            "throughput",
            "Step time and useful throughput",
            f"<figure>{step_charts(inc, job_rows, subj_rows, slug)}</figure>",
        ),
        _part("evidence", "Evidence against peers", evidence_part(inc, slug)),
        _part("cost", "Cost", cost_part(inc)),
        _part("action", "Action and measured result", action_part(inc)),
        _part("check", "Recommended check", check_part(inc)),
    ]
    return (
        f'<section class="incident" id="incident-{slug}" data-incident="{escape(iid, quote=True)}"'
        f' data-verdict="{escape(verdict)}">{head}{"".join(parts)}</section>'
    )


def summary_part(s: Mapping[str, Any]) -> str:
    bv = s["by_verdict"]
    verdicts = ", ".join(f"{bv[v]} {v}" for v in VERDICTS if bv.get(v)) or "none"
    rng = s["windows"]
    rows = [
        ("ranks", _num(s["ranks"])),
        (
            "islands",
            f"{_num(s['islands'])}"
            + (f" ({escape(s['island_text'])})" if s["island_text"] else ""),
        ),
        ("hosts", _num(s["hosts"])),
        ("windows", f"{rng[0]}–{rng[1]}" if rng else "—"),
        ("wall time", (_num(s["wall_s"] / 60, 1, "min") if s["wall_s"] else "—")),
        ("training time", (_num(s["train_s"] / 60, 1, "min") if s["train_s"] else "—")),
        ("GPU-hours", _hours(s["gpu_hours"])),
        (
            "GPU-hours lost",
            _hours(s["lost_gpu_hours"])
            + (f" ({s['lost_pct']:.1f}% of the job)" if s["lost_pct"] is not None else ""),
        ),
        ("incidents", f"{s['incidents']}: {verdicts}"),
    ]
    body = "".join(
        f'<tr data-key="{escape(k)}"><th>{escape(k)}</th><td>{v}</td></tr>' for k, v in rows
    )
    return f'<section class="summary" id="summary"><table class="summary"><tbody>{body}</tbody></table></section>'


def index_part(incidents: Sequence[Mapping[str, Any]]) -> str:
    if not incidents:
        return '<p class="none">No incidents: nothing was flagged in this job.</p>'
    rows = []
    for inc in incidents:
        slug = _slug(str(inc.get("id")))
        v = inc.get("verdict") or "open"
        c = inc.get("cost") or {}
        rows.append(
            f'<tr><td><a href="#incident-{slug}">{escape(str(inc.get("id")))}</a></td>'
            f"<td>{escape(subject_name(inc))}</td>"
            f"<td>{escape(str((inc.get('cause') or {}).get('kind', '')))}</td>"
            f'<td><span class="verdict v-{escape(v)}">{escape(v)}</span></td>'
            f'<td class="num">{_num(c.get("loss_pct"))}%</td>'
            f'<td class="num">{_hours(c.get("gpu_hours"))}</td></tr>'
        )
    return (
        '<table class="index"><thead><tr><th>incident</th><th>subject</th><th>cause</th>'
        '<th>verdict</th><th class="num">loss</th><th class="num">GPU-h lost</th></tr></thead>'
        "<tbody>" + "".join(rows) + "</tbody></table>"
    )


def render(bundle: Mapping[str, Any]) -> str:
    """The whole report for one job as HTML text (UTF-8, no external reference)."""
    s = job_summary(bundle)
    incidents = [i for i in bundle.get("incidents") or [] if isinstance(i, Mapping)]
    incidents.sort(key=lambda i: (_win(i.get("opened")) or 0, str(i.get("id"))))
    rows = [r for r in bundle.get("windows") or [] if isinstance(r, Mapping)]
    subjects = bundle.get("subjects") or {}
    notes = [str(n) for n in bundle.get("notes") or []]
    gen = _when(bundle.get("generated"))
    title = f"Artemis incident report: {s['job']}"
    sections = "".join(
        incident_section(inc, rows, list(subjects.get(str(inc.get("id"))) or []))
        for inc in incidents
    )
    note_html = "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
    source = bundle.get("source")
    meta = " · ".join(
        x
        for x in (
            f"run {escape(str(s['run']))}" if s["run"] else "",
            f"from {escape(str(source))}" if source else "",
            f"written {gen}" if gen else "",
        )
        if x
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>"
        f'<body><main data-job="{escape(str(s["job"]), quote=True)}">'
        f'<h1>{escape(title)}</h1><p class="meta">{meta}</p>'
        f"{summary_part(s)}{note_html}{index_part(incidents)}{sections}"
        "</main></body></html>\n"
    )
