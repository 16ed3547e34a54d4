"""Simulated telemetry: what each fault would show on a real node.

Written once per rank before the run as `<shm_dir>/<job>.simtel.r<rank>.json`
(the format artemis.agent.telemetry.simulated reads): a base reading plus
segments that override fields while a fault is active. Clocks low with no
throttle reason for `clocks`; temperature and a thermal reason for `thermal`;
power at its cap for `power`; a PCIe link below its maximum for `pcie`; host CPU
contention with GPU clocks normal for `host`; XID events and NVLink errors on
one GPU for `hardware`.

The base reading carries no GPU identity, hardware error or NIC counter
fields: a simulated rank reports them missing, as a node without those
sources would, unless a fault model sets them (`hardware` sets the GPU's
error counts for the windows it covers, as increases in the window).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from artemis.sim.scenario import Scenario

VENDOR_OF_ISLAND = {"nvidia": "nvidia", "amd": "amd"}
MODEL = {"nvidia": "NVIDIA H100 80GB HBM3", "amd": "AMD Instinct MI300X"}
SM_MAX = {"nvidia": 1980.0, "amd": 2100.0}
POWER_LIMIT = {"nvidia": 700.0, "amd": 750.0}


def base_reading(sc: Scenario, rank: int, rng: np.random.Generator) -> dict[str, Any]:
    vendor = VENDOR_OF_ISLAND.get(sc.islands[rank], "nvidia")
    model = sc.classes[rank] if sc.classes is not None else MODEL[vendor]
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
    }


def fault_fields(kind: str, slowdown: float, base: dict[str, Any]) -> dict[str, Any]:
    low_clock = round(base["sm_mhz"] / (1.0 + slowdown), 1)
    if kind == "clocks":
        return {"sm_mhz": low_clock, "throttle": {}}
    if kind == "thermal":
        return {
            "sm_mhz": low_clock,
            "temp_c": 89.0,
            "throttle": {"hw_thermal": True, "sw_thermal": True},
        }
    if kind == "power":
        return {
            "sm_mhz": low_clock,
            "power_w": base["power_limit_w"],
            "throttle": {"sw_power_cap": True},
        }
    if kind == "pcie":
        return {"pcie_width": 4, "pcie_gen": 3}
    if kind == "hardware":
        # XID 74 is NVIDIA's "NVLink error"; replays on a sick link slow the rank.
        return {"xid_count": 1, "xid_last": 74, "nvlink_errors": 250, "ecc_uncorrected": 0}
    if kind == "host":
        ncpu = base["ncpu"]
        return {
            "cpu_pct": 99.0,
            "steal_pct": 18.0,
            "psi_cpu_some": 45.0,
            "load1": float(ncpu * 2),
            "proc_cpu_pct": 55.0,
        }
    return {}


def telemetry_plan(sc: Scenario) -> dict[int, dict[str, Any]]:
    rng = np.random.default_rng(sc.seed + 7)
    out: dict[int, dict[str, Any]] = {}
    for r in range(sc.ranks):
        base = base_reading(sc, r, rng)
        segs = []
        for f in sc.faults:
            if r in f.ranks and f.kind not in ("hang", "agent_down", "island", "collective"):
                fields = fault_fields(f.kind, f.slowdown, base)
                if fields:
                    segs.append(
                        {
                            "start_window": f.start_window,
                            "end_window": f.end_window,
                            "fields": fields,
                        }
                    )
        out[r] = {"base": base, "segments": segs}
    return out


def write_telemetry(sc: Scenario, job: str, shm_dirs: dict[int, Path]) -> None:
    """Write each rank's telemetry file into its host's shm dir (atomic replace)."""
    for r, doc in telemetry_plan(sc).items():
        d = shm_dirs[sc.host_of(r)]
        path = d / f"{job}.simtel.r{r}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
