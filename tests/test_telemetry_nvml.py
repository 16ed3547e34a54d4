"""NvmlSource against a fake ``pynvml`` shaped like nvidia-ml-py 13's module.

The fake keeps the parts of pynvml that decide behaviour: the same function
and constant names and values, ``NVMLError`` whose constructor maps an error
code onto its ``NVMLError_*`` subclass, and C symbols resolved only when a
function is called (``_nvmlGetFunctionPointer``): a Python function can exist
while the driver lacks its symbol, and then raises
``NVMLError_FunctionNotFound``. A "driver" is the set of C symbols it
exports. Return shapes follow pynvml: strings for UUID, serial and name, a
struct with a ``busId`` bytes field for PCI info, a 4-tuple for remapped rows,
a list of addresses for retired pages, a struct with ``device``,
``eventType`` and ``eventData`` from ``nvmlEventSetWait_v2``, which raises
``NVMLError_Timeout`` when no event is pending.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
from artemis.agent.telemetry import NvmlSource, RankTarget, TelemetryAccumulator, collect

# ------------------------------------------------------------------ the fake

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15

# Every C symbol the source may touch, as pynvml 13 resolves them.
ALL_SYMBOLS = frozenset(
    {
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetSupportedClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetSupportedClocksThrottleReasons",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkErrorCounter",
        "nvmlEventSetCreate",
        "nvmlDeviceRegisterEvents",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlEventSetWait_v2",
        "nvmlEventSetFree",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
    }
)
# R525: before the clock "event" reason symbols (R535) and nvmlDeviceGetTemperatureV.
R525 = ALL_SYMBOLS - {
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetTemperatureV",
}
# A driver of the CUDA 14 era: the deprecated symbols are gone.
CUDA14 = ALL_SYMBOLS - {
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
}


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-6f1d2c3b-0000-1111-2222-333344445555"
    serial: str | None = "1654123456789"
    bus_id: bytes = b"00000000:18:00.0"
    sm: int = 1980
    reasons: int = 0x4 | 0x40  # sw power cap, hw thermal
    supported: int = 0xFF
    ecc: list[int] = field(default_factory=lambda: [0, 0])  # volatile corrected, uncorrected
    retired: list[list[int]] | None = None  # per cause; None: NOT_SUPPORTED (A100+)
    page_pending: int | None = None  # None: NOT_SUPPORTED
    rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # None: NOT_SUPPORTED (pre-A100)
    nvlink: dict[int, list[int]] = field(default_factory=dict)  # active link -> 5 counters
    events: int = 0x8 | 0x1 | 0x2  # supported event types
    register_error: int | None = None  # NVML error code nvmlDeviceRegisterEvents returns


class FakeEventData:
    def __init__(self, device: Any, event_type: int, data: int) -> None:
        self.device = device
        self.eventType = event_type
        self.eventData = data
        self.gpuInstanceId = 0xFFFFFFFF
        self.computeInstanceId = 0xFFFFFFFF


def fake_pynvml(gpus: list[FakeGpu], symbols: frozenset[str] = ALL_SYMBOLS) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    g: dict[str, Any] = m.__dict__
    for k, v in list(globals().items()):
        if k.startswith(("NVML_ERROR_", "NVML_SUCCESS")):
            g[k] = v
    g.update(
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_TEMPERATURE_GPU=0,
        NVML_FEATURE_DISABLED=0,
        NVML_FEATURE_ENABLED=1,
        NVML_VOLATILE_ECC=0,
        NVML_AGGREGATE_ECC=1,
        NVML_MEMORY_ERROR_TYPE_CORRECTED=0,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS=0,
        NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=1,
        NVML_NVLINK_MAX_LINKS=36,
        NVML_NVLINK_ERROR_DL_REPLAY=0,
        NVML_NVLINK_ERROR_DL_RECOVERY=1,
        NVML_NVLINK_ERROR_DL_CRC_FLIT=2,
        NVML_NVLINK_ERROR_DL_CRC_DATA=3,
        NVML_NVLINK_ERROR_DL_ECC_DATA=4,
        NVML_NVLINK_ERROR_COUNT=5,
        nvmlEventTypeSingleBitEccError=0x1,
        nvmlEventTypeDoubleBitEccError=0x2,
        nvmlEventTypeXidCriticalError=0x8,
        nvmlEventTypeNone=0x0,
    )

    class NVMLError(Exception):
        _valClassMapping: dict[int, type] = {}  # noqa: RUF012 - as pynvml has it

        def __new__(typ, value: int) -> NVMLError:
            if typ is NVMLError:
                typ = NVMLError._valClassMapping.get(value, typ)
            obj = Exception.__new__(typ)
            obj.value = value  # type: ignore[attr-defined]
            return obj

        def __str__(self) -> str:
            return f"NVML error {self.value}"  # type: ignore[attr-defined]

    for name, code in list(g.items()):
        if name.startswith("NVML_ERROR_"):
            cls_name = "NVMLError_" + "".join(
                w.capitalize() for w in name[len("NVML_ERROR_") :].split("_")
            )

            def new(typ: type, *args: Any, _v: int = code) -> Any:
                return NVMLError.__new__(typ, _v)

            sub = type(cls_name, (NVMLError,), {"__new__": new})
            g[cls_name] = sub
            NVMLError._valClassMapping[code] = sub
    g["NVMLError"] = NVMLError
    state: dict[str, Any] = {"init": False, "queue": [], "registered": set(), "waits": []}
    m._fake_state = state  # type: ignore[attr-defined]

    def sym(name: str) -> None:
        # pynvml's _nvmlGetFunctionPointer: the symbol is looked up at call time
        if not state["init"]:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if name not in symbols:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)

    class Handle:
        def __init__(self, i: int) -> None:
            self.i = i

    handles = [Handle(i) for i in range(len(gpus))]

    def gpu(h: Handle) -> FakeGpu:
        return gpus[h.i]

    def nvmlInit() -> None:
        state["init"] = True
        sym("nvmlInitWithFlags")

    def api(csym: str, fn: Any) -> Any:
        def wrapper(*a: Any) -> Any:
            sym(csym)
            return fn(*a)

        return wrapper

    def unsupported() -> Any:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def retired(h: Handle, cause: int) -> list[int]:
        r = gpu(h).retired
        return list(r[cause]) if r is not None else unsupported()

    def page_pending(h: Handle) -> int:
        p = gpu(h).page_pending
        return p if p is not None else unsupported()

    def rows(h: Handle) -> tuple[int, int, int, int]:
        r = gpu(h).rows
        return r if r is not None else unsupported()

    def link_state(h: Handle, link: int) -> int:
        if not gpu(h).nvlink:
            unsupported()
        if link >= 18:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link in gpu(h).nvlink else 0

    def link_counter(h: Handle, link: int, counter: int) -> int:
        return gpu(h).nvlink[link][counter]

    def register(h: Handle, types_: int, es: object) -> None:
        err = gpu(h).register_error
        if err is not None:
            raise NVMLError(err)
        state["registered"].add(h.i)

    def wait_v2(es: object, timeoutms: int) -> FakeEventData:
        state["waits"].append(timeoutms)
        if state.get("lost"):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        q = [e for e in state["queue"] if e[0] in state["registered"]]
        if not q:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        state["queue"].remove(q[0])
        return FakeEventData(handles[q[0][0]], 0x8, q[0][1])

    def pci(h: Handle) -> Any:
        return types.SimpleNamespace(busId=gpu(h).bus_id, busIdLegacy=gpu(h).bus_id[4:])

    def serial(h: Handle) -> str:
        s = gpu(h).serial
        return s if s is not None else unsupported()

    def ecc(h: Handle, etype: int, ctype: int) -> int:
        assert ctype == 0, "the source reads the volatile counters"
        return gpu(h).ecc[etype]

    def reasons(h: Handle) -> int:
        return gpu(h).reasons

    def supported(h: Handle) -> int:
        return gpu(h).supported

    fns: dict[str, tuple[str, Any]] = {
        "nvmlShutdown": ("nvmlShutdown", lambda: None),
        "nvmlDeviceGetCount": ("nvmlDeviceGetCount_v2", lambda: len(gpus)),
        "nvmlDeviceGetHandleByIndex": ("nvmlDeviceGetHandleByIndex_v2", lambda i: handles[i]),
        "nvmlDeviceGetIndex": ("nvmlDeviceGetIndex", lambda h: h.i),
        "nvmlDeviceGetName": ("nvmlDeviceGetName", lambda h: gpu(h).name),
        "nvmlDeviceGetUUID": ("nvmlDeviceGetUUID", lambda h: gpu(h).uuid),
        "nvmlDeviceGetSerial": ("nvmlDeviceGetSerial", serial),
        "nvmlDeviceGetPciInfo": ("nvmlDeviceGetPciInfo_v3", pci),
        "nvmlDeviceGetClockInfo": ("nvmlDeviceGetClockInfo", lambda h, t: gpu(h).sm),
        "nvmlDeviceGetMaxClockInfo": ("nvmlDeviceGetMaxClockInfo", lambda h, t: 1980),
        "nvmlDeviceGetTemperature": ("nvmlDeviceGetTemperature", lambda h, s: 61),
        "nvmlDeviceGetTemperatureV": ("nvmlDeviceGetTemperatureV", lambda h, s, *v: 61),
        "nvmlDeviceGetPowerUsage": ("nvmlDeviceGetPowerUsage", lambda h: 412_000),
        "nvmlDeviceGetEnforcedPowerLimit": ("nvmlDeviceGetEnforcedPowerLimit", lambda h: 700_000),
        # The clock event reasons, under their R535 names and their older "throttle" ones.
        **{
            f"nvmlDeviceGet{which}Clocks{kind}Reasons": (
                f"nvmlDeviceGet{which}Clocks{kind}Reasons",
                reasons if which == "Current" else supported,
            )
            for kind in ("Event", "Throttle")
            for which in ("Current", "Supported")
        },
        "nvmlDeviceGetCurrPcieLinkGeneration": ("nvmlDeviceGetCurrPcieLinkGeneration", lambda h: 5),
        "nvmlDeviceGetMaxPcieLinkGeneration": ("nvmlDeviceGetMaxPcieLinkGeneration", lambda h: 5),
        "nvmlDeviceGetCurrPcieLinkWidth": ("nvmlDeviceGetCurrPcieLinkWidth", lambda h: 16),
        "nvmlDeviceGetMaxPcieLinkWidth": ("nvmlDeviceGetMaxPcieLinkWidth", lambda h: 16),
        "nvmlDeviceGetComputeRunningProcesses": (
            "nvmlDeviceGetComputeRunningProcesses_v3",
            lambda h: [],
        ),
        "nvmlDeviceGetTotalEccErrors": ("nvmlDeviceGetTotalEccErrors", ecc),
        "nvmlDeviceGetRetiredPages": ("nvmlDeviceGetRetiredPages", retired),
        "nvmlDeviceGetRetiredPagesPendingStatus": (
            "nvmlDeviceGetRetiredPagesPendingStatus",
            page_pending,
        ),
        "nvmlDeviceGetRemappedRows": ("nvmlDeviceGetRemappedRows", rows),
        "nvmlDeviceGetNvLinkState": ("nvmlDeviceGetNvLinkState", link_state),
        "nvmlDeviceGetNvLinkErrorCounter": ("nvmlDeviceGetNvLinkErrorCounter", link_counter),
        "nvmlEventSetCreate": ("nvmlEventSetCreate", lambda: object()),
        "nvmlDeviceRegisterEvents": ("nvmlDeviceRegisterEvents", register),
        "nvmlDeviceGetSupportedEventTypes": (
            "nvmlDeviceGetSupportedEventTypes",
            lambda h: gpu(h).events,
        ),
        "nvmlEventSetWait_v2": ("nvmlEventSetWait_v2", wait_v2),
        "nvmlEventSetFree": ("nvmlEventSetFree", lambda es: None),
        # str since nvidia-ml-py 11.515 (convertStrBytes); 1000 * major + 10 * minor
        "nvmlSystemGetDriverVersion": ("nvmlSystemGetDriverVersion", lambda: "550.54.15"),
        "nvmlSystemGetCudaDriverVersion": ("nvmlSystemGetCudaDriverVersion", lambda: 12040),
        "nvmlSystemGetCudaDriverVersion_v2": ("nvmlSystemGetCudaDriverVersion_v2", lambda: 12040),
    }
    g["nvmlInit"] = nvmlInit
    for py_name, (csym, fn) in fns.items():
        g[py_name] = api(csym, fn)
    g["nvmlEventSetWait"] = g["nvmlEventSetWait_v2"]
    return m


def install(
    monkeypatch: pytest.MonkeyPatch,
    gpus: list[FakeGpu],
    symbols: frozenset[str] = ALL_SYMBOLS,
    **kw: Any,
) -> tuple[NvmlSource, types.ModuleType]:
    mod = fake_pynvml(gpus, symbols)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    kw.setdefault("error_interval_s", 0.0)  # every sample reads the counters
    src = NvmlSource("/nonexistent", **kw)
    assert src.available() == (True, "")
    return src, mod


def spy(mod: types.ModuleType, name: str, calls: list[str], tag: str) -> None:
    """Wrap a fake pynvml function so each call is noted in ``calls``."""
    fn = getattr(mod, name)

    def wrapped(*a: Any) -> Any:
        calls.append(tag)
        return fn(*a)

    setattr(mod, name, wrapped)


def at(i: int) -> RankTarget:
    return RankTarget(rank=i, gpu_index=i)


# ------------------------------------------------------------------ the fake itself


def test_the_fake_behaves_like_pynvml_on_a_missing_symbol() -> None:
    nv = fake_pynvml([FakeGpu()], R525)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons")  # the Python function exists
    with pytest.raises(nv.NVMLError_FunctionNotFound) as e:  # but the driver lacks the symbol
        nv.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert isinstance(e.value, nv.NVMLError) and e.value.value == NVML_ERROR_FUNCTION_NOT_FOUND
    assert nv.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0x44


# ------------------------------------------------------------------ item 4: driver versions


# FakeGpu's reasons (0x4 | 0x40) as the source reads them, every reason supported.
SW_POWER_CAP_HW_THERMAL = {
    "idle": False,
    "apps_clocks": False,
    "sw_power_cap": True,
    "hw_slowdown": False,
    "sync_boost": False,
    "sw_thermal": False,
    "hw_thermal": True,
    "hw_power_brake": False,
}


@pytest.mark.parametrize("driver", [R525, ALL_SYMBOLS, CUDA14], ids=["R525", "R550", "CUDA14"])
def test_throttle_reasons_on_every_driver(monkeypatch: pytest.MonkeyPatch, driver: Any) -> None:
    src, _ = install(monkeypatch, [FakeGpu()], driver)
    got = src.sample(at(0))
    assert got["throttle"] == SW_POWER_CAP_HW_THERMAL


def test_supported_reasons_fall_back_too(monkeypatch: pytest.MonkeyPatch) -> None:
    src, _ = install(monkeypatch, [FakeGpu(reasons=0x40, supported=0x40 | 0x4)], R525)
    assert src.sample(at(0))["throttle"] == {"sw_power_cap": False, "hw_thermal": True}


@pytest.mark.parametrize("driver", [R525, ALL_SYMBOLS, CUDA14], ids=["R525", "R550", "CUDA14"])
def test_temperature_on_every_driver(monkeypatch: pytest.MonkeyPatch, driver: Any) -> None:
    src, _ = install(monkeypatch, [FakeGpu()], driver)
    assert src.sample(at(0))["temp_c"] == 61


def test_the_versioned_temperature_call_is_preferred(monkeypatch: pytest.MonkeyPatch) -> None:
    src, nv = install(monkeypatch, [FakeGpu()])
    calls: list[str] = []
    spy(nv, "nvmlDeviceGetTemperature", calls, "old")
    spy(nv, "nvmlDeviceGetTemperatureV", calls, "V")
    src.sample(at(0))
    assert calls == ["V"]


# ------------------------------------------------------------------ item 7: identity and errors


def test_identity_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    src, _ = install(monkeypatch, [FakeGpu(), FakeGpu(uuid="GPU-b", serial=None, bus_id=b"x")])
    a, b = src.sample(at(0)), src.sample(at(1))
    assert (a["gpu_uuid"], a["gpu_serial"], a["gpu_pci_bus"]) == (
        "GPU-6f1d2c3b-0000-1111-2222-333344445555",
        "1654123456789",
        "00000000:18:00.0",
    )
    assert b["gpu_uuid"] == "GPU-b" and "gpu_serial" not in b  # a board without a serial


def test_xid_events_are_drained_without_blocking_and_kept_per_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src, nv = install(monkeypatch, [FakeGpu(), FakeGpu()])
    st = nv._fake_state
    assert st["registered"] == {0, 1}
    first = src.sample(at(0))
    assert first["xid_count"] == 0 and "xid_last" not in first  # registered, none seen
    st["queue"] += [(1, 79), (0, 13), (0, 48)]
    a = src.sample(at(0))
    assert (a["xid_count"], a["xid_last"]) == (2, 48)  # a running total per GPU
    b = src.sample(at(1))  # drained while sampling GPU 0, kept for GPU 1
    assert (b["xid_count"], b["xid_last"]) == (1, 79)
    assert src.sample(at(0))["xid_count"] == 2
    assert set(st["waits"]) == {0}, "every wait must be non-blocking (0 ms)"


def test_xids_absent_where_events_cannot_be_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    src, _ = install(monkeypatch, [FakeGpu(register_error=NVML_ERROR_NO_PERMISSION)])
    t = collect([src], at(0))
    assert t.xid_count is None and "xid_count" in t.missing


def test_a_lost_gpu_stops_the_event_set(monkeypatch: pytest.MonkeyPatch) -> None:
    src, nv = install(monkeypatch, [FakeGpu()])
    nv._fake_state["lost"] = True
    assert "xid_count" not in src.sample(at(0))
    n = len(nv._fake_state["waits"])
    src.sample(at(0))
    assert len(nv._fake_state["waits"]) == n  # not polled again


def test_ecc_counts_are_running_totals_that_survive_a_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = FakeGpu(ecc=[100, 2])
    src, _ = install(monkeypatch, [gpu])
    first = src.sample(at(0))
    assert (first["ecc_corrected"], first["ecc_uncorrected"]) == (0, 0)  # since the agent started
    gpu.ecc = [103, 2]
    s = src.sample(at(0))
    assert (s["ecc_corrected"], s["ecc_uncorrected"]) == (3, 0)
    gpu.ecc = [1, 0]  # a GPU reset cleared the volatile counters: 1 more since
    assert src.sample(at(0))["ecc_corrected"] == 4


def test_row_remapping_on_a100_and_later(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(rows=(3, 1, 1, 0))
    src, _ = install(monkeypatch, [gpu])
    s = src.sample(at(0))
    assert (s["remapped_rows"], s["remap_pending"], s["remap_failed"]) == (4, 1, 0)
    assert "retired_pages" not in s  # NOT_SUPPORTED on row-remapping GPUs
    gpu.rows = (3, 2, 0, 1)
    s = src.sample(at(0))
    assert (s["remapped_rows"], s["remap_pending"], s["remap_failed"]) == (5, 0, 1)


def test_page_retirement_on_older_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(retired=[[0x1000, 0x2000], [0x9000]], page_pending=1, rows=None)
    src, _ = install(monkeypatch, [gpu])
    s = src.sample(at(0))
    assert (s["retired_pages"], s["remap_pending"]) == (3, 1)
    assert "remapped_rows" not in s and "remap_failed" not in s


def test_nvlink_errors_over_active_links(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(nvlink={0: [1, 0, 0, 0, 0], 3: [0, 0, 5, 0, 0]})
    src, _ = install(monkeypatch, [gpu])
    assert src.sample(at(0))["nvlink_errors"] == 0
    gpu.nvlink[3][2] += 7  # CRC flit errors on link 3
    gpu.nvlink[0][0] += 1  # a replay on link 0
    assert src.sample(at(0))["nvlink_errors"] == 8
    no_link, _ = install(monkeypatch, [FakeGpu()])
    t = collect([no_link], at(0))
    assert "nvlink_errors" in t.missing  # a GPU without NVLink: unknown, not zero


def test_windows_get_the_increase_and_keep_the_state(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(ecc=[50, 0], rows=(0, 0, 0, 0))
    src, nv = install(monkeypatch, [gpu])
    acc = TelemetryAccumulator()
    acc.add(collect([src], at(0)))  # the ring's first sample primes it
    for corr, code in ((52, 31), (55, 43), (59, None)):
        gpu.ecc = [corr, 0]
        if code is not None:
            nv._fake_state["queue"].append((0, code))
        acc.add(collect([src], at(0)))
    t = acc.result()
    assert (t.ecc_corrected, t.ecc_uncorrected, t.xid_count, t.xid_last) == (9, 0, 2, 43)
    assert (t.remapped_rows, t.remap_failed, t.gpu_uuid) == (0, 0, gpu.uuid)
    acc.reset()  # next window: only what happened since
    gpu.ecc = [60, 0]
    acc.add(collect([src], at(0)))
    t = acc.result()
    assert (t.ecc_corrected, t.xid_count, t.xid_last) == (1, 0, 43)


def test_two_rings_of_one_rank_each_see_the_whole_increase(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A rank in two communicators has two rings sampled one after the other
    # with the same target: neither may steal the other's share of a rise.
    gpu = FakeGpu(ecc=[0, 0])
    src, nv = install(monkeypatch, [gpu])
    rings = [TelemetryAccumulator(), TelemetryAccumulator()]
    for acc in rings:
        acc.add(collect([src], at(0)))
    gpu.ecc = [5, 1]
    nv._fake_state["queue"].append((0, 94))
    for acc in rings:
        acc.add(collect([src], at(0)))
    for acc in rings:
        t = acc.result()
        assert (t.ecc_corrected, t.ecc_uncorrected, t.xid_count, t.xid_last) == (5, 1, 1, 94)


def test_error_counters_are_read_at_most_once_per_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    gpu = FakeGpu(ecc=[0, 0])
    src, nv = install(monkeypatch, [gpu], error_interval_s=10.0, clock=lambda: now[0])
    calls: list[str] = []
    spy(nv, "nvmlDeviceGetTotalEccErrors", calls, "ecc")
    assert src.sample(at(0))["ecc_corrected"] == 0
    gpu.ecc = [4, 0]
    nv._fake_state["queue"].append((0, 79))
    now[0] += 5.0
    s = src.sample(at(0))
    assert s["ecc_corrected"] == 0 and s["xid_count"] == 1  # cached totals; XIDs every time
    now[0] += 5.0
    assert src.sample(at(0))["ecc_corrected"] == 4
    assert len(calls) == 4  # two reads (corrected, uncorrected) per refresh, two refreshes


def test_software_fingerprint_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    src, _ = install(monkeypatch, [FakeGpu(), FakeGpu(name="NVIDIA H100 80GB HBM3")])
    assert src.software(at(1)) == {
        "driver": "550.54.15",
        "cuda": "12.4",
        "gpu_model": "NVIDIA H100 80GB HBM3",
    }
    # a driver without the _v2 symbol: the older call gives the same
    src, _ = install(monkeypatch, [FakeGpu()], ALL_SYMBOLS - {"nvmlSystemGetCudaDriverVersion_v2"})
    assert src.software(at(0))["cuda"] == "12.4"
    # no GPU for the rank: the system parts only
    assert src.software(RankTarget(rank=0)) == {"driver": "550.54.15", "cuda": "12.4"}
