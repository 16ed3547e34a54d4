"""Read-only reader of the plugin's shared-memory rings.

The format is defined once, in ``profiler_plugin/artemis_ring.h``; the numpy
dtypes below mirror it field by field with explicit offsets, and
``tests/test_ring_layout.py`` compiles the header to prove they agree.

Reading follows the seqlock protocol from the header: copy the lock words,
copy the slot bodies, copy the lock words again, and accept a slot only where
both lock copies are equal and even and the slot's ``seq`` is the ticket we
expected. Everything is done on whole arrays of tickets at once, so a poll
costs a few numpy gathers however many records arrived.

Cursor. Every ticket the writer ever claimed ends in exactly one of two
buckets: returned once as *done*, or counted once as *lost* (overwritten by a
wrap, torn until it left the ring, or never written because the writer dropped
it). Tickets that are not resolved yet (in flight, torn, claimed but not yet
written) are kept in a small ``pending`` array and retried on later polls; the
scan frontier moves on regardless, so a collective that never completes (a
hang) never holds back later records. ``pending`` only holds tickets that are
still in the ring, so it never exceeds the ring's capacity.

Memory ordering: the reader only loads. numpy's copies are plain loads with
no fences; on x86-64 (TSO) loads are not reordered with other loads, so
lock -> body -> lock is observed in program order. On aarch64 the hardware may
reorder the loads; the ``seq`` check and the equal-even-lock check still
reject every slot that changed between the two lock copies as seen, but a
strict guarantee there would need a load barrier that Python cannot issue.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

# -- constants mirrored from artemis_ring.h ---------------------------------

RING_MAGIC = 0x31474E4952534D41  # "AMSRING1" little-endian
RING_VERSION = 1
HEADER_SIZE = 512
SLOT_SIZE = 64
DEFAULT_SLOTS = 8192
MIN_SLOTS = 4
MAX_SLOTS = 1 << 22
NAME_LEN = 64

CLOCK_HOST = 0
CLOCK_DEVICE_NS = 1
CLOCK_DEVICE_TICKS = 2
CLOCK_KIND_NAMES = {
    CLOCK_HOST: "host",
    CLOCK_DEVICE_NS: "device_ns",
    CLOCK_DEVICE_TICKS: "device_ticks",
}

RING_FINISHED = 1

KIND_COLL = 1
KIND_P2P = 2
KIND_BRIDGE = 3
KIND_NAMES = {KIND_COLL: "coll", KIND_P2P: "p2p", KIND_BRIDGE: "bridge"}

STATE_IN_FLIGHT = 1
STATE_DONE = 2
STATE_NAMES = {STATE_IN_FLIGHT: "in_flight", STATE_DONE: "done"}

REC_HOST = 0
REC_DEVICE = 1
REC_CLOCK_NAMES = {REC_HOST: "host", REC_DEVICE: "device"}

# Codes -> the names NCCL puts in its descriptors (reference §2.10).
FUNC_NAMES: dict[int, str] = {
    0: "Unknown",
    1: "AllReduce",
    2: "AllGather",
    3: "ReduceScatter",
    4: "Broadcast",
    5: "Reduce",
    6: "AlltoAll",
    7: "Gather",
    8: "Scatter",
    9: "Send",
    10: "Recv",
    11: "SendRecv",
    12: "Bridge",
}
DTYPE_NAMES: dict[int, str] = {
    0: "Unknown",
    1: "ncclInt8",
    2: "ncclUint8",
    3: "ncclInt32",
    4: "ncclUint32",
    5: "ncclInt64",
    6: "ncclUint64",
    7: "ncclFloat16",
    8: "ncclFloat32",
    9: "ncclFloat64",
    10: "ncclBfloat16",
    11: "ncclFloat8e4m3",
    12: "ncclFloat8e5m2",
}
DTYPE_SIZES: dict[int, int] = {
    0: 1,
    1: 1,
    2: 1,
    3: 4,
    4: 4,
    5: 8,
    6: 8,
    7: 2,
    8: 4,
    9: 8,
    10: 2,
    11: 1,
    12: 1,
}
ALGO_NAMES: dict[int, str] = {
    0: "Unknown",
    1: "TREE",
    2: "RING",
    3: "COLLNET_DIRECT",
    4: "COLLNET_CHAIN",
    5: "NVLS",
    6: "NVLS_TREE",
    7: "PAT",
}
PROTO_NAMES: dict[int, str] = {0: "Unknown", 1: "LL", 2: "LL128", 3: "SIMPLE"}

# -- numpy mirrors of the C structs -----------------------------------------


def _dtype(fields: list[tuple[str, str, int]], itemsize: int) -> np.dtype[Any]:
    return np.dtype(
        {
            "names": [f[0] for f in fields],
            "formats": [f[1] for f in fields],
            "offsets": [f[2] for f in fields],
            "itemsize": itemsize,
        }
    )


SLOT_FIELDS: list[tuple[str, str, int]] = [
    ("lock", "<u4", 0),
    ("kind", "u1", 4),
    ("func", "u1", 5),
    ("dtype", "u1", 6),
    ("state", "u1", 7),
    ("clock", "u1", 8),
    ("algo", "u1", 9),
    ("proto", "u1", 10),
    ("nchannels", "u1", 11),
    ("peer", "<i4", 12),
    ("seq", "<u8", 16),
    ("coll_seq", "<u8", 24),
    ("bytes", "<u8", 32),
    ("enqueue_ns", "<u8", 40),
    ("start", "<u8", 48),
    ("end", "<u8", 56),
]
SLOT_DTYPE = _dtype(SLOT_FIELDS, SLOT_SIZE)

HEADER_FIELDS: list[tuple[str, str, int]] = [
    ("magic", "<u8", 0),
    ("version", "<u4", 8),
    ("header_size", "<u4", 12),
    ("slot_size", "<u4", 16),
    ("capacity", "<u4", 20),
    ("rank", "<i4", 24),
    ("nranks", "<i4", 28),
    ("nnodes", "<i4", 32),
    ("pid", "<i4", 36),
    ("comm_hash", "<u8", 40),
    ("clock_kind", "<u4", 48),
    ("flags", "<u4", 52),
    ("tick_hz", "<u8", 56),
    ("created_ns", "<u8", 64),
    ("finished_ns", "<u8", 72),
    ("dropped", "<u8", 80),
    ("plugin_version", "<u4", 88),
    ("global_rank", "<i4", 92),
    ("job", f"S{NAME_LEN}", 96),
    ("comm_name", f"S{NAME_LEN}", 160),
    ("host", f"S{NAME_LEN}", 224),
    ("minor", "<u2", 288),
    ("slot_minor", "<u2", 290),
    ("tick_source", "<u4", 292),
    ("writer_flags", "<u4", 296),
    ("nccl_version", "<u4", 300),
    ("tsc_hz", "<u8", 304),
    ("host_fallback", "<u8", 312),
    ("write_index", "<u8", 320),
    ("tsc_anchor", "(2,2)<u8", 328),
    ("reserved2", f"V{HEADER_SIZE - 360}", 360),
]
HEADER_DTYPE = _dtype(HEADER_FIELDS, HEADER_SIZE)

_RAW_SLOT = np.dtype((np.void, SLOT_SIZE))
_EMPTY = np.zeros(0, dtype=SLOT_DTYPE)
_NO_TICKETS = np.zeros(0, dtype=np.uint64)


class RingError(Exception):
    """A ring file that is not a valid Artemis ring; the message names the file."""


@dataclass(frozen=True)
class RingHeader:
    path: Path
    job: str
    comm: str  # comm_hash as 16 hex digits
    comm_hash: int
    rank: int
    nranks: int
    nnodes: int
    pid: int
    clock_kind: str  # "host" | "device_ns" | "device_ticks"
    tick_hz: int
    finished: bool
    created_ns: int
    finished_ns: int
    dropped: int
    plugin_version: int
    global_rank: int  # job-wide rank, -1 when the writer did not know it
    comm_name: str
    host: str
    capacity: int
    write_index: int


@dataclass(frozen=True)
class ReadBatch:
    """What one ``poll`` found.

    ``done``: records that became DONE since the last poll, in seq order, each
    returned exactly once. ``in_flight``: records currently IN_FLIGHT (not
    consumed; they come back in ``done`` when they complete). ``lost``: tickets
    resolved as unreadable by this poll (overwritten, torn until they left the
    ring, or dropped by the writer). ``write_index``: the writer's next ticket
    when the poll began.
    """

    done: np.ndarray
    in_flight: np.ndarray
    lost: int
    write_index: int


def _name(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def comm_hex(comm_hash: int) -> str:
    return f"{comm_hash:016x}"


def ring_filename(job: str, comm_hash: int, rank: int) -> str:
    """The file name the plugin (and the bridge writer) give a ring."""
    return f"{job}.{comm_hash:016x}.r{rank}.ring"


def validate_header(path: Path, size: int, hdr: np.ndarray) -> int:
    """Check a header against the format; return the capacity or raise RingError."""
    magic = int(hdr["magic"])
    if magic != RING_MAGIC:
        raise RingError(f"{path}: bad magic 0x{magic:016x} (not an Artemis ring)")
    version = int(hdr["version"])
    if version != RING_VERSION:
        raise RingError(f"{path}: ring format version {version}, this reader reads {RING_VERSION}")
    if int(hdr["header_size"]) != HEADER_SIZE:
        raise RingError(f"{path}: header_size {int(hdr['header_size'])}, expected {HEADER_SIZE}")
    if int(hdr["slot_size"]) != SLOT_SIZE:
        raise RingError(f"{path}: slot_size {int(hdr['slot_size'])}, expected {SLOT_SIZE}")
    cap = int(hdr["capacity"])
    if cap < MIN_SLOTS or cap > MAX_SLOTS or cap & (cap - 1):
        raise RingError(
            f"{path}: capacity {cap} is not a power of two in [{MIN_SLOTS}, {MAX_SLOTS}]"
        )
    want = HEADER_SIZE + cap * SLOT_SIZE
    if size != want:
        raise RingError(
            f"{path}: file is {size} bytes, expected {want} for {cap} slots (truncated or corrupt)"
        )
    ck = int(hdr["clock_kind"])
    if ck not in CLOCK_KIND_NAMES:
        raise RingError(f"{path}: unknown clock_kind {ck}")
    return cap


class RingReader:
    """Reads one ring file. Opened read-only (``mmap.ACCESS_READ``): it never writes."""

    def __init__(self, path: str | os.PathLike[str], *, from_start: bool = True) -> None:
        self.path = Path(path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise RingError(f"{self.path}: cannot open: {e.strerror}") from e
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise RingError(
                    f"{self.path}: file is {size} bytes, shorter than the {HEADER_SIZE}-byte header"
                )
            self._mm: mmap.mmap | None = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        try:
            self._hdr = np.frombuffer(self._mm, dtype=HEADER_DTYPE, count=1)
            self.capacity = validate_header(self.path, size, self._hdr[0])
        except RingError:
            self.close()
            raise
        self._slots = np.frombuffer(
            self._mm, dtype=SLOT_DTYPE, count=self.capacity, offset=HEADER_SIZE
        )
        # Slots as opaque 64-byte items: numpy gathers these with one memcpy per
        # item, ~50x faster than gathering the structured dtype field by field.
        self._raw = self._slots.view(_RAW_SLOT)
        # A strided view of just the lock words: the seqlock checks copy these
        # without copying whole slots.
        self._locks = self._slots["lock"]
        self._mask = np.uint64(self.capacity - 1)
        self._frontier = 0 if from_start else self._write_index()
        self._pending = _NO_TICKETS

    # -- header ------------------------------------------------------------

    def _write_index(self) -> int:
        # write_index is 8-byte aligned inside the mapping, so this is one
        # untorn 64-bit load.
        return int(self._hdr["write_index"][0])

    def header(self) -> RingHeader:
        """The header, with live fields (write_index, flags, dropped) re-read now."""
        h = self._hdr[0]
        comm_hash = int(h["comm_hash"])
        return RingHeader(
            path=self.path,
            job=_name(bytes(h["job"])),
            comm=comm_hex(comm_hash),
            comm_hash=comm_hash,
            rank=int(h["rank"]),
            nranks=int(h["nranks"]),
            nnodes=int(h["nnodes"]),
            pid=int(h["pid"]),
            clock_kind=CLOCK_KIND_NAMES[int(h["clock_kind"])],
            tick_hz=int(h["tick_hz"]),
            finished=bool(int(h["flags"]) & RING_FINISHED),
            created_ns=int(h["created_ns"]),
            finished_ns=int(h["finished_ns"]),
            dropped=int(h["dropped"]),
            plugin_version=int(h["plugin_version"]),
            global_rank=int(h["global_rank"]),
            comm_name=_name(bytes(h["comm_name"])),
            host=_name(bytes(h["host"])),
            capacity=self.capacity,
            write_index=self._write_index(),
        )

    @property
    def pending(self) -> int:
        """Tickets seen but not yet resolved (in flight, torn, or not yet written)."""
        return len(self._pending)

    # -- reading -----------------------------------------------------------

    def _snapshot(self, tickets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Seqlock-copy the slots of ``tickets``: (bodies, whole, overwritten).

        bodies are raw 64-byte items (view them as SLOT_DTYPE).
        whole: the copy is a consistent record of that very ticket.
        overwritten: the slot consistently holds a *newer* ticket.
        """
        idx = (tickets & self._mask).astype(np.intp)
        # Fancy indexing for the strided lock view (ndarray.take would first copy
        # the whole strided array to a contiguous one); take() for the
        # contiguous raw slots.
        lock1 = self._locks[idx]
        raw = self._raw.take(idx)
        lock2 = self._locks[idx]
        body = raw.view(SLOT_DTYPE)
        stable = (lock1 == lock2) & ((lock1 & 1) == 0)
        seq = body["seq"]
        whole = stable & (seq == tickets)
        overwritten = stable & (seq > tickets)
        return raw, whole, overwritten

    def poll(self) -> ReadBatch:
        """Everything that changed since the last poll (see ReadBatch)."""
        w = self._write_index()
        floor = max(0, w - self.capacity)  # oldest ticket still in the ring
        lost = 0
        pend = self._pending
        if len(pend) and int(pend[0]) < floor:
            keep = pend >= floor
            lost += int(len(pend) - np.count_nonzero(keep))
            pend = pend[keep]
        lo = self._frontier
        if lo < floor:
            lost += floor - lo
            lo = floor
        if w > lo:
            fresh = np.arange(lo, w, dtype=np.uint64)
            tickets = np.concatenate((pend, fresh)) if len(pend) else fresh
        else:
            tickets = pend
        self._frontier = max(self._frontier, w)
        if not len(tickets):
            self._pending = _NO_TICKETS
            return ReadBatch(_EMPTY, _EMPTY, lost, w)

        raw, whole, overwritten = self._snapshot(tickets)
        state = raw.view(SLOT_DTYPE)["state"]
        done_m = whole & (state == STATE_DONE)
        fly_m = whole & (state == STATE_IN_FLIGHT)
        lost += int(np.count_nonzero(overwritten))
        # Pending stays sorted because `tickets` is sorted (old pending < frontier).
        self._pending = tickets[~(done_m | overwritten)]
        done = raw[done_m] if not done_m.all() else raw
        return ReadBatch(done.view(SLOT_DTYPE), raw[fly_m].view(SLOT_DTYPE), lost, w)

    def last(self, n: int = 256) -> np.ndarray:
        """The most recent ``n`` whole records (done or in flight), in seq order.

        Independent of the poll cursor: meant for hang dumps.
        """
        w = self._write_index()
        lo = max(0, w - min(n, self.capacity))
        if w <= lo:
            return _EMPTY.copy()
        tickets = np.arange(lo, w, dtype=np.uint64)
        raw, whole, _ = self._snapshot(tickets)
        state = raw.view(SLOT_DTYPE)["state"]
        ok = whole & ((state == STATE_IN_FLIGHT) | (state == STATE_DONE))
        return raw[ok].view(SLOT_DTYPE)

    # -- lifetime ----------------------------------------------------------

    def close(self) -> None:
        mm = getattr(self, "_mm", None)
        if mm is None:
            return
        # numpy views hold exports of the mmap; drop them before closing it.
        for attr in ("_locks", "_raw", "_slots", "_hdr"):
            if hasattr(self, attr):
                delattr(self, attr)
        # BufferError: a caller still holds a view into the mapping; it is
        # unmapped when that view goes away.
        with contextlib.suppress(BufferError):
            mm.close()
        self._mm = None

    def __enter__(self) -> RingReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def records_to_dicts(arr: np.ndarray, header: RingHeader) -> list[dict[str, Any]]:
    """Ring records as the JSON objects of ``artemis-agent dump-ring`` and hang dumps.

    Device records keep their raw device values in start_ns/end_ns; ``units``
    says whether they count ns or ticks (RCCL wall-clock ticks at tick_hz).
    """
    dev_units = "ticks" if header.clock_kind == "device_ticks" else "ns"
    out: list[dict[str, Any]] = []
    for r in arr.tolist():
        # tolist() yields tuples in SLOT_FIELDS order.
        (_, kind, func, dt, state, clock, algo, proto, nch, peer, seq, cseq, nb, enq, st, en) = r
        out.append(
            {
                "comm": header.comm,
                "rank": header.rank,
                "seq": seq,
                "coll_seq": cseq,
                "kind": KIND_NAMES.get(kind, f"unknown({kind})"),
                "func": FUNC_NAMES.get(func, f"Unknown({func})"),
                "dtype": DTYPE_NAMES.get(dt, f"Unknown({dt})"),
                "bytes": nb,
                "start_ns": st,
                "end_ns": en,
                "clock": REC_CLOCK_NAMES.get(clock, f"unknown({clock})"),
                "units": dev_units if clock == REC_DEVICE else "ns",
                "state": STATE_NAMES.get(state, f"unknown({state})"),
                "enqueue_ns": enq,
                "nchannels": nch,
                "algo": ALGO_NAMES.get(algo, f"Unknown({algo})"),
                "proto": PROTO_NAMES.get(proto, f"Unknown({proto})"),
                "peer": peer,
            }
        )
    return out
