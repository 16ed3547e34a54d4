"""Corrections on AMD GPUs through AMD SMI (the ``amdsmi`` package of ROCm 7).

Calls, checked against amdsmi's ``amdsmi_interface.py`` (7.0.2):

* reset_clocks: ``amdsmi_set_gpu_perf_level(h, AmdSmiDevPerfLevel.AUTO)``: the
  driver chooses the clock levels again.
* Its state before: ``amdsmi_get_gpu_perf_level(h)`` (a string,
  ``"AMDSMI_DEV_PERF_LEVEL_MANUAL"``, recorded as ``perf_level = "MANUAL"``) and,
  in MANUAL, the levels the clocks sit at: ``amdsmi_get_clk_freq(h,
  AmdSmiClkType.SYS)`` / ``MEM`` -> ``{"num_supported", "current", "frequency"}``,
  recorded as ``sclk_levels`` / ``mclk_levels`` (level indices). Its rollback sets
  the perf level back (``AmdSmiDevPerfLevel[name]``) and, in MANUAL, the levels
  with ``amdsmi_set_clk_freq(h, clk_type, freq_bitmask)`` (bit i = level i).
* restore_power_limit: ``amdsmi_set_power_cap(h, sensor_ind, cap)`` to
  ``amdsmi_get_power_cap_info(h)["default_power_cap"]``; both in microwatts, as is
  the enforced ``power_cap`` recorded before. Sensor 0, the one
  ``amdsmi_get_power_cap_info`` reads.

Set calls need root (amdgpu's sysfs files are root's; docs/OPERATING.md
"Corrections"): without it AMD SMI raises ``AmdSmiLibraryException``
(AMDSMI_STATUS_NO_PERM), which becomes a ``CorrectionError`` with its text.
Not run against a real AMD GPU here (none is lent): tested against a fake shaped
like amdsmi 7.0.2 (tests/test_corrections_hw.py).
"""

from __future__ import annotations

from typing import Any

from artemis.agent.corrections.base import CorrectionError, GpuControl, library_call

_PERF_PREFIX = "AMDSMI_DEV_PERF_LEVEL_"
_SENSOR = 0
_UW = 1e6  # microwatts per watt


class AmdSmiControl(GpuControl):
    """The AMD SMI backend. ``lib`` is the amdsmi module (imported, and the library
    initialised, on first use when not given)."""

    vendor = "amd"

    def __init__(self, lib: Any = None) -> None:
        self._smi = lib
        self._handles: list[Any] | None = None

    def _call(self, name: str, *args: Any) -> Any:
        return library_call(self._smi, self._smi.AmdSmiException, "AMD SMI", name, *args)

    def _handle(self, gpu: int) -> Any:
        if self._handles is None:
            if self._smi is None:
                try:
                    import amdsmi
                except ImportError as e:
                    raise CorrectionError(f"amdsmi is not installed: {e}") from None
                self._smi = amdsmi
            flags = getattr(self._smi, "AmdSmiInitFlags", None)
            self._call("amdsmi_init", *([flags.INIT_AMD_GPUS] if flags is not None else []))
            self._handles = list(self._call("amdsmi_get_processor_handles"))
        if not 0 <= gpu < len(self._handles):
            raise CorrectionError(f"AMD SMI: no GPU {gpu} (this host has {len(self._handles)})")
        return self._handles[gpu]

    # ------------------------------------------------------------- clocks
    def clock_state(self, gpu: int) -> dict[str, Any]:
        h = self._handle(gpu)
        level = str(self._call("amdsmi_get_gpu_perf_level", h)).removeprefix(_PERF_PREFIX)
        out: dict[str, Any] = {"perf_level": level}
        if level == "MANUAL":
            clk = self._smi.AmdSmiClkType
            for key, kind in (("sclk_levels", clk.SYS), ("mclk_levels", clk.MEM)):
                freq = self._call("amdsmi_get_clk_freq", h, kind)
                out[key] = [int(freq["current"])]
        return out

    def reset_clocks(self, gpu: int) -> None:
        h = self._handle(gpu)
        self._call("amdsmi_set_gpu_perf_level", h, self._smi.AmdSmiDevPerfLevel.AUTO)

    def restore_clocks(self, gpu: int, before: dict[str, Any]) -> None:
        level = before.get("perf_level")
        levels = self._smi.AmdSmiDevPerfLevel
        if not isinstance(level, str) or level not in levels.__members__:
            raise CorrectionError(f"before: no known perf_level to restore ({level!r})")
        h = self._handle(gpu)
        self._call("amdsmi_set_gpu_perf_level", h, levels[level])
        if level != "MANUAL":
            return
        clk = self._smi.AmdSmiClkType
        for key, kind in (("sclk_levels", clk.SYS), ("mclk_levels", clk.MEM)):
            idx = before.get(key) or []
            mask = sum(1 << int(i) for i in idx)
            if mask:
                self._call("amdsmi_set_clk_freq", h, kind, mask)

    # ------------------------------------------------------------- power
    def power_state(self, gpu: int) -> dict[str, Any]:
        info = self._call("amdsmi_get_power_cap_info", self._handle(gpu))
        return {
            "power_limit_w": float(info["power_cap"]) / _UW,
            "default_w": float(info["default_power_cap"]) / _UW,
        }

    def set_power_limit(self, gpu: int, watts: float) -> None:
        self._call("amdsmi_set_power_cap", self._handle(gpu), _SENSOR, round(watts * _UW))
