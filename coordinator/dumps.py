"""Hang dumps: each rank's flight-recorder records, one JSONL file per (job, rank, comm).

Written next to the findings (`<findings>.dumps/`, or `dumps_dir`) when an agent
sends them (a hang's evidence, detect/monitor.py); old or surplus ones are pruned
by [retention]. A dump that cannot be written is counted as lost, never half left.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from artemis.common.diskio import FileHealth, prune_dir
from artemis.protocol.messages import Dump


class DumpFiles:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.health = FileHealth("dumps", str(directory))

    def write(self, d: Dump) -> Path | None:
        """The dump's file (replaced whole), or None when it could not be written."""
        path = self.dir / f"{d.job}-r{d.rank}-{d.comm}.jsonl"
        data = "".join(json.dumps(rec, separators=(",", ":")) + "\n" for rec in d.records)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(data)
        except OSError as e:
            # The hang finding goes out without this dump (named lost in the metrics).
            self.health.failed(e)
            self.health.give_up(1, "dump_not_written")
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return None
        self.health.ok()
        return path

    def prune(self, max_bytes: int, max_age_s: float, now: float) -> int:
        """Old or surplus dumps deleted; returns how many."""
        return prune_dir(self.dir, max_bytes=max_bytes, max_age_s=max_age_s, now=now)
