"""AMD GPU signals through AMD SMI (the ``amdsmi`` Python package of ROCm).

Honest status: written from the amdsmi Python API (ROCm 6.x / 7.x; the
dict shapes checked against amdsmi 7.0.2's ``amdsmi_interface.py``) and never
run against a real AMD GPU in this project: no machine here has one. The pure
helpers are tested, and the calls into amdsmi against a fake module shaped
like amdsmi 7.0.2 (tests/test_telemetry_amd.py).

``amdsmi`` is imported lazily; without it, a driver or a GPU, ``available()``
is ``(False, reason)`` and ``sample`` returns nothing, so every GPU field is
reported missing. Each field is read on its own; a call that fails or answers
"N/A" (amdsmi's marker for unsupported values) leaves its field absent.

Fields and where they come from:

* ``gpu_model``: ``amdsmi_get_gpu_asic_info(h)["market_name"]``.
* ``sm_mhz`` / ``sm_mhz_max``: ``amdsmi_get_clock_info(h, AmdSmiClkType.GFX)``
  keys ``clk`` (``cur_clk`` in older releases) / ``max_clk``; ``mem_mhz`` the
  same with ``AmdSmiClkType.MEM``.
* ``temp_c``: ``amdsmi_get_temp_metric`` of the HOTSPOT (junction) sensor, the
  one throttling follows, else EDGE (MI300 has no edge sensor).
* ``power_w``: ``amdsmi_get_power_info``: ``socket_power``, else
  ``current_socket_power`` (MI300+), else ``average_socket_power`` (W).
* ``power_limit_w`` / ``power_limit_default_w``: ``amdsmi_get_power_cap_info(h)``
  ``["power_cap"]`` / ``["default_power_cap"]`` (µW).
* ``throttle``: ``amdsmi_get_violation_status`` (MI300+, ROCm 6.4+): the
  ``active_*`` flags map onto our reasons (``throttle_from_violation``). The raw
  ``throttle_status`` bitmask of gpu_metrics has ASIC-specific meanings and is
  not interpreted; on older GPUs ``throttle`` is therefore missing.
* PCIe: ``amdsmi_get_pcie_info``: ``pcie_metric.pcie_width`` /
  ``pcie_speed`` (MT/s, turned into a generation) and ``pcie_static``
  ``max_pcie_width`` / ``pcie_interface_version``. amdsmi 7's Python binding
  puts only ``max_pcie_width``, ``max_pcie_speed``, ``pcie_interface_version``
  and ``slot_type`` in ``pcie_static`` (the C struct's
  ``max_pcie_interface_version`` is not in the dict); on Linux the library
  derives ``pcie_interface_version`` from the device's ``max_link_speed``, so
  it is the generation of the maximum link. ``max_pcie_interface_version`` is
  read if a later binding adds it, and ``max_pcie_speed`` is the last resort.
* Identity: ``gpu_uuid`` (``amdsmi_get_gpu_device_uuid``), ``gpu_serial``
  (``amdsmi_get_gpu_board_info``'s ``product_serial``, else the ASIC serial of
  ``amdsmi_get_gpu_asic_info``), ``gpu_pci_bus`` (``amdsmi_get_gpu_device_bdf``).
* RAS: ``ecc_corrected`` / ``ecc_uncorrected``: ``amdsmi_get_gpu_total_ecc_count``'s
  ``correctable_count`` and ``uncorrectable_count`` + ``deferred_count``
  (deferred errors are uncorrectable ones whose handling was put off), as
  running totals (``base.COUNT_FIELDS``: the window gets their increase);
  ``retired_pages``: the records of ``amdsmi_get_gpu_bad_page_info``.
  Not read: XGMI error status (a state, not a count) and amdsmi event
  notification (XID-like events need a reader thread of their own).

The rank's GPU: ``target.gpu_index`` (position in
``amdsmi_get_processor_handles()``), else the GPU whose
``amdsmi_get_gpu_process_list`` holds the rank's pid (dicts with ``pid`` in
current releases; process handles resolved with ``amdsmi_get_gpu_process_info``
in older ones), else ``HIP_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES`` /
``CUDA_VISIBLE_DEVICES`` with ``LOCAL_RANK`` from ``/proc/<pid>/environ``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from artemis.agent.telemetry.base import GpuLibrarySource, RankTarget, call_or_none
from artemis.agent.telemetry.nvml import gpu_from_environ, read_environ

# PCIe transfer rate per lane (MT/s) of each generation.
_GEN_BY_MTS = {2500: 1, 5000: 2, 8000: 3, 16000: 4, 32000: 5, 64000: 6}
_UINT_MAX = (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)

# amdsmi violation flags -> our throttle reasons (several map onto one)
VIOLATION_REASONS: dict[str, str] = {
    "active_ppt_pwr": "sw_power_cap",  # package power tracking limit
    "active_socket_thrm": "sw_thermal",  # firmware thermal limit of the socket
    "active_prochot_thrm": "hw_thermal",  # PROCHOT asserted by hardware
    "active_vr_thrm": "hw_thermal",  # voltage regulator too hot
    "active_hbm_thrm": "hw_thermal",  # HBM too hot
}


def num(v: Any) -> float | None:
    """A number amdsmi reported, or None for "N/A", sentinels and non-numbers."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int) and v in _UINT_MAX:
        return None
    return float(v)


def pcie_gen_from_speed(speed: Any) -> int | None:
    """PCIe generation from a per-lane speed in MT/s (or GT/s when below 100)."""
    s = num(speed)
    if s is None or s <= 0:
        return None
    mts = s * 1000 if s < 100 else s
    best = min(_GEN_BY_MTS, key=lambda k: abs(k - mts))
    return _GEN_BY_MTS[best] if abs(best - mts) <= 0.1 * best else None


def throttle_from_violation(status: Mapping[str, Any]) -> dict[str, bool] | None:
    """Our throttle reasons from amdsmi_get_violation_status (None if no flag is known)."""
    out: dict[str, bool] = {}
    for key, reason in VIOLATION_REASONS.items():
        v = status.get(key)
        if isinstance(v, bool) or (isinstance(v, int) and v not in _UINT_MAX):
            out[reason] = out.get(reason, False) or bool(v)
    return out or None


def gpu_from_environ_amd(env: Mapping[str, str]) -> int | str | None:
    """Device index (or UUID) from ROCm's visibility variables and LOCAL_RANK."""
    for var in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        if var in env:
            return gpu_from_environ({"CUDA_VISIBLE_DEVICES": env[var], **_local(env)})
    return gpu_from_environ(_local(env))


def _local(env: Mapping[str, str]) -> dict[str, str]:
    return {"LOCAL_RANK": env["LOCAL_RANK"]} if "LOCAL_RANK" in env else {}


def rocm_version(v: Any) -> str | None:
    """``rocm-6.4.1`` from what amdsmi_get_rocm_version returns ("6.4.1-123", or a
    (status, version) pair); None when no version number is in it."""
    if isinstance(v, tuple | list):
        v = next((x for x in reversed(v) if isinstance(x, str | bytes)), None)
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    m = re.match(r"\s*(\d+(?:\.\d+)*)", v) if isinstance(v, str) else None
    return f"rocm-{m.group(1)}" if m else None


class AmdSmiSource(GpuLibrarySource):
    """AMD GPU clocks, temperature, power, throttle flags and PCIe link via amdsmi."""

    name = "amdsmi"

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        super().__init__(root)
        self._smi: Any = None
        self._handles: list[Any] = []

    def _init(self) -> tuple[bool, str]:
        try:
            import amdsmi
        except ImportError as exc:
            return False, f"amdsmi is not installed (it ships with ROCm): {exc}"
        try:
            flags = getattr(amdsmi, "AmdSmiInitFlags", None)
            if flags is not None and hasattr(flags, "INIT_AMD_GPUS"):
                amdsmi.amdsmi_init(flags.INIT_AMD_GPUS)
            else:
                amdsmi.amdsmi_init()
            handles = list(amdsmi.amdsmi_get_processor_handles())
        except Exception as exc:
            return False, f"AMD SMI failed to initialise (no amdgpu driver?): {exc}"
        if not handles:
            return False, "AMD SMI sees no AMD GPU"
        self._smi, self._handles = amdsmi, handles
        return True, ""

    def close(self) -> None:
        if self._smi is not None:
            call_or_none(self._smi.amdsmi_shut_down)
            self._smi, self._handles, self._state = None, [], None

    def _pids(self, h: Any) -> set[int]:
        smi = self._smi
        procs = call_or_none(smi.amdsmi_get_gpu_process_list, h) or []
        pids: set[int] = set()
        for p in procs:
            info = (
                p if isinstance(p, Mapping) else call_or_none(smi.amdsmi_get_gpu_process_info, h, p)
            )
            if isinstance(info, Mapping) and isinstance(info.get("pid"), int):
                pids.add(info["pid"])
        return pids

    def _find_gpu(self, pid: int) -> int | None:
        found = next((i for i, h in enumerate(self._handles) if pid in self._pids(h)), None)
        if found is None:
            entry = gpu_from_environ_amd(read_environ(pid, self.root))
            found = entry if isinstance(entry, int) else None
        return found

    def software(self, target: RankTarget) -> dict[str, str]:
        """The rank's part of its software fingerprint (agent/fingerprint.py): its GPU's
        model (``amdsmi_get_gpu_asic_info``'s ``market_name``), the amdgpu driver
        (``amdsmi_get_gpu_driver_info``'s ``driver_version``) and ROCm as
        ``rocm-X.Y.Z`` (``amdsmi_get_rocm_version``: a string, or ``(ok, string)`` in
        releases that return a status with it). Unknown ones are left out."""
        if not self.available()[0]:
            return {}
        smi = self._smi
        out: dict[str, str] = {}
        rocm = rocm_version(call_or_none(getattr(smi, "amdsmi_get_rocm_version", None)))
        if rocm:
            out["cuda"] = rocm
        idx = self.gpu_index(target)
        if idx is None or not 0 <= idx < len(self._handles):
            return out
        h = self._handles[idx]
        drv = call_or_none(getattr(smi, "amdsmi_get_gpu_driver_info", None), h)
        asic = call_or_none(smi.amdsmi_get_gpu_asic_info, h)
        for key, info, field in (
            ("driver", drv, "driver_version"),
            ("gpu_model", asic, "market_name"),
        ):
            v = info.get(field) if isinstance(info, Mapping) else None
            if isinstance(v, str) and v.strip():
                out[key] = v.strip()
        return out

    def sample(self, target: RankTarget) -> dict[str, object]:
        if not self.available()[0]:
            return {}
        idx = self.gpu_index(target)
        if idx is None or not 0 <= idx < len(self._handles):
            return {}
        smi, h = self._smi, self._handles[idx]
        out: dict[str, object] = {"vendor": "amd", "gpu_index": idx}
        asic = call_or_none(smi.amdsmi_get_gpu_asic_info, h)
        if isinstance(asic, Mapping) and isinstance(asic.get("market_name"), str):
            out["gpu_model"] = asic["market_name"]
        clk_t = getattr(smi, "AmdSmiClkType", None)
        if clk_t is not None:
            gfx = call_or_none(smi.amdsmi_get_clock_info, h, clk_t.GFX)
            if isinstance(gfx, Mapping):
                out["sm_mhz"] = num(gfx.get("clk", gfx.get("cur_clk")))
                out["sm_mhz_max"] = num(gfx.get("max_clk"))
            mem = call_or_none(smi.amdsmi_get_clock_info, h, clk_t.MEM)
            if isinstance(mem, Mapping):
                out["mem_mhz"] = num(mem.get("clk", mem.get("cur_clk")))
        ttype = getattr(smi, "AmdSmiTemperatureType", None)
        tmetric = getattr(smi, "AmdSmiTemperatureMetric", None)
        if ttype is not None and tmetric is not None:
            for sensor in ("HOTSPOT", "EDGE"):
                if hasattr(ttype, sensor):
                    t = num(
                        call_or_none(
                            smi.amdsmi_get_temp_metric, h, getattr(ttype, sensor), tmetric.CURRENT
                        )
                    )
                    if t is not None:
                        out["temp_c"] = t
                        break
        power = call_or_none(smi.amdsmi_get_power_info, h)
        if isinstance(power, Mapping):
            for key in ("socket_power", "current_socket_power", "average_socket_power"):
                w = num(power.get(key))
                if w is not None:
                    out["power_w"] = w
                    break
        cap = call_or_none(getattr(smi, "amdsmi_get_power_cap_info", None), h)
        if isinstance(cap, Mapping):
            for field, key in (
                ("power_limit_w", "power_cap"),
                ("power_limit_default_w", "default_power_cap"),
            ):
                if num(cap.get(key)) is not None:
                    out[field] = float(cap[key]) / 1e6
        viol = call_or_none(getattr(smi, "amdsmi_get_violation_status", None), h)
        if isinstance(viol, Mapping):
            out["throttle"] = throttle_from_violation(viol)
        pcie = call_or_none(smi.amdsmi_get_pcie_info, h)
        if isinstance(pcie, Mapping):
            metric = pcie.get("pcie_metric") or {}
            static = pcie.get("pcie_static") or {}
            out["pcie_width"] = num(metric.get("pcie_width"))
            out["pcie_gen"] = pcie_gen_from_speed(metric.get("pcie_speed"))
            out["pcie_width_max"] = num(static.get("max_pcie_width"))
            gen_max = num(static.get("pcie_interface_version")) or num(
                static.get("max_pcie_interface_version")
            )
            out["pcie_gen_max"] = (
                int(gen_max) if gen_max else pcie_gen_from_speed(static.get("max_pcie_speed"))
            )
        out.update(self._identity(idx, h))
        out.update(self._ras(idx, h))
        return {k: v for k, v in out.items() if v is not None}

    def _identity(self, idx: int, h: Any) -> dict[str, object]:
        """UUID, serial and PCI bus id: read once per GPU."""
        if idx not in self._ident:
            smi = self._smi
            board = call_or_none(getattr(smi, "amdsmi_get_gpu_board_info", None), h)
            asic = call_or_none(smi.amdsmi_get_gpu_asic_info, h)
            serial = _text(board.get("product_serial")) if isinstance(board, Mapping) else None
            if serial is None and isinstance(asic, Mapping):
                serial = _text(asic.get("asic_serial"))
            ident = {
                "gpu_uuid": _text(
                    call_or_none(getattr(smi, "amdsmi_get_gpu_device_uuid", None), h)
                ),
                "gpu_serial": serial,
                "gpu_pci_bus": _text(
                    call_or_none(getattr(smi, "amdsmi_get_gpu_device_bdf", None), h)
                ),
            }
            self._ident[idx] = {k: v for k, v in ident.items() if v is not None}
        return self._ident[idx]

    def _ras(self, idx: int, h: Any) -> dict[str, object]:
        smi = self._smi
        out: dict[str, object] = {}
        ecc = call_or_none(getattr(smi, "amdsmi_get_gpu_total_ecc_count", None), h)
        if isinstance(ecc, Mapping):
            corr = num(ecc.get("correctable_count"))
            unc = num(ecc.get("uncorrectable_count"))
            deferred = num(ecc.get("deferred_count")) or 0.0
            out["ecc_corrected"] = self._totals.add(
                idx, "ecc_corrected", None if corr is None else int(corr), idx
            )
            out["ecc_uncorrected"] = self._totals.add(
                idx, "ecc_uncorrected", None if unc is None else int(unc + deferred), idx
            )
        pages = call_or_none(getattr(smi, "amdsmi_get_gpu_bad_page_info", None), h)
        if isinstance(pages, list):
            out["retired_pages"] = len(pages)
        return out


def _text(v: Any) -> str | None:
    """A string amdsmi reported, or None for "N/A" and empty ones."""
    if not isinstance(v, str):
        return None
    v = v.strip()
    return v if v and v != "N/A" else None
