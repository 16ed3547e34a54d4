"""The agent's Prometheus metrics (optional: `metrics_port`): its uplink, read when scraped.

What a node says about its own link to the coordinator, which the coordinator
cannot see while the link is down: whether it is up, how many outages it had
and for how long in all (the outage now included), connections dropped for
taking data without acknowledging it, and what it keeps for the coordinator
meanwhile (docs/DESIGN.md "Metrics", docs/RELIABILITY.md "Network partitions").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from artemis.protocol.client import LinkStats
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class _LinkCollector:
    def __init__(self, host: str, stats: Callable[[], LinkStats], sent: Callable[[], int]) -> None:
        self.host = host
        self.stats = stats
        self.sent = sent

    def collect(self) -> Iterator[Metric]:
        st = self.stats()
        h = [self.host]

        def gauge(name: str, text: str, v: float) -> Metric:
            g = GaugeMetricFamily(name, text, labels=["host"])
            g.add_metric(h, v)
            return g

        def counter(name: str, text: str, v: float) -> Metric:
            c = CounterMetricFamily(name, text, labels=["host"])
            c.add_metric(h, v)
            return c

        yield gauge(
            "straggler_agent_uplink_up", "1 while connected to the coordinator", st.connected
        )
        yield counter(
            "straggler_agent_uplink_outages",
            "Established connections to the coordinator that were lost",
            st.outages,
        )
        yield counter(
            "straggler_agent_uplink_down_seconds",
            "Seconds without a connection to the coordinator since the first (the outage now included)",
            st.down_seconds(),
        )
        yield counter(
            "straggler_agent_uplink_stalls",
            "Connections dropped for taking data without acknowledging it (uplink_stall_s)",
            st.stalls,
        )
        yield gauge(
            "straggler_agent_outbox_buffered",
            "Messages kept until the coordinator acknowledges them",
            st.buffered,
        )
        yield counter(
            "straggler_agent_outbox_dropped",
            "Messages dropped because the outbox was full (buffer_max)",
            st.dropped,
        )
        yield counter(
            "straggler_agent_windows_sent",
            "Rank-window summaries handed to the uplink",
            self.sent(),
        )

    def describe(self) -> list[Any]:
        return []


def serve_metrics(
    host: str, stats: Callable[[], LinkStats], sent: Callable[[], int], port: int, addr: str
) -> tuple[Any, Any]:
    """Serve the metrics at http://addr:port/metrics; (server, thread), for shutdown."""
    reg = CollectorRegistry()
    reg.register(_LinkCollector(host, stats, sent))
    return start_http_server(port, addr=addr, registry=reg)
