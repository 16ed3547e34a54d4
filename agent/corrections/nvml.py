"""Corrections on NVIDIA GPUs through NVML (``pynvml`` of nvidia-ml-py 13).

Calls, checked against nvidia-ml-py 13's signatures:

* reset_clocks: ``nvmlDeviceResetGpuLockedClocks(h)``,
  ``nvmlDeviceResetMemoryLockedClocks(h)``, then
  ``nvmlDeviceResetApplicationsClocks(h)``. That last one is deprecated (Volta and
  later boards answer NOT_SUPPORTED, and drivers may lack its symbol): either is
  no failure, the locked clocks are what matters.
* Its state before: NVML cannot read a locked range, so what is recorded is what
  the clocks run at now, ``nvmlDeviceGetClockInfo`` SM and MEM (``sm_mhz``,
  ``mem_mhz``), and the application clocks ``nvmlDeviceGetApplicationsClock`` SM and
  MEM (``app_sm_mhz``, ``app_mem_mhz``; None where not supported). Its rollback
  locks to what was observed, min = max: ``nvmlDeviceSetGpuLockedClocks(h, sm, sm)``,
  ``nvmlDeviceSetMemoryLockedClocks(h, mem, mem)``, and the application clocks
  with ``nvmlDeviceSetApplicationsClocks(h, mem, sm)`` (memory first, as NVML
  takes them) when they were read; the last two may answer NOT_SUPPORTED (boards
  before Ampere, drivers without application clocks): no setting to restore there.
* restore_power_limit: ``nvmlDeviceSetPowerManagementLimit(h, mW)`` to
  ``nvmlDeviceGetPowerManagementDefaultLimit(h)`` (mW); the enforced limit before
  from ``nvmlDeviceGetEnforcedPowerLimit`` (mW), else
  ``nvmlDeviceGetPowerManagementLimit``.

Every set call needs root or CAP_SYS_ADMIN (docs/OPERATING.md "Corrections"):
without it NVML answers NO_PERMISSION, which becomes a ``CorrectionError`` with
NVML's own text, as NOT_SUPPORTED does.
"""

from __future__ import annotations

from typing import Any

from artemis.agent.corrections.base import CorrectionError, GpuControl, library_call

# nvml.h values, used when pynvml lacks the name
_CLOCK_SM = 1
_CLOCK_MEM = 2
_ERROR_NOT_SUPPORTED = 3
_ERROR_FUNCTION_NOT_FOUND = 13


class NvmlControl(GpuControl):
    """The NVML backend. ``lib`` is the pynvml module (imported, and NVML
    initialised, on first use when not given)."""

    vendor = "nvidia"

    def __init__(self, lib: Any = None) -> None:
        self._nv = lib
        self._ready = False

    def _lib(self) -> Any:
        if not self._ready:
            if self._nv is None:
                try:
                    import pynvml
                except ImportError as e:
                    raise CorrectionError(f"pynvml is not installed: {e}") from None
                self._nv = pynvml
            # nvmlInit is reference counted: the telemetry source's init is not disturbed.
            self._call("nvmlInit")
            self._ready = True
        return self._nv

    def _call(self, name: str, *args: Any) -> Any:
        return library_call(self._nv, self._nv.NVMLError, "NVML", name, *args)

    def _handle(self, gpu: int) -> Any:
        self._lib()
        return self._call("nvmlDeviceGetHandleByIndex", gpu)

    def _const(self, name: str, default: int) -> int:
        return int(getattr(self._nv, name, default))

    def _optional(self, name: str, *args: Any) -> Any:
        """A read whose failure (NOT_SUPPORTED, a missing symbol) means "none": None then."""
        try:
            return self._call(name, *args)
        except CorrectionError:
            return None

    def _unless_unsupported(self, name: str, *args: Any) -> None:
        """A set call the board may not have: NOT_SUPPORTED (or a driver without the
        symbol) is no failure; any other error (NO_PERMISSION) is."""
        fn = getattr(self._nv, name, None)
        if fn is None:
            return
        try:
            fn(*args)
        except self._nv.NVMLError as e:
            if getattr(e, "value", None) not in (_ERROR_NOT_SUPPORTED, _ERROR_FUNCTION_NOT_FOUND):
                raise CorrectionError(f"NVML: {e}") from None

    # ------------------------------------------------------------- clocks
    def clock_state(self, gpu: int) -> dict[str, Any]:
        h = self._handle(gpu)
        sm, mem = self._const("NVML_CLOCK_SM", _CLOCK_SM), self._const("NVML_CLOCK_MEM", _CLOCK_MEM)
        return {
            "sm_mhz": int(self._call("nvmlDeviceGetClockInfo", h, sm)),
            "mem_mhz": int(self._call("nvmlDeviceGetClockInfo", h, mem)),
            "app_sm_mhz": self._optional("nvmlDeviceGetApplicationsClock", h, sm),
            "app_mem_mhz": self._optional("nvmlDeviceGetApplicationsClock", h, mem),
        }

    def reset_clocks(self, gpu: int) -> None:
        h = self._handle(gpu)
        self._call("nvmlDeviceResetGpuLockedClocks", h)
        self._call("nvmlDeviceResetMemoryLockedClocks", h)
        self._unless_unsupported("nvmlDeviceResetApplicationsClocks", h)  # deprecated

    def restore_clocks(self, gpu: int, before: dict[str, Any]) -> None:
        sm, mem = before.get("sm_mhz"), before.get("mem_mhz")
        if not isinstance(sm, int) or not isinstance(mem, int):
            raise CorrectionError(f"before: no sm_mhz/mem_mhz to lock to ({before!r})")
        h = self._handle(gpu)
        self._call("nvmlDeviceSetGpuLockedClocks", h, sm, sm)
        # Memory locks came with Ampere and application clocks are deprecated: a board
        # without them had no such setting to restore.
        self._unless_unsupported("nvmlDeviceSetMemoryLockedClocks", h, mem, mem)
        app_sm, app_mem = before.get("app_sm_mhz"), before.get("app_mem_mhz")
        if isinstance(app_sm, int) and isinstance(app_mem, int):
            self._unless_unsupported("nvmlDeviceSetApplicationsClocks", h, app_mem, app_sm)

    # ------------------------------------------------------------- power
    def power_state(self, gpu: int) -> dict[str, Any]:
        h = self._handle(gpu)
        limit = self._optional("nvmlDeviceGetEnforcedPowerLimit", h)
        if limit is None:
            limit = self._call("nvmlDeviceGetPowerManagementLimit", h)
        default = self._call("nvmlDeviceGetPowerManagementDefaultLimit", h)
        return {"power_limit_w": int(limit) / 1000.0, "default_w": int(default) / 1000.0}

    def set_power_limit(self, gpu: int, watts: float) -> None:
        self._call("nvmlDeviceSetPowerManagementLimit", self._handle(gpu), round(watts * 1000))
