"""The incident's plots: pace against its peers, step time and useful throughput,
on the windows around its markers, decimated to a bounded size. Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from . import svg
from .story import subject_name, window_of

MARKER_TEXT = {
    "onset": "onset",
    "flagged": "flagged",
    "confirmed": "confirmed",
    "applied": "plan applied",
    "verified": "verified",
    "rolled_back": "rolled back",
    "cleared": "cleared",
}
# Past this many windows on one axis a series is summarised per bucket (bands
# keep their extremes), so a page stays bounded for any episode length.
MAX_POINTS = 1200


def _x_range(inc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """The windows an incident's plots show: its markers with context on both sides."""
    ws = [m.get("window") for m in inc.get("markers") or []]
    ws += [window_of(inc.get(k)) for k in ("opened", "closed")]
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


# The job-wide charts under the pace plot: (key, css kind, title, unit, series label,
# colour, what is said when the series was not recorded).
_JOB_CHARTS = (
    (
        "step",
        "step",
        "Step time (the whole job)",
        "ms",
        "step_ms",
        "step time",
        svg.INK,
        "step time not recorded",
    ),
    (
        "tput",
        "throughput",
        "Useful throughput (the whole job)",
        "samples/s",
        "samples_per_s",
        "samples/s",
        svg.PEERS,
        "throughput not measured (no global batch known, no step time)",
    ),
)
STEPS_TITLE = "Throughput in steps/s (the whole job; no global batch known)"


class IncidentCharts:
    """The line charts of one incident's report (its pace, then the job's step time and
    useful throughput), all over one range of windows: the incident's with context,
    within what the job's and the subject's rows cover."""

    def __init__(
        self,
        inc: Mapping[str, Any],
        job_rows: Sequence[Mapping[str, Any]],
        subj_rows: Sequence[Mapping[str, Any]],
        slug: str,
    ) -> None:
        self.inc, self.job_rows, self.subj_rows, self.slug = inc, job_rows, subj_rows, slug
        self.lo, self.hi = _x_range(inc, list(job_rows) + list(subj_rows))

    def pace(self) -> str:
        inc, lo, hi = self.inc, self.lo, self.hi
        jr = _decimate_rows(_in(self.job_rows, lo, hi), ["ratio_p10"], ["ratio_p90"], ["ratio_p50"])
        sr = _decimate_rows(_in(self.subj_rows, lo, hi), [], [], ["ratio"])
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
                f"pace-{self.slug}",
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

    def job_charts(self) -> str:
        """Step time, then useful throughput, of the whole job. Without a global batch
        (no samples/s: a job that never told its batch size, as most real ones) the
        throughput is the job's steps/s, from its step time: the same shape, in steps."""
        lo, hi = self.lo, self.hi
        keys = [c[4] for c in _JOB_CHARTS]
        jr = _decimate_rows(_in(self.job_rows, lo, hi), [], [], keys)
        xs = [float(r["window"]) for r in jr]
        out = ""
        for key, kind, title, unit, col, label, color, missing in _JOB_CHARTS:
            ys = _col(jr, col)
            if col == "samples_per_s" and not any(v is not None for v in ys):
                ys = [None if v is None or v <= 0 else 1000.0 / v for v in _col(jr, "step_ms")]
                title, unit, label = STEPS_TITLE, "steps/s", "steps/s"
            out += svg.line_chart(
                svg.Chart(
                    f"{key}-{self.slug}",
                    kind,
                    title,
                    unit,
                    (lo, hi),
                    lines=[svg.Line(col, label, xs, ys, color=color)] if jr else [],
                    markers=_markers(self.inc),
                    height=170,
                    note="" if any(v is not None for v in ys) else missing,
                )
            )
        return out
