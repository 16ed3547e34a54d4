"""Output of the rebalance policy: the plans file (JSONL). The plan metrics are among
the coordinator's families (coordinator/metrics.py: ``PlanMetrics``).

The plans file (``--plans-jsonl``) gets one JSON object per line at every change
of a plan's status, flushed at once so an operator tailing it sees each change
as it happens and a crash loses nothing already reported. Field names are the
DESIGN contract ("Rebalance plans"), produced by ``PlanEvent.to_dict``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

from artemis.common.diskio import JsonlAppender, Retention

from .events import PlanEvent


class PlansWriter:
    """Appends plan events to a JSONL file, one line per status change, written at once
    (through `JsonlAppender`, common/diskio.py: a full disk holds the lines in
    memory until space returns; `retention` rotates the file)."""

    def __init__(self, path: str | Path, retention: Retention | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The file exists from the start, empty while no plan was made (as before).
        with contextlib.suppress(OSError):
            self.path.touch()
        self.out: JsonlAppender | None = JsonlAppender(self.path, "plans", retention)
        self.health = self.out.health
        # The coordinator may write from its event loop and a shutdown hook alike;
        # one lock keeps lines whole.
        self._lock = threading.Lock()
        self.lines = 0

    def write(self, event: PlanEvent | dict[str, Any]) -> None:
        rec = event.to_dict() if isinstance(event, PlanEvent) else dict(event)
        line = json.dumps(rec, separators=(",", ":"), allow_nan=False)
        with self._lock:
            if self.out is None:
                raise ValueError(f"plans file {self.path} is closed")
            self.out.write_lines([line])
            self.lines += 1

    def retry(self) -> None:
        with self._lock:
            if self.out is not None:
                self.out.retry()

    def write_all(self, events: list[PlanEvent]) -> None:
        for e in events:
            self.write(e)

    def close(self) -> None:
        with self._lock:
            if self.out is not None:
                self.out.close()
                self.out = None

    def __enter__(self) -> PlansWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
