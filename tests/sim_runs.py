"""Where a simulated run of the end-to-end tests writes: one folder per run holding
findings.jsonl, plans.jsonl and work/ (the daemons' configs, logs and rings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from artemis.sim.cluster import SimOptions


def sim_options(tmp: Path, **kw: Any) -> SimOptions:
    """The run's options with its outputs under `tmp`; `kw` sets the rest."""
    return SimOptions(
        jsonl=tmp / "findings.jsonl", plans_jsonl=tmp / "plans.jsonl", workdir=tmp / "work", **kw
    )
