"""The real correction backends (NVML, AMD SMI) against fakes shaped like the libraries.

The fakes keep what decides behaviour: module-level functions with the upstream
names and argument orders (nvidia-ml-py 13's ``pynvml``, amdsmi 7.0.2's
``amdsmi_interface``), their units (NVML milliwatts, AMD SMI microwatts), their
error types (``NVMLError`` built from a return code, mapped onto its
``NVMLError_*`` subclass, with ``value``; ``AmdSmiLibraryException`` with its
code), and a GPU whose settings the set calls change, so a test reads the effect
of a call, not the call.
"""

from __future__ import annotations

import types
from enum import IntEnum
from typing import Any

import pytest
from artemis.agent.corrections.amd import AmdSmiControl
from artemis.agent.corrections.base import CorrectionError
from artemis.agent.corrections.nvml import NvmlControl
from test_telemetry_amd import FakeAmdGpu
from test_telemetry_amd import fake_amdsmi as telemetry_amdsmi

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NVML_TEXT = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
}


class NvGpu:
    """One NVIDIA GPU's settable state, as the driver keeps it."""

    def __init__(self) -> None:
        self.max_sm, self.max_mem = 1980, 2619
        self.locked_sm: tuple[int, int] | None = (1410, 1410)  # someone locked it low
        self.locked_mem: tuple[int, int] | None = None
        self.app = (2619, 1755)  # application clocks (mem, graphics)
        self.limit_mw, self.default_mw = 450_000, 700_000
        self.deny: dict[str, int] = {}  # function -> NVML error code it returns

    def clock(self, kind: int) -> int:
        if kind == 1:
            return self.locked_sm[1] if self.locked_sm else self.max_sm
        return self.locked_mem[1] if self.locked_mem else self.max_mem


def fake_pynvml(gpu: NvGpu) -> types.ModuleType:
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        _map: dict[int, type] = {}  # noqa: RUF012 - as pynvml keeps it

        def __new__(cls, value: int) -> NVMLError:
            sub = NVMLError._map.get(value, cls) if cls is NVMLError else cls
            e = Exception.__new__(sub)
            e.value = value  # type: ignore[attr-defined]
            return e

        def __str__(self) -> str:
            return _NVML_TEXT.get(self.value, f"code {self.value}")  # type: ignore[attr-defined]

    for code, name in (
        (NVML_ERROR_NOT_SUPPORTED, "NotSupported"),
        (NVML_ERROR_NO_PERMISSION, "NoPermission"),
        (NVML_ERROR_FUNCTION_NOT_FOUND, "FunctionNotFound"),
    ):
        NVMLError._map[code] = type(f"NVMLError_{name}", (NVMLError,), {})
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM = 1, 2  # type: ignore[attr-defined]
    m.NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED  # type: ignore[attr-defined]
    m.NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION  # type: ignore[attr-defined]
    handle = object()
    calls: list[str] = []
    m.calls = calls  # type: ignore[attr-defined]

    def api(name: str, fn: Any) -> None:
        def call(*a: Any) -> Any:
            calls.append(name)
            if name in gpu.deny:
                raise NVMLError(gpu.deny[name])
            return fn(*a)

        setattr(m, name, call)

    def by_index(i: int) -> object:
        assert i == 0, "one GPU"
        return handle

    def lock(attr: str) -> Any:
        def set_(h: object, lo: int, hi: int) -> None:
            assert h is handle and lo <= hi
            setattr(gpu, attr, (lo, hi))

        return set_

    def set_app(h: object, mem: int, graphics: int) -> None:
        gpu.app = (mem, graphics)

    def app_clock(h: object, kind: int) -> int:
        return gpu.app[1] if kind == 1 else gpu.app[0]

    def set_limit(h: object, mw: int) -> None:
        assert isinstance(mw, int), "NVML takes an unsigned int of milliwatts"
        gpu.limit_mw = mw

    api("nvmlInit", lambda: None)
    api("nvmlDeviceGetHandleByIndex", by_index)
    api("nvmlDeviceGetClockInfo", lambda h, k: gpu.clock(k))
    api("nvmlDeviceGetApplicationsClock", app_clock)
    api("nvmlDeviceResetGpuLockedClocks", lambda h: setattr(gpu, "locked_sm", None))
    api("nvmlDeviceResetMemoryLockedClocks", lambda h: setattr(gpu, "locked_mem", None))
    api("nvmlDeviceResetApplicationsClocks", lambda h: setattr(gpu, "app", (2619, 1980)))
    api("nvmlDeviceSetGpuLockedClocks", lock("locked_sm"))
    api("nvmlDeviceSetMemoryLockedClocks", lock("locked_mem"))
    api("nvmlDeviceSetApplicationsClocks", set_app)
    api("nvmlDeviceGetEnforcedPowerLimit", lambda h: gpu.limit_mw)
    api("nvmlDeviceGetPowerManagementLimit", lambda h: gpu.limit_mw)
    api("nvmlDeviceGetPowerManagementDefaultLimit", lambda h: gpu.default_mw)
    api("nvmlDeviceSetPowerManagementLimit", set_limit)
    return m


def test_nvml_reset_clocks_records_before_and_rollback_relocks() -> None:
    gpu = NvGpu()
    ctl = NvmlControl(fake_pynvml(gpu))
    before = ctl.state("reset_clocks", 0)
    assert before == {
        "vendor": "nvidia",
        "sm_mhz": 1410,
        "mem_mhz": 2619,
        "app_sm_mhz": 1755,
        "app_mem_mhz": 2619,
    }
    after = ctl.apply("reset_clocks", 0, before)
    assert gpu.locked_sm is None and gpu.locked_mem is None
    assert after["sm_mhz"] == 1980
    ctl.rollback("reset_clocks", 0, before)
    # NVML cannot read a locked range: the rollback locks to what was observed
    assert gpu.locked_sm == (1410, 1410) and gpu.locked_mem == (2619, 2619)
    assert gpu.app == (2619, 1755)  # (memory, graphics), as NVML takes them


@pytest.mark.parametrize("code", [NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND])
def test_nvml_deprecated_application_clock_reset_is_not_fatal(code: int) -> None:
    gpu = NvGpu()
    gpu.deny["nvmlDeviceResetApplicationsClocks"] = code
    ctl = NvmlControl(fake_pynvml(gpu))
    ctl.apply("reset_clocks", 0, ctl.state("reset_clocks", 0))
    assert gpu.locked_sm is None


def test_nvml_restore_power_limit_in_milliwatts_and_back() -> None:
    gpu = NvGpu()
    ctl = NvmlControl(fake_pynvml(gpu))
    before = ctl.state("restore_power_limit", 0)
    assert before == {"vendor": "nvidia", "power_limit_w": 450.0, "default_w": 700.0}
    after = ctl.apply("restore_power_limit", 0, before)
    assert gpu.limit_mw == 700_000 and after["power_limit_w"] == 700.0
    ctl.rollback("restore_power_limit", 0, before)
    assert gpu.limit_mw == 450_000


@pytest.mark.parametrize(
    ("fn", "code", "text"),
    [
        ("nvmlDeviceSetPowerManagementLimit", NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
        ("nvmlDeviceResetGpuLockedClocks", NVML_ERROR_NOT_SUPPORTED, "Not Supported"),
    ],
)
def test_nvml_refusals_are_correction_errors_with_nvml_text(fn: str, code: int, text: str) -> None:
    gpu = NvGpu()
    gpu.deny[fn] = code
    ctl = NvmlControl(fake_pynvml(gpu))
    action = "restore_power_limit" if "Power" in fn else "reset_clocks"
    with pytest.raises(CorrectionError, match=text):
        ctl.apply(action, 0, ctl.state(action, 0))
    assert gpu.limit_mw == 450_000 and gpu.locked_sm == (1410, 1410)  # nothing changed


# ------------------------------------------------------------------ AMD SMI


class AmdGpu:
    def __init__(self) -> None:
        self.perf = "MANUAL"
        self.sclk = [500, 1000, 1500, 2100]  # MHz of each level
        self.mclk = [900, 1300]
        self.sclk_mask, self.mclk_mask = 0b0010, 0b01  # MANUAL: levels 1 and 0 only
        self.cap_uw, self.default_uw = 500_000_000, 750_000_000
        self.deny: set[str] = set()


def fake_amdsmi(gpu: AmdGpu) -> types.ModuleType:
    """The telemetry tests' amdsmi 7.0.2 fake (its exceptions, enums, init and handles)
    with the perf level, clock level and power cap calls over ``gpu``."""
    m = telemetry_amdsmi([FakeAmdGpu()])

    class NoPermission(m.AmdSmiLibraryException):  # type: ignore[name-defined,misc]
        def __str__(self) -> str:
            return f"Error code:\n\t{self.err_code} | AMDSMI_STATUS_NO_PERM - Permission Denied"

    class AmdSmiDevPerfLevel(IntEnum):
        AUTO = 0
        LOW = 1
        HIGH = 2
        MANUAL = 3

    m.AmdSmiDevPerfLevel = AmdSmiDevPerfLevel  # type: ignore[attr-defined]

    def guard(name: str) -> None:
        if name in gpu.deny:
            raise NoPermission(10)  # AMDSMI_STATUS_NO_PERM

    def set_perf(handle: Any, level: AmdSmiDevPerfLevel) -> None:
        assert isinstance(level, AmdSmiDevPerfLevel), "amdsmi checks the enum type"
        guard("amdsmi_set_gpu_perf_level")
        gpu.perf = level.name
        if level.name == "AUTO":
            gpu.sclk_mask, gpu.mclk_mask = 0b1111, 0b11

    def get_freq(handle: Any, kind: int) -> dict[str, Any]:
        levels, mask = (gpu.sclk, gpu.sclk_mask) if kind == 0 else (gpu.mclk, gpu.mclk_mask)
        return {
            "num_supported": len(levels),
            "current": mask.bit_length() - 1,  # the highest enabled level runs
            "frequency": [f * 1_000_000 for f in levels],
        }

    def set_freq(handle: Any, kind: int, mask: int) -> None:
        assert isinstance(mask, int)
        if kind == 0:
            gpu.sclk_mask = mask
        else:
            gpu.mclk_mask = mask

    def set_cap(handle: Any, sensor_ind: int, cap: int) -> None:
        assert isinstance(sensor_ind, int) and isinstance(cap, int), "amdsmi checks int types"
        guard("amdsmi_set_power_cap")
        gpu.cap_uw = cap

    fns = {
        "amdsmi_get_gpu_perf_level": lambda handle: f"AMDSMI_DEV_PERF_LEVEL_{gpu.perf}",
        "amdsmi_set_gpu_perf_level": set_perf,
        "amdsmi_get_clk_freq": get_freq,
        "amdsmi_set_clk_freq": set_freq,
        "amdsmi_get_power_cap_info": lambda handle: {
            "power_cap": gpu.cap_uw,
            "default_power_cap": gpu.default_uw,
            "dpm_cap": 0,
            "min_power_cap": 0,
            "max_power_cap": 750_000_000,
        },
        "amdsmi_set_power_cap": set_cap,
    }
    for name, fn in fns.items():
        setattr(m, name, fn)
    return m


def test_amd_reset_clocks_goes_auto_and_rollback_restores_manual_levels() -> None:
    ctl = AmdSmiControl(fake_amdsmi(gpu := AmdGpu()))
    before = ctl.state("reset_clocks", 0)
    assert before == {
        "vendor": "amd",
        "perf_level": "MANUAL",
        "sclk_levels": [1],
        "mclk_levels": [0],
    }
    after = ctl.apply("reset_clocks", 0, before)
    assert gpu.perf == "AUTO" and after == {"vendor": "amd", "perf_level": "AUTO"}
    ctl.rollback("reset_clocks", 0, before)
    assert gpu.perf == "MANUAL" and (gpu.sclk_mask, gpu.mclk_mask) == (0b10, 0b01)


def test_amd_restore_power_limit_in_microwatts_and_back() -> None:
    gpu = AmdGpu()
    ctl = AmdSmiControl(fake_amdsmi(gpu))
    before = ctl.state("restore_power_limit", 0)
    assert before == {"vendor": "amd", "power_limit_w": 500.0, "default_w": 750.0}
    ctl.apply("restore_power_limit", 0, before)
    assert gpu.cap_uw == 750_000_000
    ctl.rollback("restore_power_limit", 0, before)
    assert gpu.cap_uw == 500_000_000


def test_amd_no_permission_is_a_correction_error_with_its_text() -> None:
    gpu = AmdGpu()
    gpu.deny.add("amdsmi_set_power_cap")
    ctl = AmdSmiControl(fake_amdsmi(gpu))
    with pytest.raises(CorrectionError, match="AMDSMI_STATUS_NO_PERM"):
        ctl.apply("restore_power_limit", 0, ctl.state("restore_power_limit", 0))
    assert gpu.cap_uw == 500_000_000


# ------------------------------------------------------------------ the default limit


def test_telemetry_reports_the_default_power_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """power_limit_default_w beside power_limit_w: NVML's default (mW), AMD SMI's
    default_power_cap (µW), the simulator's default (a power fault lowers only the limit)."""
    from artemis.agent.telemetry import RankTarget
    from artemis.sim.scenario import parse_scenario
    from artemis.sim.telemetry import telemetry_plan
    from test_telemetry_amd import install as install_amd
    from test_telemetry_nvml import FakeGpu
    from test_telemetry_nvml import install as install_nvml

    src, nv = install_nvml(monkeypatch, [FakeGpu()])
    nv.nvmlDeviceGetPowerManagementDefaultLimit = lambda h: 800_000  # type: ignore[attr-defined]
    got = src.sample(RankTarget(rank=0, gpu_index=0))
    assert (got["power_limit_w"], got["power_limit_default_w"]) == (700.0, 800.0)

    amd = install_amd(monkeypatch, [FakeAmdGpu()]).sample(RankTarget(rank=0, gpu_index=0))
    assert amd["power_limit_default_w"] == 750.0

    job = {"ranks": 2, "ranks_per_host": 2, "step_ms": 10.0, "collectives_per_step": 2}
    sc = parse_scenario(
        {
            "job": {**job, "window_steps": 10, "windows": 4},
            "fault": [{"kind": "power", "rank": 1, "start_window": 0, "slowdown": 0.2}],
        }
    )
    doc = telemetry_plan(sc)[1]
    lowered = doc["segments"][0]["fields"]["power_limit_w"]
    assert doc["base"]["power_limit_default_w"] == 700.0 > lowered


def test_nvml_rollback_without_memory_locks_still_relocks_the_gpu_clock() -> None:
    gpu = NvGpu()
    gpu.deny["nvmlDeviceSetMemoryLockedClocks"] = NVML_ERROR_NOT_SUPPORTED  # before Ampere
    ctl = NvmlControl(fake_pynvml(gpu))
    before = ctl.state("reset_clocks", 0)
    ctl.apply("reset_clocks", 0, before)
    ctl.rollback("reset_clocks", 0, before)
    assert gpu.locked_sm == (1410, 1410) and gpu.locked_mem is None
    gpu.deny["nvmlDeviceSetGpuLockedClocks"] = NVML_ERROR_NO_PERMISSION
    with pytest.raises(CorrectionError, match="Insufficient Permissions"):
        ctl.rollback("reset_clocks", 0, before)


def test_run_names_a_bad_corrections_mode() -> None:
    from artemis.cli.run import RunError, RunOptions, run

    with pytest.raises(RunError, match="--corrections: expected one of off, recommend, apply"):
        run(RunOptions(command=["true"], corrections="always"))
