"""artemis.report: the page from plain data (render is pure), its plots and its bounds."""

from __future__ import annotations

import copy
import re
import time
import xml.etree.ElementTree as ET
from typing import Any

from artemis.report import render
from artemis.report.charts import MAX_POINTS, IncidentCharts
from artemis.report.story import job_summary, story
from artemis.report.svg import nice_ticks
from report_data import contract_bundle, cpu_bundle, drawn_bars

SVG_NS = "{http://www.w3.org/2000/svg}"


def svgs(html: str) -> dict[str, ET.Element]:
    """Every inline SVG of the page, parsed as XML (so each one is well formed), by id."""
    out = {}
    for m in re.finditer(r"<svg\b.*?</svg>", html, re.S):
        el = ET.fromstring(m.group(0))
        out[el.attrib["id"]] = el
    return out


def series(el: ET.Element) -> set[str]:
    return {g.attrib["data-series"] for g in el.iter(f"{SVG_NS}g") if "data-series" in g.attrib}


def markers(el: ET.Element) -> list[tuple[str, int]]:
    return [
        (g.attrib["data-marker"], int(float(g.attrib["data-window"])))
        for g in el.iter(f"{SVG_NS}g")
        if "data-marker" in g.attrib
    ]


def test_every_incident_has_every_part() -> None:
    b = contract_bundle()
    html = render(b)
    for inc in b["incidents"]:
        m = re.search(
            rf'<section class="incident" id="incident-[^"]+" data-incident="{inc["id"]}".*?'
            r'(?=<section class="incident"|</main>)',
            html,
            re.S,
        )
        assert m, inc["id"]
        sec = m.group(0)
        parts = re.findall(r'data-part="([a-z]+)"', sec)
        assert parts == ["story", "pace", "throughput", "evidence", "cost", "action", "check"]
        assert f'data-verdict="{inc["verdict"]}"' in sec


def test_plots_have_their_series_and_the_records_markers() -> None:
    b = contract_bundle()
    plots = svgs(render(b))
    for inc in b["incidents"]:
        slug = inc["id"]
        want = [(m["marker"], m["window"]) for m in inc["markers"]]
        pace = plots[f"pace-{slug}"]
        assert pace.attrib["data-plot"] == "pace"
        assert series(pace) == {"peers", "subject"}
        assert markers(pace) == want
        for key, s in (("step", "step_ms"), ("tput", "samples_per_s")):
            assert series(plots[f"{key}-{slug}"]) == {s}
            assert markers(plots[f"{key}-{slug}"]) == want
        tele = plots.get(f"telemetry-{slug}")
        if drawn_bars(inc):
            assert tele is not None
            assert series(tele) == drawn_bars(inc)
        else:
            assert tele is None


def test_pace_subject_line_follows_its_rows() -> None:
    b = contract_bundle()
    inc = b["incidents"][0]
    pace = svgs(render(b))[f"pace-{inc['id']}"]
    subject = next(g for g in pace.iter(f"{SVG_NS}g") if g.attrib.get("data-series") == "subject")
    (poly,) = subject.iter(f"{SVG_NS}polyline")
    pts = [tuple(map(float, p.split(","))) for p in poly.attrib["points"].split()]
    rows = b["subjects"][inc["id"]]
    assert len(pts) == len(rows)
    # Higher ratio, higher on the page (smaller y): the order of the points' y follows the rows'.
    ys = [p[1] for p in pts]
    ratios = [r["ratio"] for r in rows]
    hi, lo = ratios.index(max(ratios)), ratios.index(min(ratios))
    assert ys[hi] == min(ys) and ys[lo] == max(ys)


def test_summary_numbers() -> None:
    b = contract_bundle(windows=60, ranks=8, window_s=5.0)
    s = job_summary(b)
    assert s["ranks"] == 8 and s["islands"] == 2
    assert s["wall_s"] == 300.0
    assert abs(s["gpu_hours"] - 8 * 300 / 3600) < 1e-9
    assert abs(s["lost_gpu_hours"] - (0.0041 + 0.0004 + 0.0001)) < 1e-12
    assert s["by_verdict"] == {"mitigated": 1, "recovered": 1, "dismissed": 1}
    html = render(b)
    assert "3: 1 recovered, 1 mitigated, 1 dismissed" in html


def test_story_tells_the_record() -> None:
    inc = contract_bundle()["incidents"][0]
    text = story(inc)
    for piece in (
        "Rank 2 (island nvidia; host node-a) slowed from window 16",
        "15% over its peers'",
        "flagged it at window 18 and confirmed it at window 18",
        "Plan p1-w20-r2 was applied at window 23 and verified at window 28",
        "2,226.1 → 2,433.9 samples/s (+9.3%)",
        "Verdict: mitigated",
    ):
        assert piece in text, piece
    dismissed = contract_bundle()["incidents"][2]
    assert "never confirmed" in story(dismissed)
    assert "None: the incident was dismissed" in render(contract_bundle())


def test_no_external_reference_and_escaped_text() -> None:
    b = contract_bundle()
    b["incidents"][0]["cause"]["text"] = '<script>alert("x")</script> & <img src=http://e/x>'
    html = render(b)
    assert "<script" not in html
    assert "&lt;script&gt;" in html
    assert "&lt;img src=http://e/x&gt;" in html  # shown as text, not a tag
    assert not re.search(r"""<[a-zA-Z][^<>]*\s(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "url(" not in html and "@import" not in html
    assert "default-src 'none'" in html  # the CSP that makes any slip a console error
    svgs(html)  # still well formed


def test_an_empty_job() -> None:
    html = render({"job": {"job": "quiet"}, "incidents": [], "windows": []})
    assert "No incidents" in html and "<svg" not in html


def test_missing_rows_say_so() -> None:
    b = contract_bundle()
    b["windows"], b["subjects"] = [], {}
    html = render(b)
    assert "peer bands not recorded" in html
    assert "step time not recorded" in html


def big_bundle(windows: int) -> dict[str, Any]:
    b = contract_bundle(windows=windows)
    # The first incident spans the whole job: its plots must be bounded however long it is.
    inc = b["incidents"][0]
    inc["closed"]["window"] = windows - 1
    inc["markers"].append({"marker": "cleared", "window": windows - 1})
    return b


def test_page_is_bounded_for_long_episodes() -> None:
    small = len(render(big_bundle(1000)))
    huge_b = big_bundle(20000)
    t0 = time.perf_counter()
    huge = render(huge_b)
    took = time.perf_counter() - t0
    # Decimated to MAX_POINTS per series: 20x the windows, well under 2x the page.
    assert len(huge) < 2 * small, (len(huge), small)
    pace = svgs(huge)[f"pace-{huge_b['incidents'][0]['id']}"]
    for poly in pace.iter(f"{SVG_NS}polyline"):
        assert len(poly.attrib["points"].split()) <= MAX_POINTS
    assert took < 10.0


def test_nice_ticks() -> None:
    assert nice_ticks(0, 100, 5) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0.97, 1.16, 4) == [1.0, 1.05, 1.1, 1.15]
    assert nice_ticks(5, 5) == [5]


def test_story_places_a_plan_where_its_marker_is_not_at_its_acknowledgement() -> None:
    """The plan's history has the window its acknowledgement came in (21 here); the
    split changes at its apply_at_step, in the window the `applied` marker names."""
    inc = copy.deepcopy(contract_bundle()["incidents"][0])
    for h in inc["actions"][0]["history"]:
        if h["status"] == "applied":
            h["window"] = 21
    assert "was applied at window 23 " in story(inc)


# --------------------------------------------------------------------------- a CPU job


def test_a_cpu_jobs_page_counts_cpu_hours() -> None:
    b = cpu_bundle()
    html = render(b)
    assert "GPU-h" not in html, re.findall(r".{40}GPU-h.{20}", html)
    assert '<tr data-key="CPU-hours">' in html and '<tr data-key="CPU-hours lost">' in html
    assert html.count('data-unit="CPU-hours"') == len(b["incidents"])
    assert "CPU-hours" in story(b["incidents"][0])
    # the contract bundle (no unit: a record from before it) stays a GPU job's
    assert "CPU-h" not in render(contract_bundle())


def test_throughput_from_steps_when_no_batch_is_known() -> None:
    b = cpu_bundle()
    inc = b["incidents"][0]
    page = render(b)
    tput = svgs(page)[f"tput-{inc['id']}"]
    assert series(tput) == {"samples_per_s"}  # the plot's series, now in steps/s
    assert "steps/s" in ET.tostring(tput, encoding="unicode")
    assert "not measured" not in ET.tostring(tput, encoding="unicode")
    (poly,) = next(
        g for g in tput.iter(f"{SVG_NS}g") if g.attrib.get("data-series") == "samples_per_s"
    ).iter(f"{SVG_NS}polyline")
    ys = [float(p.split(",")[1]) for p in poly.attrib["points"].split()]
    ch = IncidentCharts(inc, b["windows"], b["subjects"][inc["id"]], inc["id"])
    steps = [r["step_ms"] for r in b["windows"] if ch.lo <= r["window"] <= ch.hi]
    assert len(steps) == len(ys)
    # the slowest window is the fewest steps/s: lowest on the page (largest y)
    assert ys.index(max(ys)) == steps.index(max(steps))


def test_no_relative_bar_between_two_near_zero_values() -> None:
    b = cpu_bundle()
    inc = b["incidents"][0]
    page = render(b)
    tele = svgs(page)[f"telemetry-{inc['id']}"]
    # 0.03% vs 0.04% steal is a -25% ratio of noise: in the table, in points, not drawn
    assert series(tele) == {"cpu_pct", "gap_busy_pct"}
    row = re.search(r'<tr data-metric="steal_pct">.*?</tr>', page)
    assert row and "-0.01 pt" in row.group(0) and "-25" not in row.group(0), row
    # near zero is by the metric's scale: a fraction (power / board limit 0.48 vs 0.71)
    # is no percentage, and keeps its relative bar
    g = contract_bundle()
    gi = g["incidents"][0]
    assert "power_frac" in series(svgs(render(g))[f"telemetry-{gi['id']}"])


def test_training_time_is_never_more_than_wall_time() -> None:
    # The first 5 windows are scored together (an agent or the in-process detector
    # reading the ring's backlog): the span of the scoring times misses the time the
    # job ran them. The old estimate (span x n / (n - 1)) read 280 s of wall time for
    # about 320 s of training.
    b = cpu_bundle(batch=5)
    s = job_summary(b)
    rows = b["windows"]
    train = sum(r["step_ms"] for r in rows) * 50 / 1000.0
    assert abs(s["train_s"] - train) < 1e-6
    span = rows[-1]["time"] - rows[0]["time"]
    assert span * len(rows) / (len(rows) - 1) < train  # the bug this guards against
    assert s["train_s"] <= s["wall_s"]
    # every window's steps took longer than the 5 s between scorings: the job's wall
    # time over its windows is its training time
    assert abs(s["wall_s"] - train) < 1e-6
    # a job idle between its windows (an evaluation, a checkpoint) keeps its longer wall
    # time: the span, plus the first window's own steps (it ran before it was scored)
    for i, r in enumerate(rows):
        r["time"] = 1_000.0 + 10.0 * i
    s = job_summary(b)
    assert s["wall_s"] == 10.0 * (len(rows) - 1) + rows[0]["step_ms"] * 50 / 1000.0
    assert s["wall_s"] > s["train_s"]
