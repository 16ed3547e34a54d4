"""Job-side writer of bridge records into an Artemis ring.

A cross-vendor bridge between island leaders (GPUBridge, or the simulator's
stand-in) is invisible to NCCL, so the job writes its own ring in the plugin's
format (``profiler_plugin/artemis_ring.h``) with ``ARTEMIS_KIND_BRIDGE``
records; the agent reads it like any other ring.

One writer per ring (this object), so a ticket needs no atomics: it is a
plain counter. Each record still follows the slot seqlock (lock odd, body,
lock even) because the agent reads concurrently from another process.

Store ordering: every store below is a separate ``memoryview`` slice
assignment or ``struct.pack_into`` call, i.e. an opaque C call, so neither
CPython nor the C compiler can reorder them. On x86-64 (TSO) the hardware
makes stores visible in program order, so the reader sees lock-odd before the
body and the body before lock-even, which is all the seqlock needs. On
aarch64 stores may become visible out of order and Python cannot issue the
``dmb ishst`` a C writer would; the reader's checks (equal, even lock and
matching ``seq``) still reject any slot it sees half-written before the final
lock store, but the strict guarantee holds on TSO machines only.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import tempfile
import time
from pathlib import Path
from types import TracebackType

# Layout constants repeated from the C header (the agent's reader holds the
# numpy mirror; job/ must not import the agent). tests/test_ring_layout.py and
# tests/test_ring_reader.py check both against the header and each other.
_MAGIC = 0x31474E4952534D41
_VERSION = 1
_HEADER_SIZE = 512
_SLOT_SIZE = 64
_NAME_LEN = 64
_MIN_SLOTS = 4
_MAX_SLOTS = 1 << 22
_FINISHED = 1
_KIND_BRIDGE = 3
_FUNC_BRIDGE = 12
_DT_UINT8 = 2
_STATE_DONE = 2
_OFF_FLAGS = 52
_OFF_FINISHED_NS = 72
_OFF_WRITE_INDEX = 320

REC_HOST = 0
REC_DEVICE = 1
CLOCK_KINDS = {"host": 0, "device_ns": 1, "device_ticks": 2}

# Header fields up to plugin_version/reserved0 (offsets 0..96), then 3 names.
_HEADER_HEAD = struct.Struct("<QIIIIiiiiQIIQQQQIi")
# Slot body without the lock word: offsets 4..64.
_SLOT_BODY = struct.Struct("<BBBBBBBBiQQQQQQ")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def _fixed(name: str) -> bytes:
    raw = name.encode("utf-8")[: _NAME_LEN - 1]
    return raw + b"\0" * (_NAME_LEN - len(raw))


class BridgeRingWriter:
    """Creates ``<job>.<comm %016x>.r<rank>.ring`` in ``shm_dir`` and appends bridge records."""

    def __init__(
        self,
        shm_dir: str | os.PathLike[str],
        job: str,
        comm_hash: int,
        rank: int,
        nranks: int,
        capacity: int = 8192,
        *,
        nnodes: int = 1,
        clock_kind: str = "device_ns",
        tick_hz: int = 0,
        comm_name: str = "bridge",
        host: str | None = None,
        global_rank: int | None = None,
    ) -> None:
        if capacity < _MIN_SLOTS or capacity > _MAX_SLOTS or capacity & (capacity - 1):
            raise ValueError(
                f"capacity {capacity} is not a power of two in [{_MIN_SLOTS}, {_MAX_SLOTS}]"
            )
        if clock_kind not in CLOCK_KINDS:
            raise ValueError(f"clock_kind {clock_kind!r} is not one of {sorted(CLOCK_KINDS)}")
        self.capacity = capacity
        self._mask = capacity - 1
        self._next = 0
        d = Path(shm_dir)
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / f"{job}.{comm_hash:016x}.r{rank}.ring"
        size = _HEADER_SIZE + capacity * _SLOT_SIZE
        header = bytearray(_HEADER_SIZE)
        _HEADER_HEAD.pack_into(
            header,
            0,
            _MAGIC,
            _VERSION,
            _HEADER_SIZE,
            _SLOT_SIZE,
            capacity,
            rank,
            nranks,
            nnodes,
            os.getpid(),
            comm_hash,
            CLOCK_KINDS[clock_kind],
            0,
            tick_hz,
            time.time_ns(),
            0,
            0,
            0,  # plugin_version 0: not written by the NCCL plugin
            rank if global_rank is None else global_rank,
        )
        header[96:160] = _fixed(job)
        header[160:224] = _fixed(comm_name)
        header[224:288] = _fixed(host if host is not None else socket.gethostname())
        # Build the whole file under a temporary name and rename it into place,
        # so a reader scanning the folder never maps a half-made header.
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".bridge-", suffix=".tmp")
        try:
            os.ftruncate(fd, size)
            os.pwrite(fd, bytes(header), 0)
            self._mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
            os.rename(tmp, self.path)
        except BaseException:
            os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        self._view = memoryview(self._mm)

    @property
    def write_index(self) -> int:
        return self._next

    def append(
        self,
        *,
        peer: int,
        nbytes: int,
        start: int,
        end: int,
        coll_seq: int,
        clock: int = REC_DEVICE,
        enqueue_ns: int = 0,
    ) -> int:
        """Append one DONE bridge record; returns its ticket (seq)."""
        t = self._next
        off = _HEADER_SIZE + (t & self._mask) * _SLOT_SIZE
        view = self._view
        lock = _U32.unpack_from(view, off)[0]
        # Seqlock: odd while the body is being written, even (+2) when whole.
        _U32.pack_into(view, off, lock + 1)
        _SLOT_BODY.pack_into(
            view,
            off + 4,
            _KIND_BRIDGE,
            _FUNC_BRIDGE,
            _DT_UINT8,
            _STATE_DONE,
            clock,
            0,
            0,
            1,
            peer,
            t,
            coll_seq,
            nbytes,
            enqueue_ns,
            start,
            end,
        )
        _U32.pack_into(view, off, lock + 2)
        # Publish the ticket after the slot is whole: a reader that sees the
        # new write_index finds the record (or an odd lock it retries).
        self._next = t + 1
        _U64.pack_into(view, _OFF_WRITE_INDEX, t + 1)
        return t

    def finish(self) -> None:
        """Mark the ring FINISHED: no more records will come."""
        if self._mm.closed:
            return
        _U64.pack_into(self._view, _OFF_FINISHED_NS, time.time_ns())
        flags = _U32.unpack_from(self._view, _OFF_FLAGS)[0]
        _U32.pack_into(self._view, _OFF_FLAGS, flags | _FINISHED)

    def close(self, *, finish: bool = True) -> None:
        if self._mm.closed:
            return
        if finish:
            self.finish()
        self._view.release()
        self._mm.close()

    def __enter__(self) -> BridgeRingWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
