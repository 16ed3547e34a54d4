"""The simulator's GPU, as a correction backend: its settable state in a control file.

File format (this module is its one definition; the simulator reads it)
-----------------------------------------------------------------------
One JSON object per simulated rank at ``<ring path>.gpu.json``, beside the rank's
ring (``gpu_state_path``)::

    {"vendor": "nvidia", "sm_mhz_max": 1980.0, "mem_mhz": 2619.0,
     "locked_sm_mhz": 1667.4,        # null: clocks unlocked (the driver chooses)
     "power_limit_w": 700.0, "power_limit_default_w": 700.0,
     "errors": {"reset_clocks": "NVML_ERROR_NO_PERMISSION: Insufficient Permissions"}}

``errors`` (optional) makes the simulated library refuse a set call (``reset_clocks``,
``restore_clocks``, ``set_power_limit``) with that text, as NVML or AMD SMI would on
a node without the privilege, or on a board without the feature: the agent's
``failed`` result carries it (tests/test_corrections_sim.py).

The simulator writes it before the job starts, with the settings its faults made
(a ``clocks`` fault locks the SM clock, a ``power`` fault lowers the limit below
its default); from then on only this backend writes it (atomically: a temporary
file in the same folder, then ``os.replace``). The simulator reads it at every
window, so a correction (and its rollback) changes the simulated GPU, and the
timing and the telemetry follow (sim/gpustate.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from artemis.agent.corrections.base import CorrectionError, GpuControl

GPU_STATE_SUFFIX = ".gpu.json"


def gpu_state_path(ring: str | os.PathLike[str]) -> Path:
    """The control file of the simulated GPU behind the rank whose ring is ``ring``."""
    return Path(os.fspath(ring) + GPU_STATE_SUFFIX)


def read_gpu_state(path: Path) -> dict[str, Any] | None:
    """The state in ``path``; None when there is none (or it cannot be parsed)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def write_gpu_state(path: Path, state: dict[str, Any]) -> None:
    """Replace ``path`` with ``state`` at once: a reader sees the old file or the new."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(state, fh)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class SimulatedControl(GpuControl):
    """The control file of one simulated rank: the first of ``rings`` (the rank's rings,
    its main ring first) that has one. ``gpu`` is not used: the file is the GPU."""

    needs_gpu = False

    def __init__(self, rings: Iterable[str | os.PathLike[str]]) -> None:
        self._candidates = [gpu_state_path(r) for r in rings]

    def _path(self) -> Path:
        for p in self._candidates:
            if p.exists():
                return p
        names = ", ".join(p.name for p in self._candidates) or "none"
        raise CorrectionError(f"simulated GPU: no control file beside the rank's rings ({names})")

    def _read(self) -> tuple[Path, dict[str, Any]]:
        path = self._path()
        doc = read_gpu_state(path)
        if doc is None:
            raise CorrectionError(f"simulated GPU: {path.name} is unreadable")
        self.vendor = str(doc.get("vendor") or "sim")
        return path, doc

    def _update(self, call: str, **changes: Any) -> None:
        path, doc = self._read()
        refused = (doc.get("errors") or {}).get(call)
        if refused:
            raise CorrectionError(f"simulated {self.vendor} library: {refused}")
        write_gpu_state(path, {**doc, **changes})

    def clock_state(self, gpu: int) -> dict[str, Any]:
        _, doc = self._read()
        locked = doc.get("locked_sm_mhz")
        sm = locked if locked is not None else doc.get("sm_mhz_max")
        return {"sm_mhz": sm, "mem_mhz": doc.get("mem_mhz"), "locked_sm_mhz": locked}

    def reset_clocks(self, gpu: int) -> None:
        self._update("reset_clocks", locked_sm_mhz=None)

    def restore_clocks(self, gpu: int, before: dict[str, Any]) -> None:
        self._update("restore_clocks", locked_sm_mhz=before.get("locked_sm_mhz"))

    def power_state(self, gpu: int) -> dict[str, Any]:
        _, doc = self._read()
        return {
            "power_limit_w": doc.get("power_limit_w"),
            "default_w": doc.get("power_limit_default_w"),
        }

    def set_power_limit(self, gpu: int, watts: float) -> None:
        self._update("set_power_limit", power_limit_w=float(watts))
