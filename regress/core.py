"""The judgement of `artemis regress` runs: pure (no torch, no files, no clocks).

A *run* is a plain dict, as the store keeps it (``regress_runs``, store/schema.py v4):
``{id, node, time, hardware, fingerprint, software, device, items: {name: {benchmark,
median, p25, p75, n, samples}}, absent, verdict, healthy}``. ``judge`` compares a new
run with two baselines built from earlier runs and returns what to report:

- **history**: the node's own latest healthy runs with the same software fingerprint
  (at most ``BASELINE_RUNS``; stable from ``MIN_RUNS`` = 2). When the node has no
  stable baseline for its current fingerprint, its latest stable baseline of another
  fingerprint stands in: that is how a driver, library or configuration change is seen.
- **peers**: the latest healthy run of each other node of the same hardware class
  (from ``MIN_PEERS`` = 2 nodes, runs at most ``PEER_MAX_AGE_S`` older than this one).

The rule (regress/README.md "The rule"), per item of a benchmark: with M the median of
the baseline runs' medians and s their largest relative distance from M (the
run-to-run noise the baseline itself shows), the item is *slower* when

  median / M > 1 + max(MARGIN, K_NOISE * s)   and   p25 > max(p75 of the baseline runs)

(MARGIN per device, ``MARGINS``: 5% on GPU, 60% on CPU, why below)
the first: the run's median is outside the baseline's spread by a margin; the second:
most of the run's samples are slower than most of every baseline run's (a burst
inside one run does not move its lower quartile). A benchmark is slower when at least
``PERSIST`` of its items are (the slowdown persists over the sweep, not one size).
A slower benchmark gives a finding: kind ``regression`` (cause ``unknown``) when the
baseline's fingerprint is the run's, else ``change`` with ``evidence.changed`` =
{component: [old, new]}. A run with a finding is not healthy: it never enters a
baseline (an unconfirmed slowdown never becomes the norm).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from artemis.detect.baselines import software_hash
from artemis.detect.findings import Finding, change_finding, regression_finding
from artemis.detect.fingerprint import diff, flatten

# The smallest slowdown reported, relative, per device (``--margin`` overrides it).
# GPU: 5%, so an 8% slower driver is seen on a quiet baseline (a GEMM's run-to-run
# scatter on a GPU is well below 1%). CPU: 60%: a CPU-pinned GEMM on a shared 2-vCPU
# KVM guest, the only other work on the guest kept off its CPU, moves between two
# modes 1.45x apart from run to run (the other vCPU's load; regress/README.md has the
# 30-run measurement), which two runs cannot show as scatter. On CPU the benchmark
# catches gross slowdowns (a co-scheduled hog) and exercises the whole path.
MARGINS = {"cuda": 0.05, "cpu": 0.60}
K_NOISE = 3.0  # times the baseline's own run-to-run scatter
PERSIST = 2 / 3  # share of a benchmark's items that must be slower
BASELINE_RUNS = 5  # a history baseline takes the latest healthy runs, at most these
MIN_RUNS = 2  # a baseline is stable after two runs
MIN_PEERS = 2  # peer nodes needed for a peer comparison (one could be the odd one out)
MAX_PEERS = 32
PEER_MAX_AGE_S = 7 * 86400.0


def summarise(samples: Sequence[float]) -> dict[str, Any]:
    """One item's samples -> ``{median, p25, p75, n, samples}`` (seconds per operation)."""
    a = np.asarray(samples, dtype=float)
    if a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError("an item needs finite samples")
    p25, med, p75 = (float(v) for v in np.percentile(a, [25, 50, 75]))
    return {
        "median": med,
        "p25": p25,
        "p75": p75,
        "n": int(a.size),
        "samples": [float(v) for v in a],
    }


@dataclass(frozen=True)
class Baseline:
    basis: str  # "history" | "peers"
    runs: tuple[Mapping[str, Any], ...]
    fingerprint: str  # the fingerprint the baseline was measured with
    software: Mapping[str, Any]

    @property
    def nodes(self) -> list[str]:
        return sorted({str(r["node"]) for r in self.runs})


def same_setup(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Runs measured the same way: one hardware class, device and rank count (a CPU run
    never judges a GPU run, nor a 4-rank all_reduce an 8-rank one)."""
    return all(a.get(k) == b.get(k) for k in ("hardware", "device", "ranks"))


def build_run(
    *,
    node: str,
    time: float,
    device: str,
    ranks: int,
    backend: str,
    hardware: str,
    software: Mapping[str, Any],
    samples: Mapping[str, Sequence[float]],
    benchmarks: Mapping[str, str],
    absent: Mapping[str, str],
    duration_s: float,
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """A run record (not judged yet: ``verdict`` and ``healthy`` are set by the caller)."""
    return {
        "id": f"{node}@{time:.6f}",
        "node": node,
        "time": time,
        "hardware": hardware,
        "device": device,
        "ranks": ranks,
        "backend": backend,
        "fingerprint": software_hash(software),
        "software": dict(software),
        "items": {
            name: {"benchmark": benchmarks[name], **summarise(s)} for name, s in samples.items()
        },
        "absent": dict(absent),
        "duration_s": duration_s,
        "meta": dict(meta),
        "verdict": None,
        "healthy": None,
    }


def _newest_first(runs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(runs, key=lambda r: (float(r["time"]), str(r.get("id", ""))), reverse=True)


def history_baseline(
    run: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]]
) -> Baseline | None:
    """The node's baseline for ``run`` from its ``earlier`` runs (any order)."""
    mine = [
        r
        for r in _newest_first(earlier)
        if r["node"] == run["node"]
        and r.get("healthy")
        and r.get("id") != run.get("id")
        and same_setup(r, run)
    ]
    by_fp: dict[str, list[Mapping[str, Any]]] = {}
    for r in mine:
        by_fp.setdefault(str(r["fingerprint"]), []).append(r)
    same = by_fp.get(str(run["fingerprint"]), [])
    if len(same) >= MIN_RUNS:
        chosen = same[:BASELINE_RUNS]
    else:
        # The latest stable baseline of another fingerprint: the one whose newest run
        # is the newest (by_fp keeps the newest-first order of `mine`).
        others = [v for k, v in by_fp.items() if k != run["fingerprint"] and len(v) >= MIN_RUNS]
        if not others:
            return None
        chosen = others[0][:BASELINE_RUNS]
    return Baseline(
        "history", tuple(chosen), str(chosen[0]["fingerprint"]), chosen[0].get("software") or {}
    )


def peer_baseline(run: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> Baseline | None:
    """The same-hardware peers' baseline: the latest healthy run of each other node."""
    latest: dict[str, Mapping[str, Any]] = {}
    for r in _newest_first(others):
        if (
            r["node"] == run["node"]
            or not r.get("healthy")
            or not same_setup(r, run)
            or abs(float(run["time"]) - float(r["time"])) > PEER_MAX_AGE_S
        ):
            continue
        latest.setdefault(str(r["node"]), r)
    chosen = list(latest.values())[:MAX_PEERS]
    if len(chosen) < MIN_PEERS:
        return None
    # The fingerprint most peers run (ties: the one of the newest run; `chosen` and
    # so `counts` are newest first, and max keeps the first of equal counts).
    counts: dict[str, int] = {}
    for r in chosen:
        counts[str(r["fingerprint"])] = counts.get(str(r["fingerprint"]), 0) + 1
    fp = max(counts, key=lambda k: counts[k])
    soft = next(r.get("software") or {} for r in chosen if r["fingerprint"] == fp)
    return Baseline("peers", tuple(chosen), fp, soft)


@dataclass(frozen=True)
class ItemVerdict:
    item: str
    benchmark: str
    median: float
    p25: float
    p75: float
    base_median: float
    base_p75_max: float
    scatter: float  # the baseline runs' largest relative distance from their median
    threshold: float  # the ratio above which the median is outside the noise
    ratio: float  # median / base_median
    slower: bool
    faster: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "median_s": self.median,
            "baseline_median_s": self.base_median,
            "ratio": round(self.ratio, 4),
            "threshold": round(self.threshold, 4),
            "scatter": round(self.scatter, 4),
            "p25_s": self.p25,
            "baseline_p75_max_s": self.base_p75_max,
            "slower": self.slower,
        }


@dataclass(frozen=True)
class Comparison:
    baseline: Baseline
    items: tuple[ItemVerdict, ...]
    slower_benchmarks: tuple[str, ...]
    ratios: Mapping[str, float]  # benchmark -> geometric mean of its items' ratios
    margin: float  # MARGIN of the rule, as applied

    @property
    def slower(self) -> bool:
        return bool(self.slower_benchmarks)

    @property
    def worst_ratio(self) -> float:
        vals = [self.ratios[b] for b in self.slower_benchmarks] or list(self.ratios.values())
        return max(vals) if vals else 1.0


def margin_for(run: Mapping[str, Any]) -> float:
    return MARGINS.get(str(run.get("device")), MARGINS["cuda"])


def compare(run: Mapping[str, Any], base: Baseline, margin: float | None = None) -> Comparison:
    """``run`` against ``base``, item by item (only items every baseline run has)."""
    floor = margin_for(run) if margin is None else margin
    verdicts = []
    for name, st in run["items"].items():
        if not all(name in b["items"] for b in base.runs):
            continue
        meds = [float(b["items"][name]["median"]) for b in base.runs]
        m = float(np.median(meds))
        scatter = max(abs(x / m - 1.0) for x in meds)
        thr = 1.0 + max(floor, K_NOISE * scatter)
        p75max = max(float(b["items"][name]["p75"]) for b in base.runs)
        p25min = min(float(b["items"][name]["p25"]) for b in base.runs)
        ratio = float(st["median"]) / m
        verdicts.append(
            ItemVerdict(
                item=name,
                benchmark=str(st["benchmark"]),
                median=float(st["median"]),
                p25=float(st["p25"]),
                p75=float(st["p75"]),
                base_median=m,
                base_p75_max=p75max,
                scatter=scatter,
                threshold=thr,
                ratio=ratio,
                slower=ratio > thr and float(st["p25"]) > p75max,
                faster=ratio < 1.0 / thr and float(st["p75"]) < p25min,
            )
        )
    by_bench: dict[str, list[ItemVerdict]] = {}
    for v in verdicts:
        by_bench.setdefault(v.benchmark, []).append(v)
    slower = tuple(
        b for b, vs in by_bench.items() if sum(v.slower for v in vs) >= math.ceil(PERSIST * len(vs))
    )
    ratios = {
        b: float(math.exp(sum(math.log(v.ratio) for v in vs) / len(vs)))
        for b, vs in by_bench.items()
    }
    return Comparison(base, tuple(verdicts), slower, ratios, floor)


@dataclass(frozen=True)
class Judgement:
    comparisons: tuple[Comparison, ...]
    flagged: tuple[tuple[str, Comparison], ...]  # (kind, comparison) for each finding
    history_runs: int  # healthy runs in the node's baseline (0: none yet)
    verdict: str  # "ok" | "no-baseline" | "regression" | "change"
    notes: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.flagged


def judge(
    run: Mapping[str, Any],
    earlier: Sequence[Mapping[str, Any]],
    peers: Sequence[Mapping[str, Any]] = (),
    *,
    margin: float | None = None,
) -> Judgement:
    """The run against the node's ``earlier`` runs and the same-hardware ``peers``' runs."""
    comps: list[Comparison] = []
    notes: list[str] = []
    hist = history_baseline(run, earlier)
    if hist is None:
        notes.append(f"history: no stable baseline yet (needs {MIN_RUNS} healthy runs)")
    else:
        comps.append(compare(run, hist, margin))
    peer = peer_baseline(run, peers)
    if peer is None:
        notes.append(f"peers: fewer than {MIN_PEERS} other nodes of this hardware class")
    else:
        comps.append(compare(run, peer, margin))
    flagged = tuple(
        ("regression" if c.baseline.fingerprint == run["fingerprint"] else "change", c)
        for c in comps
        if c.slower
    )
    kinds = {k for k, _ in flagged}
    verdict = (
        "change"
        if "change" in kinds
        else "regression"
        if kinds
        else "ok"
        if comps
        else "no-baseline"
    )
    n_hist = len(hist.runs) if hist is not None and hist.fingerprint == run["fingerprint"] else 0
    return Judgement(tuple(comps), flagged, n_hist, verdict, notes)


def evidence(run: Mapping[str, Any], c: Comparison) -> dict[str, Any]:
    """What a finding's ``evidence`` carries about one comparison (the ``changed`` map is
    added by the caller, from coordinator/fingerprint.diff)."""
    return {
        "node": run["node"],
        "hardware": run.get("hardware"),
        "basis": c.baseline.basis,
        "fingerprint": run["fingerprint"],
        "baseline_fingerprint": c.baseline.fingerprint,
        "baseline_runs": [r.get("id") for r in c.baseline.runs],
        "baseline_nodes": c.baseline.nodes,
        "slower_benchmarks": list(c.slower_benchmarks),
        "slower_pct": round((c.worst_ratio - 1.0) * 100.0, 2),
        "ratios": {b: round(r, 4) for b, r in c.ratios.items()},
        "rule": (
            f"median/baseline > 1 + max({c.margin}, {K_NOISE} x scatter) and p25 > the "
            f"baseline runs' p75, on >= {PERSIST:.2f} of a benchmark's items"
        ),
        "items": {v.item: v.to_json() for v in c.items},
    }


def findings_of(run: Mapping[str, Any], j: Judgement, *, window: int) -> list[Finding]:
    """The run's findings, built by the finding constructors of detect/findings.py:
    one per comparison that is slower. ``window`` numbers the node's runs (its earlier
    runs' count); ``job`` is ``regress/<node>``; the subject is the hardware class."""
    out: list[Finding] = []
    for kind, c in j.flagged:
        ev = evidence(run, c)
        ev["hw_class"] = run.get("hardware")
        ratio = c.worst_ratio
        common: dict[str, Any] = {
            "job": f"regress/{run['node']}",
            "state": "flagged",
            "window": window,
            "steps": [],
            "ranks": [],
            "hosts": [str(run["node"])],
            "since": window,
            "ratio": ratio,
            "drift": None,
            "excess_ms": None,
            # The share of the node's time the slowdown costs on this benchmark.
            "loss_pct": (1.0 - 1.0 / ratio) * 100.0 if ratio > 0 else None,
        }
        if kind == "change":
            ev["changed"] = diff(c.baseline.software, run.get("software") or {})
            out.append(change_finding(**common, evidence=ev))
        else:
            ev["checked"] = sorted(flatten(run.get("software") or {}))
            out.append(regression_finding(**common, evidence=ev))
    return out
