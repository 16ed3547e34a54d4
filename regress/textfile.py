"""A regress run as Prometheus metrics, in node_exporter's textfile format.

``registry(run, judgement)`` builds them (no I/O); ``write(dir, ...)`` writes
``<dir>/artemis_regress.prom`` atomically (prometheus_client writes a temporary file
beside it, which node_exporter ignores since it does not end in ``.prom``, then
renames it over the old one), so a scrape sees the whole previous run or the whole
new one. Names and labels: regress/README.md "Metrics".
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from artemis.regress.core import Judgement
from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

FILENAME = "artemis_regress.prom"


def registry(run: Mapping[str, Any], j: Judgement) -> CollectorRegistry:
    reg = CollectorRegistry()
    node = str(run["node"])

    def g(name: str, doc: str, labels: tuple[str, ...]) -> Gauge:
        return Gauge(name, doc, ("node", *labels), registry=reg)

    secs = g("straggler_regress_seconds", "Median seconds per operation", ("benchmark", "item"))
    spread = g(
        "straggler_regress_spread_ratio",
        "Interquartile range over the median of the run's samples",
        ("benchmark", "item"),
    )
    for name, st in run["items"].items():
        secs.labels(node, st["benchmark"], name).set(st["median"])
        spread.labels(node, st["benchmark"], name).set(
            (st["p75"] - st["p25"]) / st["median"] if st["median"] else 0.0
        )
    absent = g(
        "straggler_regress_absent",
        "1 for a benchmark that did not run on this node",
        ("benchmark", "reason"),
    )
    for bench, why in (run.get("absent") or {}).items():
        absent.labels(node, bench, why).set(1)
    ratio = g(
        "straggler_regress_ratio",
        "Run median over the baseline median",
        ("benchmark", "item", "basis"),
    )
    thr = g(
        "straggler_regress_threshold_ratio",
        "The ratio above which an item is slower than the baseline's noise",
        ("benchmark", "item", "basis"),
    )
    slower = g(
        "straggler_regress_slower",
        "1 when the benchmark is slower than the baseline (the rule of regress/core.py)",
        ("benchmark", "basis"),
    )
    nruns = g("straggler_regress_baseline_runs", "Runs in the baseline compared with", ("basis",))
    for c in j.comparisons:
        basis = c.baseline.basis
        nruns.labels(node, basis).set(len(c.baseline.runs))
        for v in c.items:
            ratio.labels(node, v.benchmark, v.item, basis).set(v.ratio)
            thr.labels(node, v.benchmark, v.item, basis).set(v.threshold)
        for bench in c.ratios:
            slower.labels(node, bench, basis).set(1 if bench in c.slower_benchmarks else 0)
    found = g(
        "straggler_regress_finding",
        "1 for each finding of the node's latest run (kind change or regression)",
        ("kind", "basis"),
    )
    for kind, c in j.flagged:
        found.labels(node, kind, c.baseline.basis).set(1)
    g("straggler_regress_findings", "Findings of the node's latest run", ()).labels(node).set(
        len(j.flagged)
    )
    g(
        "straggler_regress_info",
        "The latest run's hardware class, software fingerprint hash and verdict",
        ("hardware", "fingerprint", "device", "verdict"),
    ).labels(node, run["hardware"], run["fingerprint"], run["device"], j.verdict).set(1)
    g(
        "straggler_regress_last_run_timestamp_seconds", "When the latest run ended (unix s)", ()
    ).labels(node).set(run["time"])
    g("straggler_regress_duration_seconds", "How long the latest run took", ()).labels(node).set(
        run.get("duration_s") or 0.0
    )
    return reg


def write(directory: str | Path, run: Mapping[str, Any], j: Judgement) -> Path:
    """Write the run's metrics to ``<directory>/artemis_regress.prom`` (atomic)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / FILENAME
    write_to_textfile(str(path), registry(run, j))
    return path
