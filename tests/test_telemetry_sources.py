"""collect / merge / TelemetryAccumulator, and the hardware sources where absent."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from artemis.agent.telemetry import (
    ALL_FIELDS,
    AmdSmiSource,
    HostSource,
    NvmlSource,
    RankTarget,
    SimulatedSource,
    TelemetryAccumulator,
    TelemetrySource,
    collect,
)
from artemis.agent.telemetry.amd import (
    gpu_from_environ_amd,
    pcie_gen_from_speed,
    throttle_from_violation,
)
from artemis.agent.telemetry.nvml import gpu_from_environ, read_environ, throttle_from_mask
from artemis.protocol.records import GPU_FIELDS, HOST_FIELDS, Telemetry
from test_telemetry_nvml import SW_POWER_CAP_HW_THERMAL


class DictSource:
    def __init__(self, name: str, values: dict[str, object]) -> None:
        self.name = name
        self.values = values

    def sample(self, target: RankTarget) -> dict[str, object]:
        return dict(self.values)


class BrokenSource:
    name = "broken"

    def sample(self, target: RankTarget) -> dict[str, object]:
        raise RuntimeError("device fell off the bus")


T = RankTarget(rank=1, pid=None, gpu_index=None, window=4)


def test_all_sources_implement_the_protocol() -> None:
    for src in (
        HostSource("/nonexistent"),
        NvmlSource(),
        AmdSmiSource(),
        SimulatedSource("/nonexistent", "j"),
    ):
        assert isinstance(src, TelemetrySource)


def test_collect_merges_and_lists_missing() -> None:
    gpu = DictSource("gpu", {"sm_mhz": 1410, "temp_c": 71, "throttle": {"hw_thermal": True}})
    host = DictSource("host", {"cpu_pct": 35.5, "ncpu": 64, "sm_mhz": 999})
    t = collect([gpu, host], T)
    assert (t.sm_mhz, t.temp_c, t.cpu_pct, t.ncpu) == (1410.0, 71.0, 35.5, 64)
    assert t.throttle == {"hw_thermal": True}
    supplied = {"sm_mhz", "temp_c", "throttle", "cpu_pct", "ncpu"}
    assert set(t.missing) == set(ALL_FIELDS) - supplied
    assert set(GPU_FIELDS + HOST_FIELDS) <= set(ALL_FIELDS)  # every Telemetry field expected
    assert isinstance(t.ncpu, int)


def test_bad_values_become_missing_not_wrong() -> None:
    src = DictSource(
        "odd",
        {
            "sm_mhz": float("nan"),
            "temp_c": "hot",
            "power_w": None,
            "bogus": 1,
            "throttle": {"hw_thermal": 1, "made_up": True},
            "pcie_gen": 4.0,
            "ncpu": True,
        },
    )
    t = collect([src], T)
    assert t.sm_mhz is None and t.temp_c is None and t.power_w is None
    assert {"sm_mhz", "temp_c", "power_w", "ncpu"} <= set(t.missing)
    assert t.throttle == {"hw_thermal": True}
    assert t.pcie_gen == 4 and isinstance(t.pcie_gen, int)


def test_failing_source_is_logged_once_and_its_fields_missing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ok = DictSource("ok", {"cpu_pct": 10.0})
    with caplog.at_level(logging.WARNING, logger="artemis.agent.telemetry"):
        t1 = collect([BrokenSource(), ok], T)
        t2 = collect([BrokenSource(), ok], T)
    assert t1 == t2
    assert t1.cpu_pct == 10.0 and "sm_mhz" in t1.missing and "cpu_pct" not in t1.missing
    assert sum("device fell off the bus" in r.getMessage() for r in caplog.records) == 1


def test_accumulator_averages_ors_and_keeps_last() -> None:
    acc = TelemetryAccumulator()
    samples = [
        {
            "vendor": "nvidia",
            "gpu_model": "A",
            "sm_mhz": 1400,
            "temp_c": 70,
            "throttle": {"hw_thermal": False, "sw_power_cap": False},
            "pcie_width": 16,
            "pcie_gen": 4,
        },
        {
            "vendor": "nvidia",
            "gpu_model": "B",
            "sm_mhz": 1100,
            "throttle": {"hw_thermal": True},
            "pcie_width": 8,
            "pcie_gen": 4,
        },
        Telemetry(
            sm_mhz=1250.0, temp_c=80.0, pcie_width=16, pcie_gen=4, throttle={"hw_thermal": False}
        ),
    ]
    for s in samples:
        acc.add(s)
    t = acc.result()
    assert acc.count == 3
    assert t.sm_mhz == pytest.approx((1400 + 1100 + 1250) / 3)
    assert t.temp_c == pytest.approx((70 + 80) / 2)  # averaged over samples that had it
    assert t.throttle == {"hw_thermal": True, "sw_power_cap": False}
    assert t.gpu_model == "B" and t.vendor == "nvidia"
    assert t.pcie_width == 8 and t.pcie_gen == 4  # the worst link seen
    assert "power_w" in t.missing and "sm_mhz" not in t.missing
    acc.reset()
    assert acc.result().missing == ALL_FIELDS


def test_nvml_reports_missing_cleanly_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    src = NvmlSource()
    ok, reason = src.available()
    assert not ok
    assert "pynvml is not installed" in reason and "nvidia-ml-py" in reason
    assert src.sample(RankTarget(rank=0, pid=1, window=0)) == {}
    t = collect([src], RankTarget(rank=0, pid=1))
    assert set(GPU_FIELDS) <= set(t.missing)


def test_amd_reports_missing_cleanly_without_amdsmi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    src = AmdSmiSource()
    ok, reason = src.available()
    assert not ok and "amdsmi is not installed" in reason
    assert src.sample(RankTarget(rank=0, pid=1)) == {}


def test_nvml_throttle_bits() -> None:
    assert throttle_from_mask(0x4 | 0x40) == SW_POWER_CAP_HW_THERMAL
    # only the reasons the device supports are reported
    assert throttle_from_mask(0x40 | 0x80, supported=0x40 | 0x4) == {
        "sw_power_cap": False,
        "hw_thermal": True,
    }


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"LOCAL_RANK": "3"}, 3),
        ({"CUDA_VISIBLE_DEVICES": "5", "LOCAL_RANK": "3"}, 5),
        ({"CUDA_VISIBLE_DEVICES": "4,5,6,7", "LOCAL_RANK": "2"}, 6),
        ({"CUDA_VISIBLE_DEVICES": "4,5", "LOCAL_RANK": "2"}, None),
        ({"CUDA_VISIBLE_DEVICES": "GPU-1a2b,GPU-3c4d", "LOCAL_RANK": "1"}, "GPU-3c4d"),
        ({"CUDA_VISIBLE_DEVICES": ""}, None),
        ({}, None),
    ],
)
def test_gpu_from_environ(env: dict[str, str], want: object) -> None:
    assert gpu_from_environ(env) == want


def test_read_environ_from_fixture(tmp_path: Path) -> None:
    root = tmp_path
    (root / "proc/77").mkdir(parents=True)
    (root / "proc/77/environ").write_bytes(b"CUDA_VISIBLE_DEVICES=2,3\0LOCAL_RANK=1\0X=a=b\0")
    env = read_environ(77, root)
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "1", "X": "a=b"}
    assert gpu_from_environ(env) == 3
    assert read_environ(78, root) == {}


def test_amd_pure_helpers() -> None:
    assert [pcie_gen_from_speed(s) for s in (2500, 8000, 16000, 32000, 16, 32)] == [
        1,
        3,
        4,
        5,
        4,
        5,
    ]
    assert pcie_gen_from_speed("N/A") is None and pcie_gen_from_speed(0xFFFFFFFF) is None
    assert throttle_from_violation(
        {
            "active_ppt_pwr": True,
            "active_socket_thrm": False,
            "active_hbm_thrm": True,
            "active_vr_thrm": "N/A",
        }
    ) == {"sw_power_cap": True, "sw_thermal": False, "hw_thermal": True}
    assert throttle_from_violation({"active_ppt_pwr": "N/A"}) is None
    assert gpu_from_environ_amd({"HIP_VISIBLE_DEVICES": "1,2", "LOCAL_RANK": "1"}) == 2
    assert gpu_from_environ_amd({"LOCAL_RANK": "0"}) == 0
