"""A pending window's rows, copied in batch by batch as they come (detect/assembly.py).

Held as the batches themselves until the window left, a window's summaries were
in memory twice when it did: every decoded batch (its columns, one array per
numeric column per batch, its lists) and their concatenation, which the detector
reads. That was most of a coordinator's memory peak (bench/README.md "Coordinator
ingest": 0.4-0.5 KB a rank of the batches, 0.35 KB of their concatenation).
Here each batch is copied into columns of the window's size as it arrives, and
the decoded batch is let go of; when its batches came in order of their first
rank (every node's batch at once, in order: the usual window), the window's
columns are these same arrays, not a copy.

Rows stay in arrival order: `columns()` gives them so, and `starts`/`sizes`
say where each batch's rows are (the assembler orders them, as it ordered the
batches before).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from artemis.protocol.columns import COLUMNS, WindowColumns, _shared, absent

# numeric columns: (name, dtype, whether a batch may lack it: a shared NaN row then)
_NUMERIC = tuple(
    (name, np.int64 if kind == "i" else np.float64, kind in ("of", "oi"))
    for name, kind in COLUMNS.items()
    if kind in ("i", "f", "of", "oi")
)
_LISTS = tuple(name for name, kind in COLUMNS.items() if kind not in ("i", "f", "of", "oi"))


class PendingRows:
    """The rows of a window's batches in arrival order, in columns grown as needed
    (first to `capacity` rows: the window's expected size)."""

    def __init__(self, capacity: int) -> None:
        self.n = 0
        self.starts: list[int] = []  # each batch's first row
        self.sizes: list[int] = []  # and its number of rows
        self.firsts: list[int] = []  # and its first rank
        self._cap = 0
        self._want = max(capacity, 1)
        # A numeric column no batch had yet is not allocated (most optional ones).
        self._num: dict[str, npt.NDArray[Any]] = {}
        self._lists: dict[str, list[object]] = {name: [] for name in _LISTS}

    def append(self, part: WindowColumns) -> None:
        """Copy `part`'s rows in after the others."""
        k = part.n
        if not k:
            self.starts.append(self.n)
            self.sizes.append(0)
            self.firsts.append(-1)
            return
        lo, hi = self.n, self.n + k
        if hi > self._cap:
            self._grow(max(hi, self._want, 2 * self._cap))
        cols = part.cols
        mark = _shared(k)  # the NaN row of a column this batch lacks
        num = self._num
        for name, dtype, optional in _NUMERIC:
            v = cols[name]
            buf = num.get(name)
            if optional and v is mark:
                if buf is not None:
                    buf[lo:hi] = math.nan
                continue
            if buf is None:
                buf = num[name] = np.empty(self._cap, dtype=dtype)
                if lo:  # an optional column the batches before lacked
                    buf[:lo] = math.nan
            buf[lo:hi] = v
        for name in _LISTS:
            self._lists[name].extend(cols[name])
        self.starts.append(lo)
        self.sizes.append(k)
        self.firsts.append(int(cols["rank"][0]))
        self.n = hi

    def _grow(self, cap: int) -> None:
        for name, buf in self._num.items():
            bigger = np.empty(cap, dtype=buf.dtype)
            bigger[: self.n] = buf[: self.n]
            self._num[name] = bigger
        self._cap = cap

    def columns(self, final: bool = False) -> WindowColumns:
        """Every row so far, in arrival order. The numeric columns are views of these
        arrays, whose rows so far no later batch changes; the lists are copies unless
        `final` (no batch comes after: the window left)."""
        n = self.n
        cols: dict[str, object] = {}
        for name, _dtype, _optional in _NUMERIC:
            buf = self._num.get(name)
            cols[name] = absent(n) if buf is None else buf[:n]
        for name in _LISTS:
            got = self._lists[name]
            cols[name] = got if final else got[:n]
        return WindowColumns._checked(n, cols)
