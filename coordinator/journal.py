"""The assembly journal: window summaries handed to assembly but not scored yet.

The protocol acks a message once the coordinator took it into window
assembly, and an acked message is gone from the agent. Without this journal a
coordinator killed mid-window would lose every summary of the windows it was
still assembling. With it, each batch of summaries is appended here before the
ack, each scored window gets a release mark, and a restarted coordinator
replays what was taken but never scored (and remembers what was scored, so a
resend is not scored twice).

Format (derived from the protocol schema, nothing written by hand): a stream
of msgpack objects: a header `["h", 2]`, then `["c", batch]` per batch of
summaries, where `batch` is the columnar wire map of protocol/columns.py (the
same bytes a minor-1.1 `windows` message carries, columns by name, so a
journal written by another version still reads), and `["r", job, window,
[comm, ...], [rank, ...]]` per scored window: the communicators of the run that
scored it, so a new run of the job that reuses its window numbers is not
mistaken for a resend (a mark without them covers every communicator), and the
ranks it still misses (absent or empty: none). A window released with ranks
missing takes their late summaries (coordinator/DETECTOR.md "Late summaries"):
a batch of a marked window is replayed for the ranks its latest mark still
lists, so a late summary taken but not scored survives a crash, and one scored
(a newer mark without it) is not scored twice. A batch costs one column
encoding, not a record per rank.
Journals of the first format (`["h", names, names]`, `["w", values, values]`
per summary) are still read. Appends are not fsynced: the journal covers a
crash of the coordinator process (the kernel keeps the written pages), not of
the machine. A torn tail (the process died inside a write) is ignored.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any, TypeAlias

import msgpack
import msgspec
import numpy as np
import structlog
from artemis.protocol.columns import ColumnError, WindowBatch, WindowColumns, from_wire, to_wire
from artemis.protocol.records import RankWindow, Telemetry

log = structlog.get_logger("artemis.coordinator")

COMPACT_EVERY = 20_000  # release marks between rewrites of the file
FORMAT = 2

_HEADER = msgpack.packb(["h", FORMAT])

Summaries: TypeAlias = WindowColumns | Iterable[RankWindow]
# (job, comm, window) of a scored window; comm None: every communicator of the job.
Mark: TypeAlias = tuple[str, str | None, int]


def _columns(windows: Summaries) -> WindowColumns:
    if isinstance(windows, WindowColumns):
        return windows
    return WindowColumns.from_records(list(windows))


_ENCODER = msgspec.msgpack.Encoder()


def _entry(cols: WindowColumns) -> bytes:
    # A batch decoded off the wire is written back as it came (its bytes, no
    # re-encoding of the columns).
    return _ENCODER.encode(("c", to_wire(cols)))


def _v1_window(rw: Sequence[str], tel: Sequence[str], values: Any, tvalues: Any) -> RankWindow:
    """A summary of the first journal format (values listed by the header's names)."""
    t = {k: v for k, v in zip(tel, tvalues, strict=True) if k in Telemetry.__dataclass_fields__}
    t["missing"] = tuple(t.get("missing") or ())
    kw = {k: v for k, v in zip(rw, values, strict=True) if k in RankWindow.__dataclass_fields__}
    kw.pop("telemetry", None)
    return RankWindow(**kw, telemetry=Telemetry(**t))


class AssemblyJournal:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: IO[bytes] | None = None
        self._marks = 0
        # from the last load: the ranks each marked window still missed (latest mark)
        self.open_marks: dict[Mark, list[int]] = {}

    def load_columns(self) -> tuple[WindowColumns, set[Mark]]:
        """(summaries taken but not scored, windows already scored) from the file."""
        parts: list[WindowColumns] = []
        v1: list[RankWindow] = []
        released: set[Mark] = set()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return WindowColumns.empty(), set()
        self.open_marks = {}
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(data)
        bad = 0
        names: tuple[Sequence[str], Sequence[str]] = ((), ())
        try:
            for item in unpacker:
                try:
                    tag = item[0]
                    if tag == "c":
                        parts.append(from_wire(msgspec.convert(item[1], WindowBatch)))
                    elif tag == "r":
                        comms = item[3] if len(item) > 3 and item[3] else [None]
                        miss = [int(x) for x in item[4]] if len(item) > 4 else []
                        for c in comms:
                            mark = (str(item[1]), c, int(item[2]))
                            released.add(mark)
                            if miss:
                                self.open_marks[mark] = miss
                            else:
                                self.open_marks.pop(mark, None)
                    elif tag == "h" and len(item) == 3:
                        names = (item[1], item[2])
                    elif tag == "w":
                        v1.append(_v1_window(names[0], names[1], item[1], item[2]))
                except (
                    IndexError,
                    KeyError,
                    TypeError,
                    ValueError,
                    ColumnError,
                    msgspec.ValidationError,
                ):
                    bad += 1
        except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError):
            bad += 1  # a torn tail: the process died inside a write
        if bad:
            log.warning("assembly journal: unreadable entries skipped", path=str(self.path), n=bad)
        if v1:
            parts.append(WindowColumns.from_records(v1))
        cols = WindowColumns.concat(parts)
        if released and cols.n:
            # kept: windows never marked, and the ranks a marked one still misses
            open_ = {k: set(v) for k, v in self.open_marks.items()}
            keep = []
            for job, comm, w, r in zip(
                cols["job"],
                cols["comm"],
                cols.ints("window").tolist(),
                cols.ints("rank").tolist(),
                strict=True,
            ):
                a, b = (job, comm, w), (job, None, w)
                if a in released or b in released:
                    keep.append(r in open_.get(a, ()) or r in open_.get(b, ()))
                else:
                    keep.append(True)
            cols = cols.take(np.flatnonzero(keep))
        return cols, released

    def load(self) -> tuple[list[RankWindow], set[Mark]]:
        """As `load_columns`, the summaries as records."""
        cols, released = self.load_columns()
        return cols.rows(), released

    def open(
        self,
        pending: Summaries,
        released: Iterable[
            tuple[str, int, Sequence[str]] | tuple[str, int, Sequence[str], Sequence[int]]
        ] = (),
    ) -> None:
        """Start a fresh file holding only `pending` (late parts included) and the
        release marks, with the ranks each window still misses (compaction), then
        append to it."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        cols = _columns(pending)
        with open(tmp, "wb") as fh:
            fh.write(_HEADER)
            for job, window, comms, *miss in released:
                entry: list[Any] = ["r", job, window, list(comms)]
                if miss and miss[0]:
                    entry.append([int(x) for x in miss[0]])
                fh.write(msgpack.packb(entry))
            if cols.n:
                fh.write(_entry(cols))
        os.replace(tmp, self.path)
        self._fh = open(self.path, "ab")  # noqa: SIM115 - kept open for appends
        self._marks = 0

    def added(self, windows: Summaries) -> None:
        if self._fh is None:
            return
        cols = _columns(windows)
        if cols.n:
            self._fh.write(_entry(cols))
            self._fh.flush()

    def released(
        self, job: str, window: int, comms: Sequence[str] = (), missing: Sequence[int] = ()
    ) -> bool:
        """Mark a window scored by the run of `comms`, still missing the ranks `missing`
        (their late summaries are taken); True when due for compaction."""
        if self._fh is None:
            return False
        entry: list[Any] = ["r", job, window, list(comms)]
        if missing:
            entry.append([int(x) for x in missing])
        self._fh.write(msgpack.packb(entry))
        self._fh.flush()
        self._marks += 1
        return self._marks >= COMPACT_EVERY

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
