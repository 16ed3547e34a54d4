"""Every ``straggler_*`` Prometheus family the daemons export, said once, and the
collectors that fill them; the daemons only register them.

``FAMILIES`` names each family (help text, labels, type). ``Metrics`` holds the
detector's families, labelled with the job (``observe_window`` turns a
``WindowResult`` into them); ``register_protocol_metrics``,
``register_store_metrics`` and ``register_plan_metrics`` add the protocol
server's, the store sink's and the rebalance plans' families to its registry,
read at scrape time where the source keeps plain counters; ``LinkCollector`` is
the agent's uplink. ``serve`` exposes a registry on HTTP from a thread of its
own, so a scrape never runs on the coordinator's event loop.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from artemis.detect.findings import ACTIVE_STATES
from artemis.protocol.messages import REASONS
from artemis.protocol.peers import REFUSAL_REASONS
from artemis.rebalance.events import STATUSES
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from artemis.detect.detector import WindowResult
    from artemis.detect.findings import Finding
    from artemis.protocol.client import LinkStats
    from artemis.protocol.server import ProtocolServer
    from artemis.rebalance.policy import PlanEvent
    from artemis.store.sink import StoreSink

# Per-rank pace series of one job beyond which only the ranks farthest from the pace
# of their peers are exported (docs/DESIGN.md "Metrics"): a scrape of 100k per-rank
# series takes seconds of the coordinator's one interpreter and megabytes per scrape.
PACE_SERIES_MAX = 4096

# Scoring a window takes well under a second; buckets from 100 us to 2.5 s.
SCORING_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5)

# The outputs whose write state straggler_write_* and straggler_disk_full report (`file`).
WRITE_FILES = ("findings", "incidents", "plans", "journal", "state", "dumps", "store")

# Every family, one a line: type, name (a counter's without the _total of its samples),
# labels ("-": none) and help text.
_TABLE = """
# The detector (Metrics), by job.
gauge     straggler_rank_pace_ratio               job,rank,island          Rank compute gap over the median of the other ranks of its island (own warm-up history where the island is too small)
gauge     straggler_flagged                       job,kind,subject         1 while a finding is flagged (until cleared), else 0
gauge     straggler_step_ms                       job                      Median step time of the last window (ms)
counter   straggler_findings                      job,kind,state           Finding reports by kind and state
gauge     straggler_missing_ranks                 job                      Ranks without a record in the last window
gauge     straggler_detector_active               -                        1 while the detector is scoring
counter   straggler_gpu_hours_lost                job                      GPU-hours lost to confirmed findings (every GPU waiting on the slow part)
counter   straggler_windows_scored                job                      Windows scored
counter   straggler_windows_dropped               job,reason               Rank-window summaries dropped: late (their window was scored with that rank: a resend; or older than the late bound), old_run (a run of the job that a new run replaced), already_scored
counter   straggler_windows_late_scored           job                      Rank-window summaries that came after their window's deadline and were scored against that window's own peers
histogram straggler_scoring_seconds               job                      Time to score one window
counter   straggler_clock_anomalies               job,reason               Device-clock anomalies in the ranks' records, corrected or left out of the timings: reversed, jump, wrap, reset (the agents') and rate (a rank whose clock runs at the wrong rate, rescaled here), in rank-windows
gauge     straggler_last_window                   job                      Index of the last window scored
# The flagged-now view (Grafana table, alerts): one series per finding
# while it is flagged or ongoing, removed when it clears.
gauge     straggler_finding_info                  job,kind,subject,since,cause 1 while a finding is flagged or ongoing; labels say what, since when and why
gauge     straggler_finding_loss_pct              job,kind,subject         Share of each step the finding costs (%), while it lasts
gauge     straggler_finding_excess_seconds        job,kind,subject         Extra time per step the finding costs (seconds), while it lasts
# Incidents (docs/DESIGN.md "Incidents"): a counter of closed ones by verdict, and
# two gauges for the open ones only, removed when an incident closes, so the
# series stay as many as the incidents open at once.
counter   straggler_incidents                     job,kind,verdict         Incidents closed, by kind and verdict
gauge     straggler_incident_open                 job,kind,subject,cause   1 while an incident is open; labels say what and the cause
gauge     straggler_incident_gpu_hours_lost       job,incident             GPU-hours an open incident has cost so far
# With report_dir set (the coordinator writes each job's report there at its
# end), each open incident also has a series naming where its report will be,
# for the dashboard's annotation (grafana/: "Incident report").
gauge     straggler_incident_report               job,incident,path        1 while an incident is open; `path` is its section of the job's report
# Rebalance plans (PlanMetrics), by job.
counter   straggler_plans                         job,status               Rebalance plan status changes, by job and status
gauge     straggler_throughput_samples_per_second job,phase                Useful throughput (samples/s) measured before and after the job's latest plan
counter   straggler_plan_escalations              job                      Plans rolled back because throughput did not recover, by job
gauge     straggler_plan_active                   job                      1 while a verified uneven split is in force for the job, else 0
# The protocol server and the assembler (register_protocol_metrics).
counter   straggler_protocol_frames               -                        Frames received
counter   straggler_protocol_bad_frames           reason                   Bad frames by reason
counter   straggler_protocol_refused_peers        reason                   Refused peers by reason
gauge     straggler_agents_connected              -                        Authenticated agents connected
gauge     straggler_protocol_unauthenticated      -                        Connections open and not (yet) authenticated ([limits] bounds them)
counter   straggler_protocol_duplicates           -                        Resent data messages already delivered
counter   straggler_windows_late                  -                        Rank-window summaries that came after their window was released: scored late (straggler_windows_late_scored) or dropped (reason late)
counter   straggler_windows_duplicate             -                        Rank-window summaries received twice (an agent resending; ignored)
# Each output's write state (common/diskio.py; docs/RELIABILITY.md "3. Full disks").
counter   straggler_write_errors                  file,reason              Failed writes of an output (findings, journal, store, ...) by reason
counter   straggler_write_lost                    file,reason              Lines or records of an output given up (never written), by reason
gauge     straggler_disk_full                     file                     1 while the last write of an output failed
gauge     straggler_write_backlog_lines           file                     Lines held in memory until their output's disk has space again
counter   straggler_windows_not_taken             -                        Window batches refused (not acked; the agent resends) because the journal could not keep them
# The store sink's queue (store/sink.py).
counter   straggler_store_writes_dropped          -                        Store writes dropped: its queue was full (the store slow or unreachable)
gauge     straggler_store_queue_depth             -                        Store writes queued, not done
gauge     straggler_store_connected               -                        1 while the incident store is open, 0 while it is being reached (or refused)
# The coordinator fleet (coordinator/fleet.py): exported by a job's owner only.
gauge     straggler_job_owner                     job                      The lease epoch of each job this coordinator owns in its fleet (absent: owned elsewhere, or by nobody)
# The agent's uplink (agent/metrics.py serves them), by host.
gauge     straggler_agent_uplink_up               host                     1 while connected to the coordinator
counter   straggler_agent_uplink_outages          host                     Established connections to the coordinator that were lost
counter   straggler_agent_uplink_down_seconds     host                     Seconds without a connection to the coordinator since the first (the outage now included)
counter   straggler_agent_uplink_stalls           host                     Connections dropped for taking data without acknowledging it (uplink_stall_s)
gauge     straggler_agent_outbox_buffered         host                     Messages kept until the coordinator acknowledges them
counter   straggler_agent_outbox_dropped          host                     Messages dropped because the outbox was full (buffer_max)
counter   straggler_agent_windows_sent            host                     Rank-window summaries handed to the uplink
"""
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    name: (kind, text, () if labels == "-" else tuple(labels.split(",")))
    for kind, name, labels, text in (
        line.split(None, 3) for line in _TABLE.splitlines() if line and line[0] != "#"
    )
}


def declare(registry: CollectorRegistry, name: str) -> Any:
    """A labelled family of ``FAMILIES`` on ``registry``, updated as events come."""
    kind, text, labels = FAMILIES[name]
    if kind == "histogram":
        return Histogram(name, text, labels, buckets=SCORING_BUCKETS, registry=registry)
    return (Gauge if kind == "gauge" else Counter)(name, text, labels, registry=registry)


def family(name: str, samples: Iterable[tuple[Iterable[str], float]]) -> Metric:
    """A family of ``FAMILIES`` built at scrape time from (label values, value) pairs."""
    kind, text, labels = FAMILIES[name]
    fam: Metric = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
        name, text, labels=list(labels)
    )
    for values, v in samples:
        fam.add_metric(list(values), v)  # type: ignore[attr-defined]
    return fam


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
        self.flagged = declare(reg, "straggler_flagged")
        self.step_ms = declare(reg, "straggler_step_ms")
        self.findings = declare(reg, "straggler_findings")
        self.missing = declare(reg, "straggler_missing_ranks")
        self.active = declare(reg, "straggler_detector_active")
        self.gpu_hours = declare(reg, "straggler_gpu_hours_lost")
        self.windows = declare(reg, "straggler_windows_scored")
        self.dropped = declare(reg, "straggler_windows_dropped")
        self.late_scored = declare(reg, "straggler_windows_late_scored")
        self.scoring = declare(reg, "straggler_scoring_seconds")
        self.clock_anomalies = declare(reg, "straggler_clock_anomalies")
        self.last_window = declare(reg, "straggler_last_window")
        self.finding_info = declare(reg, "straggler_finding_info")
        self.finding_loss = declare(reg, "straggler_finding_loss_pct")
        self.finding_excess = declare(reg, "straggler_finding_excess_seconds")
        self.incidents_total = declare(reg, "straggler_incidents")
        self.incident_open = declare(reg, "straggler_incident_open")
        self.incident_hours = declare(reg, "straggler_incident_gpu_hours_lost")
        self.incident_report = declare(reg, "straggler_incident_report")
        self.job_owner = declare(reg, "straggler_job_owner")  # a fleet's only (else empty)
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

    def set_owner(self, job: str, epoch: int) -> None:
        """Fleet: this coordinator owns `job` at lease `epoch` (0: the job ended here)."""
        with self._lock:
            self._child(self.job_owner, job).set(epoch)

    def forget_owner(self, job: str) -> None:
        with self._lock:
            self._remove(self.job_owner, job)

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


def register_protocol_metrics(
    registry: CollectorRegistry, server: ProtocolServer, coord: Any | None = None
) -> None:
    """The protocol server's plain counters and, with the coordinator, its assembler's
    and its outputs' write state: read at scrape time."""
    registry.register(_ProtocolCollector(server, coord))


def register_store_metrics(
    registry: CollectorRegistry, sink: StoreSink, reached: Callable[[], bool] | None = None
) -> None:
    """The store sink's queue (store/sink.py), read at scrape time. `reached`: another
    user of the same store that knows it is lost sooner (a fleet's lease renewals, every
    renew_s: the sink learns it only at its next write)."""
    registry.register(_StoreCollector(sink, reached))


def register_plan_metrics(registry: CollectorRegistry) -> PlanMetrics:
    """The rebalance plans' families, by job."""
    return PlanMetrics(
        plans=declare(registry, "straggler_plans"),
        throughput=declare(registry, "straggler_throughput_samples_per_second"),
        escalations=declare(registry, "straggler_plan_escalations"),
        active=declare(registry, "straggler_plan_active"),
    )


class _ProtocolCollector:
    def __init__(self, server: ProtocolServer, coord: Any | None) -> None:
        self.server, self.coord = server, coord

    def collect(self) -> Iterator[Metric]:
        st = self.server.stats.snapshot()
        yield family("straggler_protocol_frames", [((), st["frames_total"])])
        # Every known reason is exported from the start (at 0), so rates and
        # alerts have a series before the first bad frame arrives.
        bad = {**dict.fromkeys(REASONS, 0), **st["bad_frames_total"]}
        yield family("straggler_protocol_bad_frames", (((k,), v) for k, v in sorted(bad.items())))
        refused = {**dict.fromkeys(REFUSAL_REASONS, 0), **st["refused_peers_total"]}
        yield family(
            "straggler_protocol_refused_peers", (((k,), v) for k, v in sorted(refused.items()))
        )
        yield family("straggler_agents_connected", [((), st["established"])])
        yield family("straggler_protocol_unauthenticated", [((), st["unauthenticated"])])
        yield family("straggler_protocol_duplicates", [((), st["duplicates_total"])])
        coord = self.coord
        if coord is not None:
            yield family("straggler_windows_late", [((), coord.assembler.late)])
            yield family("straggler_windows_duplicate", [((), coord.assembler.duplicates)])
            yield from _write_health(coord)

    def describe(self) -> list[Metric]:
        return []


def _write_health(coord: Any) -> Iterator[Metric]:
    """straggler_write_* and straggler_disk_full: each output's write state."""
    health = coord.write_health()
    yield family(
        "straggler_write_errors",
        (((h.label, r), n) for h in health for r, n in sorted(h.errors.items())),
    )
    yield family(
        "straggler_write_lost",
        (((h.label, r), n) for h in health for r, n in sorted(h.lost.items())),
    )
    yield family("straggler_disk_full", (((h.label,), 1.0 if h.failing else 0.0) for h in health))
    yield family("straggler_write_backlog_lines", (((h.label,), float(h.backlog)) for h in health))
    yield family("straggler_windows_not_taken", [((), coord.refused_batches)])


class _StoreCollector:
    def __init__(self, sink: StoreSink, reached: Callable[[], bool] | None = None) -> None:
        self.sink = sink
        self.reached = reached

    def collect(self) -> Iterator[Metric]:
        sink = self.sink
        yield family("straggler_store_writes_dropped", [((), sink.dropped)])
        yield family("straggler_store_queue_depth", [((), sink.depth)])
        if sink.url is not None:  # a store configured (none with store = "off")
            up = sink.connected and (self.reached is None or self.reached())
            yield family("straggler_store_connected", [((), 1 if up else 0)])

    def describe(self) -> list[Metric]:
        return []


class PlanMetrics:
    """Prometheus series for rebalance plans, registered on one registry, by job: every
    series carries a ``job`` label, taken from the event, so two jobs on one coordinator
    never share a series and one job's clean-up (``forget``) leaves the others alone."""

    def __init__(
        self, plans: Counter, throughput: Gauge, escalations: Counter, active: Gauge
    ) -> None:
        self.plans = plans  # straggler_plans_total{job,status}
        self.throughput = throughput  # straggler_throughput_samples_per_second{job,phase}
        self.escalations = escalations  # straggler_plan_escalations_total{job}
        self.active = active  # straggler_plan_active{job}: 1 while on an uneven split
        self._jobs: set[str] = set()

    def add_job(self, job: str) -> None:
        """Make the job's series visible at 0 before its first plan."""
        if job in self._jobs:
            return
        self._jobs.add(job)
        for s in STATUSES:
            self.plans.labels(job=job, status=s)
        self.escalations.labels(job=job)
        self.active.labels(job=job).set(0.0)

    def forget(self, job: str) -> None:
        """Remove every series of ``job`` (it ended); other jobs' series stay."""
        if job not in self._jobs:
            return
        self._jobs.discard(job)
        for s in STATUSES:
            self.plans.remove(job, s)
        for phase in ("before", "after"):
            with contextlib.suppress(KeyError):
                self.throughput.remove(job, phase)
        self.escalations.remove(job)
        self.active.remove(job)

    def observe(self, event: PlanEvent, job: str | None = None) -> None:
        """Count ``event`` under ``job`` (default: the event's own ``job``)."""
        job = event.job if job is None else job
        self.add_job(job)
        self.plans.labels(job=job, status=event.status).inc()
        if event.throughput_before is not None:
            self.throughput.labels(job=job, phase="before").set(event.throughput_before)
        if event.throughput_after is not None:
            self.throughput.labels(job=job, phase="after").set(event.throughput_after)
        if event.escalate:
            self.escalations.labels(job=job).inc()
        if event.status == "verified":
            self.active.labels(job=job).set(0.0 if _even(event.after) else 1.0)
        elif event.status == "rolled_back":
            self.active.labels(job=job).set(0.0 if _even(event.before) else 1.0)


def _even(split: list[int]) -> bool:
    return max(split) - min(split) <= 1 if split else True


class LinkCollector:
    """The agent's own link to the coordinator, which the coordinator cannot see while
    the link is down: whether it is up, its outages and how long they lasted in all
    (the outage now included), connections dropped for taking data without
    acknowledging it, and what it keeps for the coordinator meanwhile
    (docs/DESIGN.md "Metrics", docs/RELIABILITY.md "Network partitions")."""

    def __init__(self, host: str, stats: Callable[[], LinkStats], sent: Callable[[], int]) -> None:
        self.host = host
        self.stats = stats
        self.sent = sent

    def collect(self) -> Iterator[Metric]:
        st = self.stats()
        h = (self.host,)
        yield family("straggler_agent_uplink_up", [(h, st.connected)])
        yield family("straggler_agent_uplink_outages", [(h, st.outages)])
        yield family("straggler_agent_uplink_down_seconds", [(h, st.down_seconds())])
        yield family("straggler_agent_uplink_stalls", [(h, st.stalls)])
        yield family("straggler_agent_outbox_buffered", [(h, st.buffered)])
        yield family("straggler_agent_outbox_dropped", [(h, st.dropped)])
        yield family("straggler_agent_windows_sent", [(h, self.sent())])

    def describe(self) -> list[Metric]:
        return []


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

    def describe(self) -> list[Metric]:
        return [family(self.NAME, ())]

    def collect(self) -> list[Metric]:
        fam = family(self.NAME, ())
        for job, (ranks, islands, values) in list(self._jobs.items()):
            for r, isl, v in zip(ranks.tolist(), islands.tolist(), values.tolist(), strict=True):
                fam.add_metric([job, str(r), str(isl)], v)  # type: ignore[attr-defined]
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
