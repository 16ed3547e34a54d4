"""Prometheus metrics of the detector, on a registry of their own.

`Metrics.observe_window` turns a `WindowResult` into gauges and counters,
labelled with the job;
`serve` exposes the registry on HTTP from a thread of its own, so a scrape
never runs on the coordinator's event loop. Other parts of the coordinator
register their own metrics on `Metrics.registry`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import numpy as np
from artemis.detect.detector import WindowResult
from artemis.detect.findings import ACTIVE_STATES, Finding
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Per-rank pace series of one job beyond which only the ranks farthest from the pace
# of their peers are exported (docs/DESIGN.md "Metrics"): a scrape of 100k per-rank
# series takes seconds of the coordinator's one interpreter and megabytes per scrape.
PACE_SERIES_MAX = 4096

# Scoring a window takes well under a second; buckets from 100 us to 2.5 s.
SCORING_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5)


class Metrics:
    """Every job-scoped series has a `job` label, so jobs sharing a coordinator never
    overwrite each other; `forget_job` removes one job's series and only those.
    Process-wide series (`straggler_detector_active`, the protocol counters) have none."""

    def __init__(
        self, registry: CollectorRegistry | None = None, pace_series_max: int = PACE_SERIES_MAX
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        # One series per rank: held as the window's arrays and turned into samples
        # only when scraped (_PaceCollector), not one labelled child per rank per window.
        self.pace = _PaceCollector(pace_series_max)
        reg.register(self.pace)
        self.flagged = Gauge(
            "straggler_flagged",
            "1 while a finding is flagged (until cleared), else 0",
            ["job", "kind", "subject"],
            registry=reg,
        )
        self.step_ms = Gauge(
            "straggler_step_ms", "Median step time of the last window (ms)", ["job"], registry=reg
        )
        self.findings = Counter(
            "straggler_findings",
            "Finding reports by kind and state",
            ["job", "kind", "state"],
            registry=reg,
        )
        self.missing = Gauge(
            "straggler_missing_ranks",
            "Ranks without a record in the last window",
            ["job"],
            registry=reg,
        )
        self.active = Gauge(
            "straggler_detector_active", "1 while the detector is scoring", registry=reg
        )
        self.gpu_hours = Counter(
            "straggler_gpu_hours_lost",
            "GPU-hours lost to confirmed findings (every GPU waiting on the slow part)",
            ["job"],
            registry=reg,
        )
        self.windows = Counter("straggler_windows_scored", "Windows scored", ["job"], registry=reg)
        self.dropped = Counter(
            "straggler_windows_dropped",
            "Rank-window summaries dropped: late (their window was scored with that rank: "
            "a resend; or older than the late bound), old_run (a run of the job that a new "
            "run replaced), already_scored",
            ["job", "reason"],
            registry=reg,
        )
        self.late_scored = Counter(
            "straggler_windows_late_scored",
            "Rank-window summaries that came after their window's deadline and were scored "
            "against that window's own peers",
            ["job"],
            registry=reg,
        )
        self.scoring = Histogram(
            "straggler_scoring_seconds",
            "Time to score one window",
            ["job"],
            buckets=SCORING_BUCKETS,
            registry=reg,
        )
        self.clock_anomalies = Counter(
            "straggler_clock_anomalies",
            "Device-clock anomalies in the ranks' records, corrected or left out of the"
            " timings: reversed, jump, wrap, reset (the agents') and rate (a rank whose"
            " clock runs at the wrong rate, rescaled here), in rank-windows",
            ["job", "reason"],
            registry=reg,
        )
        self.last_window = Gauge(
            "straggler_last_window", "Index of the last window scored", ["job"], registry=reg
        )
        # The flagged-now view (Grafana table, alerts): one series per finding
        # while it is flagged or ongoing, removed when it clears.
        self.finding_info = Gauge(
            "straggler_finding_info",
            "1 while a finding is flagged or ongoing; labels say what, since when and why",
            ["job", "kind", "subject", "since", "cause"],
            registry=reg,
        )
        self.finding_loss = Gauge(
            "straggler_finding_loss_pct",
            "Share of each step the finding costs (%), while it lasts",
            ["job", "kind", "subject"],
            registry=reg,
        )
        self.finding_excess = Gauge(
            "straggler_finding_excess_seconds",
            "Extra time per step the finding costs (seconds), while it lasts",
            ["job", "kind", "subject"],
            registry=reg,
        )
        # Incidents (docs/DESIGN.md "Incidents"): a counter of closed ones by verdict, and
        # two gauges for the open ones only, removed when an incident closes, so the
        # series stay as many as the incidents open at once.
        self.incidents_total = Counter(
            "straggler_incidents",
            "Incidents closed, by kind and verdict",
            ["job", "kind", "verdict"],
            registry=reg,
        )
        self.incident_open = Gauge(
            "straggler_incident_open",
            "1 while an incident is open; labels say what and the cause",
            ["job", "kind", "subject", "cause"],
            registry=reg,
        )
        self.incident_hours = Gauge(
            "straggler_incident_gpu_hours_lost",
            "GPU-hours an open incident has cost so far",
            ["job", "incident"],
            registry=reg,
        )
        # With report_dir set (the coordinator writes each job's report there at its
        # end), each open incident also has a series naming where its report will be,
        # for the dashboard's annotation (grafana/: "Incident report").
        self.incident_report = Gauge(
            "straggler_incident_report",
            "1 while an incident is open; `path` is its section of the job's report",
            ["job", "incident", "path"],
            registry=reg,
        )
        self.report_dir = ""
        self._incident_labels: dict[tuple[str, str], tuple[str, ...]] = {}  # (job, id) -> open
        self._info_labels: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self._hours_seen: dict[str, float] = {}
        # Every labelled series made, per job, so forget_job removes exactly those.
        self._series: dict[str, set[tuple[Any, tuple[str, ...]]]] = {}
        self._lock = threading.Lock()

    def _child(self, metric: Any, *labels: str) -> Any:
        self._series.setdefault(labels[0], set()).add((metric, labels))
        return metric.labels(*labels)

    def _remove(self, metric: Any, *labels: str) -> None:
        with contextlib.suppress(KeyError):
            metric.remove(*labels)
        self._series.get(labels[0], set()).discard((metric, labels))

    def observe_window(self, result: WindowResult, scoring_seconds: float) -> None:
        job = result.job
        with self._lock:
            # The last window's values replace the job's: a rank that moved island or
            # stopped reporting leaves no stale series.
            self.pace.set(job, result.ranks, result.island_labels, result.pace_values)
            self._observe_findings(result.findings)
            if result.step_ms == result.step_ms:  # not NaN
                self._child(self.step_ms, job).set(result.step_ms)
            self._child(self.missing, job).set(len(result.missing))
            # The result carries the job's running total; the counter takes the increase.
            delta = result.gpu_hours_lost - self._hours_seen.get(job, 0.0)
            hours = self._child(self.gpu_hours, job)
            if delta > 0:
                hours.inc(delta)
                self._hours_seen[job] = result.gpu_hours_lost
            self._child(self.windows, job).inc()
            self._child(self.scoring, job).observe(max(0.0, scoring_seconds))
            self._child(self.last_window, job).set(result.window)

    def observe_restored(self, job: str, last_window: int) -> None:
        """A job restored from an earlier life's state: its last window scored is known
        before this life scores one (a paced job waits on it: sim/hostproc.py)."""
        with self._lock:
            self._child(self.last_window, job).set(last_window)

    def observe_findings(self, findings: list[Finding]) -> None:
        """Findings that come outside a window's scoring (hangs, missing ranks)."""
        with self._lock:
            self._observe_findings(findings)

    def observe_incidents(self, records: list[dict[str, Any]]) -> None:
        """Incident records (detect/incidents.py): open ones set their series, a
        closed one removes them and counts its verdict."""
        with self._lock:
            for rec in records:
                job, ident = str(rec["job"]), str(rec["id"])
                cause = str((rec.get("cause") or {}).get("kind") or "")
                labels = (job, str(rec["kind"]), str(rec["subject"]), cause)
                old = self._incident_labels.get((job, ident))
                if old is not None and (old != labels or rec["status"] == "closed"):
                    self._remove(self.incident_open, *old)
                    del self._incident_labels[(job, ident)]
                link = self._report_link(job, ident)
                if rec["status"] == "closed":
                    self._remove(self.incident_hours, job, ident)
                    if link:
                        self._remove(self.incident_report, job, ident, link)
                    verdict = str(rec.get("verdict") or "")
                    self._child(self.incidents_total, job, str(rec["kind"]), verdict).inc()
                    continue
                self._child(self.incident_open, *labels).set(1)
                self._incident_labels[(job, ident)] = labels
                hours = (rec.get("cost") or {}).get("gpu_hours")
                self._child(self.incident_hours, job, ident).set(float(hours or 0.0))
                if link:
                    self._child(self.incident_report, job, ident, link).set(1)

    def _report_link(self, job: str, ident: str) -> str:
        if not self.report_dir:
            return ""
        from artemis.report.load import incident_link  # the one place report paths are made

        return incident_link(self.report_dir, job, ident)

    def observe_incident_rows(self, rows: list[dict[str, Any]]) -> None:
        """The per-window subject rows: an open incident's GPU-hours so far."""
        with self._lock:
            for row in rows:
                if row.get("row") != "subject" or row.get("gpu_hours") is None:
                    continue
                job, ident = str(row["job"]), str(row["incident"])
                if (job, ident) in self._incident_labels:
                    self._child(self.incident_hours, job, ident).set(float(row["gpu_hours"]))

    def observe_clock(self, job: str, counts: dict[str, int]) -> None:
        with self._lock:
            for reason, n in counts.items():
                self._child(self.clock_anomalies, job, reason).inc(n)

    def observe_late_scored(self, job: str, rows: int) -> None:
        with self._lock:
            self._child(self.late_scored, job).inc(rows)

    def observe_dropped(self, job: str, reason: str, rows: int) -> None:
        with self._lock:
            self._child(self.dropped, job, reason).inc(rows)

    def forget_job(self, job: str) -> None:
        """The job ended: remove its series (and only its series)."""
        with self._lock:
            for metric, labels in list(self._series.pop(job, set())):
                with contextlib.suppress(KeyError):
                    metric.remove(*labels)
            self.pace.forget(job)
            self._hours_seen.pop(job, None)
            for key in [k for k in self._info_labels if k[0] == job]:
                del self._info_labels[key]
            for ikey in [k for k in self._incident_labels if k[0] == job]:
                del self._incident_labels[ikey]

    def _observe_findings(self, findings: list[Finding]) -> None:
        for f in findings:
            job = f.job
            self._child(self.findings, job, f.kind, f.state).inc()
            key = (job, f.kind, f.subject)
            if f.state in ACTIVE_STATES:
                self._child(self.flagged, *key).set(1)
                cause = (f.cause or {}).get("kind", "") if f.cause else ""
                labels = (*key, str(f.since if f.since is not None else ""), cause)
                old = self._info_labels.get(key)
                if old is not None and old != labels:
                    self._remove(self.finding_info, *old)
                self._child(self.finding_info, *labels).set(1)
                self._info_labels[key] = labels
                if f.loss_pct is not None and f.loss_pct == f.loss_pct:
                    self._child(self.finding_loss, *key).set(f.loss_pct)
                if f.excess_ms is not None and f.excess_ms == f.excess_ms:
                    self._child(self.finding_excess, *key).set(f.excess_ms / 1000.0)
            elif f.state == "cleared":
                self._child(self.flagged, *key).set(0)
                old = self._info_labels.pop(key, None)
                if old is not None:
                    self._remove(self.finding_info, *old)
                self._remove(self.finding_loss, *key)
                self._remove(self.finding_excess, *key)

    def set_active(self, active: bool) -> None:
        self.active.set(1 if active else 0)

    def serve(self, port: int, addr: str = "0.0.0.0") -> MetricsServer:
        return serve(self, port, addr)


class _PaceCollector(Collector):
    """`straggler_rank_pace_ratio{job, rank, island}`: one series per rank with a finite
    pace in the job's last scored window, or, in a job with more such ranks than
    `limit`, the `limit` ranks farthest from the pace of their peers (largest
    |log ratio|, slow or fast). A prometheus_client child per rank cost a label
    lookup (and at first a new child) per rank per window, most of the
    coordinator's time at 100k ranks, and about a kilobyte per rank
    (bench/README.md "Coordinator ingest"); here a window costs a few array
    operations and a scrape builds the samples."""

    NAME = "straggler_rank_pace_ratio"
    HELP = (
        "Rank compute gap over the median of the other ranks of its island "
        "(own warm-up history where the island is too small)"
    )

    def __init__(self, limit: int = PACE_SERIES_MAX) -> None:
        self.limit = limit
        self._jobs: dict[str, tuple[Any, Any, Any]] = {}

    def set(self, job: str, ranks: Any, islands: Any, values: Any) -> None:
        ok = np.isfinite(values)
        ranks, islands, values = ranks[ok], islands[ok], values[ok]
        if values.size > self.limit:
            with np.errstate(divide="ignore", invalid="ignore"):
                far = -np.abs(np.log(np.maximum(values, 1e-300)))
            pick = np.sort(np.argpartition(far, self.limit - 1)[: self.limit])
            ranks, islands, values = ranks[pick], islands[pick], values[pick]
        self._jobs[job] = (ranks, islands, values)

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.NAME, self.HELP, labels=["job", "rank", "island"])]

    def collect(self) -> list[GaugeMetricFamily]:
        fam = GaugeMetricFamily(self.NAME, self.HELP, labels=["job", "rank", "island"])
        for job, (ranks, islands, values) in list(self._jobs.items()):
            for r, isl, v in zip(ranks.tolist(), islands.tolist(), values.tolist(), strict=True):
                fam.add_metric([job, str(r), str(isl)], v)
        return [fam]


class MetricsServer:
    """A running /metrics endpoint; call it (or `stop()`) to shut it down."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.addr: str = server.server_address[0]
        self.port: int = server.server_address[1]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __call__(self) -> None:
        self.stop()


def serve(metrics: Metrics, port: int, addr: str = "0.0.0.0") -> MetricsServer:
    """Serve `metrics.registry` at http://addr:port/metrics (port 0 picks a free one)."""
    server, thread = start_http_server(port, addr=addr, registry=metrics.registry)
    return MetricsServer(server, thread)
