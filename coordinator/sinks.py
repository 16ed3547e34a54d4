"""Sinks: where what a job's monitor returns (`MonitorOutput`) is written.

One interface, `Sink`: `write(job, out, scored_s)` takes one group of outputs
(a scored window's, a late part's, a tick's, a job's end), and `commit(job,
state)` ends the group with the job's state, so the window's state and its
outputs are committed together (here: the state file after the lines; a
database sink would write both in one transaction). `Sinks` composes them, as
dynolog's CompositeLogger composes its loggers, and is the ONE place that fixes
the order of writes: the record files first (findings, incidents, plans: a
store that fails, logged then off, never costs a line of them), then the
metrics, then the store, then the in-memory lists of the in-process detector.
The coordinator daemon (service.py), `artemis.job.Detector` and the
simulator's in-process path (sim/inproc.py) all write through it. The record files' writers (`FindingsWriter`, `IncidentsWriter`,
with the `straggler` log line of each new flag) are here too: the JSONL is
`Finding.to_json` and the incident records, both the pure core's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgpack
import structlog
from artemis.common.diskio import FileHealth, JsonlAppender, Retention
from artemis.coordinator.metrics import Metrics, PlanMetrics
from artemis.detect.findings import Finding, _clean, flag_message
from artemis.detect.monitor import MonitorOutput
from artemis.rebalance.outputs import PlansWriter
from artemis.store.sink import StoreSink

__all__ = [
    "INCIDENTS_FILE",
    "FindingsSink",
    "FindingsWriter",
    "IncidentsSink",
    "IncidentsWriter",
    "MemorySink",
    "MetricsSink",
    "PlansSink",
    "Sink",
    "Sinks",
    "StateFiles",
    "StoreOutputs",
    "WriteSink",
    "incidents_path",
    "log_flags",
]

log = structlog.get_logger("artemis.coordinator")

# --------------------------------------------------------------------------- record files
# The JSONL writers of findings and incidents (their contents are the core's:
# `Finding.to_json`, the incident records) and the `straggler` log line of a flag.

logger = logging.getLogger("straggler")


def log_flags(findings: Iterable[Finding]) -> int:
    """Log new flags to the `straggler` logger at WARNING; returns how many."""
    n = 0
    for f in findings:
        if f.state == "flagged":
            logger.warning(flag_message(f))
            n += 1
    return n


W = TypeVar("W", bound="_JsonlWriter")


class _JsonlWriter:
    """A record file: one JSON object per line, one write per batch.

    The lines go through `JsonlAppender` (common/diskio.py): on a full disk they
    wait in memory (bounded) and are written when space returns, whole lines
    only; `retention` rotates the file by size and age."""

    KIND = ""  # the file's name in the appender's logs and health

    def __init__(self, path: str | Path, retention: Retention | None = None) -> None:
        self.path = Path(path)
        self.out = JsonlAppender(self.path, self.KIND, retention)

    @property
    def health(self) -> FileHealth:
        return self.out.health

    def _write_records(self, records: Iterable[Mapping[str, Any]]) -> None:
        self.out.write_lines(
            json.dumps(rec, allow_nan=False, separators=(", ", ": ")) for rec in records
        )

    def retry(self) -> None:
        self.out.retry()

    def close(self) -> None:
        self.out.close()

    def __enter__(self: W) -> W:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FindingsWriter(_JsonlWriter):
    """Appends one JSON object per finding to `path`, one write per window."""

    KIND = "findings"

    def write(self, findings: Iterable[Finding]) -> int:
        """Write one window's findings; returns the number of findings taken."""
        batch = list(findings)
        if not batch:
            return 0
        self._write_records(f.to_json() for f in batch)
        log_flags(batch)
        return len(batch)


INCIDENTS_FILE = "incidents.jsonl"


def incidents_path(findings: str | Path) -> Path:
    """Where the incidents of a findings file go: `incidents.jsonl` in its folder."""
    return Path(findings).parent / INCIDENTS_FILE


class IncidentsWriter(_JsonlWriter):
    """Appends one JSON object per incident change (docs/DESIGN.md "Incidents"), one
    write per batch, as the findings; the coordinator and the in-process detector
    both write with it."""

    KIND = "incidents"

    def write(self, records: Iterable[Mapping[str, Any]]) -> int:
        batch = list(records)
        if not batch:
            return 0
        self._write_records(_clean(dict(rec)) for rec in batch)
        return len(batch)


# --------------------------------------------------------------------------- sinks


class Sink(Protocol):
    """One destination of a job's outputs."""

    def write(self, job: str, out: MonitorOutput, scored_s: float | None = None) -> None:
        """One group of `job`'s outputs. `scored_s`: set for a scored window (the time its
        scoring took), None for anything else (a late part, a tick, a plan ack, an end)."""

    def commit(self, job: str, state: Mapping[str, Any] | None) -> None:
        """The group is whole: `state` (JobTable.state) is the job's state that has seen
        it through (None: the job has none to keep)."""


class WriteSink:
    """A sink whose writes are whole as they are made: nothing is left to commit."""

    def commit(self, job: str, state: Mapping[str, Any] | None) -> None:
        pass


class FindingsSink(WriteSink):
    """The findings JSONL (and the `straggler` log line of each new flag)."""

    def __init__(self, writer: FindingsWriter) -> None:
        self.writer = writer

    def write(self, job: str, out: MonitorOutput, scored_s: float | None = None) -> None:
        # A scored window writes its batch even when empty (one write per window).
        if out.findings or scored_s is not None:
            self.writer.write(out.findings)


class IncidentsSink(WriteSink):
    """The incident records, `incidents.jsonl` next to the findings."""

    def __init__(self, writer: IncidentsWriter) -> None:
        self.writer = writer

    def write(self, job: str, out: MonitorOutput, scored_s: float | None = None) -> None:
        if out.incidents:
            self.writer.write(out.incidents)


class PlansSink(WriteSink):
    """Plan events, the plans JSONL, each logged (an escalation at WARNING)."""

    def __init__(self, writer: PlansWriter) -> None:
        self.writer = writer

    def write(self, job: str, out: MonitorOutput, scored_s: float | None = None) -> None:
        for ev in out.plans:
            self.writer.write({**ev.to_dict(), "job": job})
            if ev.escalate:
                log.warning(
                    "rebalance plan failed: escalating",
                    job=job,
                    plan=ev.id,
                    rank=ev.rank,
                    status=ev.status,
                    reason=ev.reason,
                )
            else:
                log.info("rebalance plan", job=job, plan=ev.id, status=ev.status, reason=ev.reason)


class MetricsSink(WriteSink):
    """The `straggler_*` series of what was written (the scored window, its findings,
    incidents, plan events)."""

    def __init__(self, metrics: Metrics, plans: PlanMetrics | None = None) -> None:
        self.metrics = metrics
        self.plans = plans

    def write(self, job: str, out: MonitorOutput, scored_s: float | None = None) -> None:
        m = self.metrics
        if scored_s is not None and out.result is not None:
            m.observe_window(out.result, scored_s)
            # the window's own findings are counted with it; the monitor's additions
            # (missing ranks, baselines) here
            extra = out.findings[len(out.result.findings) :]
            if extra:
                m.observe_findings(extra)
            m.set_active(True)
        elif out.findings:
            m.observe_findings(out.findings)
        if out.incidents:
            m.observe_incidents(out.incidents)
        if out.incident_rows:
            m.observe_incident_rows(out.incident_rows)
        if self.plans is not None:
            for ev in out.plans:
                self.plans.observe(ev)


class StoreOutputs(WriteSink):
    """The incident store: incident records and the per-window rows (the job's row is
    written by the shell with `write_job`, before the window's outputs). Each row is
    queued as written (a later issue: one transaction with the state)."""

    def __init__(self, store: StoreSink) -> None:
        self.store = store

    def write(self, job: str, out: MonitorOutput, scored_s: float | None = None) -> None:
        if out.incidents:
            self.store.write_incidents(out.incidents)
        if out.incident_rows:
            self.store.write_monitor_rows(out.incident_rows)


class MemorySink(WriteSink):
    """The outputs kept in lists (the in-process detector's `findings`, `incidents`)."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.incidents: list[dict[str, Any]] = []

    def write(self, job: str, out: MonitorOutput, scored_s: float | None = None) -> None:
        self.findings += out.findings
        self.incidents += out.incidents


class StateFiles:
    """Each job's state, one file per job in `directory`, atomically replaced (write,
    fsync-free rename) at every commit: what a restarted coordinator takes back."""

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory
        self.health = FileHealth("state")

    def open(self, directory: Path) -> None:
        self.dir = directory
        self.health.path = str(directory)

    def write(self, job: str, out: MonitorOutput, scored_s: float | None = None) -> None:
        pass

    def commit(self, job: str, state: Mapping[str, Any] | None) -> None:
        if self.dir is None or state is None:
            return
        path = self.dir / (hashlib.sha1(job.encode()).hexdigest()[:16] + ".state")
        tmp = path.with_suffix(".tmp")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(msgpack.packb(dict(state), use_bin_type=True))
            os.replace(tmp, path)
        except OSError as e:
            # The previous state file stays whole; this one is saved again after the
            # job's next window (the journal still holds what was not scored).
            self.health.failed(e)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return
        self.health.ok()

    def load(self) -> list[tuple[Path, Any]]:
        """Every saved state (path, plain data); an unreadable one is logged, skipped."""
        out: list[tuple[Path, Any]] = []
        if self.dir is None or not self.dir.exists():
            return out
        for path in sorted(self.dir.glob("*.state")):
            try:
                out.append(
                    (path, msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False))
                )
            except (OSError, ValueError, msgpack.UnpackException) as e:
                log.warning("job state unreadable: skipped", path=str(path), error=str(e))
        return out


class Sinks:
    """The composite: every sink, in the one order writes take (module docstring)."""

    def __init__(
        self,
        *,
        findings: FindingsWriter | None = None,
        incidents: IncidentsWriter | None = None,
        plans: PlansWriter | None = None,
        metrics: Metrics | None = None,
        plan_metrics: PlanMetrics | None = None,
        store: StoreSink | None = None,
        memory: MemorySink | None = None,
        state: StateFiles | None = None,
    ) -> None:
        self.findings, self.incidents, self.plans = findings, incidents, plans
        self.memory = memory
        self.store = store if store is not None else StoreSink(None)
        self.state = state if state is not None else StateFiles()
        order: list[Sink | None] = [
            None if findings is None else FindingsSink(findings),
            None if incidents is None else IncidentsSink(incidents),
            None if plans is None else PlansSink(plans),
            None if metrics is None else MetricsSink(metrics, plan_metrics),
            StoreOutputs(self.store),
            memory,
            self.state,  # last: its commit says the group is through
        ]
        self.sinks: list[Sink] = [s for s in order if s is not None]

    def write(self, job: str, out: MonitorOutput, scored_s: float | None = None) -> None:
        for s in self.sinks:
            s.write(job, out, scored_s)

    def commit(self, job: str, state: Mapping[str, Any] | None) -> None:
        for s in self.sinks:
            s.commit(job, state)

    def write_job(self, job: str, info: Mapping[str, Any] | None) -> None:
        """The job's row in the store (only its keys that changed)."""
        if info is not None and self.store.on:
            self.store.write_job(job, dict(info))

    def files(self) -> list[Path]:
        """The record files a group of outputs appends to (an intent's marks)."""
        return [w.path for w in (self.findings, self.plans, self.incidents) if w is not None]

    def writers(self) -> Iterable[FindingsWriter | IncidentsWriter | PlansWriter]:
        return [w for w in (self.findings, self.incidents, self.plans) if w is not None]

    def retry(self) -> None:
        """Lines held in memory by a full disk go out as soon as there is space."""
        for w in self.writers():
            w.retry()

    def close(self) -> None:
        self.store.close()
        for w in (self.findings, self.plans, self.incidents):
            if w is not None:
                w.close()
