"""Window summaries as columns: one array per field for many rank-windows.

This is the in-memory form the coordinator core works on, and (protocol minor
1.1) the wire form of a `windows` message: a node's batch is decoded straight
into it (the cost is per column, not per rank), assembly copies the
batches into a window's, and the detector reads its arrays. There are no per-rank Python
objects on the hot path; `rows()` and `from_records()` convert to and from
`RankWindow` for code at the edges (tests, the simulator, tools, agents of
the older minor).

The columns are derived from the schema in records.py: every RankWindow field
is a column of the same name, every Telemetry field a column `tel_<field>`.

Absent numbers: float columns hold NaN; optional integer columns are float64
with NaN for absent (exact up to 2**53; the wire refuses larger ones there).
Strings, the `throttle` maps and `missing` are Python lists, one entry a row.
Arrays decoded from the wire are read-only views of the frame, and an optional
numeric column a batch lacks is a shared read-only NaN row (`absent`), which
`concat` and `take` keep, and a string or map column that repeats one value off the
wire holds that one object in every row (`WireBatch`): consumers never write into a
window's columns.

Wire form (`WindowBatch`, see protocol/README.md): `n` rows; a numeric column
is `[dtype, bin]` or, for an optional integer column, `[dtype, bin, validity]`
with `dtype` one of "<i8" "<i4" "<f8" "<f4" (little-endian) and `validity` a
bitmap of ceil(n/8) bytes, bit i (LSB first) set when row i is present; an
optional column that is absent altogether is left out (or nil). Strings, the
throttle maps and missing are msgpack arrays.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from itertools import chain, repeat
from operator import attrgetter, is_
from types import GenericAlias
from typing import Any, Literal

import msgspec
import numpy as np
import numpy.typing as npt
from artemis.protocol.records import FLOAT_MAX, U63, RankWindow, Telemetry, field_specs


def _column_kind(kind: str, optional: bool) -> str:
    if kind in ("i", "f", "s"):
        return ("o" + kind) if optional else kind
    return kind


# Column name -> kind, for RankWindow's own fields (telemetry follows below).
#   "i": int64, always present; "f": float64, always present (finite);
#   "of": optional float, NaN = absent; "oi": optional int, float64 with NaN = absent;
#   "s": str; "os": optional str; "t": throttle map or None; "m": the `missing` tuple.
_RW_SPECS = {s.name: s for s in field_specs(RankWindow) if s.kind != "r"}
_TEL_SPECS = {s.name: s for s in field_specs(Telemetry)}
WINDOW_COLUMNS: dict[str, str] = {n: _column_kind(s.kind, s.optional) for n, s in _RW_SPECS.items()}
# Telemetry fields, as columns named `tel_<field>`.
TELEMETRY_COLUMNS: dict[str, str] = {
    n: _column_kind(s.kind, s.optional) for n, s in _TEL_SPECS.items()
}

_ARRAY_KINDS = ("i", "f", "of", "oi")


def _all_columns() -> dict[str, str]:
    out = dict(WINDOW_COLUMNS)
    out.update({f"tel_{k}": v for k, v in TELEMETRY_COLUMNS.items()})
    return out


COLUMNS: dict[str, str] = _all_columns()
_SPECS = {**_RW_SPECS, **{f"tel_{k}": s for k, s in _TEL_SPECS.items()}}


@dataclass(frozen=True, slots=True)
class WindowColumns:
    """Many rank-window summaries, one entry per column per row.

    `cols` maps every name of COLUMNS to a numpy array (kinds i, f, oi, of) or a
    list (kinds s, os, t, m), all of length `n`.
    """

    n: int
    cols: dict[str, Any]
    # The decoded wire batch these columns are views of, when they came off the
    # wire: `to_wire` hands it back instead of encoding the columns again.
    wire: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in COLUMNS:
            if name not in self.cols:
                raise ValueError(f"window columns: column {name!r} is missing")
            if len(self.cols[name]) != self.n:
                raise ValueError(
                    f"window columns: column {name!r} has {len(self.cols[name])} rows, not {self.n}"
                )

    @classmethod
    def _checked(cls, n: int, cols: dict[str, Any], wire: Any = None) -> WindowColumns:
        """Built from columns already checked (every name present, `n` rows each)."""
        out = object.__new__(cls)
        object.__setattr__(out, "n", n)
        object.__setattr__(out, "cols", cols)
        object.__setattr__(out, "wire", wire)
        return out

    def __len__(self) -> int:
        return self.n

    def detached(self) -> WindowColumns:
        """The same columns without the wire batch they were decoded from (which holds
        the frame's bytes): what is kept after the batch was journaled."""
        return self if self.wire is None else WindowColumns._checked(self.n, self.cols)

    def __getitem__(self, name: str) -> Any:
        return self.cols[name]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WindowColumns):
            return NotImplemented
        if self.n != other.n:
            return False
        for name, kind in COLUMNS.items():
            a, b = self.cols[name], other.cols[name]
            if kind in _ARRAY_KINDS:
                if not np.array_equal(a, b, equal_nan=kind != "i"):
                    return False
            elif list(a) != list(b):
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

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
    def from_records(cls, recs: Sequence[RankWindow] | WindowColumns) -> WindowColumns:
        if isinstance(recs, WindowColumns):
            return recs  # columns already (a detector's input either way: detect/monitor.py)
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
        n = sum(p.n for p in parts)
        # An optional column that no part has stays one shared NaN row (`absent`):
        # concatenating the parts' NaNs would allocate and fill a fresh array per
        # such column, about half of a usual batch's numeric columns.
        marks = [_shared(p.n) for p in parts]
        cols: dict[str, Any] = {}
        for name, kind in COLUMNS.items():
            got = [p.cols[name] for p in parts]
            if kind not in _ARRAY_KINDS:
                cols[name] = list(chain.from_iterable(got))
            elif kind in ("of", "oi") and all(map(is_, got, marks)):
                cols[name] = absent(n)
            else:
                cols[name] = np.concatenate(got)
        return cls._checked(n, cols)

    def take(self, idx: npt.NDArray[np.intp] | Sequence[int]) -> WindowColumns:
        """The rows at `idx`, in that order."""
        ix = np.asarray(idx, dtype=np.intp)
        il = ix.tolist()
        mark = _shared(self.n)  # an absent column stays the shared NaN row
        cols: dict[str, Any] = {}
        for name, kind in COLUMNS.items():
            v = self.cols[name]
            if kind not in _ARRAY_KINDS:
                cols[name] = list(map(v.__getitem__, il))
            else:
                cols[name] = absent(len(il)) if v is mark else v[ix]
        return WindowColumns._checked(len(il), cols)

    # -- reading ------------------------------------------------------------

    def row(self, i: int) -> RankWindow:
        return self.take([i]).rows()[0]

    def rows(self) -> list[RankWindow]:
        """Every row as a RankWindow: one list per column, then one call per row."""
        lists = {name: _pylist(kind, self.cols[name]) for name, kind in COLUMNS.items()}
        tels = [
            Telemetry(*vals)
            for vals in zip(*(lists[f"tel_{k}"] for k in TELEMETRY_COLUMNS), strict=True)
        ]
        rw = zip(*(lists[k] for k in WINDOW_COLUMNS), strict=True)
        # Positional: the columns are in field order and `telemetry` is the last field.
        return [RankWindow(*vals, tel) for vals, tel in zip(rw, tels, strict=True)]


def _pylist(kind: str, v: Any) -> list[Any]:
    if kind in ("i", "f"):
        out: list[Any] = v.tolist()
        return out
    if kind == "of":
        return [None if x != x else x for x in v.tolist()]  # x != x: NaN
    if kind == "oi":
        return [None if x != x else int(x) for x in v.tolist()]
    if kind == "m":
        return [None if x is None else tuple(x) for x in v]
    return list(v)


def _empty(kind: str) -> Any:
    if kind == "i":
        return np.zeros(0, dtype=np.int64)
    if kind in ("f", "of", "oi"):
        return np.zeros(0, dtype=np.float64)
    return []


# The NaN row of an optional numeric column absent from a batch: one read-only array
# per row count, shared by every absent column of every batch of that size (a fleet
# sends batches of a few sizes: a node's ranks), so `concat` knows by identity that
# no part has the column. Sizes past _ABSENT_ROWS, or past _ABSENT_SIZES distinct
# sizes, share the row of the latest such size (`_LATEST`): a window's concatenation
# and its `take`s make one row for all of its absent columns, not one each (a
# 100k-rank window lacking 30 columns: 24 MB).
_ABSENT: dict[int, npt.NDArray[np.float64]] = {}
_LATEST: dict[int, npt.NDArray[np.float64]] = {}
_ABSENT_ROWS = 1 << 14
_ABSENT_SIZES = 64


def _shared(n: int) -> npt.NDArray[np.float64] | None:
    """The shared NaN row of `n` rows, if one is kept."""
    row = _ABSENT.get(n)
    return _LATEST.get(n) if row is None else row


def absent(n: int) -> npt.NDArray[np.float64]:
    """The shared read-only NaN row of an absent optional column of `n` rows."""
    row = _shared(n)
    if row is None:
        row = np.full(n, math.nan)
        row.flags.writeable = False
        if n <= _ABSENT_ROWS and len(_ABSENT) < _ABSENT_SIZES:
            _ABSENT[n] = row
        else:
            _LATEST.clear()
            _LATEST[n] = row
    return row


def _column(kind: str, values: list[Any], n: int) -> Any:
    if kind == "i":
        return np.fromiter(values, dtype=np.int64, count=n)
    if kind in ("f", "of", "oi"):
        return np.fromiter((math.nan if v is None else v for v in values), np.float64, count=n)
    if kind == "m":
        return [None if v is None else tuple(v) for v in values]
    return list(values)


# --------------------------------------------------------------------------- wire

# The dtype tags of numeric columns (little-endian); NumCol's Literal lists them.
Dtype = Literal["<i8", "<i4", "<f8", "<f4"]
_INT_DTYPES = ("<i8", "<i4")
_EXACT = float(1 << 53)  # largest integer a float64 column holds exactly


class NumCol(msgspec.Struct, frozen=True, array_like=True):
    """A numeric column on the wire: ``[dtype, data]`` or ``[dtype, data, validity]``."""

    dtype: Dtype
    data: bytes
    valid: bytes | None = None


def _wire_type(name: str, kind: str, hint: Any, raw: bool) -> tuple[Any, Any]:
    """(type, default) of column `name` in the wire struct, from its schema hint; with
    `raw`, a column of strings or maps is kept as its msgpack bytes (`_listed`)."""
    if kind in _ARRAY_KINDS:
        return (NumCol, msgspec.NODEFAULT) if kind in ("i", "f") else (NumCol | None, None)
    if raw:
        # (msgspec takes no union with Raw: an absent column reads as nil's bytes)
        return (msgspec.Raw, msgspec.NODEFAULT) if kind == "s" else (msgspec.Raw, _NIL)
    if kind == "s":
        return list[hint], msgspec.NODEFAULT
    return list[hint] | None, None


_NIL = msgspec.Raw(b"\xc0")  # msgpack's nil


def _hints() -> dict[str, Any]:
    rw_hints = typing.get_type_hints(RankWindow, include_extras=True)
    tel_hints = typing.get_type_hints(Telemetry, include_extras=True)
    return {n: tel_hints[n[4:]] if n.startswith("tel_") else rw_hints[n] for n in COLUMNS}


def _batch_struct(raw: bool) -> type[msgspec.Struct]:
    flds: list[Any] = [("n", typing.Annotated[int, msgspec.Meta(ge=0, le=1 << 24)])]
    for name, hint in _hints().items():
        tp, default = _wire_type(name, COLUMNS[name], hint, raw)
        flds.append((name, tp) if default is msgspec.NODEFAULT else (name, tp, default))
    # Required columns first (a struct's fields with defaults must come last).
    flds.sort(key=lambda f: len(f) == 3)
    return msgspec.defstruct("WireBatch" if raw else "WindowBatch", flds, frozen=True, kw_only=True)


# The struct of a columnar batch, generated from the schema: strings and maps are
# validated by msgspec in C, numeric columns by `from_wire` below.
WindowBatch: Any = _batch_struct(raw=False)
# The same batch as a `windows` message carries it (the same msgpack): the columns of
# strings and maps are kept as their bytes and read by `from_wire` (`_listed`), which
# takes a column of one repeated value (a node's job, host, GPU model...) as one
# object shared by every row instead of one object a row.
WireBatch: Any = _batch_struct(raw=True)


class ColumnError(ValueError):
    """A column of a batch is invalid; ``column`` names it."""

    def __init__(self, column: str, text: str) -> None:
        super().__init__(f"{column}: {text}")
        self.column = column
        self.text = text


def _array(name: str, c: NumCol, n: int) -> npt.NDArray[Any]:
    dt = np.dtype(c.dtype)
    if len(c.data) != n * dt.itemsize:
        raise ColumnError(
            name, f"expected {n} rows of {c.dtype} ({n * dt.itemsize} bytes), got {len(c.data)}"
        )
    return np.frombuffer(c.data, dt)


def _first_bad(
    name: str, what: str, a: npt.NDArray[Any], bad: npt.NDArray[np.bool_]
) -> ColumnError:
    i = int(np.argmax(bad))
    return ColumnError(name, f"expected {what}, got {a[i].item()!r} at row {i}")


def _range(what: str, lo: float, hi: float) -> str:
    if hi >= FLOAT_MAX or hi >= U63:
        return f"{what} >= {lo}"
    return f"{what} in [{lo}, {hi}]"


def _int_column(name: str, c: NumCol, n: int, lo: float, hi: float) -> npt.NDArray[np.int64]:
    if c.dtype not in _INT_DTYPES:
        raise ColumnError(name, f"expected an integer dtype (<i8 or <i4), got {c.dtype}")
    if c.valid is not None:
        raise ColumnError(name, "a required column has no validity bitmap")
    a = _array(name, c, n).astype(np.int64, copy=False)
    if n and (a.min() < lo or a.max() > hi):
        raise _first_bad(name, _range("integers", lo, hi), a, (a < lo) | (a > hi))
    return a


def _opt_int_column(
    name: str, c: NumCol | None, n: int, lo: float, hi: float
) -> npt.NDArray[np.float64]:
    if c is None:
        return absent(n)
    hi = min(hi, _EXACT)
    a = _array(name, c, n)
    if c.dtype in _INT_DTYPES:
        present = None
        if c.valid is not None:
            if len(c.valid) != (n + 7) // 8:
                raise ColumnError(
                    name, f"validity bitmap of {len(c.valid)} bytes, expected {(n + 7) // 8}"
                )
            bits = np.unpackbits(np.frombuffer(c.valid, np.uint8), count=n, bitorder="little")
            present = bits.astype(bool)
        bad = (a < lo) | (a > hi)
        if present is not None:
            bad &= present
        if bad.any():
            raise _first_bad(name, f"integers in [{lo}, {hi:.0f}]", a, bad)
        out = a.astype(np.float64)
        if present is not None:
            out[~present] = math.nan
        return out
    # A float dtype: NaN is absent, the rest must be whole numbers.
    if c.valid is not None:
        raise ColumnError(name, "a validity bitmap goes with an integer dtype only")
    f = a.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):
        bad = ~np.isnan(f) & ((f < lo) | (f > hi) | (f != np.floor(f)))
    if bad.any():
        raise _first_bad(name, f"whole numbers in [{lo}, {hi:.0f}] or NaN (absent)", f, bad)
    return f


def _float_column(
    name: str, c: NumCol | None, n: int, lo: float, hi: float, optional: bool
) -> npt.NDArray[np.float64]:
    if c is None:
        return absent(n)
    if c.valid is not None:
        raise ColumnError(name, "a validity bitmap goes with an integer dtype only")
    f = _array(name, c, n).astype(np.float64, copy=False)
    # NaN fails both comparisons; +-inf fails the finite bounds of every field.
    ok = (f >= lo) & (f <= hi)
    if optional:
        ok |= np.isnan(f)
    if not ok.all():
        what = _range("finite numbers", lo, hi) + (" or NaN (absent)" if optional else "")
        raise _first_bad(name, what, f, ~ok)
    return f


def from_wire(b: Any) -> WindowColumns:
    """The columns of a decoded `WindowBatch` (types already checked by msgspec);
    numeric columns are checked here. Raises ColumnError naming the column."""
    cols = _from_wire_fast(b)
    if cols is None:
        # Something unusual (another dtype, a bitmap) or wrong: the column by
        # column walk handles the first and names the column of the second.
        cols = _from_wire_columns(b)
    n: int = b.n
    lo, hi = cols["step_lo"], cols["step_hi"]
    if n and (hi < lo).any():
        raise _first_bad("step_hi", "step_hi >= step_lo", hi, hi < lo)
    lo, hi = cols["coll_lo"], cols["coll_hi"]
    if n and (hi < lo).any():
        raise _first_bad("coll_hi", "coll_hi >= coll_lo", hi, hi < lo)
    return WindowColumns._checked(n, cols, b)


def _group(kinds: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(name for name, kind in COLUMNS.items() if kind in kinds)


_INT_NAMES = _group(("i",))
_OPT_INT_NAMES = _group(("oi",))
_FLOAT_NAMES = _group(("f", "of"))
# Everything else travels as a msgpack array (strings, maps, `missing`, any bool).
_OTHER_NAMES = tuple(name for name, kind in COLUMNS.items() if kind not in _ARRAY_KINDS)
_I64_MIN = int(np.iinfo(np.int64).min)
_I64_MAX = int(np.iinfo(np.int64).max)


_INTS = _INT_NAMES + _OPT_INT_NAMES  # every integer column, required first
_NUMERIC = _INTS + _FLOAT_NAMES
_get_numeric = attrgetter(*_NUMERIC)
_get_other = attrgetter(*_OTHER_NAMES)
_dtype = attrgetter("dtype")
_valid = attrgetter("valid")
_data = attrgetter("data")


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to check one set of present numeric columns (absent optional ones are nil)."""

    names: tuple[str, ...]  # the present columns: integers first, then floats
    ints: int  # how many of them are integers
    opt_ints: tuple[str, ...]  # present optional integer columns (held as float64)
    lo: npt.NDArray[np.int64]  # (ints, 1) bounds of the integer rows
    hi: npt.NDArray[np.int64]
    f_lo: npt.NDArray[np.float64]  # (floats, 1) bounds of the float rows
    f_hi: npt.NDArray[np.float64]
    f_opt: npt.NDArray[np.bool_]  # (floats, 1): NaN allowed (absent)
    absent: tuple[str, ...]


_PLANS: dict[tuple[bool, ...], _Plan | None] = {}


def _plan(present: tuple[bool, ...]) -> _Plan | None:
    got = _PLANS.get(present, False)
    if got is not False:
        return got  # type: ignore[return-value]
    names = tuple(n for n, p in zip(_NUMERIC, present, strict=True) if p)
    absent = tuple(n for n, p in zip(_NUMERIC, present, strict=True) if not p)
    ints = [n for n in names if n in _INTS]
    floats = [n for n in names if n not in _INTS]

    def vec(ns: list[str], which: str, cap: float) -> npt.NDArray[np.float64]:
        vals = [min(max(float(getattr(_SPECS[x], which)), -cap), cap) for x in ns]
        return np.asarray(vals, dtype=np.float64)[:, None]

    plan: _Plan | None = _Plan(
        names=names,
        ints=len(ints),
        opt_ints=tuple(n for n in ints if COLUMNS[n] == "oi"),
        # int64 bounds: comparing with float ones would convert the whole matrix.
        lo=np.asarray([[int(max(_SPECS[x].lo, _I64_MIN))] for x in ints], dtype=np.int64).reshape(
            -1, 1
        ),
        hi=np.asarray(
            [[1 << 53 if COLUMNS[x] == "oi" else _I64_MAX] for x in ints], dtype=np.int64
        ).reshape(-1, 1),
        f_lo=vec(floats, "lo", FLOAT_MAX),
        f_hi=vec(floats, "hi", FLOAT_MAX),
        f_opt=np.asarray([[COLUMNS[x] == "of"] for x in floats], dtype=bool).reshape(-1, 1),
        absent=absent,
    )
    if any(COLUMNS[x] in ("i", "f") for x in absent):
        plan = None  # a required column is nil: the walk names it
    if len(_PLANS) < 4096:  # bounded: 2**k sets are possible, a few occur
        _PLANS[present] = plan
    return plan


def _from_wire_fast(b: Any) -> dict[str, Any] | None:
    """Every numeric column checked at once (the usual batch: 8-byte little-endian
    columns, no bitmaps), or None to take the column by column walk."""
    n: int = b.n
    every = _get_numeric(b)
    plan = _plan(tuple(c is not None for c in every))
    if plan is None:
        return None
    cs = [c for c in every if c is not None]
    k = plan.ints
    # Types, bitmaps and lengths of every column in a few C-level passes.
    if (
        set(map(_dtype, cs[:k])) - {"<i8"}
        or set(map(_dtype, cs[k:])) - {"<f8"}
        or set(map(_valid, cs)) != {None}
    ):
        return None
    datas = list(map(_data, cs))
    if set(map(len, datas)) != {8 * n} and n:
        return None
    m = np.frombuffer(b"".join(datas), "<i8").reshape(len(cs), n)
    ints, floats = m[:k], m[k:].view("<f8")
    if n:
        if ((ints < plan.lo) | (ints > plan.hi)).any():
            return None
        ok = (floats >= plan.f_lo) & (floats <= plan.f_hi)
        if not ok.all():
            ok |= np.isnan(floats) & plan.f_opt
            if not ok.all():
                return None
    cols: dict[str, Any] = dict(zip(plan.names, (*ints, *floats), strict=True))
    if plan.opt_ints:
        nopt = len(plan.opt_ints)
        cols.update(zip(plan.opt_ints, ints[k - nopt :].astype(np.float64), strict=True))
    if plan.absent:
        nan_row = absent(n)
        for name in plan.absent:
            cols[name] = nan_row
    others: tuple[Any, ...] = tuple(map(_listed, _OTHER_NAMES, _get_other(b), repeat(n)))
    if None in others or set(map(len, others)) != {n}:
        if not others:
            return cols
        fixed = []
        for name, v in zip(_OTHER_NAMES, others, strict=True):
            if v is None:
                v = [()] * n if COLUMNS[name] == "m" else [None] * n
            elif len(v) != n:
                return None
            fixed.append(v)
        others = tuple(fixed)
    cols.update(zip(_OTHER_NAMES, others, strict=True))
    return cols


# A column of strings or maps off the wire (`WireBatch`): its values' decoder, and
# the whole column's.
_LISTED = {k: h for k, h in _hints().items() if k in _OTHER_NAMES}
_ONE = {k: msgspec.msgpack.Decoder(h) for k, h in _LISTED.items()}
_ALL = {k: msgspec.msgpack.Decoder(GenericAlias(list, (h,))) for k, h in _LISTED.items()}
_SHARED_MIN = 16  # rows from which a repeated value is looked for (smaller: decoded whole)
_AT_PATH = re.compile(r"^(?P<text>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)


def _listed(name: str, v: Any, n: int) -> list[Any] | None:
    """Column `name` of a batch of `n` rows as a list (None: nil, absent); a column of
    `WireBatch` is decoded from its bytes here. Raises ColumnError naming the row."""
    if type(v) is not msgspec.Raw:
        return v
    data = bytes(v)
    try:
        if data == b"\xc0":
            if COLUMNS[name] == "s":
                raise ColumnError(name, "expected an array, got nil")
            return None
        one = _repeated(data, n) if n >= _SHARED_MIN else None
        if one is not None:
            try:
                return [_ONE[name].decode(one)] * n
            except (msgspec.ValidationError, msgspec.DecodeError):
                pass  # not one whole valid value: the column is decoded (and refused) whole
        got: list[Any] = _ALL[name].decode(data)
        return got
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        m = _AT_PATH.match(str(e))
        assert m is not None  # the pattern matches any text
        raise ColumnError(name + (m["path"] or ""), m["text"]) from None


def _repeated(data: bytes, n: int) -> bytes | None:
    """The bytes the items of a msgpack array of `n` values repeat, else None (when they
    decode as one whole value, msgpack's values being self-delimiting, the array is `n`
    copies of it)."""
    head = data[0]
    if 0x90 <= head <= 0x9F:
        count, at = head & 0x0F, 1
    elif head == 0xDC:
        count, at = int.from_bytes(data[1:3], "big"), 3
    elif head == 0xDD:
        count, at = int.from_bytes(data[1:5], "big"), 5
    else:
        return None
    size, odd = divmod(len(data) - at, n)
    if count != n or odd or not size:
        return None
    one = data[at : at + size]
    return one if data.endswith(one * n) else None  # (n * size bytes end `data`)


def _from_wire_columns(b: Any) -> dict[str, Any]:
    n: int = b.n
    cols: dict[str, Any] = {}
    for name, kind in COLUMNS.items():
        v = getattr(b, name)
        spec = _SPECS[name]
        if kind == "i":
            cols[name] = _int_column(name, v, n, spec.lo, spec.hi)
        elif kind == "oi":
            cols[name] = _opt_int_column(name, v, n, spec.lo, spec.hi)
        elif kind in ("f", "of"):
            cols[name] = _float_column(name, v, n, spec.lo, spec.hi, kind == "of")
        else:
            v = _listed(name, v, n)
            if v is None:
                v = [()] * n if kind == "m" else [None] * n
            elif len(v) != n:
                raise ColumnError(name, f"expected {n} rows, got {len(v)}")
            cols[name] = v
    return cols


def to_wire(wc: WindowColumns) -> Any:
    """The wire form of `wc` (what `from_wire` reads back), for msgspec's encoder: the
    batch `wc` was decoded from, else a map of plain msgpack values."""
    if wc.wire is not None:
        return wc.wire
    out: dict[str, Any] = {"n": wc.n}
    for name, kind in COLUMNS.items():
        v = wc.cols[name]
        if kind == "i":
            out[name] = ["<i8", np.asarray(v, dtype="<i8").tobytes()]
        elif kind == "f":
            out[name] = ["<f8", np.asarray(v, dtype="<f8").tobytes()]
        elif kind == "of":
            a = np.asarray(v, dtype="<f8")
            if not np.isnan(a).all():
                out[name] = ["<f8", a.tobytes()]
        elif kind == "oi":
            a = np.asarray(v, dtype=np.float64)
            absent = np.isnan(a)
            if absent.all():
                continue
            col = ["<i8", np.where(absent, 0.0, a).astype("<i8").tobytes()]
            if absent.any():
                col.append(np.packbits(~absent, bitorder="little").tobytes())
            out[name] = col
        elif kind == "s":
            out[name] = list(v)
        elif kind == "m":
            if any(v):
                out[name] = [None if x is None else list(x) for x in v]
        elif any(x is not None for x in v):
            out[name] = list(v)
    return out


_RW_FIELDS = [f.name for f in fields(RankWindow)]
assert _RW_FIELDS[-1] == "telemetry", "RankWindow.telemetry must stay its last field (rows())"
assert list(WINDOW_COLUMNS) == _RW_FIELDS[:-1]
assert list(TELEMETRY_COLUMNS) == [f.name for f in fields(Telemetry)]
