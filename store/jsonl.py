"""``JsonlIncidents``: an ``incidents.jsonl`` read as a read-only store.

For findings written with the store off: the incident records are there (the
last line of an id is its current state, docs/DESIGN.md "Incidents"), the
per-window rows are not (``job_windows`` and ``incident_windows`` are empty).
A line that is not JSON (a line cut by a crash, at the end) is skipped.
Rotated generations (``incidents.jsonl.N`` ... ``.1``, written by the
coordinator's retention, common/diskio.py) are read first, oldest first, so
an incident opened before a rotation keeps its history.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from artemis.common.diskio import rotated_paths
from artemis.store.base import Store, StoreError


class JsonlIncidents(Store):
    readonly = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.url = str(self.path)
        self.skipped = 0  # lines that were not a JSON object with an id
        latest: dict[str, dict[str, Any]] = {}
        self._job_order: dict[str, int] = {}  # jobs in the order of their first line
        try:
            for path in rotated_paths(self.path) or [self.path]:
                with open(path, encoding="utf-8") as fh:
                    for line in fh:
                        try:
                            rec = json.loads(line)
                        except ValueError:
                            self.skipped += line.strip() != ""
                            continue
                        if not isinstance(rec, dict) or not rec.get("id"):
                            self.skipped += 1
                            continue
                        latest[str(rec["id"])] = rec
                        self._job_order.setdefault(str(rec.get("job")), len(self._job_order))
        except (OSError, UnicodeDecodeError) as e:
            raise StoreError(f"{self.path}: cannot read incidents: {e}") from e
        self._latest = latest

    def _no_writes(self, *a: Any) -> None:
        raise StoreError(f"{self.path}: an incidents JSONL is read-only here")

    def write_job(self, job: str, info: dict[str, Any]) -> None:
        self._no_writes()

    def write_incident(self, record: dict[str, Any]) -> None:
        self._no_writes()

    def write_rows(
        self, job_rows: list[dict[str, Any]], incident_rows: list[dict[str, Any]]
    ) -> None:
        self._no_writes()

    def _sorted(self) -> list[dict[str, Any]]:
        first = self._job_order

        def key(r: dict[str, Any]) -> tuple[int, int, str]:
            w = (r.get("opened") or {}).get("window")
            return (first[str(r.get("job"))], -1 if w is None else int(w), str(r["id"]))

        return sorted(self._latest.values(), key=key)

    def jobs(self) -> list[dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for r in self._sorted():
            j = str(r.get("job"))
            t = (r.get("opened") or {}).get("time")
            e = out.setdefault(j, {"job": j, "first_seen": t, "updated": t, "incidents": 0})
            e["incidents"] += 1
            for k in ("opened", "confirmed", "closed"):
                tk = (r.get(k) or {}).get("time")
                if tk is not None:
                    e["updated"] = max(e["updated"] or tk, tk)
        return list(out.values())

    def incidents(self, job: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self._sorted() if job is None or r.get("job") == job]

    def incident(self, id: str) -> dict[str, Any] | None:
        return self._latest.get(id)

    def job_windows(
        self, job: str, lo: int | None = None, hi: int | None = None, *, run: str | None = None
    ) -> list[dict[str, Any]]:
        return []

    def incident_windows(self, id: str) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass
