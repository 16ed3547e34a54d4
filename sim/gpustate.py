"""The simulated GPUs' settable state: faults a correction can end, and the path back.

A ``clocks`` fault is an SM clock someone locked low, a ``power`` fault a power
limit someone lowered below its default: settings, not fate. Before the job
starts the simulator writes each rank's settings into its control file beside the
rank's ring (``<ring path>.gpu.json``, format in
``artemis.agent.corrections.simulated``): the lock and the lowered limit of its
faults, the default limit beside it. The simulated agent's correction backend
changes that file; every host process reads every rank's file at each window
(``GpuStates.effective``), and a fault whose setting is gone stops from that
window on (and starts again if a rollback puts the setting back). The timing
(``LockstepModel``) and the telemetry (``write_telemetry``) both come from the
scenario this returns, so the effects follow the cause. A ``thermal`` fault has
no setting: nothing in the file ends it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from artemis.agent.corrections.simulated import gpu_state_path, read_gpu_state, write_gpu_state
from artemis.ring.format import ring_filename
from artemis.sim.physics import clock_ratio
from artemis.sim.scenario import Fault, Scenario
from artemis.sim.telemetry import SM_MAX, VENDOR_OF_ISLAND, fault_fields

SETTABLE = ("clocks", "power")  # the fault kinds that are a GPU setting


def main_comm(sc: Scenario, rank: int) -> tuple[str, tuple[int, ...]]:
    """The name and members of the rank's main communicator: its island's, or with
    tensor parallelism its data-parallel one (sim/hostproc.py creates them)."""
    island = sc.islands[rank]
    if sc.tp > 1:
        return f"{island}/dp{rank % sc.tp}", sc.dp_group(rank)
    return island, sc.island_ranks(island)


def control_path(sc: Scenario, job: str, run: str, shm_root: Path, rank: int) -> Path:
    """The control file of ``rank``'s GPU: beside its main ring, in its host's folder."""
    from artemis.sim.hostproc import comm_hash

    name, members = main_comm(sc, rank)
    ring = ring_filename(job, comm_hash(job, name, run), members.index(rank))
    return gpu_state_path(shm_root / sc.host_name(sc.host_of(rank)) / ring)


def initial_state(sc: Scenario, rank: int, base: dict[str, Any]) -> dict[str, Any]:
    """The rank's GPU settings as its faults made them (``base``: its telemetry base)."""
    vendor = VENDOR_OF_ISLAND.get(sc.islands[rank], "nvidia")
    state: dict[str, Any] = {
        "vendor": vendor,
        "sm_mhz_max": SM_MAX[vendor],
        "mem_mhz": base["mem_mhz"],
        "locked_sm_mhz": None,
        "power_limit_w": base["power_limit_default_w"],
        "power_limit_default_w": base["power_limit_default_w"],
    }
    for f in sc.faults:
        if rank not in f.ranks or f.kind not in SETTABLE:
            continue
        if f.kind == "clocks":
            state["locked_sm_mhz"] = round(SM_MAX[vendor] * clock_ratio(f.slowdown), 1)
        else:
            state["power_limit_w"] = fault_fields("power", f.slowdown, base)["power_limit_w"]
    return state


def write_initial(
    sc: Scenario, job: str, run: str, shm_root: Path, plan: dict[int, dict[str, Any]]
) -> None:
    """Every rank's control file, before the job starts (``plan``: the telemetry plan)."""
    for r in range(sc.ranks):
        path = control_path(sc, job, run, shm_root, r)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_gpu_state(path, initial_state(sc, r, plan[r]["base"]))


def setting_in_place(kind: str, state: dict[str, Any] | None) -> bool:
    """Whether a fault of ``kind`` still has its setting (no file: nothing changed it)."""
    if state is None:
        return True
    if kind == "clocks":
        return state.get("locked_sm_mhz") is not None
    limit, default = state.get("power_limit_w"), state.get("power_limit_default_w")
    if not isinstance(limit, int | float) or not isinstance(default, int | float):
        return True
    return bool(limit < default - 0.5)


def split(f: Fault, rank: int, off: list[list[int | None]]) -> list[Fault]:
    """The pieces of ``f`` on ``rank`` outside the windows its setting was off."""
    pieces: list[Fault] = []

    def piece(lo: int, hi: int | None) -> None:
        # back on after a rollback: at once, no second ramp
        ramp = f.ramp_windows if lo == f.start_window else 0
        pieces.append(
            dataclasses.replace(f, ranks=(rank,), start_window=lo, end_window=hi, ramp_windows=ramp)
        )

    lo: int | None = f.start_window
    for a, b in sorted(off, key=lambda iv: iv[0] or 0):
        assert a is not None
        end = a if f.end_window is None else min(a, f.end_window)
        if lo is not None and end > lo:
            piece(lo, end)
        lo = None if b is None else max(b, f.start_window)
    if lo is not None and (f.end_window is None or lo < f.end_window):
        piece(lo, f.end_window)
    return pieces


class GpuStates:
    """Reads the control files each window; the scenario as the GPUs' settings make it."""

    def __init__(self, sc: Scenario, job: str, run: str, shm_root: Path) -> None:
        self.sc = sc
        self._paths = {r: control_path(sc, job, run, shm_root, r) for r in range(sc.ranks)}
        self._watch = [
            (i, r) for i, f in enumerate(sc.faults) if f.kind in SETTABLE for r in f.ranks
        ]
        # (fault index, rank) -> [from, to) windows its setting was off (to None: still)
        self.off: dict[tuple[int, int], list[list[int | None]]] = {}

    def update(self, w: int) -> set[int]:
        """Read the files before window ``w``; the ranks whose faults changed."""
        changed: set[int] = set()
        states = {r: read_gpu_state(self._paths[r]) for r in {r for _, r in self._watch}}
        for i, r in self._watch:
            f = self.sc.faults[i]
            ivs = self.off.setdefault((i, r), [])
            open_iv = bool(ivs) and ivs[-1][1] is None
            if setting_in_place(f.kind, states[r]) == (not open_iv):
                continue
            if open_iv:
                ivs[-1][1] = w  # a rollback put the setting back
            else:
                ivs.append([w, None])  # a correction took it away
            changed.add(r)
        return changed

    def effective(self) -> Scenario:
        """The scenario with each settable fault cut where its setting was off."""
        faults: list[Fault] = []
        for i, f in enumerate(self.sc.faults):
            cut = [r for r in f.ranks if self.off.get((i, r))]
            if not cut:
                faults.append(f)
                continue
            keep = tuple(r for r in f.ranks if r not in cut)
            if keep:
                faults.append(dataclasses.replace(f, ranks=keep))
            for r in cut:
                faults.extend(split(f, r, self.off[(i, r)]))
        return dataclasses.replace(self.sc, faults=tuple(faults))
