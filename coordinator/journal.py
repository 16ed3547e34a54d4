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
missing takes their late summaries (detect/DETECTOR.md "Late summaries"):
a batch of a marked window is replayed for the ranks its latest mark still
lists, so a late summary taken but not scored survives a crash, and one scored
(a newer mark without it) is not scored twice. A batch costs one column
encoding, not a record per rank.
Before the coordinator writes a group
of output lines (a scored window's, or a plan ack's, a hang's),
`["s", job, seq, {path: [inode, size]}]` records where the findings, plans
and incidents files ended (`[0, 0]`: not made yet) (an intent; `seq` grows with
every group). The
job's saved state names the last group it saw through (`out_seq`); a restart
whose last intent is newer than that cuts those files back to it, and the
window (or ack) is taken in again: a crash inside a group's outputs neither
loses it nor writes its lines twice (docs/DESIGN.md "Coordinator crash").
The file is rewritten (compacted) to hold only what is pending and the recent
release marks every `COMPACT_EVERY` marks, or once the bytes appended since the
last rewrite reach `COMPACT_FACTOR` times what that rewrite wrote (at least
`COMPACT_MIN_BYTES`), the first that comes: the batches of scored windows are
dead weight, so the file stays within a few times its live part, and each
rewrite costs the live part only.
Journals of the first format (`["h", names, names]`, `["w", values, values]`
per summary) are still read. Appends are not fsynced: the journal covers a
crash of the coordinator process (the kernel keeps the written pages), not of
the machine. A torn tail (the process died inside a write) is ignored.

A full disk: an append that fails is cut back to the file's size before it
(whole entries only) and raises `JournalUnavailable`; the coordinator then
refuses the batch (not acked: the agent keeps it and resends), so nothing is
acked that the journal does not hold. A release mark that cannot be written
waits in memory and goes out before the next batch (a coordinator killed while
the disk is full may score those windows again after its restart: their
findings repeated, nothing lost). A compaction that cannot write its new file
keeps appending to the old one (docs/RELIABILITY.md "3. Full disks").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeAlias

import msgpack
import msgspec
import numpy as np
import structlog
from artemis.common.diskio import FileHealth
from artemis.protocol.columns import ColumnError, WindowBatch, WindowColumns, from_wire, to_wire
from artemis.protocol.records import RankWindow, Telemetry

log = structlog.get_logger("artemis.coordinator")

COMPACT_EVERY = 20_000  # release marks between rewrites of the file
# Bytes appended between rewrites: COMPACT_FACTOR x the live part, at least
# COMPACT_MIN_BYTES (a 1k-rank window is about 60 KB of batches: a rewrite every
# dozen or so windows, each writing the live part, a few hundred KB).
COMPACT_MIN_BYTES = 1 << 20
COMPACT_FACTOR = 4
FORMAT = 2

_HEADER = msgpack.packb(["h", FORMAT])

Summaries: TypeAlias = WindowColumns | Iterable[RankWindow]
# (job, comm, window) of a scored window; comm None: every communicator of the job.
Mark: TypeAlias = tuple[str, str | None, int]
# Where an output file ended before a window's outputs: path -> (inode, size).
Outputs: TypeAlias = dict[str, tuple[int, int]]


@dataclass(frozen=True)
class Intent:
    """The last group of outputs the journal saw begin: its job, number and offsets."""

    job: str
    seq: int
    outputs: Outputs


NO_FILE = (0, 0)  # an output that did not exist yet (no file has inode 0)


def output_marks(paths: Iterable[str | Path]) -> Outputs:
    """(inode, size) of each file of `paths`, NO_FILE where there is none yet: an
    intent's record."""
    out: Outputs = {}
    for p in paths:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            out[str(p)] = NO_FILE
            continue
        out[str(p)] = (st.st_ino, st.st_size)
    return out


def cut_back(outputs: Outputs) -> dict[str, int]:
    """Truncate each file to its recorded size (same inode, grown since): the lines of a
    window whose scoring a crash interrupted. Returns path -> bytes removed."""
    cut: dict[str, int] = {}
    for path, (ino, size) in outputs.items():
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        # Another inode: the file was rotated since; its lines are left alone. A file
        # that did not exist at the intent was made by the group (its first lines).
        if (st.st_ino == ino or (ino, size) == NO_FILE) and st.st_size > size:
            os.truncate(path, size)
            cut[path] = st.st_size - size
    return cut


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


class JournalUnavailable(OSError):
    """The journal could not keep a batch (its disk is full, or failing)."""


class AssemblyJournal:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: IO[bytes] | None = None
        self._marks = 0
        self._unwritten: list[bytes] = []  # release marks waiting for space
        self.health = FileHealth("journal", str(self.path))
        self._bytes = 0  # appended since the last rewrite
        self._live = 0  # bytes the last rewrite wrote
        # Set by load_columns: the last group of outputs begun (the only one a crash
        # can have cut short: the coordinator writes one group at a time).
        self.intent: Intent | None = None
        # from the last load: the ranks each marked window still missed (latest mark)
        self.open_marks: dict[Mark, list[int]] = {}

    def load_columns(self) -> tuple[WindowColumns, set[Mark]]:
        """(summaries taken but not scored, windows already scored) from the file; the
        last intent in `intent`."""
        self.intent = None
        intent: Intent | None = None
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
                    elif tag == "s":
                        intent = Intent(
                            str(item[1]),
                            int(item[2]),
                            {str(k): (int(v[0]), int(v[1])) for k, v in item[3].items()},
                        )
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
        self.intent = intent
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
        append to it. Where the new file cannot be written, the old one is kept
        (and appended to) and the failure counted."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        cols = _columns(pending)
        try:
            with open(tmp, "wb") as fh:
                fh.write(_HEADER)
                for job, window, comms, *miss in released:
                    entry: list[Any] = ["r", job, window, list(comms)]
                    if miss and miss[0]:
                        entry.append([int(x) for x in miss[0]])
                    fh.write(msgpack.packb(entry))
                if cols.n:
                    fh.write(_entry(cols))
        except OSError as e:
            tmp.unlink(missing_ok=True)
            self.health.failed(e, "compaction")
            if self._fh is None:
                # The old file still holds all of it: keep appending there.
                self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115
            return
        self.close()
        os.replace(tmp, self.path)
        # Unbuffered: a failed write must leave nothing queued to go out later.
        self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115 - kept open for appends
        self._marks = 0
        self._unwritten = []
        self._bytes = 0
        self._live = self.path.stat().st_size

    def _append(self, data: bytes) -> None:
        """Write the marks waiting for space, then `data`; all of it or none."""
        assert self._fh is not None
        fd = self._fh.fileno()
        blob = b"".join([*self._unwritten, data])
        size = os.fstat(fd).st_size
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)  # whole entries only
            self.health.failed(e)
            raise JournalUnavailable(e.errno, f"assembly journal {self.path}: {e.strerror}") from e
        self._unwritten = []
        self._bytes += len(blob)
        self.health.ok()

    def added(self, windows: Summaries) -> None:
        """Journal a batch before it is acked; raises `JournalUnavailable` when it cannot."""
        if self._fh is None:
            return
        cols = _columns(windows)
        if cols.n:
            self._append(_entry(cols))

    def begin(self, job: str, seq: int, outputs: Outputs) -> None:
        """Group `seq` of `job`'s outputs is about to be written; the files end at `outputs`."""
        if self._fh is None:
            return
        marks = {p: list(v) for p, v in outputs.items()}
        intent = msgpack.packb(["s", job, seq, marks])
        try:
            self._append(intent)
        except JournalUnavailable:
            self._unwritten.append(intent)  # written before the next batch

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
        mark = msgpack.packb(entry)
        try:
            self._append(mark)
        except JournalUnavailable:
            self._unwritten.append(mark)  # written before the next batch
            return False
        self._marks += 1
        due = max(COMPACT_MIN_BYTES, COMPACT_FACTOR * self._live)
        return self._marks >= COMPACT_EVERY or self._bytes >= due

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
