"""NVIDIA GPU signals through NVML (``pynvml``, from the ``nvidia-ml-py`` package).

``pynvml`` is imported lazily, on first use: without it, or without a driver or
a GPU, ``available()`` is ``(False, reason)`` and ``sample`` returns nothing, so
every GPU field is reported missing. Each field is read on its own; one the
device does not support (NVML_ERROR_NOT_SUPPORTED, e.g. power on some boards)
is simply absent.

Fields: ``gpu_model`` (nvmlDeviceGetName), ``sm_mhz`` / ``mem_mhz``
(nvmlDeviceGetClockInfo SM / MEM), ``sm_mhz_max`` (nvmlDeviceGetMaxClockInfo
SM), ``temp_c`` (GPU die), ``power_w`` (nvmlDeviceGetPowerUsage, mW),
``power_limit_w`` (nvmlDeviceGetEnforcedPowerLimit, mW), ``throttle`` (clock
event reasons, see ``THROTTLE_BITS``; only the reasons the device says it
supports), ``pcie_gen``/``pcie_width`` current and ``*_max`` the maximum the
device *and* the slot allow (nvmlDeviceGetMaxPcieLink*). An idle GPU may train
its link down to save power, so the current link is only meaningful under load.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from artemis.agent.telemetry.base import RankTarget, call_or_none

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


class NvmlSource:
    """GPU clocks, temperature, power, throttle reasons and PCIe link via NVML."""

    name = "nvml"

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = root
        self._nv: Any = None
        self._state: tuple[bool, str] | None = None
        self._pid_gpu: dict[int, int] = {}

    def available(self) -> tuple[bool, str]:
        """(True, "") when NVML works and sees a GPU, else (False, why)."""
        if self._state is None:
            self._state = self._init()
        return self._state

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
        return True, ""

    def close(self) -> None:
        if self._nv is not None:
            call_or_none(self._nv.nvmlShutdown)
            self._nv = None
            self._state = None

    def gpu_index(self, target: RankTarget) -> int | None:
        """NVML index of the rank's GPU (see the module docstring for the order)."""
        if target.gpu_index is not None:
            return target.gpu_index
        if target.pid is None or not self.available()[0]:
            return None
        pid = target.pid
        if pid in self._pid_gpu:
            return self._pid_gpu[pid]
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
        if found is not None:
            self._pid_gpu[pid] = found
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
            "temp_c": call_or_none(
                nv.nvmlDeviceGetTemperature,
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
        out.update({k: v for k, v in reads.items() if v is not None})
        # newer drivers call them clock *event* reasons; older ones throttle reasons
        cur = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        sup = getattr(nv, "nvmlDeviceGetSupportedClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetSupportedClocksThrottleReasons", None
        )
        mask = call_or_none(cur, h)
        if mask is not None:
            out["throttle"] = throttle_from_mask(int(mask), call_or_none(sup, h))
        return out
