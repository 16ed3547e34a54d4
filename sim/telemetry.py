"""Simulated telemetry: what each rank's GPU and host read, healthy or faulty.

Written once per rank before the run as `<shm_dir>/<job>.simtel.r<rank>.json`
(the format artemis.agent.telemetry.simulated reads): a base reading plus
segments that override fields for a span of windows.

Healthy ranks differ naturally: each GPU has its own cooling (temperature a
few degrees apart), boost clock (a little below its max) and power draw, and
power and temperature follow the clock. A fault's readings come from its
physical state (`physics.fault_state`): a thermal fault holds the die at the
regulator's limit and the clocks fall; a power cap lowers the limit, the GPU
draws what the limit allows and the clocks fall; locked clocks lower power
and temperature with them; a host fault gives the rank's process a smaller
share of the CPU it needs, so its CPU time falls, the run queue grows and the
process waits runnable for the rest (its run delay). Every rank's cgroup has no
CPU quota (throttled 0%); a healthy rank's run delay is a little of its time.
No reading is copied from a diagnosis threshold.

With `telemetry_noise` > 0 (or a fault that ramps or comes and goes) every
window gets its own segment: each reading is the mean of the window's
`SAMPLES_PER_WINDOW` samples, each with relative sd `telemetry_noise`, as the
agent averages its samples over a window. Healthy wander (boost clocks,
load) varies per window too.

The base reading carries no GPU identity, hardware error or NIC counter
fields: a simulated rank reports them missing, as a node without those
sources would, unless a fault model sets them (`hardware` sets the GPU's
error counts for the windows it covers, as increases in the window).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from artemis.sim.physics import FaultState, fault_state
from artemis.sim.scenario import Fault, Scenario

VENDOR_OF_ISLAND = {"nvidia": "nvidia", "amd": "amd"}
SM_MAX = {"nvidia": 1980.0, "amd": 2100.0}
POWER_LIMIT = {"nvidia": 700.0, "amd": 750.0}
SAMPLES_PER_WINDOW = 10  # agent samples averaged into one window's reading
STATIC_POWER = 0.3  # share of a GPU's draw that does not scale with its clock
C_PER_W = 0.06  # die temperature rise per watt above the rank's healthy draw
NOISY = ("sm_mhz", "temp_c", "power_w", "cpu_pct", "iowait_pct", "psi_cpu_some", "load1")
NOISY_PROC = ("proc_cpu_pct",)
TEL_KINDS = ("clocks", "thermal", "power", "pcie", "host", "hardware")


def base_reading(sc: Scenario, rank: int, rng: np.random.Generator) -> dict[str, Any]:
    # The run delay draws from its own stream: the shared one keeps its sequence,
    # so every other reading stays what it was.
    delay_rng = np.random.default_rng([sc.seed, 0x5C4ED, rank])
    vendor = VENDOR_OF_ISLAND.get(sc.islands[rank], "nvidia")
    model = sc.software_of(rank)["gpu_model"]  # its class, the vendor's model, or [software]
    sm_max = SM_MAX[vendor]
    limit = POWER_LIMIT[vendor]
    return {
        "vendor": vendor,
        "gpu_model": model,
        "gpu_index": rank % sc.ranks_per_host,
        "sm_mhz": round(sm_max - float(rng.uniform(0, 15)), 1),
        "sm_mhz_max": sm_max,
        "mem_mhz": 2619.0 if vendor == "nvidia" else 1300.0,
        "temp_c": round(float(rng.normal(62.0, 2.0)), 1),
        "power_w": round(limit * float(rng.uniform(0.62, 0.72)), 1),
        "power_limit_w": limit,
        "power_limit_default_w": limit,
        "throttle": {},
        "pcie_gen": 5,
        "pcie_gen_max": 5,
        "pcie_width": 16,
        "pcie_width_max": 16,
        "cpu_pct": round(float(rng.uniform(25, 35)), 1),
        "steal_pct": 0.0,
        "iowait_pct": round(float(rng.uniform(0.1, 0.6)), 2),
        "psi_cpu_some": round(float(rng.uniform(0.5, 2.0)), 2),
        "load1": round(float(rng.uniform(14, 20)), 2),
        "ncpu": 96,
        "proc_cpu_pct": round(float(rng.uniform(95, 105)), 1),
        "run_delay_pct": round(float(delay_rng.uniform(0.3, 1.5)), 2),
        "cg_throttled_pct": 0.0,
        "cg_nr_throttled": 0,
        "stopped_pct": 0.0,
    }


def _power_at(base: dict[str, Any], clock: float) -> float:
    # Dynamic power goes with f x V^2 and V with f in the DVFS range: about f^2.5.
    return float(base["power_w"]) * (STATIC_POWER + (1.0 - STATIC_POWER) * clock**2.5)


def state_fields(kind: str, st: FaultState, base: dict[str, Any]) -> dict[str, Any]:
    """The readings a rank in physical state `st` shows (fields that differ from `base`)."""
    if kind == "hardware":
        # XID 74 is NVIDIA's "NVLink error"; replays on a sick link slow the rank.
        return {"xid_count": 1, "xid_last": 74, "nvlink_errors": 250, "ecc_uncorrected": 0}
    out: dict[str, Any] = {}
    if st.clock < 1.0:
        out["sm_mhz"] = round(float(base["sm_mhz"]) * st.clock, 1)
        power = _power_at(base, st.clock)
        throttle: dict[str, bool] = {}
        if st.power_capped:
            # the operator's (or a BMC's) lowered limit is what the GPU now draws
            limit = round(power / 0.995, 1)
            out["power_limit_w"] = limit
            throttle["sw_power_cap"] = True
        temp = float(base["temp_c"]) - C_PER_W * (float(base["power_w"]) - power)
        if st.at_thermal_limit:
            temp = float(base["temp_c"]) + st.temp_rise_c
            throttle["sw_thermal"] = True
        out["power_w"] = round(power, 1)
        out["temp_c"] = round(temp, 1)
        out["throttle"] = throttle
    if st.pcie_lanes < int(base["pcie_width"]) or st.pcie_gen < int(base["pcie_gen"]):
        out["pcie_width"] = st.pcie_lanes
        out["pcie_gen"] = st.pcie_gen
    if st.cpu_share < 1.0:
        q = st.cpu_share
        ncpu = float(base["ncpu"])
        # Runnable threads beyond the cores: each gets cores / runnable of a CPU,
        # so the run queue is what makes the process's share q; the time its
        # threads wait for a CPU is the pressure.
        out["load1"] = round(max(float(base["load1"]), ncpu / q), 2)
        out["cpu_pct"] = 99.5
        out["psi_cpu_some"] = round(max(float(base["psi_cpu_some"]), 100.0 * (1.0 - q)), 2)
        out["proc_cpu_pct"] = round(float(base["proc_cpu_pct"]) * q, 1)
        # Runnable all along, it runs q of the time and waits the rest: a process
        # that ran proc_cpu_pct of a core now waits that x (1 - q) of the time.
        out["run_delay_pct"] = round(
            float(base["run_delay_pct"]) + float(base["proc_cpu_pct"]) * (1.0 - q), 2
        )
    return out


def fault_fields(kind: str, slowdown: float, base: dict[str, Any]) -> dict[str, Any]:
    """The readings of a fault of `kind` at its full size, on a rank reading `base`."""
    return state_fields(kind, fault_state(kind, slowdown, 1.0, float(base["temp_c"])), base)


def _rank_faults(sc: Scenario, rank: int) -> list[Fault]:
    return [f for f in sc.faults if rank in f.ranks and f.kind in TEL_KINDS]


def _window_reading(
    sc: Scenario, rank: int, w: int, base: dict[str, Any], rng: np.random.Generator
) -> dict[str, Any]:
    """One window's reading: the physical state, then healthy wander, then sampling noise."""
    fields: dict[str, Any] = {}
    for f in _rank_faults(sc, rank):
        lvl = f.level(w)
        if lvl > 0:
            fields.update(
                state_fields(f.kind, fault_state(f.kind, f.slowdown, lvl, base["temp_c"]), base)
            )
    cur = {**base, **fields}
    # Boost clocks wander a little under the max; load (and so power) moves with the step.
    if "sm_mhz" not in fields:
        cur["sm_mhz"] = min(float(base["sm_mhz_max"]), float(base["sm_mhz"]) + rng.normal(0, 4))
    sd = sc.telemetry_noise / np.sqrt(SAMPLES_PER_WINDOW)
    for k in NOISY + NOISY_PROC:
        cur[k] = float(cur[k]) * (1.0 + sd * float(rng.standard_normal()))
    cur["sm_mhz"] = min(float(cur["sm_mhz"]), float(base["sm_mhz_max"]))
    cur["power_w"] = min(float(cur["power_w"]), float(cur["power_limit_w"]))
    cur["cpu_pct"] = min(float(cur["cpu_pct"]), 100.0)
    out: dict[str, Any] = {k: round(float(cur[k]), 2) for k in NOISY + NOISY_PROC}
    # The run delay is sampled with the process's CPU time (the same noise, no
    # new draw: the shared stream keeps its sequence).
    proc = float(fields.get("proc_cpu_pct", base["proc_cpu_pct"]))
    delay = float(fields.get("run_delay_pct", base["run_delay_pct"]))
    out["run_delay_pct"] = round(delay * (float(cur["proc_cpu_pct"]) / proc if proc else 1.0), 2)
    out.update({k: v for k, v in fields.items() if k not in out})
    if "throttle" not in out:
        out["throttle"] = {}
    return out


def telemetry_plan(sc: Scenario) -> dict[int, dict[str, Any]]:
    rng = np.random.default_rng(sc.seed + 7)
    per_window = sc.telemetry_noise > 0 or any(
        f.ramp_windows > 0 or f.duty < 1.0 for f in sc.faults if f.kind in TEL_KINDS
    )
    wrng = np.random.default_rng([sc.seed, 0x7E1])
    out: dict[int, dict[str, Any]] = {}
    for r in range(sc.ranks):
        base = base_reading(sc, r, rng)
        segs: list[dict[str, Any]] = []
        if per_window:
            for w in range(sc.windows):
                fields = _window_reading(sc, r, w, base, wrng)
                segs.append({"start_window": w, "end_window": w + 1, "fields": fields})
        else:
            for f in _rank_faults(sc, r):
                fields = fault_fields(f.kind, f.slowdown, base)
                if fields:
                    segs.append(
                        {
                            "start_window": f.start_window,
                            "end_window": f.end_window,
                            "fields": fields,
                        }
                    )
        # The rank's software fingerprint, as the agent's simulated source reports it (its
        # nccl and env reach the agent through the plugin's ring, like a real job's).
        sw = sc.software_of(r)
        software = {k: sw[k] for k in ("driver", "cuda", "torch", "kernel", "gpu_model")}
        out[r] = {"base": base, "segments": segs, "software": software}
    return out


def write_telemetry(
    sc: Scenario, job: str, shm_dirs: dict[int, Path], ranks: Iterable[int] | None = None
) -> dict[int, dict[str, Any]]:
    """Write each rank's telemetry file (of ``ranks``, default all) into its host's shm
    dir (atomic replace); the plan written."""
    plan = telemetry_plan(sc)
    keep = set(plan if ranks is None else ranks)
    for r, doc in plan.items():
        if r not in keep:
            continue
        d = shm_dirs[sc.host_of(r)]
        path = d / f"{job}.simtel.r{r}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
    return plan
