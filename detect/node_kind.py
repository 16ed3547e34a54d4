"""What kind of node a rank runs on, GPU or CPU, and so what its costs count. Pure.

A CPU rank is one with no GPU telemetry source and no vendor (issue 31, item 9):
no GPU-tagged telemetry field reported, `vendor` absent, and some host field
reported. A rank with no telemetry at all is not called a CPU rank: nothing
says what it runs on, and the hours keep the contract's first unit, `gpu`.

The cost keys keep their names (`gpu_hours`, `straggler_gpu_hours_lost_total`);
`cost.unit` says what those hours count: a GPU's, or a CPU rank's (one rank
process) for a job whose every rank is a CPU rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from artemis.protocol.columns import TELEMETRY_COLUMNS, WindowColumns
from artemis.protocol.records import GPU_FIELDS, HOST_FIELDS, Telemetry

COST_UNITS = ("gpu", "cpu")
# The words the human text uses for an hour of each unit.
UNIT_HOURS = {"gpu": "GPU-hours", "cpu": "CPU-hours"}


def _present(v: object) -> bool:
    if v is None:
        return False
    if isinstance(v, float):
        return not math.isnan(v)
    return True


def is_cpu(t: Telemetry) -> bool:
    """Whether a rank's telemetry is a CPU rank's: host fields and nothing of a GPU."""
    if any(_present(getattr(t, f)) for f in GPU_FIELDS):
        return False  # `vendor` is a GPU field too
    return any(_present(getattr(t, f)) for f in HOST_FIELDS)


def reportable(t: Telemetry, missing: Iterable[str]) -> list[str]:
    """The `missing` names this kind of node could have reported: on a CPU rank the
    GPU fields are not missing, there is nothing to report them."""
    if not is_cpu(t):
        return sorted(set(missing))
    gpu = set(GPU_FIELDS)
    return sorted({m for m in missing if m not in gpu})


def _numeric_first(names: Sequence[str]) -> list[str]:
    # numeric columns are one vector test each; an object column (vendor, model) is
    # one comparison per row: tried last, and often not needed (see cost_unit)
    return sorted(names, key=lambda n: TELEMETRY_COLUMNS[n] not in ("of", "oi", "f", "i"))


def _col_present(cols: WindowColumns, name: str) -> np.ndarray:
    """Per row: whether the telemetry field `name` is reported."""
    col = cols[f"tel_{name}"]
    if TELEMETRY_COLUMNS[name] in ("of", "oi", "f", "i"):
        return ~np.isnan(np.asarray(col, dtype=np.float64))
    # None and NaN are absent: compared in numpy's C loop, not a Python call per row
    # (a 16k-rank window spent 26 ms here that way)
    arr = np.asarray(col, dtype=object)
    return np.asarray((arr != None) & (arr == arr), dtype=bool)  # noqa: E711


def _any_present(cols: WindowColumns, name: str) -> bool:
    """Whether any row reports the telemetry field `name`."""
    col = cols[f"tel_{name}"]
    if isinstance(col, list) and col.count(None) == len(col):
        return False  # an object column nobody reported: counted in C, no array built
    return bool(_col_present(cols, name).any())


def _rows_present(cols: WindowColumns, names: Sequence[str]) -> np.ndarray:
    """Per row: whether any of the telemetry fields `names` is reported."""
    out = np.zeros(cols.n, dtype=bool)
    for name in _numeric_first(names):
        out |= _col_present(cols, name)
    return out


def cost_unit(cols: WindowColumns) -> str:
    """`cpu` when every rank of a window is a CPU rank, else `gpu` (any GPU rank's
    hours are GPU-hours; an empty window or one without telemetry keeps `gpu`)."""
    if not cols.n:
        return "gpu"
    if not any(_present(cols[f"tel_{name}"][0]) for name in HOST_FIELDS):
        # the first row is no CPU rank, so not every rank is one: no column need be
        # scanned (a 100k-rank window's GPU columns took 11 M instructions to say so)
        return "gpu"
    if any(_any_present(cols, name) for name in _numeric_first(GPU_FIELDS)):
        return "gpu"
    return "cpu" if _rows_present(cols, HOST_FIELDS).all() else "gpu"


def unit_hours(unit: object) -> str:
    """How the human text names an hour of `unit` (a record without one is a GPU job's)."""
    return UNIT_HOURS.get(str(unit), UNIT_HOURS["gpu"]) if unit else UNIT_HOURS["gpu"]
