"""The JSONL writers of findings and incidents, and the `straggler` log line of a flag.

The shell's I/O of the two record files; their contents are the pure core's
(`Finding.to_json`, detect/findings.py; the incident records, detect/incidents.py).
The coordinator and the in-process detector both write with them (coordinator/sinks.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from artemis.common.diskio import FileHealth, JsonlAppender, Retention
from artemis.detect.findings import Finding, _clean, flag_message

__all__ = [
    "INCIDENTS_FILE",
    "FindingsWriter",
    "IncidentsWriter",
    "incidents_path",
    "log_flags",
]

logger = logging.getLogger("straggler")


def log_flags(findings: Iterable[Finding]) -> int:
    """Log new flags to the `straggler` logger at WARNING; returns how many."""
    n = 0
    for f in findings:
        if f.state == "flagged":
            logger.warning(flag_message(f))
            n += 1
    return n


class FindingsWriter:
    """Appends one JSON object per finding to `path`, one write per window.

    The lines go through `JsonlAppender` (common/diskio.py): on a full disk they
    wait in memory (bounded) and are written when space returns, whole lines
    only; `retention` rotates the file by size and age."""

    def __init__(self, path: str | Path, retention: Retention | None = None) -> None:
        self.path = Path(path)
        self.out = JsonlAppender(self.path, "findings", retention)

    @property
    def health(self) -> FileHealth:
        return self.out.health

    def write(self, findings: Iterable[Finding]) -> int:
        """Write one window's findings; returns the number of findings taken."""
        batch = list(findings)
        if not batch:
            return 0
        self.out.write_lines(
            json.dumps(f.to_json(), allow_nan=False, separators=(", ", ": ")) for f in batch
        )
        log_flags(batch)
        return len(batch)

    def retry(self) -> None:
        self.out.retry()

    def close(self) -> None:
        self.out.close()

    def __enter__(self) -> FindingsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


INCIDENTS_FILE = "incidents.jsonl"


def incidents_path(findings: str | Path) -> Path:
    """Where the incidents of a findings file go: `incidents.jsonl` in its folder."""
    return Path(findings).parent / INCIDENTS_FILE


class IncidentsWriter:
    """Appends one JSON object per incident change (docs/DESIGN.md "Incidents"), one
    write per batch, through `JsonlAppender` as the findings; the coordinator and
    the in-process detector both write with it."""

    def __init__(self, path: str | Path, retention: Retention | None = None) -> None:
        self.path = Path(path)
        self.out = JsonlAppender(self.path, "incidents", retention)

    @property
    def health(self) -> FileHealth:
        return self.out.health

    def write(self, records: Iterable[Mapping[str, Any]]) -> int:
        batch = list(records)
        if not batch:
            return 0
        self.out.write_lines(
            json.dumps(_clean(dict(rec)), allow_nan=False, separators=(", ", ": ")) for rec in batch
        )
        return len(batch)

    def retry(self) -> None:
        self.out.retry()

    def close(self) -> None:
        self.out.close()

    def __enter__(self) -> IncidentsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
