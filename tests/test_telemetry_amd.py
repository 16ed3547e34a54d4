"""AmdSmiSource against a fake ``amdsmi`` shaped like amdsmi 7.0.2's Python package.

Only the shapes matter here, and they follow ``amdsmi_interface.py`` of 7.0.2:
the same function and enum names, dicts with the same keys, "N/A" where the
library saw a max-uint sentinel, ``AmdSmiLibraryException`` (with
``err_code``) for a call the device does not support. In particular
``amdsmi_get_pcie_info``'s ``pcie_static`` holds ``max_pcie_width``,
``max_pcie_speed``, ``pcie_interface_version`` and ``slot_type``, and no
``max_pcie_interface_version`` (that name exists only in the C struct).
No AMD GPU exists on the development machine; nothing here ran on one.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from enum import IntEnum

import pytest
from artemis.agent.telemetry import AmdSmiSource, RankTarget, collect
from artemis.agent.telemetry.amd import rocm_version

AMDSMI_STATUS_NOT_SUPPORTED = 2


@dataclass
class FakeAmdGpu:
    max_pcie_speed: int | str = 32000  # MT/s, or "N/A"
    pcie_interface_version: int | str = 5
    ecc: dict[str, int] = field(
        default_factory=lambda: {
            "correctable_count": 0,
            "uncorrectable_count": 0,
            "deferred_count": 0,
        }
    )
    bad_pages: list[dict[str, int]] = field(default_factory=list)
    product_serial: str = "PCB068560-0020"
    asic_serial: str = "0xF33397508B72EAAF"
    ras: bool = True  # False: the RAS calls are not supported


def fake_amdsmi(gpus: list[FakeAmdGpu]) -> types.ModuleType:
    m = types.ModuleType("amdsmi")

    class AmdSmiException(Exception):
        pass

    class AmdSmiLibraryException(AmdSmiException):
        def __init__(self, err_code: int) -> None:
            super().__init__(err_code)
            self.err_code = abs(err_code)

    class AmdSmiInitFlags(IntEnum):
        INIT_ALL_PROCESSORS = 0xFFFFFFFF
        INIT_AMD_GPUS = 1 << 1

    class AmdSmiClkType(IntEnum):
        SYS = 0
        GFX = 0
        DF = 1
        DCEF = 2
        SOC = 3
        MEM = 4

    class AmdSmiTemperatureType(IntEnum):
        EDGE = 0
        HOTSPOT = 1
        JUNCTION = 1
        VRAM = 2

    class AmdSmiTemperatureMetric(IntEnum):
        CURRENT = 0

    class Handle:  # amdsmi_wrapper.amdsmi_processor_handle stands behind it
        def __init__(self, i: int) -> None:
            self.i = i

    handles = [Handle(i) for i in range(len(gpus))]

    def g(h: Handle) -> FakeAmdGpu:
        return gpus[h.i]

    def ras(h: Handle) -> FakeAmdGpu:
        if not g(h).ras:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return g(h)

    errors = (AmdSmiException, AmdSmiLibraryException)
    enums = (AmdSmiInitFlags, AmdSmiClkType, AmdSmiTemperatureType, AmdSmiTemperatureMetric)
    m.__dict__.update({c.__name__: c for c in (*errors, *enums)})
    m.__dict__.update(
        amdsmi_init=lambda flag=AmdSmiInitFlags.INIT_AMD_GPUS: None,
        amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: list(handles),
        amdsmi_get_gpu_process_list=lambda h: [],
        amdsmi_get_gpu_asic_info=lambda h: {
            "market_name": "AMD Instinct MI300X",
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": g(h).asic_serial,
            "oam_id": 2,
            "num_compute_units": 304,
            "target_graphics_version": "gfx942",
            "subsystem_id": "0x74a1",
        },
        amdsmi_get_gpu_board_info=lambda h: {
            "model_number": "102-G30201-0B",
            "product_serial": g(h).product_serial,
            "fru_id": "113-AMDG302010B14",
            "product_name": "AMD Instinct MI300X OAM",
            "manufacturer_name": "AMD",
        },
        amdsmi_get_gpu_device_uuid=lambda h: f"1fff74a1-0000-1000-80f3-{h.i:012x}",
        amdsmi_get_gpu_device_bdf=lambda h: f"0000:{0x0C + h.i:02x}:00.0",
        amdsmi_get_clock_info=lambda h, t: {
            "clk": 2100 if t == AmdSmiClkType.GFX else 1300,
            "min_clk": 500,
            "max_clk": 2100 if t == AmdSmiClkType.GFX else 1300,
            "clk_locked": False,
            "clk_deep_sleep": 0,
        },
        amdsmi_get_temp_metric=lambda h, t, metric: 58,
        amdsmi_get_power_info=lambda h: {
            "socket_power": 512,
            "current_socket_power": 512,
            "average_socket_power": "N/A",
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": 750_000_000,
        },
        amdsmi_get_power_cap_info=lambda h: {
            "power_cap": 750_000_000,
            "default_power_cap": 750_000_000,
            "dpm_cap": 0,
            "min_power_cap": 0,
            "max_power_cap": 750_000_000,
        },
        amdsmi_get_pcie_info=lambda h: {
            "pcie_static": {
                "max_pcie_width": 16,
                "max_pcie_speed": g(h).max_pcie_speed,
                "pcie_interface_version": g(h).pcie_interface_version,
                "slot_type": "OAM",
            },
            "pcie_metric": {
                "pcie_width": 16,
                "pcie_speed": 32000,
                "pcie_bandwidth": "N/A",
                "pcie_replay_count": 0,
                "pcie_l0_to_recovery_count": 0,
                "pcie_replay_roll_over_count": 0,
                "pcie_nak_sent_count": 0,
                "pcie_nak_received_count": 0,
                "pcie_lc_perf_other_end_recovery_count": 0,
            },
        },
        amdsmi_get_gpu_total_ecc_count=lambda h: dict(ras(h).ecc),
        amdsmi_get_gpu_bad_page_info=lambda h: list(ras(h).bad_pages),
        # amdsmi 6.x: the driver info map; the ROCm version as its string
        amdsmi_get_gpu_driver_info=lambda h: {
            "driver_name": "amdgpu",
            "driver_version": "6.8.5",
            "driver_date": "2015/01/01 00:00",
        },
        amdsmi_get_rocm_version=lambda: "6.4.1-123",
    )
    return m


def install(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeAmdGpu]) -> AmdSmiSource:
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(gpus))
    src = AmdSmiSource("/nonexistent")
    assert src.available() == (True, "")
    return src


def at(i: int) -> RankTarget:
    return RankTarget(rank=i, gpu_index=i)


def test_max_pcie_generation_from_amdsmi7s_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # max_pcie_speed unsupported ("N/A"): only pcie_interface_version says the generation
    src = install(monkeypatch, [FakeAmdGpu(max_pcie_speed="N/A", pcie_interface_version=5)])
    got = src.sample(at(0))
    assert got["pcie_gen_max"] == 5 and got["pcie_gen"] == 5
    assert got["pcie_width_max"] == 16


def test_max_pcie_generation_falls_back_to_the_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    src = install(monkeypatch, [FakeAmdGpu(max_pcie_speed=16000, pcie_interface_version="N/A")])
    assert src.sample(at(0))["pcie_gen_max"] == 4


def test_the_clocks_power_and_temperature_still_read(monkeypatch: pytest.MonkeyPatch) -> None:
    got = install(monkeypatch, [FakeAmdGpu()]).sample(at(0))
    assert (got["sm_mhz"], got["sm_mhz_max"], got["mem_mhz"]) == (2100, 2100, 1300)
    assert (got["temp_c"], got["power_w"], got["power_limit_w"]) == (58, 512, 750)
    assert got["gpu_model"] == "AMD Instinct MI300X"


def test_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    src = install(monkeypatch, [FakeAmdGpu(), FakeAmdGpu(product_serial="N/A")])
    a, b = src.sample(at(0)), src.sample(at(1))
    assert a["gpu_uuid"] == "1fff74a1-0000-1000-80f3-000000000000"
    assert (a["gpu_serial"], a["gpu_pci_bus"]) == ("PCB068560-0020", "0000:0c:00.0")
    assert b["gpu_serial"] == "0xF33397508B72EAAF"  # no board serial: the ASIC serial


def test_ecc_counts_with_deferred_as_uncorrected(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeAmdGpu(ecc={"correctable_count": 10, "uncorrectable_count": 1, "deferred_count": 0})
    src = install(monkeypatch, [gpu])
    first = src.sample(at(0))
    assert (first["ecc_corrected"], first["ecc_uncorrected"]) == (0, 0)  # since the agent started
    gpu.ecc = {"correctable_count": 14, "uncorrectable_count": 1, "deferred_count": 2}
    gpu.bad_pages = [{"value": 0, "page_address": 0x7F000, "page_size": 4096, "status": 0}]
    got = src.sample(at(0))
    assert (got["ecc_corrected"], got["ecc_uncorrected"], got["retired_pages"]) == (4, 2, 1)


def test_ras_unsupported_leaves_the_fields_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    src = install(monkeypatch, [FakeAmdGpu(ras=False)])
    t = collect([src], at(0))
    assert {"ecc_corrected", "ecc_uncorrected", "retired_pages"} <= set(t.missing)
    assert t.sm_mhz == 2100  # the rest still reads


def test_software_fingerprint_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    src = install(monkeypatch, [FakeAmdGpu()])
    assert src.software(at(0)) == {
        "cuda": "rocm-6.4.1",
        "driver": "6.8.5",
        "gpu_model": "AMD Instinct MI300X",
    }
    assert src.software(at(5)) == {"cuda": "rocm-6.4.1"}  # no such GPU: the host part only
    # a release that returns (status, version), and one without the call
    assert rocm_version((True, "6.2.4")) == "rocm-6.2.4"
    assert rocm_version(None) is None and rocm_version("unknown") is None
    del sys.modules["amdsmi"].amdsmi_get_rocm_version
    assert "cuda" not in src.software(at(0))
