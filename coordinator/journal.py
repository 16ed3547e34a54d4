"""The assembly journal: window summaries handed to assembly but not scored yet.

The protocol acks a message once the coordinator took it into window
assembly, and an acked message is gone from the agent. Without this journal a
coordinator killed mid-window would lose every summary of the windows it was
still assembling. With it, each summary is appended here before the ack, each
scored window gets a release mark, and a restarted coordinator replays what was
taken but never scored (and remembers what was scored, so a resend is not
scored twice).

Format: a stream of msgpack objects: a header `["h", [RankWindow field names],
[Telemetry field names]]` (so a journal written by another version still
reads by name), then `["w", [values...], [telemetry values...]]` per summary
and `["r", job, window, [comm, ...]]` per scored window: the communicators of
the run that scored it, so a new run of the job that reuses its window
numbers is not mistaken for a resend (an entry without them covers every
communicator). Values are taken with one C-level
attribute getter per record: the journal costs a few microseconds a summary. Appends are not fsynced: the journal covers a crash of
the coordinator process (the kernel keeps the written pages), not of the
machine. A torn tail (the process died inside a write) is ignored.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from operator import attrgetter
from pathlib import Path
from typing import IO, Any

import msgpack
import structlog
from artemis.protocol.records import RankWindow, Telemetry

log = structlog.get_logger("artemis.coordinator")

COMPACT_EVERY = 20_000  # release marks between rewrites of the file

_RW = tuple(f.name for f in dataclasses.fields(RankWindow) if f.name != "telemetry")
_TEL = tuple(f.name for f in dataclasses.fields(Telemetry))
_rw_values = attrgetter(*_RW)
_tel_values = attrgetter(*_TEL)
_HEADER = msgpack.packb(["h", list(_RW), list(_TEL)])


def _entry(w: RankWindow) -> list[Any]:
    return ["w", _rw_values(w), _tel_values(w.telemetry)]


def _window(rw: Sequence[str], tel: Sequence[str], values: Any, tvalues: Any) -> RankWindow:
    t = dict(zip(tel, tvalues, strict=True))
    t = {k: v for k, v in t.items() if k in _TEL}
    t["missing"] = tuple(t.get("missing") or ())
    kw = {k: v for k, v in zip(rw, values, strict=True) if k in _RW}
    return RankWindow(**kw, telemetry=Telemetry(**t))


class AssemblyJournal:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: IO[bytes] | None = None
        self._marks = 0

    def load(self) -> tuple[list[RankWindow], set[tuple[str, str | None, int]]]:
        """(summaries taken but not scored, windows already scored as (job, comm, window);
        comm None: every communicator) from the file."""
        added: list[RankWindow] = []
        released: set[tuple[str, str | None, int]] = set()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return [], set()
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(data)
        bad = 0
        rw_names: Sequence[str] = _RW
        tel_names: Sequence[str] = _TEL
        try:
            for item in unpacker:
                try:
                    if item[0] == "h":
                        rw_names, tel_names = item[1], item[2]
                    elif item[0] == "w":
                        added.append(_window(rw_names, tel_names, item[1], item[2]))
                    elif item[0] == "r":
                        comms = item[3] if len(item) > 3 and item[3] else [None]
                        released.update((str(item[1]), c, int(item[2])) for c in comms)
                except (IndexError, KeyError, TypeError, ValueError):
                    bad += 1
        except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError):
            bad += 1  # a torn tail: the process died inside a write
        if bad:
            log.warning("assembly journal: unreadable entries skipped", path=str(self.path), n=bad)
        pending = [
            w
            for w in added
            if (w.job, w.comm, w.window) not in released and (w.job, None, w.window) not in released
        ]
        return pending, released

    def open(
        self,
        pending: Iterable[RankWindow],
        released: Iterable[tuple[str, int, Sequence[str]]] = (),
    ) -> None:
        """Start a fresh file holding only `pending` and the release marks (compaction),
        then append to it."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(_HEADER)
            for job, window, comms in released:
                fh.write(msgpack.packb(["r", job, window, list(comms)]))
            for w in pending:
                fh.write(msgpack.packb(_entry(w)))
        os.replace(tmp, self.path)
        self._fh = open(self.path, "ab")  # noqa: SIM115 - kept open for appends
        self._marks = 0

    def added(self, windows: Iterable[RankWindow]) -> None:
        if self._fh is None:
            return
        self._fh.write(b"".join(msgpack.packb(_entry(w)) for w in windows))
        self._fh.flush()

    def released(self, job: str, window: int, comms: Sequence[str] = ()) -> bool:
        """Mark a window scored by the run of `comms`; True when due for compaction."""
        if self._fh is None:
            return False
        self._fh.write(msgpack.packb(["r", job, window, list(comms)]))
        self._fh.flush()
        self._marks += 1
        return self._marks >= COMPACT_EVERY

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
