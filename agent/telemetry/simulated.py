"""Telemetry the simulator makes up for its ranks, read back like a real source.

File format (written by the simulator, read here)
-------------------------------------------------
One JSON file per rank at ``<shm_dir>/<job>.simtel.r<rank>.json``::

    {
      "base": {"vendor": "nvidia", "gpu_model": "NVIDIA H100 80GB HBM3",
               "sm_mhz": 1980, "sm_mhz_max": 1980, "temp_c": 62,
               "throttle": {"sw_power_cap": false}, ...},
      "segments": [
        {"start_window": 16, "end_window": null,
         "fields": {"sm_mhz": 1110, "throttle": {"hw_thermal": true}}}
      ]
    }

Field names are those of ``records.Telemetry``; a
field absent from both base and the covering segments is reported missing.
``sample(target)`` returns ``base`` overlaid with every segment whose
``[start_window, end_window)`` covers ``target.window`` (``end_window`` null:
to the end), in file order, later segments winning; ``throttle`` dicts are
merged reason by reason rather than replaced. A field set to null in a
segment removes it (the fault makes that signal unavailable).

The simulator should write the file atomically (write a temporary file in the
same folder, then ``os.replace``). The source re-reads it when its mtime or
size changes; if a read fails to parse, the last good content is used, and with
none the sample raises (``collect`` then reports the fields missing). A missing
file means the simulator gives this rank no telemetry: an empty sample.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from artemis.agent.telemetry.base import RankTarget


def sim_telemetry_path(shm_dir: str | os.PathLike[str], job: str, rank: int) -> Path:
    return Path(shm_dir) / f"{job}.simtel.r{rank}.json"


def overlay(doc: dict[str, Any], window: int) -> dict[str, object]:
    """base overlaid with the segments covering ``window`` (pure)."""
    out: dict[str, object] = dict(doc.get("base") or {})
    for seg in doc.get("segments") or []:
        lo = int(seg.get("start_window", 0))
        hi = seg.get("end_window")
        if window < lo or (hi is not None and window >= int(hi)):
            continue
        for k, v in (seg.get("fields") or {}).items():
            if v is None:
                out.pop(k, None)
            elif k == "throttle" and isinstance(v, dict) and isinstance(out.get(k), dict):
                out[k] = {**out[k], **v}  # type: ignore[dict-item]
            else:
                out[k] = v
    return out


class SimulatedSource:
    """Reads the per-rank telemetry files the simulator writes."""

    name = "simulated"

    def __init__(self, shm_dir: str | os.PathLike[str], job: str | None = None) -> None:
        self.shm_dir = Path(shm_dir)
        self.job = job  # default job; a target's own job takes precedence
        self._cache: dict[tuple[str, int], tuple[tuple[int, int], dict[str, Any]]] = {}

    def _doc(self, job: str, rank: int) -> dict[str, Any] | None:
        path = sim_telemetry_path(self.shm_dir, job, rank)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._cache.get((job, rank))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            doc = json.loads(path.read_text())
            if not isinstance(doc, dict):
                raise ValueError(f"{path}: top level is not an object")
        except (OSError, ValueError) as exc:
            if cached is not None:
                return cached[1]  # a torn write: keep the last good content
            raise ValueError(f"unreadable simulator telemetry {path}: {exc}") from exc
        self._cache[(job, rank)] = (stamp, doc)
        return doc

    def software(self, target: RankTarget) -> dict[str, str]:
        """The rank's software fingerprint components the simulator wrote (its scenario's
        [software]: driver, cuda, torch, kernel, gpu_model), for agent/fingerprint.py."""
        job = target.job or self.job
        doc = self._doc(job, target.rank) if job else None
        sw = doc.get("software") if doc is not None else None
        if not isinstance(sw, dict):
            return {}
        return {str(k): v for k, v in sw.items() if isinstance(v, str) and v}

    def sample(self, target: RankTarget) -> dict[str, object]:
        job = target.job or self.job
        if not job:
            raise ValueError("SimulatedSource needs a job (from the target or the constructor)")
        doc = self._doc(job, target.rank)
        return {} if doc is None else overlay(doc, target.window)
