"""SimulatedSource: base overlaid with the segments covering the target window."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from artemis.agent.telemetry import RankTarget, SimulatedSource, collect, sim_telemetry_path

DOC: dict[str, Any] = {
    "base": {
        "vendor": "nvidia",
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "sm_mhz": 1980,
        "sm_mhz_max": 1980,
        "temp_c": 60,
        "throttle": {"sw_power_cap": False, "hw_thermal": False},
        "pcie_width": 16,
    },
    "segments": [
        {"start_window": 10, "end_window": 20, "fields": {"sm_mhz": 1110}},
        {
            "start_window": 15,
            "end_window": None,
            "fields": {"temp_c": 91, "throttle": {"hw_thermal": True}, "pcie_width": None},
        },
    ],
}


def write(path: Path, doc: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def test_segments_overlay_by_window(tmp_path: Path) -> None:
    write(sim_telemetry_path(tmp_path, "j1", 3), DOC)
    src = SimulatedSource(tmp_path, "j1")
    base = DOC["base"]
    assert src.sample(RankTarget(rank=3, window=9)) == base
    w12 = src.sample(RankTarget(rank=3, window=12))
    assert w12 == {**base, "sm_mhz": 1110}
    w17 = src.sample(RankTarget(rank=3, window=17))
    assert w17["sm_mhz"] == 1110 and w17["temp_c"] == 91
    assert w17["throttle"] == {"sw_power_cap": False, "hw_thermal": True}  # merged
    assert "pcie_width" not in w17  # removed by the fault
    w20 = src.sample(RankTarget(rank=3, window=20))  # end_window is exclusive
    assert w20["sm_mhz"] == 1980 and w20["temp_c"] == 91
    assert src.sample(RankTarget(rank=3, window=10_000))["temp_c"] == 91


def test_missing_file_means_missing_fields(tmp_path: Path) -> None:
    src = SimulatedSource(tmp_path, "j1")
    assert src.sample(RankTarget(rank=0)) == {}
    t = collect([src], RankTarget(rank=0))
    assert "sm_mhz" in t.missing and t.sm_mhz is None


def test_rewrites_are_picked_up_and_torn_files_keep_the_last_good(tmp_path: Path) -> None:
    path = sim_telemetry_path(tmp_path, "j1", 0)
    write(path, {"base": {"sm_mhz": 1500}})
    src = SimulatedSource(tmp_path, "j1")
    assert src.sample(RankTarget(rank=0))["sm_mhz"] == 1500
    write(path, {"base": {"sm_mhz": 1400, "temp_c": 70}})
    assert src.sample(RankTarget(rank=0)) == {"sm_mhz": 1400, "temp_c": 70}
    path.write_text('{"base": {"sm_mhz": 13')  # torn
    assert src.sample(RankTarget(rank=0)) == {"sm_mhz": 1400, "temp_c": 70}
    # a torn file with nothing good before it: the source fails, collect reports missing
    bad = sim_telemetry_path(tmp_path, "j1", 5)
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="unreadable simulator telemetry"):
        src.sample(RankTarget(rank=5))
    t = collect([src], RankTarget(rank=5))
    assert "sm_mhz" in t.missing and "temp_c" in t.missing


def test_the_targets_job_selects_the_file(tmp_path: Path) -> None:
    write(sim_telemetry_path(tmp_path, "jobA", 0), {"base": {"sm_mhz": 1000}})
    write(sim_telemetry_path(tmp_path, "jobB", 0), {"base": {"sm_mhz": 2000}})
    src = SimulatedSource(tmp_path)
    assert src.sample(RankTarget(rank=0, job="jobA"))["sm_mhz"] == 1000
    assert src.sample(RankTarget(rank=0, job="jobB"))["sm_mhz"] == 2000
    assert SimulatedSource(tmp_path, "jobB").sample(RankTarget(rank=0))["sm_mhz"] == 2000
    with pytest.raises(ValueError, match="needs a job"):
        src.sample(RankTarget(rank=0))


def test_simulated_ranks_report_hardware_fields_missing_unless_a_fault_sets_them(
    tmp_path: Path,
) -> None:
    from artemis.detect.diagnosis import diagnose
    from artemis.protocol.records import Telemetry
    from artemis.sim.scenario import load_scenario
    from artemis.sim.telemetry import fault_fields, telemetry_plan

    sc = load_scenario(Path(__file__).parents[1] / "sim/scenarios/healthy.toml")
    plan = telemetry_plan(sc)
    hw = {"gpu_uuid", "xid_count", "ecc_uncorrected", "nvlink_errors", "nic_symbol_errors"}
    for doc in plan.values():
        assert not hw & set(doc["base"])
    path = sim_telemetry_path(tmp_path, "j", 0)
    write(path, plan[0])
    t = collect([SimulatedSource(tmp_path, "j")], RankTarget(rank=0, window=3))
    assert hw <= set(t.missing)
    # the hardware fault model sets the GPU's error counts, which diagnose as `hardware`
    base = plan[0]["base"]
    sick = Telemetry(**{**base, **fault_fields("hardware", 0.2, base)})
    peers = [Telemetry(**plan[r]["base"]) for r in range(1, 4)]
    c = diagnose(sick, peers)
    assert c.kind == "hardware" and "XID 74" in c.text
