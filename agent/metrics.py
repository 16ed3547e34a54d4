"""The agent's Prometheus metrics (optional: `metrics_port`): its uplink, read when scraped.

The families and their collector (``LinkCollector``) are in the one metrics module,
coordinator/metrics.py; the agent registers it and serves it here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from artemis.coordinator.metrics import LinkCollector
from artemis.protocol.client import LinkStats
from prometheus_client import CollectorRegistry, start_http_server


def serve_metrics(
    host: str, stats: Callable[[], LinkStats], sent: Callable[[], int], port: int, addr: str
) -> tuple[Any, Any]:
    """Serve the metrics at http://addr:port/metrics; (server, thread), for shutdown."""
    reg = CollectorRegistry()
    reg.register(LinkCollector(host, stats, sent))
    return start_http_server(port, addr=addr, registry=reg)
