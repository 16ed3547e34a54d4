"""Prometheus metrics of the detector, on a registry of their own.

`Metrics.observe_window` turns a `WindowResult` into gauges and counters;
`serve` exposes the registry on HTTP from a thread of its own, so a scrape
never runs on the coordinator's event loop. Other parts of the coordinator
register their own metrics on `Metrics.registry`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from artemis.coordinator.detector import WindowResult
from artemis.coordinator.findings import Finding
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Scoring a window takes well under a second; buckets from 100 us to 2.5 s.
SCORING_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.pace = Gauge(
            "straggler_rank_pace_ratio",
            "Rank compute gap over the median of the other ranks of its island "
            "(own warm-up history where the island is too small)",
            ["rank", "island"],
            registry=reg,
        )
        self.flagged = Gauge(
            "straggler_flagged",
            "1 while a finding is flagged (until cleared), else 0",
            ["kind", "subject"],
            registry=reg,
        )
        self.step_ms = Gauge(
            "straggler_step_ms", "Median step time of the last window (ms)", registry=reg
        )
        self.findings = Counter(
            "straggler_findings",
            "Finding reports by kind and state",
            ["kind", "state"],
            registry=reg,
        )
        self.missing = Gauge(
            "straggler_missing_ranks", "Ranks without a record in the last window", registry=reg
        )
        self.active = Gauge(
            "straggler_detector_active", "1 while the detector is scoring", registry=reg
        )
        self.gpu_hours = Counter(
            "straggler_gpu_hours_lost",
            "GPU-hours lost to confirmed findings (every GPU waiting on the slow part)",
            registry=reg,
        )
        self.windows = Counter("straggler_windows_scored", "Windows scored", registry=reg)
        self.scoring = Histogram(
            "straggler_scoring_seconds",
            "Time to score one window",
            buckets=SCORING_BUCKETS,
            registry=reg,
        )
        self.last_window = Gauge(
            "straggler_last_window", "Index of the last window scored", registry=reg
        )
        # The flagged-now view (Grafana table, alerts): one series per finding
        # while it is flagged or ongoing, removed when it clears.
        self.finding_info = Gauge(
            "straggler_finding_info",
            "1 while a finding is flagged or ongoing; labels say what, since when and why",
            ["kind", "subject", "since", "cause"],
            registry=reg,
        )
        self.finding_loss = Gauge(
            "straggler_finding_loss_pct",
            "Share of each step the finding costs (%), while it lasts",
            ["kind", "subject"],
            registry=reg,
        )
        self.finding_excess = Gauge(
            "straggler_finding_excess_seconds",
            "Extra time per step the finding costs (seconds), while it lasts",
            ["kind", "subject"],
            registry=reg,
        )
        self._info_labels: dict[tuple[str, str], tuple[str, str, str, str]] = {}
        self._pace_labels: dict[str, set[tuple[str, str]]] = {}
        self._hours_seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def observe_window(self, result: WindowResult, scoring_seconds: float) -> None:
        with self._lock:
            labels = {(str(r), result.islands.get(r, "")) for r in result.pace}
            # A rank that moved island or stopped reporting must not leave a stale series.
            for old in self._pace_labels.get(result.job, set()) - labels:
                with contextlib.suppress(KeyError):
                    self.pace.remove(*old)
            for r, v in result.pace.items():
                self.pace.labels(str(r), result.islands.get(r, "")).set(v)
            self._pace_labels[result.job] = labels
            self._observe_findings(result.findings)
            if result.step_ms == result.step_ms:  # not NaN
                self.step_ms.set(result.step_ms)
            self.missing.set(len(result.missing))
            # The result carries the job's running total; the counter takes the increase.
            delta = result.gpu_hours_lost - self._hours_seen.get(result.job, 0.0)
            if delta > 0:
                self.gpu_hours.inc(delta)
                self._hours_seen[result.job] = result.gpu_hours_lost
            self.windows.inc()
            self.scoring.observe(max(0.0, scoring_seconds))
            self.last_window.set(result.window)

    def observe_findings(self, findings: list[Finding]) -> None:
        """Findings that come outside a window's scoring (hangs, missing ranks)."""
        with self._lock:
            self._observe_findings(findings)

    def _observe_findings(self, findings: list[Finding]) -> None:
        for f in findings:
            self.findings.labels(f.kind, f.state).inc()
            key = (f.kind, f.subject)
            if f.state in ("flagged", "ongoing"):
                self.flagged.labels(f.kind, f.subject).set(1)
                cause = (f.cause or {}).get("kind", "") if f.cause else ""
                labels = (f.kind, f.subject, str(f.since if f.since is not None else ""), cause)
                old = self._info_labels.get(key)
                if old is not None and old != labels:
                    with contextlib.suppress(KeyError):
                        self.finding_info.remove(*old)
                self.finding_info.labels(*labels).set(1)
                self._info_labels[key] = labels
                if f.loss_pct is not None and f.loss_pct == f.loss_pct:
                    self.finding_loss.labels(*key).set(f.loss_pct)
                if f.excess_ms is not None and f.excess_ms == f.excess_ms:
                    self.finding_excess.labels(*key).set(f.excess_ms / 1000.0)
            elif f.state == "cleared":
                self.flagged.labels(f.kind, f.subject).set(0)
                old = self._info_labels.pop(key, None)
                for g, lab in (
                    (self.finding_info, old),
                    (self.finding_loss, key),
                    (self.finding_excess, key),
                ):
                    if lab is not None:
                        with contextlib.suppress(KeyError):
                            g.remove(*lab)

    def set_active(self, active: bool) -> None:
        self.active.set(1 if active else 0)

    def serve(self, port: int, addr: str = "0.0.0.0") -> MetricsServer:
        return serve(self, port, addr)


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
