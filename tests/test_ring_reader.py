"""RingReader against rings written by the job-side writer and by a deliberately torn writer."""

from __future__ import annotations

import hashlib
import mmap
import multiprocessing as mp
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from artemis.ring import format as rf
from artemis.ring.reader import RingError, RingReader, cpu_times_ns, records_to_dicts
from artemis.ring.writer import REC_DEVICE, REC_HOST, BridgeRingWriter, RingWriter
from hypothesis import given, settings
from hypothesis import strategies as st
from ring_minor0 import OldRecord, write_minor0_ring

COMM = 0x0123456789ABCDEF


class RawRing:
    """Direct slot access for writing what the real writers would, or worse.

    Used to play the plugin's IN_FLIGHT -> DONE rewrite and a writer that dies
    or stalls inside a slot (odd lock, stale body).
    """

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR)
        self.mm = mmap.mmap(fd, 0)  # mmap keeps its own duplicate of fd
        os.close(fd)
        self.hdr = np.frombuffer(self.mm, dtype=rf.HEADER_DTYPE, count=1)
        cap = int(self.hdr["capacity"][0])
        self.cap = cap
        self.slots = np.frombuffer(self.mm, dtype=rf.SLOT_DTYPE, count=cap, offset=512)

    def claim(self) -> int:
        t = int(self.hdr["write_index"][0])
        self.hdr["write_index"] = t + 1
        return t

    def write(
        self, t: int, state: int, *, lock_after: str = "even", seq: int | None = None
    ) -> None:
        s = self.slots[t % self.cap]
        lock = int(s["lock"])
        s["lock"] = lock + 1 if lock % 2 == 0 else lock
        s["kind"] = rf.KIND_COLL
        s["func"] = 1
        s["dtype"] = 8
        s["state"] = state
        s["clock"] = REC_DEVICE
        s["nchannels"] = 2
        s["peer"] = -1
        s["seq"] = t if seq is None else seq
        s["coll_seq"] = t
        s["bytes"] = 4 * t
        s["start"] = 1000 + t
        s["end"] = 2000 + t if state == rf.STATE_DONE else 0
        if lock_after == "even":
            s["lock"] = int(s["lock"]) + 1

    def close(self) -> None:
        del self.hdr, self.slots
        self.mm.close()


def _writer(d: Path, cap: int = 8, **kw: Any) -> BridgeRingWriter:
    return BridgeRingWriter(d, "job1", COMM, 3, 8, cap, **kw)


@contextmanager
def _raw_ring(d: Path, cap: int) -> Iterator[tuple[BridgeRingWriter, RawRing]]:
    """A ring and a RawRing on it, to claim and write slots by hand (hangs, torn
    writes); both closed after."""
    w = _writer(d, cap)
    raw = RawRing(w.path)
    try:
        yield w, raw
    finally:
        raw.close()
        w.close()


def _append(w: BridgeRingWriter, n: int) -> None:
    for _ in range(n):
        t = w.write_index
        w.append(peer=1, nbytes=100 + t, start=10 * t, end=10 * t + 5, coll_seq=t // 2)


def test_reads_back_every_field(tmp_path: Path) -> None:
    w = _writer(tmp_path, 16, clock_kind="device_ticks", tick_hz=100_000_000, host="hostA")
    w.append(peer=2, nbytes=4096, start=111, end=222, coll_seq=7, enqueue_ns=55)
    w.append(peer=0, nbytes=1, start=5, end=9, coll_seq=8, clock=REC_HOST)
    with RingReader(w.path) as r:
        h = r.header()
        assert (h.job, h.comm, h.comm_hash, h.rank, h.nranks) == (
            "job1",
            "0123456789abcdef",
            COMM,
            3,
            8,
        )
        assert (h.clock_kind, h.tick_hz, h.host, h.capacity, h.write_index) == (
            "device_ticks",
            100_000_000,
            "hostA",
            16,
            2,
        )
        assert h.pid == os.getpid() and not h.finished and h.plugin_version == 0
        b = r.poll()
        assert b.lost == 0 and len(b.in_flight) == 0 and b.write_index == 2
        d = records_to_dicts(b.done, h)
    assert d[0] == {
        "comm": "0123456789abcdef",
        "rank": 3,
        "seq": 0,
        "coll_seq": 7,
        "kind": "bridge",
        "func": "Bridge",
        "dtype": "ncclUint8",
        "bytes": 4096,
        "start_ns": 111,
        "end_ns": 222,
        "clock": "device",
        "units": "ticks",
        "state": "done",
        "enqueue_ns": 55,
        "nchannels": 1,
        "algo": "Unknown",
        "proto": "Unknown",
        "peer": 2,
    }
    assert (d[1]["seq"], d[1]["clock"], d[1]["units"], d[1]["peer"]) == (1, "host", "ns", 0)
    w.close()


def test_each_record_once_in_order(tmp_path: Path) -> None:
    w = _writer(tmp_path, 64)
    with RingReader(w.path) as r:
        assert len(r.poll().done) == 0
        _append(w, 10)
        b1 = r.poll()
        _append(w, 5)
        b2 = r.poll()
        b3 = r.poll()
    assert b1.done["seq"].tolist() == list(range(10))
    assert b2.done["seq"].tolist() == list(range(10, 15))
    assert len(b3.done) == 0 and b3.lost == 0
    assert b2.done["bytes"].tolist() == [100 + t for t in range(10, 15)]
    w.close()


def test_overwrite_losses_counted_exactly(tmp_path: Path) -> None:
    w = _writer(tmp_path, 8)
    with RingReader(w.path) as r:
        _append(w, 20)
        b = r.poll()
        assert b.done["seq"].tolist() == list(range(12, 20)) and b.lost == 12
        _append(w, 5)
        b = r.poll()
        assert b.done["seq"].tolist() == list(range(20, 25)) and b.lost == 0
        _append(w, 30)
        b = r.poll()
        assert b.done["seq"].tolist() == list(range(47, 55)) and b.lost == 22
    w.close()


def test_from_start_false_skips_history(tmp_path: Path) -> None:
    w = _writer(tmp_path, 8)
    _append(w, 20)
    with RingReader(w.path, from_start=False) as r:
        assert r.poll().lost == 0
        _append(w, 2)
        assert r.poll().done["seq"].tolist() == [20, 21]
    w.close()


def test_in_flight_reported_then_done_once(tmp_path: Path) -> None:
    with _raw_ring(tmp_path, 16) as (w, raw), RingReader(w.path) as r:
        t0 = raw.claim()
        raw.write(t0, rf.STATE_IN_FLIGHT)
        b = r.poll()
        assert len(b.done) == 0 and b.in_flight["seq"].tolist() == [0]
        assert b.in_flight["end"].tolist() == [0]
        # A hang: ticket 0 stays in flight while later records complete; they
        # are returned at once, not held behind it.
        for _ in range(5):
            raw.write(raw.claim(), rf.STATE_DONE)
        b = r.poll()
        assert b.done["seq"].tolist() == [1, 2, 3, 4, 5]
        assert b.in_flight["seq"].tolist() == [0] and r.pending == 1
        raw.write(t0, rf.STATE_DONE)
        b = r.poll()
        assert b.done["seq"].tolist() == [0] and b.done["end"].tolist() == [2000]
        assert len(b.in_flight) == 0 and r.pending == 0
        assert len(r.poll().done) == 0


def test_hang_through_wrap_is_lost_and_pending_bounded(tmp_path: Path) -> None:
    with _raw_ring(tmp_path, 8) as (w, raw), RingReader(w.path) as r:
        t0 = raw.claim()
        raw.write(t0, rf.STATE_IN_FLIGHT)
        r.poll()
        lost = 0
        for _ in range(10):
            for _ in range(3):
                raw.write(raw.claim(), rf.STATE_DONE)
            b = r.poll()
            lost += b.lost
            assert r.pending <= 8
        assert lost == 1 and r.pending == 0  # only ticket 0, the hung one


def test_torn_slot_never_accepted(tmp_path: Path) -> None:
    with _raw_ring(tmp_path, 8) as (w, raw), RingReader(w.path) as r:
        # Writer inside the slot (odd lock): full body, still rejected.
        t = raw.claim()
        raw.write(t, rf.STATE_DONE, lock_after="odd")
        # Writer claimed a ticket but the slot holds a stale ticket's body.
        t1 = raw.claim()
        raw.write(t1, rf.STATE_DONE, seq=t1 + 100)
        b = r.poll()
        assert len(b.done) == 0 and len(b.in_flight) == 0 and r.pending == 1
        assert b.lost == 1  # a slot holding a newer ticket: t1 was overwritten
        # The torn writer finishes: accepted now, exactly once.
        raw.slots["lock"][t % 8] += 1
        b = r.poll()
        assert b.done["seq"].tolist() == [0] and r.pending == 0


def test_torn_slot_that_never_heals_is_lost(tmp_path: Path) -> None:
    with _raw_ring(tmp_path, 4) as (w, raw), RingReader(w.path) as r:
        raw.write(raw.claim(), rf.STATE_DONE, lock_after="odd")
        assert r.poll().lost == 0 and r.pending == 1
        total_lost = 0
        seen: list[int] = []
        for _ in range(3):
            for _ in range(2):
                raw.write(raw.claim(), rf.STATE_DONE)
            b = r.poll()
            total_lost += b.lost
            seen += b.done["seq"].tolist()
        # Ticket 0 stays torn until ticket 4 reuses its slot: then it is lost,
        # counted once, and never returned.
        assert seen == [1, 2, 3, 4, 5, 6]
        assert total_lost == 1 and r.pending == 0


def _stress_writer(path: str, n: int) -> None:
    """A single writer that writes bodies in two halves inside the seqlock."""
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, 0)
    os.close(fd)
    size, cap = struct.unpack_from("<II", mm, 16)
    for t in range(n):
        off = 512 + (t % cap) * size
        lock = struct.unpack_from("<I", mm, off)[0]
        struct.pack_into("<I", mm, off, lock + 1)
        struct.pack_into("<BBBBBBBBiQQ", mm, off + 4, 3, 12, 2, 2, 1, 0, 0, 1, 1, t, t)
        struct.pack_into("<QQQQ", mm, off + 32, 7 * t, 0, 3 * t, 3 * t + 1)
        if size == 128:  # CPU slot: its CPU times too
            struct.pack_into("<QQ", mm, off + 64, 5 * t, 5 * t + 2)
        struct.pack_into("<I", mm, off, lock + 2)
        struct.pack_into("<Q", mm, 320, t + 1)
    mm.close()


@pytest.mark.parametrize("cpu", [False, True], ids=["base-slots", "cpu-slots"])
def test_concurrent_writer_no_torn_record_accepted(tmp_path: Path, cpu: bool) -> None:
    w = RingWriter(tmp_path, "job1", COMM, 3, 8, 16, cpu_times=cpu)
    n = 40_000
    proc = mp.get_context("fork").Process(target=_stress_writer, args=(str(w.path), n))
    with RingReader(w.path) as r:
        proc.start()
        done: list[np.ndarray] = []
        lost = 0
        while True:
            alive = proc.is_alive()
            b = r.poll()
            done.append(b.done)
            lost += b.lost
            if not alive:
                break
        proc.join()
        b = r.poll()
        done.append(b.done)
        lost += b.lost
    got = np.concatenate(done)
    seq = got["seq"]
    # Every accepted record is internally consistent: no half-old, half-new body.
    assert (got["coll_seq"] == seq).all()
    assert (got["bytes"] == 7 * seq).all()
    assert (got["start"] == 3 * seq).all() and (got["end"] == 3 * seq + 1).all()
    assert (np.diff(seq.astype(np.int64)) > 0).all()
    if cpu:
        assert (got["cpu_start_ns"] == 5 * seq).all() and (got["cpu_end_ns"] == 5 * seq + 2).all()
    assert len(got) + lost == n and r.pending == 0
    w.close()


@settings(max_examples=60, deadline=None)
@given(
    cap_log=st.integers(2, 5),
    ops=st.lists(st.integers(0, 40), min_size=1, max_size=12),
)
def test_every_ticket_done_or_lost_exactly_once(
    tmp_path_factory: pytest.TempPathFactory, cap_log: int, ops: list[int]
) -> None:
    d = tmp_path_factory.mktemp("prop")
    w = _writer(d, 1 << cap_log)
    seen: list[int] = []
    lost = 0
    with RingReader(w.path) as r:
        for n in ops:
            _append(w, n)
            b = r.poll()
            seen += b.done["seq"].tolist()
            lost += b.lost
            # What a poll returns is exactly what survived since the last poll.
            assert b.done["seq"].tolist() == list(
                range(max(b.write_index - (1 << cap_log), b.write_index - n), b.write_index)
            )
    assert seen == sorted(set(seen))
    assert len(seen) + lost == sum(ops)
    w.close()


def test_last_returns_recent_and_leaves_cursor(tmp_path: Path) -> None:
    w = _writer(tmp_path, 16)
    raw = RawRing(w.path)
    _append(w, 20)
    t = raw.claim()
    raw.write(t, rf.STATE_IN_FLIGHT)
    with RingReader(w.path) as r:
        last = r.last(5)
        assert last["seq"].tolist() == [16, 17, 18, 19, 20]
        assert last["state"].tolist() == [2, 2, 2, 2, 1]
        assert r.last(256)["seq"].tolist() == list(range(5, 21))
        b = r.poll()
        assert b.done["seq"].tolist() == list(range(5, 20)) and b.lost == 5
    raw.close()
    w.close()


def test_finished_flag(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    with RingReader(w.path) as r:
        assert not r.header().finished and r.header().finished_ns == 0
        w.finish()
        h = r.header()
        assert h.finished and h.finished_ns > 0
    w.close()


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_reader_never_writes(tmp_path: Path) -> None:
    w = _writer(tmp_path, 8)
    _append(w, 11)
    w.close()
    before = _digest(w.path)
    mtime = w.path.stat().st_mtime_ns
    with RingReader(w.path) as r:
        r.header()
        r.poll()
        r.last()
        maps = Path("/proc/self/maps").read_text().splitlines()
        mine = [m for m in maps if m.endswith(str(w.path))]
        assert mine, "the ring is not mapped"
        assert all(m.split()[1].startswith("r-") for m in mine), mine
    assert _digest(w.path) == before and w.path.stat().st_mtime_ns == mtime


def _ring_bytes(tmp_path: Path, cap: int = 8) -> tuple[Path, bytearray]:
    w = _writer(tmp_path, cap)
    _append(w, 3)
    w.close()
    return w.path, bytearray(w.path.read_bytes())


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (lambda b: struct.pack_into("<Q", b, 0, 0xDEADBEEF), "bad magic 0x00000000deadbeef"),
        (lambda b: struct.pack_into("<I", b, 8, 9), "ring format version 9"),
        (lambda b: struct.pack_into("<I", b, 12, 256), "header_size 256"),
        (lambda b: struct.pack_into("<I", b, 16, 32), "slot_size 32"),
        (lambda b: struct.pack_into("<I", b, 20, 6), "capacity 6 is not a power of two"),
        (lambda b: struct.pack_into("<I", b, 20, 2), "capacity 2 is not a power of two"),
        (lambda b: struct.pack_into("<I", b, 20, 16), "expected 1536 for 16 slots"),
        (lambda b: struct.pack_into("<I", b, 48, 7), "unknown clock_kind 7"),
    ],
)
def test_corrupt_header_rejected(tmp_path: Path, patch: object, message: str) -> None:
    path, raw = _ring_bytes(tmp_path)
    patch(raw)  # type: ignore[operator]
    path.write_bytes(bytes(raw))
    with pytest.raises(RingError) as ei:
        RingReader(path)
    assert str(ei.value).startswith(f"{path}: ") and message in str(ei.value)


def test_truncated_files_rejected(tmp_path: Path) -> None:
    path, raw = _ring_bytes(tmp_path)
    path.write_bytes(bytes(raw[:-64]))
    with pytest.raises(RingError, match=r"is 960 bytes, expected 1024 for 8 slots"):
        RingReader(path)
    path.write_bytes(bytes(raw[:100]))
    with pytest.raises(RingError, match=r"100 bytes, shorter than the 512-byte header"):
        RingReader(path)
    path.write_bytes(b"")
    with pytest.raises(RingError, match=r"0 bytes"):
        RingReader(path)
    with pytest.raises(RingError, match=r"nope\.ring: cannot open"):
        RingReader(tmp_path / "nope.ring")


def test_writer_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="power of two"):
        BridgeRingWriter(tmp_path, "j", 1, 0, 1, 12)
    with pytest.raises(ValueError, match="clock_kind"):
        BridgeRingWriter(tmp_path, "j", 1, 0, 1, 8, clock_kind="sundial")
    assert list(tmp_path.iterdir()) == []


def test_writer_file_name_and_no_temp_left(tmp_path: Path) -> None:
    w = BridgeRingWriter(tmp_path, "jobX", 0xAB, 5, 8, 4)
    assert w.path.name == rf.ring_filename("jobX", 0xAB, 5) == "jobX.00000000000000ab.r5.ring"
    assert sorted(p.name for p in tmp_path.iterdir()) == [w.path.name]
    w.close()


# -- format versions ------------------------------------------------------------


def test_minor0_ring_still_read(tmp_path: Path) -> None:
    # A rolling upgrade: a job still holding the old plugin keeps being read.
    p = tmp_path / "oldjb.0123456789abcdef.r2.ring"
    recs = [OldRecord(i, 4096, 1000 * i, 1000 * i + 400) for i in range(12)]
    write_minor0_ring(
        p,
        8,
        recs,
        job="oldjb",
        comm_hash=COMM,
        rank=2,
        nranks=4,
        global_rank=6,
        host="hostO",
        pid=4242,
    )
    with RingReader(p) as r:
        h = r.header()
        assert (h.job, h.host, h.rank, h.global_rank, h.pid, h.plugin_version) == (
            "oldjb",
            "hostO",
            2,
            6,
            4242,
            5,
        )
        assert (h.minor, h.slot_minor, h.slot_size, h.tick_source) == (0, 0, 64, "none")
        assert (h.writer_flags, h.nccl_version, h.tsc_hz) == (0, 0, 0)
        assert h.tsc_anchor == ((0, 0), (0, 0)) and not (h.rccl or h.tsc or h.cpu_times)
        b = r.poll()
        assert b.done.dtype == rf.SLOT_DTYPE and b.lost == 4
        assert b.done["coll_seq"].tolist() == list(range(4, 12))
        assert b.done["end"].tolist() == [1000 * i + 400 for i in range(4, 12)]
        start, end = cpu_times_ns(b.done)
        assert np.isnan(start).all() and np.isnan(end).all() and len(start) == 8
        d = records_to_dicts(b.done[:1], h)[0]
        assert (d["func"], d["algo"], d["proto"], d["nchannels"]) == (
            "AllReduce",
            "RING",
            "SIMPLE",
            2,
        )
        assert "cpu_start_ns" not in d


def test_minor1_header_fields(tmp_path: Path) -> None:
    w = RingWriter(
        tmp_path,
        "j",
        COMM,
        0,
        2,
        8,
        clock_kind="device_ticks",
        tick_hz=100_000_000,
        writer_flags=rf.WRITER_RCCL | rf.WRITER_BACKEND,
        nccl_version=22803,
    )
    with RingReader(w.path) as r:
        h = r.header()
    assert (h.minor, h.slot_minor, h.slot_size) == (rf.RING_MINOR, 0, 64)
    assert (h.tick_source, h.nccl_version, h.writer_flags) == ("default", 22803, 5)
    assert h.rccl and h.backend and not h.tsc and not h.cpu_times
    w.close()
    with pytest.raises(ValueError, match="WRITER_TSC"):
        RingWriter(tmp_path, "k", COMM, 0, 2, 8, writer_flags=rf.WRITER_TSC)
    with pytest.raises(ValueError, match="tick_source"):
        RingWriter(tmp_path, "k", COMM, 0, 2, 8, tick_source="sundial")


def test_cpu_slots_round_trip(tmp_path: Path) -> None:
    w = RingWriter(tmp_path, "j", COMM, 1, 2, 8, cpu_times=True, clock_kind="host")
    assert w.path.stat().st_size == 512 + 8 * 128
    # Two host-timed 64-byte all_reduces: the first done, the second still in flight.
    ar: dict[str, Any] = {
        "kind": rf.KIND_COLL,
        "func": rf.FUNC_CODES["AllReduce"],
        "nbytes": 64,
        "clock": REC_HOST,
    }
    t0 = w.record(**ar, coll_seq=0, start=10, end=20, cpu_start_ns=5_000, cpu_end_ns=7_000)
    t1 = w.record(**ar, coll_seq=1, start=30, state=rf.STATE_IN_FLIGHT, cpu_start_ns=9_000)
    with RingReader(w.path) as r:
        h = r.header()
        assert (h.slot_minor, h.slot_size, h.cpu_times) == (rf.SLOT_MINOR_CPU, 128, True)
        b = r.poll()
        assert b.done.dtype == rf.SLOT_CPU_DTYPE
        assert b.done["seq"].tolist() == [t0] and b.in_flight["seq"].tolist() == [t1]
        start, end = cpu_times_ns(b.done)
        assert start.tolist() == [5000.0] and end.tolist() == [7000.0]
        fs, fe = cpu_times_ns(b.in_flight)
        assert fs.tolist() == [9000.0] and np.isnan(fe).all()  # not yet
        d = records_to_dicts(b.done, h)[0]
        assert (d["cpu_start_ns"], d["cpu_end_ns"], d["end_ns"], d["func"]) == (
            5000,
            7000,
            20,
            "AllReduce",
        )
        assert w.complete(t1, end=44, cpu_end_ns=9_500)
        b = r.poll()
        assert b.done["seq"].tolist() == [t1] and b.done["end"].tolist() == [44]
        assert cpu_times_ns(b.done)[1].tolist() == [9500.0]
        assert len(b.in_flight) == 0 and r.pending == 0
        # Wrap: 128-byte slots index and lose exactly like 64-byte ones.
        for i in range(20):
            w.record(kind=rf.KIND_COLL, func=1, coll_seq=2 + i, nbytes=1, start=1, end=2)
        b = r.poll()
        assert b.done["seq"].tolist() == list(range(14, 22)) and b.lost == 12
        assert not w.complete(t1, end=50)  # long overwritten
    with pytest.raises(ValueError, match="never written"):
        w.complete(99, end=1)
    w.close()


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (lambda b: struct.pack_into("<H", b, 290, 7), "slot_minor 7"),
        (
            lambda b: struct.pack_into("<H", b, 290, 1),
            "slot_size 64, expected 128 for slot_minor 1",
        ),
    ],
)
def test_unknown_slot_layout_rejected(tmp_path: Path, patch: Any, message: str) -> None:
    path, raw = _ring_bytes(tmp_path)
    patch(raw)
    path.write_bytes(bytes(raw))
    with pytest.raises(RingError, match=message):
        RingReader(path)


def test_newer_minor_with_known_slots_is_read(tmp_path: Path) -> None:
    # A later minor adds header fields in zeroed space: this reader ignores them.
    path, raw = _ring_bytes(tmp_path)
    struct.pack_into("<H", raw, 288, rf.RING_MINOR + 1)
    raw[400:408] = b"newfield"
    path.write_bytes(bytes(raw))
    with RingReader(path) as r:
        assert r.header().minor == rf.RING_MINOR + 1
        assert len(r.poll().done) == 3
