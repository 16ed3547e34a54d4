"""A small SVG writer for the incident report: line charts with bands and markers, bar charts.

Pure functions from plain data to SVG text; no plotting library, no script, no
external reference, so a report opens from a file share (report/README.md).
Every series and marker carries a stable ``id``, ``class`` and ``data-`` attribute
(``data-series``, ``data-marker``, ``data-window``) that the browser test finds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

# Colours chosen to survive greyscale printing: the subject is dark and thick,
# peers a light band, markers mid-grey with their own dash.
SUBJECT = "#c0392b"
PEERS = "#2c6fbb"
INK = "#222"
GRID = "#e3e3e3"
MARKER_STYLE = {
    "onset": ("#7f8c8d", "2,3"),
    "flagged": ("#d35400", ""),
    "confirmed": ("#8e44ad", "6,3"),
    "applied": ("#16a085", ""),
    "verified": ("#27ae60", "6,3"),
    "rolled_back": ("#c0392b", "6,3"),
    "cleared": ("#2c3e50", "2,2"),
}
CHAR_W = 6.2  # an estimate of one 11px sans-serif character's width, for label placement


@dataclass(frozen=True)
class _Series:
    """What every drawn series has: its key (CSS class), its legend label, its x values."""

    key: str
    label: str
    xs: Sequence[float]


@dataclass(frozen=True)
class Line(_Series):
    """One series drawn as a polyline; a None y breaks the line."""

    ys: Sequence[float | None]
    color: str = INK
    width: float = 1.5
    dash: str = ""


@dataclass(frozen=True)
class Band(_Series):
    """A shaded area between lo and hi (peers' p10..p90), with an optional mid line (p50)."""

    lo: Sequence[float | None]
    hi: Sequence[float | None]
    mid: Sequence[float | None] | None = None
    color: str = PEERS


@dataclass(frozen=True)
class Marker:
    """A labelled vertical line at a window (onset, flagged, confirmed, ...)."""

    kind: str
    x: float
    label: str


@dataclass(frozen=True)
class Chart:
    key: str  # the svg id
    kind: str  # data-plot: pace, step, throughput
    title: str
    y_label: str
    x_range: tuple[float, float]
    lines: Sequence[Line] = ()
    bands: Sequence[Band] = ()
    markers: Sequence[Marker] = ()
    ref_y: float | None = None  # a dashed reference line (ratio 1.0)
    width: int = 860
    height: int = 230
    x_label: str = "window"
    y_floor: float | None = None  # include this y in the range (0 for throughput)
    note: str = ""


@dataclass(frozen=True)
class Bar:
    key: str
    label: str
    value: float  # a signed relative difference, percent
    text: str


@dataclass(frozen=True)
class BarChart:
    key: str
    kind: str
    title: str
    bars: Sequence[Bar] = field(default_factory=tuple)
    width: int = 860


def nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """About n round tick values covering [lo, hi] (whole numbers only if ``integer``)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, float(math.ceil(step)))
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    return ticks


def fmt_tick(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 10000:
        return f"{v / 1000:.0f}k"
    if a >= 100 or float(v).is_integer():
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.3f}".rstrip("0").rstrip(".")


def _attr(s: str) -> str:
    return escape(s, quote=True)


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _y_range(chart: Chart) -> tuple[float, float]:
    vals: list[float] = []
    for ln in chart.lines:
        vals.extend(v for v in ln.ys if v is not None and _finite(v))
    for b in chart.bands:
        for seq in (b.lo, b.hi, b.mid or ()):
            vals.extend(v for v in seq if v is not None and _finite(v))
    if chart.ref_y is not None:
        vals.append(chart.ref_y)
    if chart.y_floor is not None:
        vals.append(chart.y_floor)
    if not vals:
        return (0.0, 1.0)
    lo, hi = min(vals), max(vals)
    if hi - lo < 1e-9:
        pad = abs(hi) * 0.05 or 1.0
        return (lo - pad, hi + pad)
    pad = (hi - lo) * 0.08
    lo2 = lo - pad
    if chart.y_floor is not None and lo >= chart.y_floor:
        lo2 = max(lo2, chart.y_floor)
    return (lo2, hi + pad)


def _runs(xs: Sequence[float], ys: Sequence[float | None]) -> list[list[tuple[float, float]]]:
    """Split a series at its gaps (None, NaN)."""
    runs: list[list[tuple[float, float]]] = []
    cur: list[tuple[float, float]] = []
    for x, y in zip(xs, ys, strict=True):
        if y is None or not _finite(y):
            if cur:
                runs.append(cur)
            cur = []
        else:
            cur.append((x, y))
    if cur:
        runs.append(cur)
    return runs


def _label_rows(markers: Sequence[Marker], sx: float, x0: float) -> list[int]:
    """Greedy rows for marker labels so that labels at nearby windows do not overlap."""
    order = sorted(range(len(markers)), key=lambda i: markers[i].x)
    row_end: list[float] = []
    rows = [0] * len(markers)
    for i in order:
        px = x0 + (markers[i].x) * sx
        w = len(markers[i].label) * CHAR_W + 6
        for r, end in enumerate(row_end):
            if px >= end:
                rows[i] = r
                row_end[r] = px + w
                break
        else:
            rows[i] = len(row_end)
            row_end.append(px + w)
    return rows


def line_chart(chart: Chart) -> str:
    """An SVG line chart: bands, lines, a reference line and labelled vertical markers."""
    ml, mr, mb = 58, 14, 34
    x_lo, x_hi = chart.x_range
    if x_hi <= x_lo:
        x_hi = x_lo + 1
    # Marker labels sit above the plot area, in as many rows as they need.
    pw = chart.width - ml - mr
    sx = pw / (x_hi - x_lo)
    rows = _label_rows([Marker(m.kind, m.x - x_lo, m.label) for m in chart.markers], sx, ml)
    n_rows = (max(rows) + 1) if rows else 0
    mt = 26 + 13 * n_rows
    height = chart.height + 13 * n_rows
    ph = height - mt - mb
    y_lo, y_hi = _y_range(chart)
    sy = ph / (y_hi - y_lo)

    def px(x: float) -> float:
        return ml + (x - x_lo) * sx

    def py(y: float) -> float:
        return mt + (y_hi - y) * sy

    out: list[str] = []
    out.append(
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{_attr(chart.key)}" '
        f'class="plot plot-{_attr(chart.kind)}" data-plot="{_attr(chart.kind)}" '
        f'viewBox="0 0 {chart.width} {height}" width="100%" role="img" '
        f'aria-label="{_attr(chart.title)}">'
    )
    out.append(f"<title>{escape(chart.title)}</title>")
    out.append(
        f'<text class="plot-title" x="{ml}" y="14" font-size="12" font-weight="600" '
        f'fill="{INK}">{escape(chart.title)}</text>'
    )
    # Grid and axes.
    out.append('<g class="axis axis-y">')
    for t in nice_ticks(y_lo, y_hi, 4):
        y = py(t)
        out.append(
            f'<line x1="{ml}" x2="{ml + pw:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>'
            f'<text x="{ml - 6}" y="{y + 3.5:.1f}" font-size="10" text-anchor="end" '
            f'fill="#555">{fmt_tick(t)}</text>'
        )
    out.append(
        f'<text x="12" y="{mt + ph / 2:.1f}" font-size="10" fill="#555" text-anchor="middle" '
        f'transform="rotate(-90 12 {mt + ph / 2:.1f})">{escape(chart.y_label)}</text>'
    )
    out.append("</g>")
    out.append('<g class="axis axis-x">')
    for t in nice_ticks(x_lo, x_hi, 8, integer=True):
        x = px(t)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt + ph:.1f}" y2="{mt + ph + 4:.1f}" '
            f'stroke="#888"/><text x="{x:.1f}" y="{mt + ph + 15:.1f}" font-size="10" '
            f'text-anchor="middle" fill="#555">{fmt_tick(t)}</text>'
        )
    out.append(
        f'<text x="{ml + pw / 2:.1f}" y="{height - 4}" font-size="10" fill="#555" '
        f'text-anchor="middle">{escape(chart.x_label)}</text>'
    )
    out.append(
        f'<rect x="{ml}" y="{mt}" width="{pw:.1f}" height="{ph:.1f}" fill="none" stroke="#bbb"/>'
    )
    out.append("</g>")
    if chart.ref_y is not None and y_lo <= chart.ref_y <= y_hi:
        y = py(chart.ref_y)
        out.append(
            f'<line class="ref" x1="{ml}" x2="{ml + pw:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="#999" stroke-dasharray="4,3"/>'
        )
    for b in chart.bands:
        out.append(
            f'<g class="series series-band" id="{_attr(chart.key)}-{_attr(b.key)}" '
            f'data-series="{_attr(b.key)}" data-label="{_attr(b.label)}">'
        )
        pairs = [
            (x, lo, hi)
            for x, lo, hi in zip(b.xs, b.lo, b.hi, strict=True)
            if lo is not None and hi is not None and _finite(lo) and _finite(hi)
        ]
        n_poly = 0
        if pairs:
            # One polygon per unbroken run of windows.
            run: list[tuple[float, float, float]] = []
            runs: list[list[tuple[float, float, float]]] = []
            prev_i = None
            idx = {x: i for i, x in enumerate(b.xs)}
            for p in pairs:
                i = idx[p[0]]
                if prev_i is not None and i != prev_i + 1:
                    runs.append(run)
                    run = []
                run.append(p)
                prev_i = i
            runs.append(run)
            for r in runs:
                top = " ".join(f"{px(x):.1f},{py(hi):.1f}" for x, _, hi in r)
                bot = " ".join(f"{px(x):.1f},{py(lo):.1f}" for x, lo, _ in reversed(r))
                out.append(
                    f'<polygon class="band" points="{top} {bot}" fill="{b.color}" '
                    f'fill-opacity="0.18" stroke="{b.color}" stroke-opacity="0.35" '
                    f'stroke-width="0.6"/>'
                )
                n_poly += 1
        if b.mid is not None:
            for r2 in _runs(b.xs, b.mid):
                pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in r2)
                out.append(
                    f'<polyline class="band-mid" points="{pts}" fill="none" stroke="{b.color}" '
                    f'stroke-width="1.2"/>'
                )
        out.append("</g>")
    for ln in chart.lines:
        out.append(
            f'<g class="series series-line" id="{_attr(chart.key)}-{_attr(ln.key)}" '
            f'data-series="{_attr(ln.key)}" data-label="{_attr(ln.label)}">'
        )
        for r2 in _runs(ln.xs, ln.ys):
            pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in r2)
            dash = f' stroke-dasharray="{ln.dash}"' if ln.dash else ""
            if len(r2) == 1:
                x, y = r2[0]
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2" fill="{ln.color}"/>')
            else:
                out.append(
                    f'<polyline points="{pts}" fill="none" stroke="{ln.color}" '
                    f'stroke-width="{ln.width}" stroke-linejoin="round"{dash}/>'
                )
        out.append("</g>")
    for m, row in zip(chart.markers, rows, strict=True):
        color, dash = MARKER_STYLE.get(m.kind, ("#555", ""))
        x = px(min(max(m.x, x_lo), x_hi))
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        ly = 26 + 13 * row + 9
        out.append(
            f'<g class="marker marker-{_attr(m.kind)}" id="{_attr(chart.key)}-m-{_attr(m.kind)}" '
            f'data-marker="{_attr(m.kind)}" data-window="{m.x:g}">'
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{ly + 2:.1f}" y2="{mt + ph:.1f}" '
            f'stroke="{color}" stroke-width="1.3"{dash_attr}/>'
            f'<text x="{x + 3:.1f}" y="{ly:.1f}" font-size="11" fill="{color}">'
            f"{escape(m.label)}</text></g>"
        )
    # Legend: the series in drawing order, laid out from the right; one swatch each.
    lx: float = ml + pw
    legend: list[str] = []
    series: list[Line | Band] = [*reversed(chart.lines), *reversed(chart.bands)]
    for sr in series:
        lx -= len(sr.label) * CHAR_W + 26
        if isinstance(sr, Line):
            swatch = (
                f'<line x1="{lx:.1f}" x2="{lx + 16:.1f}" y1="10" y2="10" stroke="{sr.color}" '
                f'stroke-width="{sr.width + 0.5}"/>'
            )
        else:
            swatch = (
                f'<rect x="{lx:.1f}" y="5" width="16" height="10" fill="{sr.color}" '
                f'fill-opacity="0.25" stroke="{sr.color}"/>'
            )
        legend.append(
            f'{swatch}<text x="{lx + 20:.1f}" y="14" font-size="10" '
            f'fill="#333">{escape(sr.label)}</text>'
        )
    out.append('<g class="legend">' + "".join(legend) + "</g>")
    if chart.note:
        out.append(
            f'<text class="plot-note" x="{ml + 6}" y="{mt + 14}" font-size="10" '
            f'fill="#777">{escape(chart.note)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def bar_chart(chart: BarChart) -> str:
    """Horizontal bars of signed percentages around zero (the rank against its peers)."""
    label_w, mr, row_h, top = 150, 70, 22, 24
    height = top + row_h * max(len(chart.bars), 1) + 18
    pw = chart.width - label_w - mr
    biggest = max((abs(b.value) for b in chart.bars if _finite(b.value)), default=1.0)
    biggest = max(biggest, 1.0)
    sx = (pw / 2 - 56) / biggest  # room for the value's text beside the longest bar
    zero = label_w + pw / 2
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{_attr(chart.key)}" '
        f'class="plot plot-{_attr(chart.kind)}" data-plot="{_attr(chart.kind)}" '
        f'viewBox="0 0 {chart.width} {height}" width="100%" role="img" '
        f'aria-label="{_attr(chart.title)}"><title>{escape(chart.title)}</title>',
        f'<text class="plot-title" x="4" y="14" font-size="12" font-weight="600" '
        f'fill="{INK}">{escape(chart.title)}</text>',
        f'<line x1="{zero:.1f}" x2="{zero:.1f}" y1="{top - 4}" y2="{height - 14}" stroke="#888"/>',
    ]
    for i, b in enumerate(chart.bars):
        y = top + i * row_h
        v = b.value if _finite(b.value) else 0.0
        w = abs(v) * sx
        x = zero if v >= 0 else zero - w
        color = SUBJECT
        out.append(
            f'<g class="series series-bar" id="{_attr(chart.key)}-{_attr(b.key)}" '
            f'data-series="{_attr(b.key)}" data-value="{v:.4g}">'
            f'<text x="{label_w - 8}" y="{y + 14}" font-size="11" text-anchor="end" '
            f'fill="#333">{escape(b.label)}</text>'
            f'<rect x="{x:.1f}" y="{y + 3}" width="{max(w, 1.0):.1f}" height="{row_h - 8}" '
            f'fill="{color}" fill-opacity="0.75"/>'
            f'<text x="{(x + w + 4) if v >= 0 else (x - 4):.1f}" y="{y + 14}" font-size="10" '
            f'text-anchor="{"start" if v >= 0 else "end"}" fill="#333">{escape(b.text)}</text></g>'
        )
    out.append(
        f'<text x="{zero:.1f}" y="{height - 2}" font-size="10" text-anchor="middle" '
        f'fill="#555">rank against peers (0 = same)</text></svg>'
    )
    return "".join(out)
