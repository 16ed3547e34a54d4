"""NVIDIA GPU signals through NVML (``pynvml``, from the ``nvidia-ml-py`` package).

``pynvml`` is imported lazily, on first use: without it, or without a driver or
a GPU, ``available()`` is ``(False, reason)`` and ``sample`` returns nothing, so
every GPU field is reported missing. Each field is read on its own; one the
device does not support (NVML_ERROR_NOT_SUPPORTED, e.g. power on some boards)
is simply absent.

Fields: ``gpu_model`` (nvmlDeviceGetName), ``sm_mhz`` / ``mem_mhz``
(nvmlDeviceGetClockInfo SM / MEM), ``sm_mhz_max`` (nvmlDeviceGetMaxClockInfo
SM), ``temp_c`` (GPU die), ``power_w`` (nvmlDeviceGetPowerUsage, mW),
``power_limit_w`` (nvmlDeviceGetEnforcedPowerLimit, mW), ``power_limit_default_w``
(nvmlDeviceGetPowerManagementDefaultLimit, mW), ``throttle`` (clock
event reasons, see ``THROTTLE_BITS``; only the reasons the device says it
supports), ``pcie_gen``/``pcie_width`` current and ``*_max`` the maximum the
device *and* the slot allow (nvmlDeviceGetMaxPcieLink*). An idle GPU may train
its link down to save power, so the current link is only meaningful under load.

Identity and hardware errors, for an RMA ticket: ``gpu_uuid``
(nvmlDeviceGetUUID), ``gpu_serial`` (nvmlDeviceGetSerial; boards without one
leave it absent), ``gpu_pci_bus`` (nvmlDeviceGetPciInfo ``busId``);
``xid_count`` / ``xid_last``: XID events (nvmlEventTypeXidCriticalError)
from one NVML event set the source registers every GPU in, drained without
blocking (nvmlEventSetWait_v2 with a 0 ms timeout, until NVML_ERROR_TIMEOUT)
and counted per GPU, with the last code seen; ``ecc_corrected`` /
``ecc_uncorrected``: nvmlDeviceGetTotalEccErrors (volatile counters);
``retired_pages``: nvmlDeviceGetRetiredPages
of both causes (GPUs before A100), ``remapped_rows`` / ``remap_pending`` /
``remap_failed``: nvmlDeviceGetRemappedRows (A100 and later), pending also
from nvmlDeviceGetRetiredPagesPendingStatus; ``nvlink_errors``:
nvmlDeviceGetNvLinkErrorCounter (replay, recovery, CRC flit, CRC data, ECC)
summed over the active links (nvmlDeviceGetNvLinkState). The counts
(``base.COUNT_FIELDS``) are reported as running totals since the agent
started, absorbing the device counters' own resets; the window accumulator
turns them into the increase over the window (``base`` says why).

Driver and library versions (checked against nvidia-ml-py 13's pynvml):

* pynvml resolves a C symbol only when a function is called: a Python
  function can exist while the driver lacks the symbol, and then raises
  ``NVMLError_FunctionNotFound``. ``nvmlDeviceGetCurrentClocksEventReasons``
  is such a case on drivers up to R525 (the symbol came with R535): on
  ``NVMLError`` the source falls back to ``...ClocksThrottleReasons`` (same
  for ``Supported...``), which newer drivers still export.
* ``nvmlDeviceGetTemperature`` is deprecated and goes with CUDA 14:
  ``nvmlDeviceGetTemperatureV`` (the versioned struct call) is used, with the
  old call as fallback for drivers that lack the new symbol.

Tested against a fake module shaped like pynvml (tests/test_telemetry_nvml.py),
and, where a GPU is lent, by tests/gpu/test_nvml_real.py.

Which GPU a rank uses
---------------------
1. ``target.gpu_index`` when the daemon already knows it;
2. the GPU whose compute processes (nvmlDeviceGetComputeRunningProcesses)
   include the rank's pid (the ring header's pid). NVML reports pids of the
   host's pid namespace, so this works when the agent sees the same namespace;
3. else ``/proc/<pid>/environ``: ``CUDA_VISIBLE_DEVICES`` and ``LOCAL_RANK``
   (``gpu_from_environ``). Caveat: CUDA orders devices fastest-first unless
   ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` while NVML uses PCI order, so on a host with
   mixed GPUs the numeric fallback can point at the wrong device; UUID entries
   are exact.
The mapping is cached per pid.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from artemis.agent.telemetry.base import GpuLibrarySource, RankTarget, call_or_none

# NVML clock event (formerly "throttle") reason bits, from nvml.h.
THROTTLE_BITS: dict[int, str] = {
    0x1: "idle",  # GpuIdle
    0x2: "apps_clocks",  # ApplicationsClocksSetting
    0x4: "sw_power_cap",  # SwPowerCap
    0x8: "hw_slowdown",  # HwSlowdown
    0x10: "sync_boost",  # SyncBoost
    0x20: "sw_thermal",  # SwThermalSlowdown
    0x40: "hw_thermal",  # HwThermalSlowdown
    0x80: "hw_power_brake",  # HwPowerBrakeSlowdown
}
_ALL_BITS = sum(THROTTLE_BITS)

# nvml.h enum values, used when pynvml lacks the constant name
_NVML_CLOCK_SM = 1
_NVML_CLOCK_MEM = 2
_NVML_TEMPERATURE_GPU = 0
_NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
_NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
_NVML_VOLATILE_ECC = 0
_NVML_PAGE_RETIREMENT_CAUSES = (0, 1)  # multiple single-bit, double-bit
_NVML_FEATURE_ENABLED = 1
_NVML_NVLINK_MAX_LINKS = 18  # pynvml 13 says 36; its constant wins when present
_NVML_NVLINK_ERROR_COUNTERS = 5  # DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA, DL_ECC_DATA
_EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
_MAX_EVENTS_PER_DRAIN = 4096  # an XID storm must not hold the sampler


def first_ok(nv: Any, names: tuple[str, ...], *args: Any) -> Any:
    """The result of the first of ``names`` that pynvml has and that does not
    raise, or None. pynvml raises ``NVMLError`` (``NVMLError_FunctionNotFound``)
    when the driver lacks the symbol behind an existing Python function, so a
    newer name is tried first and an older one after it."""
    for name in names:
        fn = getattr(nv, name, None)
        if fn is None:
            continue
        try:
            return fn(*args)
        except Exception:  # NVMLError: not found, not supported, no permission
            continue
    return None


def cuda_version(code: int | None) -> str | None:
    """The CUDA driver API's version code (1000 * major + 10 * minor) as ``12.8``."""
    if not code or code <= 0:
        return None
    return f"{code // 1000}.{(code % 1000) // 10}"


def _text(v: Any) -> str | None:
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    return (v.strip() or None) if isinstance(v, str) else None


def throttle_from_mask(mask: int, supported: int | None = None) -> dict[str, bool]:
    """Reason -> active for the reasons the device supports (all if unknown)."""
    sup = _ALL_BITS if supported is None else supported
    return {name: bool(mask & bit) for bit, name in THROTTLE_BITS.items() if sup & bit}


def gpu_from_environ(env: Mapping[str, str]) -> int | str | None:
    """The device a process uses from its environment: an NVML index or a UUID.

    ``CUDA_VISIBLE_DEVICES`` lists the devices the process may see; the process
    uses entry ``LOCAL_RANK`` of that list (entry 0 when only one is visible).
    Without the variable, device ``LOCAL_RANK``. None when it cannot be told.
    """
    local_s = env.get("LOCAL_RANK")
    local = int(local_s) if local_s is not None and local_s.strip().isdigit() else None
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return local
    visible = [v.strip() for v in cvd.split(",") if v.strip()]
    if not visible:
        return None
    if len(visible) == 1:
        entry = visible[0]
    elif local is not None and local < len(visible):
        entry = visible[local]
    else:
        return None
    return int(entry) if entry.isdigit() else entry


def read_environ(pid: int, root: str | os.PathLike[str] = "/") -> dict[str, str]:
    """A process's environment from /proc/<pid>/environ ({} if unreadable)."""
    try:
        raw = (Path(root) / f"proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


class NvmlSource(GpuLibrarySource):
    """GPU clocks, temperature, power, throttle reasons and PCIe link via NVML."""

    name = "nvml"

    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        error_interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(root)
        # ECC, remap and NVLink counters cost up to ~100 NVML calls per GPU
        # (5 counters x 18 links on an H100), and on GSP-based GPUs a call can
        # take a millisecond: they are read at most this often per GPU, the
        # last totals reported in between (the window still gets their rise).
        self.error_interval_s = error_interval_s
        self._clock = clock
        self._err_cache: dict[int, tuple[float, dict[str, object]]] = {}
        self._nv: Any = None
        self._links: dict[int, list[int]] = {}
        self._xid_total: dict[int, int] = {}  # XID events seen per GPU
        self._xid_last: dict[int, int] = {}
        self._events: Any = None  # the NVML event set, None when XIDs cannot be had
        self._xids: dict[int, list[int]] = {}  # per GPU index, drained, not yet sampled
        self._xid_gpus: set[int] = set()  # GPUs registered for XID events

    def _init(self) -> tuple[bool, str]:
        try:
            import pynvml
        except ImportError as exc:
            return False, f"pynvml is not installed (pip install nvidia-ml-py): {exc}"
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            return False, f"NVML failed to initialise (no NVIDIA driver?): {exc}"
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception as exc:
            return False, f"NVML could not count devices: {exc}"
        if count == 0:
            return False, "NVML sees no NVIDIA GPU"
        self._nv = pynvml
        self._open_events(count)
        return True, ""

    def _open_events(self, count: int) -> None:
        """One event set for XIDs on every GPU that supports them; none if no GPU does."""
        nv = self._nv
        xid = getattr(nv, "nvmlEventTypeXidCriticalError", _EVENT_XID)
        es = call_or_none(getattr(nv, "nvmlEventSetCreate", None))
        if es is None:
            return
        for i in range(count):
            h = call_or_none(nv.nvmlDeviceGetHandleByIndex, i)
            supported = call_or_none(getattr(nv, "nvmlDeviceGetSupportedEventTypes", None), h)
            if h is None or not isinstance(supported, int) or not supported & xid:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(h, xid, es)
            except Exception:
                continue  # e.g. NVML_ERROR_NO_PERMISSION: this GPU's XIDs stay absent
            self._xid_gpus.add(i)
        if self._xid_gpus:
            self._events = es
        else:
            call_or_none(getattr(nv, "nvmlEventSetFree", None), es)

    def _drain_events(self) -> None:
        """Take every pending XID event without waiting; file it under its GPU."""
        nv, es = self._nv, self._events
        if es is None:
            return
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        timeout = getattr(nv, "NVMLError_Timeout", None)
        for _ in range(_MAX_EVENTS_PER_DRAIN):
            try:
                data = wait(es, 0)
            except Exception as exc:
                if timeout is None or not isinstance(exc, timeout):
                    # Anything but "no event" (GPU lost, unknown): stop using the set.
                    call_or_none(getattr(nv, "nvmlEventSetFree", None), es)
                    self._events = None
                    self._xid_gpus.clear()
                return
            idx = call_or_none(nv.nvmlDeviceGetIndex, data.device)
            if isinstance(idx, int):
                self._xids.setdefault(idx, []).append(int(data.eventData))

    def close(self) -> None:
        if self._nv is not None:
            if self._events is not None:
                call_or_none(getattr(self._nv, "nvmlEventSetFree", None), self._events)
                self._events = None
            call_or_none(self._nv.nvmlShutdown)
            self._nv = None
            self._state = None

    def software(self, target: RankTarget) -> dict[str, str]:
        """The rank's part of its software fingerprint (agent/fingerprint.py): its GPU's
        model (nvmlDeviceGetName), the driver (nvmlSystemGetDriverVersion) and the CUDA
        version the driver supports (nvmlSystemGetCudaDriverVersion_v2, before it
        nvmlSystemGetCudaDriverVersion: 1000 * major + 10 * minor). Unknown ones are
        left out."""
        if not self.available()[0]:
            return {}
        nv = self._nv
        out: dict[str, str] = {}
        driver = _text(first_ok(nv, ("nvmlSystemGetDriverVersion",)))
        if driver:
            out["driver"] = driver
        code = first_ok(nv, ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"))
        cuda = cuda_version(code if isinstance(code, int) else None)
        if cuda:
            out["cuda"] = cuda
        idx = self.gpu_index(target)
        h = call_or_none(nv.nvmlDeviceGetHandleByIndex, idx) if idx is not None else None
        name = _text(call_or_none(nv.nvmlDeviceGetName, h)) if h is not None else None
        if name:
            out["gpu_model"] = name
        return out

    def _find_gpu(self, pid: int) -> int | None:
        """NVML index of the process's GPU (see the module docstring for the order)."""
        nv = self._nv
        found: int | None = None
        for i in range(int(nv.nvmlDeviceGetCount())):
            h = call_or_none(nv.nvmlDeviceGetHandleByIndex, i)
            procs = (
                call_or_none(nv.nvmlDeviceGetComputeRunningProcesses, h) if h is not None else None
            )
            if procs and any(getattr(p, "pid", None) == pid for p in procs):
                found = i
                break
        if found is None:
            entry = gpu_from_environ(read_environ(pid, self.root))
            if isinstance(entry, int):
                found = entry
            elif isinstance(entry, str):
                h = call_or_none(nv.nvmlDeviceGetHandleByUUID, entry)
                found = call_or_none(nv.nvmlDeviceGetIndex, h) if h is not None else None
        return found

    def sample(self, target: RankTarget) -> dict[str, object]:
        if not self.available()[0]:
            return {}
        idx = self.gpu_index(target)
        if idx is None:
            return {}
        nv = self._nv
        h = call_or_none(nv.nvmlDeviceGetHandleByIndex, idx)
        if h is None:
            return {}
        sm = getattr(nv, "NVML_CLOCK_SM", _NVML_CLOCK_SM)
        mem = getattr(nv, "NVML_CLOCK_MEM", _NVML_CLOCK_MEM)
        out: dict[str, object] = {"vendor": "nvidia", "gpu_index": idx}
        name = call_or_none(nv.nvmlDeviceGetName, h)
        if name is not None:
            out["gpu_model"] = name.decode() if isinstance(name, bytes) else str(name)
        reads: dict[str, Any] = {
            "sm_mhz": call_or_none(nv.nvmlDeviceGetClockInfo, h, sm),
            "sm_mhz_max": call_or_none(nv.nvmlDeviceGetMaxClockInfo, h, sm),
            "mem_mhz": call_or_none(nv.nvmlDeviceGetClockInfo, h, mem),
            "temp_c": first_ok(
                nv,
                ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"),
                h,
                getattr(nv, "NVML_TEMPERATURE_GPU", _NVML_TEMPERATURE_GPU),
            ),
            "pcie_gen": call_or_none(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "pcie_gen_max": call_or_none(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
            "pcie_width": call_or_none(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
            "pcie_width_max": call_or_none(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
        }
        power = call_or_none(nv.nvmlDeviceGetPowerUsage, h)
        limit = call_or_none(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        reads["power_w"] = None if power is None else power / 1000.0
        reads["power_limit_w"] = None if limit is None else limit / 1000.0
        default = call_or_none(getattr(nv, "nvmlDeviceGetPowerManagementDefaultLimit", None), h)
        reads["power_limit_default_w"] = None if default is None else default / 1000.0
        out.update({k: v for k, v in reads.items() if v is not None})
        # Drivers from R535 call them clock *event* reasons; older ones only
        # export the throttle-reason symbols (see the module docstring).
        mask = first_ok(
            nv,
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
            h,
        )
        if mask is not None:
            sup = first_ok(
                nv,
                (
                    "nvmlDeviceGetSupportedClocksEventReasons",
                    "nvmlDeviceGetSupportedClocksThrottleReasons",
                ),
                h,
            )
            out["throttle"] = throttle_from_mask(int(mask), None if sup is None else int(sup))
        out.update(self._identity(idx, h))
        out.update(self._errors(idx, h))
        return out

    def _identity(self, idx: int, h: Any) -> dict[str, object]:
        """UUID, serial and PCI bus id: read once per GPU."""
        if idx not in self._ident:
            nv = self._nv
            pci = call_or_none(nv.nvmlDeviceGetPciInfo, h)
            ident = {
                "gpu_uuid": _text(call_or_none(nv.nvmlDeviceGetUUID, h)),
                "gpu_serial": _text(call_or_none(getattr(nv, "nvmlDeviceGetSerial", None), h)),
                "gpu_pci_bus": _text(getattr(pci, "busId", None)),
            }
            self._ident[idx] = {k: v for k, v in ident.items() if v is not None}
        return self._ident[idx]

    def _errors(self, idx: int, h: Any) -> dict[str, object]:
        out = self._xid_fields(idx)
        now = self._clock()
        cached = self._err_cache.get(idx)
        if cached is None or now - cached[0] >= self.error_interval_s:
            cached = (now, self._counters(idx, h))
            self._err_cache[idx] = cached
        out.update(cached[1])
        return out

    def _xid_fields(self, idx: int) -> dict[str, object]:
        """XID events, drained on every sample (cheap: one call when none is pending)."""
        out: dict[str, object] = {}
        if idx in self._xid_gpus:
            self._drain_events()
        if idx in self._xid_gpus:  # still registered: no XID is "none seen", not unknown
            codes = self._xids.pop(idx, [])
            self._xid_total[idx] = self._xid_total.get(idx, 0) + len(codes)
            out["xid_count"] = self._xid_total[idx]
            if codes:
                self._xid_last[idx] = codes[-1]
            out["xid_last"] = self._xid_last.get(idx)
        return {k: v for k, v in out.items() if v is not None}

    def _counters(self, idx: int, h: Any) -> dict[str, object]:
        """ECC, retired pages, row remapping and NVLink error counters of one GPU."""
        nv = self._nv
        out: dict[str, object] = {}
        volatile = getattr(nv, "NVML_VOLATILE_ECC", _NVML_VOLATILE_ECC)
        for field, etype in (
            ("ecc_corrected", getattr(nv, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)),
            ("ecc_uncorrected", getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)),
        ):
            total = call_or_none(nv.nvmlDeviceGetTotalEccErrors, h, etype, volatile)
            out[field] = self._totals.add(idx, field, total, idx)
        retired_fn = getattr(nv, "nvmlDeviceGetRetiredPages", None)
        pages = [call_or_none(retired_fn, h, c) for c in _NVML_PAGE_RETIREMENT_CAUSES]
        if all(isinstance(p, list) for p in pages):
            out["retired_pages"] = sum(len(p) for p in pages if isinstance(p, list))
        # Pending: a retired page (older GPUs) or a remapped row (A100+) takes
        # effect only after a GPU reset; known when either call answers.
        pendings: list[bool] = []
        page_pending = call_or_none(getattr(nv, "nvmlDeviceGetRetiredPagesPendingStatus", None), h)
        if isinstance(page_pending, int):
            pendings.append(page_pending == _NVML_FEATURE_ENABLED)
        rows = call_or_none(getattr(nv, "nvmlDeviceGetRemappedRows", None), h)
        if isinstance(rows, tuple) and len(rows) == 4:
            corr, unc, row_pending, failure = (int(x) for x in rows)
            out["remapped_rows"] = corr + unc
            out["remap_failed"] = int(bool(failure))
            pendings.append(bool(row_pending))
        if pendings:
            out["remap_pending"] = int(any(pendings))
        out["nvlink_errors"] = self._totals.add(
            idx, "nvlink_errors", self._nvlink_total(idx, h), idx
        )
        return {k: v for k, v in out.items() if v is not None}

    def _nvlink_total(self, idx: int, h: Any) -> int | None:
        """Sum of the NVLink error counters over the GPU's active links (None: no NVLink)."""
        nv = self._nv
        if idx not in self._links:
            n = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", _NVML_NVLINK_MAX_LINKS))
            state = getattr(nv, "nvmlDeviceGetNvLinkState", None)
            self._links[idx] = [
                link for link in range(n) if call_or_none(state, h, link) == _NVML_FEATURE_ENABLED
            ]
        links = self._links[idx]
        if not links:
            return None
        counters = int(getattr(nv, "NVML_NVLINK_ERROR_COUNT", _NVML_NVLINK_ERROR_COUNTERS))
        total, seen = 0, False
        for link in links:
            for c in range(counters):
                v = call_or_none(nv.nvmlDeviceGetNvLinkErrorCounter, h, link, c)
                if isinstance(v, int):
                    total, seen = total + v, True
        return total if seen else None
