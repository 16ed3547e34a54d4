"""Corrections the node agent applies on the coordinator's behalf (issue 29).

``base``: the narrow hardware interface (``GpuControl``) and the two actions;
``nvml``, ``amd``, ``simulated``: its backends; ``handler``: consent, the
journal that makes a redelivered correction apply at most once, and the result
the agent acknowledges with. docs/DESIGN.md "Corrections: the node side".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from artemis.agent.corrections.base import ACTIONS, CorrectionError, GpuControl
from artemis.agent.corrections.handler import CorrectionHandler
from artemis.agent.telemetry.base import RankTarget

if TYPE_CHECKING:
    from artemis.agent.config import AgentConfig

__all__ = [
    "ACTIONS",
    "CorrectionError",
    "CorrectionHandler",
    "GpuControl",
    "backend_for",
    "node_handler",
]


def backend_for(
    telemetry: Sequence[str],
    available: Iterable[str],
    rings: Iterable[str | os.PathLike[str]],
) -> GpuControl:
    """The backend for one rank: the first GPU library that works on this node
    (``available``: names of the telemetry sources whose library opened), else the
    simulator's control file beside the rank's ``rings`` when this agent reads
    simulated telemetry."""
    names = set(available)
    if "nvml" in names:
        from artemis.agent.corrections.nvml import NvmlControl

        return NvmlControl()
    if "amdsmi" in names:
        from artemis.agent.corrections.amd import AmdSmiControl

        return AmdSmiControl()
    if "simulated" in telemetry:
        from artemis.agent.corrections.simulated import SimulatedControl

        return SimulatedControl(rings)
    raise CorrectionError("no GPU library (NVML, AMD SMI) works on this node")


def node_handler(
    cfg: Callable[[], AgentConfig],
    sources: Sequence[Any],
    rings_of: Callable[[int], list[tuple[Path, int]]],
) -> CorrectionHandler:
    """The agent's handler: consent from ``cfg().policy``, the journal in
    ``cfg().state_dir``, a rank's GPU found as telemetry finds it (``rings_of(rank)``:
    its rings and their writer's pid, main ring first), a real library opened once."""
    opened: list[GpuControl] = []  # a real library's backend, opened once

    def backend(rank: int) -> GpuControl:
        if opened:
            return opened[0]
        ok = [s.name for s in sources if getattr(s, "available", lambda: (False,))()[0]]
        b = backend_for(cfg().telemetry, ok, [p for p, _ in rings_of(rank)])
        if b.needs_gpu:
            opened.append(b)
        return b

    def gpu_of(rank: int) -> int | None:
        rings = rings_of(rank)
        for src in sources if rings else ():
            find = getattr(src, "gpu_index", None)
            idx = find(RankTarget(rank=rank, pid=rings[0][1])) if find is not None else None
            if idx is not None:
                return int(idx)
        return None

    return CorrectionHandler(
        lambda: cfg().policy.allow_corrections, cfg().state_dir, backend, gpu_of
    )
