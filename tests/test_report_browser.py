"""The incident report opened in a real headless browser (Debian's chromium).

Driven over Chromium's DevTools protocol on a pipe (artemis.report.browser, stdlib
only). `make test` installs chromium (tests/setup/install-chromium.sh); without it
this test skips and says why, except under CI=true, where it fails. The
screenshots are kept in out/test-artifacts/report/ (docs/OPERATING.md "Reading an incident").
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from artemis.report import render
from artemis.report.browser import Browser, Page, find_chromium, new_page
from artemis.report.load import bundles_from_findings
from report_data import contract_bundle, cpu_bundle, drawn_bars

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "out" / "test-artifacts" / "report"
ARTEMIS = Path(sys.executable).parent / "artemis"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for the module; each test opens its own tabs."""
    exe = find_chromium()
    if exe is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("chromium is not installed: tests/setup/install-chromium.sh must run in CI")
        pytest.skip(
            "chromium not installed (bash tests/setup/install-chromium.sh, run by make test)"
        )
    b = Browser(exe)
    yield b
    b.close()


# What the page shows, read back from the rendered DOM: per incident section, its
# parts, and per plot its series (with their drawn size) and markers.
DOM_QUERY = """
(() => {
  const out = {};
  for (const sec of document.querySelectorAll('section.incident')) {
    const plots = {};
    for (const svg of sec.querySelectorAll('svg.plot')) {
      const series = {};
      for (const g of svg.querySelectorAll('[data-series]')) {
        const bb = g.getBBox();
        series[g.dataset.series] = {w: bb.width, h: bb.height};
      }
      const markers = [...svg.querySelectorAll('[data-marker]')].map(
        g => [g.dataset.marker, Number(g.dataset.window)]);
      const box = svg.getBoundingClientRect();
      plots[svg.id] = {plot: svg.dataset.plot, series, markers, w: box.width, h: box.height};
    }
    out[sec.dataset.incident] = {
      verdict: sec.dataset.verdict,
      parts: [...sec.querySelectorAll('[data-part]')].map(p => p.dataset.part),
      visible: sec.getBoundingClientRect().height > 0,
      plots,
    };
  }
  return out;
})()
"""

# Decode a PNG in the browser (canvas) and measure it: luminance variance and
# the number of distinct colours. A blank page has variance 0 and 1 colour.
PIXEL_QUERY = """
(async () => {
  const img = new Image();
  img.src = 'data:image/png;base64,%s';
  await img.decode();
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const ctx = c.getContext('2d');
  ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data;
  let n = 0, s = 0, s2 = 0; const colours = new Set();
  for (let i = 0; i < d.length; i += 4) {
    const y = 0.299 * d[i] + 0.587 * d[i + 1] + 0.114 * d[i + 2];
    n++; s += y; s2 += y * y;
    if (colours.size < 5000) colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
  }
  const mean = s / n;
  return {w: c.width, h: c.height, mean, variance: s2 / n - mean * mean, colours: colours.size};
})()
"""


def pixel_stats(b: Browser, png: bytes, tmp: Path) -> dict[str, Any]:
    blank = tmp / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    page = new_page(b, blank)
    stats: dict[str, Any] = page.evaluate(PIXEL_QUERY % base64.b64encode(png).decode())
    return stats


def check_page(page: Page, bundle: dict[str, Any], url: str) -> None:
    log = page.log
    assert log.problems() == [], log.problems()
    # The document itself is the only request: nothing else was fetched.
    assert log.requests == [url], log.requests
    dom = page.evaluate(DOM_QUERY)
    assert set(dom) == {i["id"] for i in bundle["incidents"]}
    for inc in bundle["incidents"]:
        d = dom[inc["id"]]
        assert d["visible"]
        assert d["verdict"] == inc["verdict"]
        assert d["parts"] == ["story", "pace", "throughput", "evidence", "cost", "action", "check"]
        want_markers = [[m["marker"], m["window"]] for m in inc["markers"]]
        iid = inc["id"]
        pace = d["plots"][f"pace-{iid}"]
        assert pace["plot"] == "pace" and pace["w"] > 300 and pace["h"] > 100
        assert set(pace["series"]) == {"peers", "subject"}
        # Drawn, not only present: the peers' band has an area, the subject a length.
        assert pace["series"]["peers"]["w"] > 100 and pace["series"]["peers"]["h"] > 1
        assert pace["series"]["subject"]["w"] > 0 or pace["series"]["subject"]["h"] > 0
        assert pace["markers"] == want_markers
        for key, name in (("step", "step_ms"), ("tput", "samples_per_s")):
            p = d["plots"][f"{key}-{iid}"]
            assert set(p["series"]) == {name} and p["series"][name]["w"] > 100
            assert p["markers"] == want_markers
        tele = drawn_bars(inc)
        if tele:
            p = d["plots"][f"telemetry-{iid}"]
            assert set(p["series"]) == tele
        else:
            assert f"telemetry-{iid}" not in d["plots"]


def test_report_in_chromium(browser: Browser, tmp_path: Path) -> None:
    bundle = contract_bundle()
    html = tmp_path / "flagship-sim.html"
    html.write_text(render(bundle), encoding="utf-8")
    page = new_page(browser, html)
    check_page(page, bundle, html.resolve().as_uri())
    png = page.screenshot(1100)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "contract-bundle.png").write_bytes(png)
    (tmp_path / "report.png").write_bytes(png)
    stats = pixel_stats(browser, png, tmp_path)
    (ARTIFACTS / "contract-bundle.json").write_text(json.dumps(stats))
    assert stats["w"] == 1100 and stats["h"] > 2000
    # Mostly white paper with ink: a blank or single-colour page fails both.
    assert stats["variance"] > 100.0, stats
    assert stats["colours"] > 50, stats


def test_a_cpu_jobs_report_in_chromium(browser: Browser, tmp_path: Path) -> None:
    """A CPU job's page (issue 31, item 9): every part drawn, the throughput in steps/s
    (no global batch known), no bar for two near-zero percentages, CPU-hours."""
    bundle = cpu_bundle()
    html = tmp_path / "cpu-job.html"
    html.write_text(render(bundle), encoding="utf-8")
    page = new_page(browser, html)
    check_page(page, bundle, html.resolve().as_uri())  # tput drawn: steps/s from step time
    inc = bundle["incidents"][0]
    dom = page.evaluate(DOM_QUERY)[inc["id"]]
    assert set(dom["plots"][f"telemetry-{inc['id']}"]["series"]) == {"cpu_pct", "gap_busy_pct"}
    text = page.evaluate("document.body.innerText")
    assert "CPU-hours" in text and "GPU-hours" not in text
    assert "steps/s" in text and "not measured" not in text
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "cpu-job.png").write_bytes(page.screenshot(1100))


def test_blank_page_measures_blank(browser: Browser, tmp_path: Path) -> None:
    """The pixel check can fail: a page with nothing on it measures as blank."""
    empty = tmp_path / "empty.html"
    empty.write_text("<!DOCTYPE html><html><body style='background:#fff'></body></html>")
    png = new_page(browser, empty).screenshot(400, max_height=300)
    stats = pixel_stats(browser, png, tmp_path)
    assert stats["variance"] < 1e-6 and stats["colours"] == 1, stats


def test_console_errors_and_requests_are_seen(browser: Browser, tmp_path: Path) -> None:
    """The checks above can fail: a page that fetches something or logs an error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><head>"
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "script-src 'unsafe-inline'\">"
        '</head><body><img src="http://127.0.0.1:9/x.png">'
        "<script>console.error('boom')</script></body></html>"
    )
    problems = new_page(browser, bad).log.problems()
    assert any("boom" in p for p in problems), problems
    assert any("Content Security Policy" in p or "x.png" in p for p in problems), problems


@pytest.mark.slow
def test_report_of_a_real_simulated_run(browser: Browser, tmp_path: Path) -> None:
    """The whole path: `artemis sim` of the rebalancing scenario (real plugin, agent and
    coordinator, its store next to the findings), `artemis report`, the page in Chromium."""
    run = tmp_path / "run"
    sim = subprocess.run(
        [
            str(ARTEMIS), "sim", "--scenario", str(REPO / "sim" / "scenarios" / "rebalance.toml"),
            "--jsonl", str(run / "findings.jsonl"), "--plans-jsonl", str(run / "plans.jsonl"),
        ],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr[-3000:]
    assert (run / "artemis.db").is_file()
    rep = subprocess.run(
        [str(ARTEMIS), "report", "--findings", str(run / "findings.jsonl"), "--out", str(run)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr
    (bundle,) = bundles_from_findings(run / "findings.jsonl")
    job = bundle["job"]["job"]
    # Rank 1's clocks drop at window 8 and the job rebalances away from it: one incident,
    # with its plan, its markers through `verified`, and the rows to draw it.
    (inc,) = bundle["incidents"]
    assert inc["rank"] == 1 and inc["cause"]["kind"] == "clocks"
    assert [a["status"] for a in inc["actions"] if a["type"] == "plan"] == ["verified"]
    # issue 29: the default corrections = "recommend" names the fix, and runs nothing
    fixes = [(a["action"], a["status"]) for a in inc["actions"] if a["type"] == "correction"]
    assert fixes == [("reset_clocks", "recommended")]
    kinds = [m["marker"] for m in inc["markers"]]
    assert kinds[:3] == ["onset", "flagged", "confirmed"] and "applied" in kinds
    assert bundle["windows"] and bundle["subjects"][inc["id"]]
    page_path = run / f"{job}.html"
    page = new_page(browser, page_path)
    check_page(page, bundle, page_path.resolve().as_uri())
    png = page.screenshot(1100)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "rebalance-sim.png").write_bytes(png)
    stats = pixel_stats(browser, png, tmp_path)
    assert stats["variance"] > 100.0 and stats["colours"] > 50, stats
