"""Window summaries as columns: one array per field for many rank-windows.

This is the in-memory form the coordinator core works on: a node's batch is
decoded straight into it, assembly concatenates batches, and the detector
reads its arrays. There are no per-rank Python objects on the hot path;
`rows()` and `from_records()` convert to and from `RankWindow` for code at the
edges (tests, the simulator, tools).

Absent numbers: float columns hold NaN; optional integer columns are float64
with NaN for absent (exact up to 2**53, which every such field is far below).
Strings, the `throttle` maps and `missing` are Python lists, one entry a row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt
from artemis.protocol.records import RankWindow, Telemetry

# Column name -> kind, for RankWindow's own fields (telemetry follows below).
#   "i": int64, always present; "f": float64, always present (NaN kept as NaN);
#   "of": optional float, NaN = absent; "oi": optional int, float64 with NaN = absent;
#   "s": str; "os": optional str.
WINDOW_COLUMNS: dict[str, str] = {
    "job": "s",
    "comm": "s",
    "rank": "i",
    "nranks": "i",
    "host": "s",
    "window": "i",
    "step_lo": "i",
    "step_hi": "i",
    "coll_lo": "i",
    "coll_hi": "i",
    "gap_ms": "f",
    "coll_ms": "f",
    "step_ms": "f",
    "collectives": "i",
    "bytes": "i",
    "lost": "i",
    "clock": "s",
    "island": "os",
    "hw_class": "os",
    "samples": "oi",
    "bridge_ms": "of",
    "bridge_peer": "oi",
}
# Telemetry fields, as columns named `tel_<field>`. "t": throttle map or None;
# "m": the `missing` tuple of names.
TELEMETRY_COLUMNS: dict[str, str] = {
    "vendor": "os",
    "gpu_model": "os",
    "gpu_index": "oi",
    "sm_mhz": "of",
    "sm_mhz_max": "of",
    "mem_mhz": "of",
    "temp_c": "of",
    "power_w": "of",
    "power_limit_w": "of",
    "throttle": "t",
    "pcie_gen": "oi",
    "pcie_gen_max": "oi",
    "pcie_width": "oi",
    "pcie_width_max": "oi",
    "cpu_pct": "of",
    "steal_pct": "of",
    "iowait_pct": "of",
    "psi_cpu_some": "of",
    "load1": "of",
    "ncpu": "oi",
    "proc_cpu_pct": "of",
    "gpu_uuid": "os",
    "gpu_serial": "os",
    "gpu_pci_bus": "os",
    "xid_count": "oi",
    "xid_last": "oi",
    "ecc_corrected": "oi",
    "ecc_uncorrected": "oi",
    "retired_pages": "oi",
    "remapped_rows": "oi",
    "remap_pending": "oi",
    "remap_failed": "oi",
    "nvlink_errors": "oi",
    "nic_symbol_errors": "oi",
    "nic_link_downed": "oi",
    "nic_rcv_errors": "oi",
    "nic_xmit_wait": "oi",
    "missing": "m",
}

_ARRAY_KINDS = ("i", "f", "of", "oi")


def _all_columns() -> dict[str, str]:
    out = dict(WINDOW_COLUMNS)
    out.update({f"tel_{k}": v for k, v in TELEMETRY_COLUMNS.items()})
    return out


COLUMNS: dict[str, str] = _all_columns()

_RW_FIELDS = {f.name for f in fields(RankWindow)} - {"telemetry"}
_TEL_FIELDS = {f.name for f in fields(Telemetry)}
assert set(WINDOW_COLUMNS) == _RW_FIELDS, "WINDOW_COLUMNS must name every RankWindow field"
assert set(TELEMETRY_COLUMNS) == _TEL_FIELDS, "TELEMETRY_COLUMNS must name every Telemetry field"


@dataclass(frozen=True, slots=True)
class WindowColumns:
    """Many rank-window summaries, one entry per column per row.

    `cols` maps every name of COLUMNS to a numpy array (kinds i, f, oi) or a
    list (kinds s, os, t, m), all of length `n`.
    """

    n: int
    cols: dict[str, Any]

    def __post_init__(self) -> None:
        for name in COLUMNS:
            if name not in self.cols:
                raise ValueError(f"window columns: column {name!r} is missing")
            if len(self.cols[name]) != self.n:
                raise ValueError(
                    f"window columns: column {name!r} has {len(self.cols[name])} rows, not {self.n}"
                )

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, name: str) -> Any:
        return self.cols[name]

    def ints(self, name: str) -> npt.NDArray[np.int64]:
        a: npt.NDArray[np.int64] = self.cols[name]
        return a

    def floats(self, name: str) -> npt.NDArray[np.float64]:
        a: npt.NDArray[np.float64] = self.cols[name]
        return a

    # -- building -----------------------------------------------------------

    @classmethod
    def empty(cls) -> WindowColumns:
        return cls(0, {k: _empty(kind) for k, kind in COLUMNS.items()})

    @classmethod
    def from_records(cls, recs: Sequence[RankWindow]) -> WindowColumns:
        n = len(recs)
        cols: dict[str, Any] = {}
        for name, kind in WINDOW_COLUMNS.items():
            cols[name] = _column(kind, [getattr(r, name) for r in recs], n)
        for name, kind in TELEMETRY_COLUMNS.items():
            cols[f"tel_{name}"] = _column(kind, [getattr(r.telemetry, name) for r in recs], n)
        return cls(n, cols)

    @classmethod
    def concat(cls, parts: Iterable[WindowColumns]) -> WindowColumns:
        parts = [p for p in parts if p.n]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        cols: dict[str, Any] = {}
        for name, kind in COLUMNS.items():
            if kind in _ARRAY_KINDS:
                cols[name] = np.concatenate([p.cols[name] for p in parts])
            else:
                cols[name] = [v for p in parts for v in p.cols[name]]
        return cls(sum(p.n for p in parts), cols)

    def take(self, idx: npt.NDArray[np.intp] | Sequence[int]) -> WindowColumns:
        """The rows at `idx`, in that order."""
        ix = np.asarray(idx, dtype=np.intp)
        cols: dict[str, Any] = {}
        for name, kind in COLUMNS.items():
            v = self.cols[name]
            cols[name] = v[ix] if kind in _ARRAY_KINDS else [v[i] for i in ix.tolist()]
        return WindowColumns(int(ix.size), cols)

    # -- reading ------------------------------------------------------------

    def row(self, i: int) -> RankWindow:
        tel = {k: _value(kind, self.cols[f"tel_{k}"][i]) for k, kind in TELEMETRY_COLUMNS.items()}
        kw = {k: _value(kind, self.cols[k][i]) for k, kind in WINDOW_COLUMNS.items()}
        return RankWindow(telemetry=Telemetry(**tel), **kw)

    def rows(self) -> list[RankWindow]:
        return [self.row(i) for i in range(self.n)]


def _empty(kind: str) -> Any:
    if kind == "i":
        return np.zeros(0, dtype=np.int64)
    if kind in ("f", "of", "oi"):
        return np.zeros(0, dtype=np.float64)
    return []


def _column(kind: str, values: list[Any], n: int) -> Any:
    if kind == "i":
        return np.fromiter(values, dtype=np.int64, count=n)
    if kind in ("f", "of", "oi"):
        return np.fromiter((math.nan if v is None else v for v in values), np.float64, count=n)
    if kind == "m":
        return [tuple(v) for v in values]
    return list(values)


def _value(kind: str, v: Any) -> Any:
    if kind == "i":
        return int(v)
    if kind == "f":
        return float(v)
    if kind == "of":
        f = float(v)
        return None if math.isnan(f) else f
    if kind == "oi":
        f = float(v)
        return None if math.isnan(f) else int(f)
    if kind == "m":
        return tuple(v)
    return v
