"""Object-array and number helpers shared by the detector's modules (pure numpy).

A window's string columns (host, island, class) arrive as lists with None for
absent; these turn them into object arrays and masks without a per-row Python
loop, since Python runs per finding here, never per rank.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
OBJ = npt.NDArray[np.object_]


def factorize(labels: OBJ) -> tuple[OBJ, I64]:
    """Distinct labels (sorted) and each one's index, for a few distinct strings in
    many rows: a set and one comparison pass per label, where np.unique would sort
    every row's string."""
    if labels.size == 0:
        return labels[:0].copy(), np.zeros(0, dtype=np.int64)
    names = sorted(set(labels.tolist()))
    if len(names) > 64:
        uniq, inv = np.unique(labels, return_inverse=True)
        return uniq, inv.ravel().astype(np.int64)
    out: OBJ = np.empty(len(names), dtype=object)
    out[:] = names
    ids = np.zeros(labels.size, dtype=np.int64)
    for k, name in enumerate(names[1:], start=1):
        ids[labels == name] = k
    return out, ids


def all_none(col: Any) -> bool:
    """A column that is absent in every row (identity checks only: cheap)."""
    return isinstance(col, list) and (not col or (col[0] is None and col.count(None) == len(col)))


def none_mask(a: OBJ) -> npt.NDArray[np.bool_]:
    """Elementwise `is None` of an object array. Truth is a cheap C call per element,
    a comparison with None a slow one: only the falsy ones ("" or None) are compared."""
    out = ~a.astype(bool)
    if out.any():
        out[out] = np.asarray(a[out] == None, dtype=bool)  # noqa: E711 - elementwise
    return out


def objects(values: Any) -> OBJ:
    """A string column as an object array (None kept), without a per-row Python loop."""
    out: OBJ = np.empty(len(values), dtype=object)
    if (
        isinstance(values, list)
        and values
        and values[0] is None
        and values.count(None) == len(values)
    ):
        return out  # an absent column (no island, no class): already all None
    out[:] = values
    return out


def pack(a: npt.NDArray[Any]) -> bytes:
    """An array as raw little-endian bytes (snapshots: msgpack-able, any host's)."""
    return np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()


def unpack(b: bytes, dtype: Any) -> npt.NDArray[Any]:
    return np.frombuffer(b, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)


def finite_or_none(v: Any) -> float | None:
    """A number for a finding's field: non-finite is unknown (null)."""
    x = float(v)
    return x if math.isfinite(x) else None


def pct(excess: float, step_ms: float) -> float | None:
    """Excess as a percentage of the step (None without a step time)."""
    return 100.0 * excess / step_ms if step_ms > 0 else None
