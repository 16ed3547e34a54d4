"""Read-only reader of the plugin's shared-memory rings.

The format is defined once, in ``profiler_plugin/artemis_ring.h``; its one
Python mirror is ``artemis.ring.format`` (checked against the header by
``tests/test_ring_layout.py``).

Versions: the reader refuses another major ``version`` and reads every minor
(docs/DESIGN.md, "Ring format"). A minor-0 ring, written by a plugin older
than the versioned fields, reads with those fields zero. The slot layout comes
from the header's ``slot_minor`` (64-byte base slots or 128-byte CPU slots);
records come back in that layout's dtype, whose leading fields are always the
base slot's, so consumers that read base fields by name take either.

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
from typing import Any

import numpy as np
from artemis.ring.format import (
    ALGO_NAMES,
    CLOCK_KIND_NAMES,
    DTYPE_NAMES,
    FUNC_NAMES,
    HEADER_DTYPE,
    HEADER_SIZE,
    KIND_NAMES,
    LIFE_FLOCK,
    MAX_SLOTS,
    MIN_SLOTS,
    PROTO_NAMES,
    REC_CLOCK_NAMES,
    REC_DEVICE,
    RING_FINISHED,
    RING_MAGIC,
    RING_MINOR,
    RING_VERSION,
    SLOT_LAYOUTS,
    SLOT_MINOR_BASE,
    SLOT_SIZE,
    STATE_DONE,
    STATE_IN_FLIGHT,
    STATE_NAMES,
    TICK_SOURCE_NAMES,
    WRITER_BACKEND,
    WRITER_RCCL,
    WRITER_TSC,
    comm_hex,
)

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
    # minor >= 1 (0 / "none" / () in minor-0 rings)
    minor: int = 0
    slot_minor: int = SLOT_MINOR_BASE
    slot_size: int = SLOT_SIZE
    tick_source: str = "none"  # "none" | "default" | "hip" (where tick_hz came from)
    writer_flags: int = 0  # ARTEMIS_WRITER_* bits
    nccl_version: int = 0  # ncclGetVersion() code, 0 = unknown
    tsc_hz: int = 0
    # records host-timed although device timing was on (self Send/Recv, lost KernelCh)
    host_fallback: int = 0
    # (tsc, CLOCK_MONOTONIC ns) pairs: [0] at creation, [1] refreshed by the writer
    tsc_anchor: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    # minor >= 2 (0 in older rings): LIFE_* bits (artemis.ring.lifetime)
    life_flags: int = 0

    @property
    def rccl(self) -> bool:
        """The writing process runs RCCL."""
        return bool(self.writer_flags & WRITER_RCCL)

    @property
    def tsc(self) -> bool:
        """Host times in this ring are TSC ticks (see tsc_hz, tsc_anchor)."""
        return bool(self.writer_flags & WRITER_TSC)

    @property
    def writer_locked(self) -> bool:
        """Its writer holds a lock on the ring for its life (LIFE_FLOCK): a free lock
        means the writer is gone (``artemis.ring.lifetime.writer_gone``)."""
        return bool(self.life_flags & LIFE_FLOCK)

    @property
    def backend(self) -> bool:
        """Written by the artemis torch.distributed backend, not the NCCL plugin."""
        return bool(self.writer_flags & WRITER_BACKEND)

    @property
    def cpu_times(self) -> bool:
        """Slots carry the process CPU time (``cpu_start_ns``/``cpu_end_ns``)."""
        return self.slot_minor != SLOT_MINOR_BASE


@dataclass(frozen=True)
class ReadBatch:
    """What one ``poll`` found.

    ``done``: records that became DONE since the last poll, in seq order, each
    returned exactly once. ``in_flight``: records currently IN_FLIGHT (not
    consumed; they come back in ``done`` when they complete). ``lost``: tickets
    resolved as unreadable by this poll (overwritten, torn until they left the
    ring, or dropped by the writer). ``write_index``: the writer's next ticket
    when the poll began. Both arrays have the ring's slot dtype.
    """

    done: np.ndarray
    in_flight: np.ndarray
    lost: int
    write_index: int


def _name(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def validate_header(path: Path, size: int, hdr: np.ndarray) -> tuple[int, int]:
    """Check a header against the format; return (capacity, slot_minor) or raise RingError."""
    magic = int(hdr["magic"])
    if magic != RING_MAGIC:
        raise RingError(f"{path}: bad magic 0x{magic:016x} (not an Artemis ring)")
    version = int(hdr["version"])
    if version != RING_VERSION:
        raise RingError(f"{path}: ring format version {version}, this reader reads {RING_VERSION}")
    if int(hdr["header_size"]) != HEADER_SIZE:
        raise RingError(f"{path}: header_size {int(hdr['header_size'])}, expected {HEADER_SIZE}")
    # A newer minor only adds fields in space this reader ignores; the slot
    # layout it cannot read is refused here, by its slot_minor.
    slot_minor = int(hdr["slot_minor"])
    if slot_minor not in SLOT_LAYOUTS:
        raise RingError(
            f"{path}: slot_minor {slot_minor} (minor {int(hdr['minor'])}), this reader reads "
            f"slot minors {sorted(SLOT_LAYOUTS)} (ring minor <= {RING_MINOR})"
        )
    slot_size = SLOT_LAYOUTS[slot_minor][0]
    if int(hdr["slot_size"]) != slot_size:
        raise RingError(
            f"{path}: slot_size {int(hdr['slot_size'])}, expected {slot_size} "
            f"for slot_minor {slot_minor}"
        )
    cap = int(hdr["capacity"])
    if cap < MIN_SLOTS or cap > MAX_SLOTS or cap & (cap - 1):
        raise RingError(
            f"{path}: capacity {cap} is not a power of two in [{MIN_SLOTS}, {MAX_SLOTS}]"
        )
    want = HEADER_SIZE + cap * slot_size
    if size != want:
        raise RingError(
            f"{path}: file is {size} bytes, expected {want} for {cap} slots (truncated or corrupt)"
        )
    ck = int(hdr["clock_kind"])
    if ck not in CLOCK_KIND_NAMES:
        raise RingError(f"{path}: unknown clock_kind {ck}")
    return cap, slot_minor


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
            self.capacity, self.slot_minor = validate_header(self.path, size, self._hdr[0])
        except RingError:
            self.close()
            raise
        self.slot_size, self.dtype = SLOT_LAYOUTS[self.slot_minor]
        self._slots = np.frombuffer(
            self._mm, dtype=self.dtype, count=self.capacity, offset=HEADER_SIZE
        )
        # Slots as opaque fixed-size items: numpy gathers these with one memcpy
        # per item, ~50x faster than gathering the structured dtype field by field.
        self._raw = self._slots.view(np.dtype((np.void, self.slot_size)))
        # A strided view of just the lock words: the seqlock checks copy these
        # without copying whole slots.
        self._locks = self._slots["lock"]
        self._empty = np.zeros(0, dtype=self.dtype)
        self._mask = np.uint64(self.capacity - 1)
        self._frontier = 0 if from_start else self._write_index()
        self._pending = _NO_TICKETS

    # -- header ------------------------------------------------------------

    def _write_index(self) -> int:
        # write_index is 8-byte aligned inside the mapping, so this is one
        # untorn 64-bit load.
        return int(self._hdr["write_index"][0])

    def header(self) -> RingHeader:
        """The header, with live fields (write_index, flags, dropped, tsc_anchor) re-read now."""
        h = self._hdr[0]
        comm_hash = int(h["comm_hash"])
        # The refreshed anchor pair is two plain loads: a writer between them
        # can pair a new tsc with an old ns (the plugin's contract says how it
        # refreshes; a consumer checks that the pair moved forward together).
        (a0, a1), (b0, b1) = (tuple(int(x) for x in row) for row in h["tsc_anchor"])
        ts = int(h["tick_source"])
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
            minor=int(h["minor"]),
            slot_minor=self.slot_minor,
            slot_size=self.slot_size,
            tick_source=TICK_SOURCE_NAMES.get(ts, f"unknown({ts})"),
            writer_flags=int(h["writer_flags"]),
            nccl_version=int(h["nccl_version"]),
            tsc_hz=int(h["tsc_hz"]),
            host_fallback=int(h["host_fallback"]),
            tsc_anchor=((a0, a1), (b0, b1)),
            life_flags=int(h["life_flags"]),
        )

    @property
    def pending(self) -> int:
        """Tickets seen but not yet resolved (in flight, torn, or not yet written)."""
        return len(self._pending)

    # -- reading -----------------------------------------------------------

    def _snapshot(self, tickets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Seqlock-copy the slots of ``tickets``: (bodies, whole, overwritten).

        bodies are raw slot-size items (view them as ``self.dtype``).
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
        body = raw.view(self.dtype)
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
            return ReadBatch(self._empty, self._empty, lost, w)

        raw, whole, overwritten = self._snapshot(tickets)
        state = raw.view(self.dtype)["state"]
        done_m = whole & (state == STATE_DONE)
        fly_m = whole & (state == STATE_IN_FLIGHT)
        lost += int(np.count_nonzero(overwritten))
        # Pending stays sorted because `tickets` is sorted (old pending < frontier).
        self._pending = tickets[~(done_m | overwritten)]
        done = raw[done_m] if not done_m.all() else raw
        return ReadBatch(done.view(self.dtype), raw[fly_m].view(self.dtype), lost, w)

    def last(self, n: int = 256) -> np.ndarray:
        """The most recent ``n`` whole records (done or in flight), in seq order.

        Independent of the poll cursor: meant for hang dumps.
        """
        w = self._write_index()
        lo = max(0, w - min(n, self.capacity))
        if w <= lo:
            return self._empty.copy()
        tickets = np.arange(lo, w, dtype=np.uint64)
        raw, whole, _ = self._snapshot(tickets)
        state = raw.view(self.dtype)["state"]
        ok = whole & ((state == STATE_IN_FLIGHT) | (state == STATE_DONE))
        return raw[ok].view(self.dtype)

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

    def __exit__(self, *exc: object) -> None:
        self.close()


def cpu_times_ns(records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cpu_start_ns, cpu_end_ns) of polled records as float64, NaN where absent.

    Absent: base slots (the ring has no CPU times) or 0 (not taken / not yet).
    The values are the writing process's CLOCK_PROCESS_CPUTIME_ID.
    """
    names = records.dtype.names or ()
    if "cpu_start_ns" not in names:
        nan = np.full(records.shape[0], np.nan)
        return nan, nan.copy()
    out = []
    for f in ("cpu_start_ns", "cpu_end_ns"):
        v = records[f]
        out.append(np.where(v > 0, v.astype(np.float64), np.nan))
    return out[0], out[1]


def records_to_dicts(arr: np.ndarray, header: RingHeader) -> list[dict[str, Any]]:
    """Ring records as the JSON objects of ``artemis-agent dump-ring`` and hang dumps.

    Device records keep their raw device values in start_ns/end_ns; ``units``
    says whether they count ns or ticks (RCCL wall-clock ticks at tick_hz).
    Rings with CPU slots add ``cpu_start_ns``/``cpu_end_ns`` (raw, 0 = not
    taken); base-slot rings leave them out.
    """
    dev_units = "ticks" if header.clock_kind == "device_ticks" else "ns"
    cpu = "cpu_start_ns" in (arr.dtype.names or ())
    out: list[dict[str, Any]] = []
    for r in arr.tolist():
        # tolist() yields tuples in field order: the base slot's fields come first.
        base = r[:16]
        (_, kind, func, dt, state, clock, algo, proto, nch, peer, seq, cseq, nb, enq, st, en) = base
        d = {
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
        if cpu:
            d["cpu_start_ns"], d["cpu_end_ns"] = r[16], r[17]
        out.append(d)
    return out
