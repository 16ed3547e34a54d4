"""Job-side writer of Artemis rings.

A cross-vendor bridge between island leaders (GPUBridge, or the simulator's
stand-in) is invisible to NCCL, so the job writes its own ring in the plugin's
format (``profiler_plugin/artemis_ring.h``) with ``ARTEMIS_KIND_BRIDGE``
records (``BridgeRingWriter``); the agent reads it like any other ring.
``RingWriter`` writes any record kind, in-flight then done, and optionally
128-byte CPU slots (``cpu_times=True``: the process CPU time at each record's
start and end), for writers other than the plugin.

The layout comes from ``artemis.ring.format``, which imports only numpy
and the standard library, so importing this module pulls in no agent machinery.
It writes ring minor ``RING_MINOR``.

One writer per ring (this object), so a ticket needs no atomics: it is a
plain counter. Each record still follows the slot seqlock (lock odd, body,
lock even) because the agent reads concurrently from another process.

Store ordering: every store below is a separate ``memoryview`` item
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

import contextlib
import mmap
import os
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from artemis.ring import format as rf

REC_HOST = rf.REC_HOST
REC_DEVICE = rf.REC_DEVICE
CLOCK_KINDS = rf.CLOCK_KINDS
TICK_SOURCES = {v: k for k, v in rf.TICK_SOURCE_NAMES.items()}

_HEAD = rf.packer(rf.HEADER_FIELDS, "magic", "global_rank")  # offsets 0..96
_MINOR = rf.packer(rf.HEADER_FIELDS, "minor", "tsc_hz")  # offsets 288..312
# The slot without its lock word, in one store: base slots, and CPU slots (the
# CPU times follow ``end`` without a gap).
_BODY = rf.packer(rf.SLOT_FIELDS, "kind", "end")
_LIFE = struct.Struct("<I")  # life_flags (minor >= 2)
_CPU_TAIL = rf.packer(rf.SLOT_CPU_FIELDS, "cpu_start_ns", "cpu_end_ns")
_CPU_TAIL_AT = rf.slot_offset("cpu_start_ns")
_OFF_FLAGS = rf.header_offset("flags")
_OFF_FINISHED_NS = rf.header_offset("finished_ns")
_OFF_STATE = rf.slot_offset("state")
# Single words are stored through native-order casts of the mapping (one C
# store each, cheaper than a pack_into call): word indices, so every offset
# below must be aligned to its word, which the layout guarantees (checked here).
_I32_LOCK = rf.slot_offset("lock") // 4
_I64_WRITE_INDEX = rf.header_offset("write_index") // 8
_I64_START = rf.slot_offset("start") // 8
_I64_END = rf.slot_offset("end") // 8
_I64_CPU_END = rf.slot_offset("cpu_end_ns") // 8
_U32_MAX = 0xFFFFFFFF
assert rf.header_offset("write_index") % 8 == 0 and rf.HEADER_SIZE % 8 == 0
assert all(rf.slot_offset(n) % 8 == 0 for n in ("start", "end", "cpu_end_ns"))
assert rf.SLOT_SIZE % 8 == 0 and rf.SLOT_CPU_SIZE % 8 == 0


def _lifetime() -> Any:
    """``artemis.ring.lifetime``, loaded by the first writer that manages its ring's
    lifetime: importing this module stays the format and the writer alone
    (tests/test_ring_layout.py, test_job_writer_imports_no_agent_machinery)."""
    from artemis.ring import lifetime

    return lifetime


def _fixed(name: str) -> bytes:
    raw = name.encode("utf-8")[: rf.NAME_LEN - 1]
    return raw + b"\0" * (rf.NAME_LEN - len(raw))


class RingWriter:
    """Creates ``<job>.<comm %016x>.r<rank>.ring`` in ``shm_dir``; one writer per ring."""

    COMM_NAME = ""  # the header's comm_name when none is given

    def __init__(
        self,
        shm_dir: str | os.PathLike[str],
        job: str,
        comm_hash: int,
        rank: int,
        nranks: int,
        capacity: int = rf.DEFAULT_SLOTS,
        *,
        nnodes: int = 1,
        clock_kind: str = "device_ns",
        tick_hz: int = 0,
        tick_source: str | None = None,
        comm_name: str | None = None,
        host: str | None = None,
        global_rank: int | None = None,
        cpu_times: bool = False,
        writer_flags: int = 0,
        nccl_version: int = 0,
        env: Mapping[str, str] | None = None,
        torch: str | None = None,
        remove_unread: bool = False,
    ) -> None:
        """``remove_unread``: the ring's lifetime is managed (``artemis.ring.lifetime``):
        the writer holds its lock and sets LIFE_FLOCK, and a clean finish removes the
        ring when no one will read it, as the NCCL plugin's finalize does. Off, the ring
        stays for whoever reads it after the writer.

        ``env`` (the process's environment, filtered here by the fingerprint's privacy
        rule) and ``torch`` (its version) go into the ring's env sidecar
        (``ring_format``, "the env sidecar") when either is given; a sidecar the file
        system refuses leaves WRITER_ENV clear and the ring is made all the same."""
        if comm_name is None:
            comm_name = self.COMM_NAME
        if capacity < rf.MIN_SLOTS or capacity > rf.MAX_SLOTS or capacity & (capacity - 1):
            raise ValueError(
                f"capacity {capacity} is not a power of two in [{rf.MIN_SLOTS}, {rf.MAX_SLOTS}]"
            )
        if clock_kind not in CLOCK_KINDS:
            raise ValueError(f"clock_kind {clock_kind!r} is not one of {sorted(CLOCK_KINDS)}")
        if tick_source is None:
            tick_source = "default" if clock_kind == "device_ticks" else "none"
        if tick_source not in TICK_SOURCES:
            raise ValueError(f"tick_source {tick_source!r} is not one of {sorted(TICK_SOURCES)}")
        if sys.byteorder != "little" or struct.calcsize("=IQ") != 12:
            raise RuntimeError("the ring is little-endian: this writer needs a little-endian host")
        if writer_flags & rf.WRITER_TSC:
            raise ValueError("this writer stamps host times in ns; it cannot set WRITER_TSC")
        self.capacity = capacity
        self.cpu_times = cpu_times
        self.slot_minor = rf.SLOT_MINOR_CPU if cpu_times else rf.SLOT_MINOR_BASE
        self.slot_size = rf.SLOT_LAYOUTS[self.slot_minor][0]
        self._mask = capacity - 1
        self._next = 0
        self.remove_unread = remove_unread
        self._lock_fd: int | None = None
        d = Path(shm_dir)
        d.mkdir(parents=True, exist_ok=True)
        if remove_unread:  # rings of writers that died here before, with no agent to see
            _lifetime().reclaim_dead(d)
        self.path = d / rf.ring_filename(job, comm_hash, rank)
        if env is not None or torch:
            # Before the ring's rename, like the plugin: a reader seeing the ring sees it whole.
            side = rf.encode_env_sidecar(os.getpid(), rf.filter_env(env or {}), torch)
            if rf.write_env_sidecar(self.path, side):
                writer_flags |= rf.WRITER_ENV
        size = rf.HEADER_SIZE + capacity * self.slot_size
        header = bytearray(rf.HEADER_SIZE)
        _HEAD.pack_into(
            header,
            0,
            rf.RING_MAGIC,
            rf.RING_VERSION,
            rf.HEADER_SIZE,
            self.slot_size,
            capacity,
            rank,
            nranks,
            nnodes,
            os.getpid(),
            comm_hash,
            CLOCK_KINDS[clock_kind],
            0,  # flags
            tick_hz,
            time.time_ns(),
            0,  # finished_ns
            0,  # dropped
            0,  # plugin_version 0: not written by the NCCL plugin
            rank if global_rank is None else global_rank,
        )
        for name, text in (
            ("job", job),
            ("comm_name", comm_name),
            ("host", host if host is not None else socket.gethostname()),
        ):
            off = rf.header_offset(name)
            header[off : off + rf.NAME_LEN] = _fixed(text)
        _MINOR.pack_into(
            header,
            rf.header_offset("minor"),
            rf.RING_MINOR,
            self.slot_minor,
            TICK_SOURCES[tick_source],
            writer_flags,
            nccl_version,
            0,  # tsc_hz: host times are ns
        )
        # its lifetime is managed: the agent may reclaim it (lifetime.py)
        _LIFE.pack_into(
            header, rf.header_offset("life_flags"), rf.LIFE_FLOCK if remove_unread else 0
        )
        # Build the whole file under a temporary name and rename it into place,
        # so a reader scanning the folder never maps a half-made header.
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".ring-", suffix=".tmp")
        try:
            os.ftruncate(fd, size)
            os.pwrite(fd, bytes(header), 0)
            self._mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
            if remove_unread:  # locked before the rename: never seen without its writer
                _lifetime().hold_writer_lock(fd)
            os.rename(tmp, self.path)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            if writer_flags & rf.WRITER_ENV:
                with contextlib.suppress(OSError):
                    os.unlink(rf.env_sidecar_path(self.path))
            raise
        if remove_unread:
            self._lock_fd = fd  # the writer's lock lives as long as this open file
        else:
            os.close(fd)
        self._view = memoryview(self._mm)
        self._u32 = self._view.cast("I")  # native order: little-endian (checked above)
        self._u64 = self._view.cast("Q")

    @property
    def write_index(self) -> int:
        return self._next

    def record(
        self,
        *,
        kind: int,
        func: int,
        coll_seq: int,
        nbytes: int,
        start: int,
        end: int = 0,
        state: int = rf.STATE_DONE,
        dtype: int = 0,
        clock: int = REC_DEVICE,
        algo: int = 0,
        proto: int = 0,
        nchannels: int = 1,
        peer: int = -1,
        enqueue_ns: int = 0,
        cpu_start_ns: int = 0,
        cpu_end_ns: int = 0,
    ) -> int:
        """Write one record (DONE, or IN_FLIGHT to ``complete`` later); returns its ticket.

        The CPU times are written only to CPU slots (``cpu_times=True``).
        """
        t = self._next
        off = rf.HEADER_SIZE + (t & self._mask) * self.slot_size
        u32 = self._u32
        li = (off >> 2) + _I32_LOCK
        lock = u32[li]
        # Seqlock: odd while the body is being written, even (+2) when whole.
        u32[li] = (lock + 1) & _U32_MAX
        _BODY.pack_into(
            self._view,
            off + 4,
            kind,
            func,
            dtype,
            state,
            clock,
            algo,
            proto,
            nchannels,
            peer,
            t,
            coll_seq,
            nbytes,
            enqueue_ns,
            start,
            end,
        )
        if self.cpu_times:  # the CPU slot: the base slot's fields, then the CPU times
            _CPU_TAIL.pack_into(self._view, off + _CPU_TAIL_AT, cpu_start_ns, cpu_end_ns)
        u32[li] = (lock + 2) & _U32_MAX
        # Publish the ticket after the slot is whole: a reader that sees the
        # new write_index finds the record (or an odd lock it retries).
        self._next = t + 1
        self._u64[_I64_WRITE_INDEX] = t + 1
        return t

    def complete(
        self, ticket: int, *, end: int, cpu_end_ns: int = 0, start: int | None = None
    ) -> bool:
        """Mark an IN_FLIGHT record DONE with its end; False when the ring wrapped past it.

        ``start`` replaces the start written in flight (a device time resolved late).
        A ring already closed takes nothing (a completion racing ``close``).
        """
        if self._mm.closed:
            return False
        if not 0 <= ticket < self._next:
            raise ValueError(f"ticket {ticket} was never written (write_index {self._next})")
        if ticket < self._next - self.capacity:
            return False
        off = rf.HEADER_SIZE + (ticket & self._mask) * self.slot_size
        u32, u64 = self._u32, self._u64
        li = (off >> 2) + _I32_LOCK
        w = off >> 3
        lock = u32[li]
        u32[li] = (lock + 1) & _U32_MAX
        self._view[off + _OFF_STATE] = rf.STATE_DONE
        if start is not None:
            u64[w + _I64_START] = start
        u64[w + _I64_END] = end
        if self.cpu_times:
            u64[w + _I64_CPU_END] = cpu_end_ns
        u32[li] = (lock + 2) & _U32_MAX
        return True

    def finish(self) -> None:
        """Mark the ring FINISHED: no more records will come."""
        if self._mm.closed:
            return
        self._u64[_OFF_FINISHED_NS // 8] = time.time_ns()
        self._u32[_OFF_FLAGS // 4] |= rf.RING_FINISHED

    def close(self, *, finish: bool = True) -> None:
        """Unmap the ring; with ``finish`` mark it FINISHED and ``release`` it. Without,
        the writer's lock stays (another writer of this process maps the ring: the C++
        backend), to be released when that one finishes it."""
        if not self._mm.closed:
            if finish:
                self.finish()
            self._u32.release()
            self._u64.release()
            self._view.release()
            self._mm.close()
        if finish:
            self.release()

    def release(self, *, only_finished: bool = False) -> bool:
        """Once the ring is finished: drop the writer's lock, and with ``remove_unread``
        remove the ring no one will read. True when it was removed. ``only_finished``:
        do nothing unless the ring is FINISHED (by another writer of this process)."""
        if self._lock_fd is None:
            return False
        if only_finished:
            (flags,) = _LIFE.unpack(os.pread(self._lock_fd, 4, _OFF_FLAGS))
            if not flags & rf.RING_FINISHED:
                return False  # not a clean finish: the lock goes with the process
        try:
            return self.remove_unread and _lifetime().retire(self.path)
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> RingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BridgeRingWriter(RingWriter):
    """A ring of ``ARTEMIS_KIND_BRIDGE`` records (comm_name "bridge": the agent routes
    them to the rank's main ring)."""

    COMM_NAME = "bridge"

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
        return self.record(
            kind=rf.KIND_BRIDGE,
            func=rf.FUNC_BRIDGE,
            dtype=rf.DT_UINT8,
            clock=clock,
            peer=peer,
            coll_seq=coll_seq,
            nbytes=nbytes,
            enqueue_ns=enqueue_ns,
            start=start,
            end=end,
        )
