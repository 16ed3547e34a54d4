"""render(bundle) -> one self-contained HTML page for one job's incidents. Pure.

The bundle is plain data (report/README.md "The bundle"): the job's summary,
its incident records and per-window rows as docs/DESIGN.md "Incidents
(coordinator -> world)" defines them, and the plans. No file, clock or network
here: the loaders (``artemis.report.load``) build the bundle, the shell writes
the page. The page has no script and no external reference; a Content Security
Policy forbids any, so a slip shows as a console error in the browser test.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from artemis.detect.node_kind import unit_hours

from . import svg
from .charts import IncidentCharts
from .story import (
    correction_text,
    fmt_hours,
    fmt_num,
    fmt_signed,
    fmt_when,
    job_summary,
    story,
    subject_name,
    window_of,
)

VERDICTS = ("recovered", "mitigated", "escalated", "unresolved", "dismissed", "open")
VERDICT_TEXT = {
    "recovered": "recovered: cleared, the recovery measured",
    "mitigated": "mitigated: a plan in force with a measured gain",
    "escalated": "escalated: an action did not restore throughput; needs an engineer",
    "unresolved": "unresolved: still slow at the end, no action allowed",
    "dismissed": "dismissed: cleared before it was confirmed",
    "open": "open: the episode is still going on",
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
    "gap_busy_pct": ("process busy in the gap", "%"),
    "run_delay_pct": ("run delay (waiting for a CPU)", "%"),
    "cg_throttled_pct": ("cgroup throttled", "%"),
    "psi_cpu_some": ("CPU pressure", "%"),
    "nic_xmit_wait": ("NIC xmit wait", ""),
}
# A telemetry bar is drawn for a metric this far (percent) from its peers' value.
BAR_MIN_PCT = 0.5
# Near zero, by a metric's scale: a percentage (of a core, of the host's CPUs, of
# the wall time) under one point on both sides is a few scheduler ticks in a window
# (/proc counts in 10 ms ticks), and one point of CPU explains no slowdown worth a
# report; a relative difference between two such values (0.03% vs 0.04% steal:
# -25%) is noise drawn as the largest bar. The table gives their difference in points.
NEAR_ZERO = {"%": 1.0}
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


def _rel(r: float, p: float, unit: str = "") -> float | None:
    """The rank's value against its peers', in percent; None where that means nothing:
    a zero reference, or both values near zero on the metric's scale (NEAR_ZERO)."""
    zero = NEAR_ZERO.get(unit)
    if p == 0 or (zero is not None and abs(r) < zero and abs(p) < zero):
        return None
    return 100.0 * (r - p) / abs(p)


def _difference(r: float, p: float, rel: float | None, unit: str) -> str:
    if rel is None and unit in NEAR_ZERO:
        return f"{r - p:+.2f} pt"  # near zero: the difference itself, no ratio
    return fmt_signed(rel)


def evidence_part(inc: Mapping[str, Any], slug: str) -> str:
    pairs = telemetry_pairs(inc)
    if not pairs:
        return '<p class="note">No telemetry against peers in this record.</p>'
    rows = []
    bars = []
    for k, r, p in pairs:
        name, unit = METRICS.get(k, (k, ""))
        rel = _rel(r, p, unit)
        rows.append(
            f'<tr data-metric="{escape(k)}"><td>{escape(name)}</td>'
            f'<td class="num">{fmt_num(r, 2 if abs(r) < 10 else 0)} {escape(unit)}</td>'
            f'<td class="num">{fmt_num(p, 2 if abs(p) < 10 else 0)} {escape(unit)}</td>'
            f'<td class="num">{_difference(r, p, rel, unit)}</td></tr>'
        )
        # The plot shows what differs; the table keeps every metric.
        if rel is not None and abs(rel) >= BAR_MIN_PCT:
            bars.append(svg.Bar(_slug(k), name, rel, fmt_signed(rel)))
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
    hours = unit_hours(c.get("unit"))  # cost.unit: GPU-hours, or a CPU job's CPU-hours
    return (
        f'<table class="cost" data-unit="{escape(hours)}"><tbody>'
        f'<tr><td>extra time per step</td><td class="num">{fmt_num(c.get("excess_ms"))} ms</td></tr>'
        f'<tr><td>job throughput lost</td><td class="num">{fmt_num(c.get("loss_pct"))}%</td></tr>'
        f'<tr><td>{hours} lost over the episode</td><td class="num">{fmt_hours(c.get("gpu_hours"))}</td></tr>'
        f'<tr><td>{hours} a day if unresolved</td><td class="num">{fmt_hours(c.get("gpu_hours_per_day"))}</td></tr>'
        "</tbody></table>"
    )


def action_part(inc: Mapping[str, Any]) -> str:
    acts = inc.get("actions") or []
    if not acts:
        return '<p class="action-none">No action was taken (rebalancing off, not confirmed, or not possible for this kind).</p>'
    out = []
    for a in acts:
        if a.get("type") == "correction":  # issue 29: what it did and measured, in words
            cid = escape(str(a.get("id")))
            out.append(
                f'<p class="action" data-correction="{cid}">{escape(correction_text(a))}</p>'
            )
            continue
        hist = ", ".join(
            f"{escape(str(h.get('status')))} at window {h.get('window')}"
            for h in a.get("history") or []
        )
        out.append(
            f'<table class="action" data-plan="{escape(str(a.get("plan")))}"><tbody>'
            f"<tr><td>plan</td><td>{escape(str(a.get('plan')))} ({escape(str(a.get('status')))})</td></tr>"
            f"<tr><td>history</td><td>{hist or '—'}</td></tr>"
            f'<tr><td>throughput before</td><td class="num">{fmt_num(a.get("throughput_before"))} samples/s</td></tr>'
            f'<tr><td>throughput after</td><td class="num">{fmt_num(a.get("throughput_after"))} samples/s</td></tr>'
            f'<tr><td>measured gain</td><td class="num">{fmt_signed(a.get("gain_pct"))}</td></tr>'
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
    when = fmt_when(opened.get("time"))
    if closed:
        when += f" to {fmt_when(closed.get('time'))}" if closed.get("time") else ""
    head = (
        f'<h2>{escape(iid)} <span class="verdict v-{escape(verdict)}">{escape(verdict)}</span></h2>'
        f'<p class="meta">{escape(str(inc.get("kind")))} incident on {escape(subject_name(inc))}'
        f" · windows {window_of(opened)}–{window_of(closed) if closed else 'now'}"
        f"{' · ' + escape(when) if when else ''}</p>"
    )
    charts = IncidentCharts(inc, job_rows, subj_rows, slug)
    parts = [
        _part("story", "What happened", f'<p class="story">{escape(story(inc))}</p>'),
        _part("pace", "Pace", f"<figure>{charts.pace()}</figure>"),
        _part(
            "throughput",
            "Step time and useful throughput",
            f"<figure>{charts.job_charts()}</figure>",
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
        ("ranks", fmt_num(s["ranks"])),
        (
            "islands",
            f"{fmt_num(s['islands'])}"
            + (f" ({escape(s['island_text'])})" if s["island_text"] else ""),
        ),
        ("hosts", fmt_num(s["hosts"])),
        ("windows", f"{rng[0]}–{rng[1]}" if rng else "—"),
        ("wall time", (fmt_num(s["wall_s"] / 60, 1, "min") if s["wall_s"] else "—")),
        ("training time", (fmt_num(s["train_s"] / 60, 1, "min") if s["train_s"] else "—")),
        (s["hours_unit"], fmt_hours(s["gpu_hours"])),
        (
            f"{s['hours_unit']} lost",
            fmt_hours(s["lost_gpu_hours"])
            + (f" ({s['lost_pct']:.1f}% of the job)" if s["lost_pct"] is not None else ""),
        ),
        ("incidents", f"{s['incidents']}: {verdicts}"),
    ]
    body = "".join(
        f'<tr data-key="{escape(k)}"><th>{escape(k)}</th><td>{v}</td></tr>' for k, v in rows
    )
    return f'<section class="summary" id="summary"><table class="summary"><tbody>{body}</tbody></table></section>'


def index_part(incidents: Sequence[Mapping[str, Any]], hours: str) -> str:
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
            f'<td class="num">{fmt_num(c.get("loss_pct"))}%</td>'
            f'<td class="num">{fmt_hours(c.get("gpu_hours"))}</td></tr>'
        )
    return (
        '<table class="index"><thead><tr><th>incident</th><th>subject</th><th>cause</th>'
        f'<th>verdict</th><th class="num">loss</th><th class="num">{hours[:3]}-h lost</th></tr></thead>'
        "<tbody>" + "".join(rows) + "</tbody></table>"
    )


def render(bundle: Mapping[str, Any]) -> str:
    """The whole report for one job as HTML text (UTF-8, no external reference)."""
    s = job_summary(bundle)
    incidents = [i for i in bundle.get("incidents") or [] if isinstance(i, Mapping)]
    incidents.sort(key=lambda i: (window_of(i.get("opened")) or 0, str(i.get("id"))))
    rows = [r for r in bundle.get("windows") or [] if isinstance(r, Mapping)]
    subjects = bundle.get("subjects") or {}
    notes = [str(n) for n in bundle.get("notes") or []]
    gen = fmt_when(bundle.get("generated"))
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
        f"{summary_part(s)}{note_html}{index_part(incidents, s['hours_unit'])}{sections}"
        "</main></body></html>\n"
    )
