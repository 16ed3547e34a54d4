"""The real compiled plugin driven through the NCCL ABI by sim/nccl.py, read back by the reader."""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

import pytest
from artemis.ring.reader import RingReader, records_to_dicts
from artemis.sim import nccl_abi as nccl
from artemis.sim.nccl import NcclStandIn, format_c
from standin_comms import one_comm, ring_path

VERSIONS = (4, 5, 6, 7)


def test_abi_sizes_and_offsets_match_the_reference() -> None:
    v4, v5, v6, v7 = nccl.DescrV4, nccl.DescrV5, nccl.DescrV6, nccl.DescrV7
    assert [ctypes.sizeof(d) for d in (v4, v5, v6, v7)] == [104, 112, 112, 136]
    assert ctypes.sizeof(nccl.StateArgs) == 8
    assert nccl.StateArgs.kernelCh.offset == 0
    for d in (v4, v5, v6, v7):
        assert d.u.offset == 24
        # ctypes reports anonymous-union members at their offset in the descriptor.
        assert d.kernelCh.offset + nccl._KernelCh.pTimer.offset == 32
    # Union members at their offset in the v6 descriptor (the reference's offsetof),
    # "struct.member": offset; compared as one table, so a failure names every one that moved.
    union_members = {
        "_CollV5.parentGroup": 104,
        "_CollV5.nChannels": 80,
        "_ProxyOp.isSend": 44,
        "_CollApiV5.graphCaptured": 64,
        "_CeCollV6.stream": 104,
        "_P2pV5.peer": 56,
        "_CollV7.kernelVariant": 112,
        "_CollV7.userTag": 128,
        "_CollApiV7.userTag": 72,
        "_KernelPhase.pTimer": 40,
        "_CollV4.proto": 96,
        "_P2pV4.nChannels": 60,
    }

    def offset(member: str) -> int:
        struct, field = member.split(".")
        return int(v6.u.offset + getattr(getattr(nccl, struct), field).offset)

    assert {m: offset(m) for m in union_members} == union_members
    assert v4.type.size == 1 and v5.type.size == 8


@pytest.mark.parametrize("version", VERSIONS)
def test_values_read_back_exactly(plugin_lib: Path, shm_dir: Path, version: int) -> None:
    comm_hash = 0xC0FFEE00 + version
    n = NcclStandIn(plugin_lib, version)
    assert n.name == "Artemis"
    c = n.comm_init(comm_hash, rank=1, nranks=4, nnodes=2, name="tp-group")
    assert c.init_rc == 0 and c.context
    assert n.mask.value == nccl.COLL | nccl.P2P | nccl.KERNEL_CH
    assert len(n.log_lines) == 1 and str(ring_path(shm_dir, comm_hash, 1)) in n.log_lines[0]
    c.collective("AllReduce", 1000, "ncclFloat32", kernel_times=[(500, 900), (480, 950)])
    c.collective(
        "ReduceScatter", 64, "ncclBfloat16", 3, "TREE", "LL128", [(10, 20), (5, 30), (7, 25)]
    )
    c.p2p("Send", 100, "ncclInt64", peer=3, kernel_times=[(40, 41)])
    c.collective("AllReduce", 8, "ncclFloat64", 1, kernel_times=[(60, 70)])
    c.p2p("Recv", 3, "ncclUint8", peer=0, nchannels=2, kernel_times=[(80, 85), (79, 84)])
    with RingReader(ring_path(shm_dir, comm_hash, 1)) as r:
        h = r.header()
        b = r.poll()
        recs = records_to_dicts(b.done, h)
    assert (h.comm_hash, h.rank, h.nranks, h.nnodes, h.comm_name) == (
        comm_hash,
        1,
        4,
        2,
        "tp-group",
    )
    assert (h.plugin_version, h.clock_kind, h.job, h.write_index, h.dropped) == (
        version,
        "device_ns",
        "testjob",
        5,
        0,
    )
    assert b.lost == 0 and len(b.in_flight) == 0
    got = [
        (
            r["seq"],
            r["coll_seq"],
            r["kind"],
            r["func"],
            r["dtype"],
            r["bytes"],
            r["start_ns"],
            r["end_ns"],
            r["nchannels"],
            r["algo"],
            r["proto"],
            r["peer"],
        )
        for r in recs
    ]
    assert got == [
        (0, 0, "coll", "AllReduce", "ncclFloat32", 4000, 480, 950, 2, "RING", "SIMPLE", -1),
        (1, 1, "coll", "ReduceScatter", "ncclBfloat16", 128, 5, 30, 3, "TREE", "LL128", -1),
        (2, 2, "p2p", "Send", "ncclInt64", 800, 40, 41, 1, "Unknown", "Unknown", 3),
        (3, 2, "coll", "AllReduce", "ncclFloat64", 64, 60, 70, 1, "RING", "SIMPLE", -1),
        (4, 3, "p2p", "Recv", "ncclUint8", 3, 79, 85, 2, "Unknown", "Unknown", 0),
    ]
    assert all(r["state"] == "done" and r["clock"] == "device" for r in recs)
    assert all(r["units"] == "ns" and r["enqueue_ns"] > 0 for r in recs)
    c.finalize()


@pytest.mark.parametrize("version", VERSIONS)
def test_allgather_reaches_coll_as_bytes(plugin_lib: Path, shm_dir: Path, version: int) -> None:
    _, c = one_comm(plugin_lib, version, 0xA6)
    c.collective("AllGather", 10, "ncclFloat32", kernel_times=[(1, 2), (1, 3)])
    c.collective("Broadcast", 4, "ncclFloat16", kernel_times=[(1, 2), (1, 3)])
    with RingReader(ring_path(shm_dir, 0xA6, 0)) as r:
        d = records_to_dicts(r.poll().done, r.header())
    assert [(x["func"], x["dtype"], x["bytes"]) for x in d] == [
        ("AllGather", "ncclInt8", 40),
        ("Broadcast", "ncclInt8", 8),
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_in_flight_then_done_once(plugin_lib: Path, shm_dir: Path, version: int) -> None:
    _, c = one_comm(plugin_lib, version, 0x1F)
    with RingReader(ring_path(shm_dir, 0x1F, 0)) as r:
        hung = c.begin_collective("AllReduce", 16, "ncclFloat32", nchannels=2)
        b = r.poll()
        assert len(b.done) == 0 and b.in_flight["seq"].tolist() == [0]
        fly = records_to_dicts(b.in_flight, r.header())[0]
        assert (fly["state"], fly["start_ns"], fly["end_ns"], fly["bytes"]) == (
            "in_flight",
            0,
            0,
            64,
        )
        # Later collectives complete while the first stays in flight.
        c.collective("AllReduce", 16, "ncclFloat32", kernel_times=[(5, 6), (5, 7)])
        b = r.poll()
        assert b.done["seq"].tolist() == [1] and b.in_flight["seq"].tolist() == [0]
        hung.complete([(1, 3), (2, 4)])
        b = r.poll()
        assert b.done["seq"].tolist() == [0] and len(b.in_flight) == 0
        assert (int(b.done["start"][0]), int(b.done["end"][0])) == (1, 4)
        assert len(r.poll().done) == 0


@pytest.mark.parametrize("version", (4, 7))
def test_host_timing_when_device_timing_off(
    plugin_lib: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    monkeypatch.setenv("ARTEMIS_DEVICE_TIMING", "0")
    n, c = one_comm(plugin_lib, version, 0x40)
    assert n.mask.value == nccl.COLL | nccl.P2P  # no KernelCh: none are sent
    t0 = time.monotonic_ns()
    c.collective("AllReduce", 4, "ncclInt32", kernel_times=[(1, 2), (3, 4)])
    c.p2p("Send", 4, "ncclInt32", peer=1)
    t1 = time.monotonic_ns()
    with RingReader(ring_path(shm_dir, 0x40, 0)) as r:
        h = r.header()
        recs = records_to_dicts(r.poll().done, h)
    assert h.clock_kind == "host"
    assert [x["seq"] for x in recs] == [0, 1]
    for x in recs:
        assert (x["clock"], x["units"], x["state"]) == ("host", "ns", "done")
        assert t0 <= x["enqueue_ns"] <= x["start_ns"] <= x["end_ns"] <= t1


def test_disable_gives_no_ring_and_one_log_line(
    plugin_lib: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARTEMIS_DISABLE", "1")
    n, c = one_comm(plugin_lib, 7, 0x50)
    c.collective("AllReduce", 4, "ncclInt32")
    c.finalize()
    assert c.context is None and n.mask.value == 0
    assert list(shm_dir.iterdir()) == []
    assert len(n.log_lines) == 1 and "ARTEMIS_DISABLE" in n.log_lines[0], n.log_lines


@pytest.mark.parametrize("version", (4, 6))
def test_unwritable_shm_dir_one_log_line_no_crash(
    plugin_lib: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    blocker = shm_dir / "a-file"
    blocker.write_text("not a folder")
    # A path under a regular file cannot be created, even by root.
    monkeypatch.setenv("ARTEMIS_SHM_DIR", str(blocker / "rings"))
    n, c = one_comm(plugin_lib, version, 0x60)
    # NULL context: this comm is unprofiled (the mask is process-wide, so other
    # comms keep theirs), and its events arrive with a NULL context.
    assert c.init_rc == 0 and c.context is None
    c.collective("AllReduce", 4, "ncclInt32")
    c.p2p("Recv", 4, "ncclInt32", peer=1)
    c.finalize()
    assert len(n.log_lines) == 1 and str(blocker) in n.log_lines[0]
    assert n.log_levels == [2]  # NCCL_LOG_WARN
    assert sorted(p.name for p in shm_dir.iterdir()) == ["a-file"]


def test_tiny_ring_counts_losses(
    plugin_lib: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARTEMIS_RING_SLOTS", "4")
    _, c = one_comm(plugin_lib, 7, 0x70)
    for i in range(10):
        c.collective("AllReduce", 1, "ncclFloat32", 1, kernel_times=[(i + 1, i + 2)])
    with RingReader(ring_path(shm_dir, 0x70, 0)) as r:
        assert r.capacity == 4
        b = r.poll()
        assert b.done["seq"].tolist() == [6, 7, 8, 9] and b.lost == 6
        assert b.done["start"].tolist() == [7, 8, 9, 10]
        for i in range(3):
            c.collective("AllReduce", 1, "ncclFloat32", 1, kernel_times=[(i + 1, i + 2)])
        b = r.poll()
        assert b.done["seq"].tolist() == [10, 11, 12] and b.lost == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_events_after_finalize_are_ignored(plugin_lib: Path, shm_dir: Path, version: int) -> None:
    n, c = one_comm(plugin_lib, version, 0x80)
    c.collective("AllReduce", 4, "ncclFloat32", kernel_times=[(1, 2), (1, 2)])
    late = c.begin_collective("AllReduce", 4, "ncclFloat32")
    n.finalize()
    # Racing callbacks after finalize: a kernel finishing late and new ops.
    late.complete([(3, 4), (3, 5)])
    c.collective("AllReduce", 4, "ncclFloat32", kernel_times=[(5, 6), (5, 6)])
    c.p2p("Send", 1, "ncclInt8", peer=1, kernel_times=[(7, 8)])
    with RingReader(ring_path(shm_dir, 0x80, 0)) as r:
        h = r.header()
        b = r.poll()
    assert h.finished and h.finished_ns > 0 and h.write_index == 2
    assert b.done["seq"].tolist() == [0, 1] and b.done["end"].tolist() == [2, 5]


def test_several_ranks_and_comms_in_one_process(plugin_lib: Path, shm_dir: Path) -> None:
    n = NcclStandIn(plugin_lib, 6)
    world = [n.comm_init(0xAAAA, r, 4) for r in range(4)]
    pair = n.comm_init(0xBBBB, 0, 2)
    for step in range(3):
        for r, c in enumerate(world):
            t = 1000 * (step + 1) + 10 * r  # pTimer 0 means 'no timer'
            c.collective("AllReduce", 256, "ncclFloat32", kernel_times=[(t, t + 5), (t + 1, t + 7)])
    pair.p2p("Send", 8, "ncclFloat32", peer=1, kernel_times=[(9, 10)])
    n.finalize()
    for r in range(4):
        with RingReader(ring_path(shm_dir, 0xAAAA, r)) as rr:
            h = rr.header()
            b = rr.poll()
        assert (h.rank, h.nranks, h.finished) == (r, 4, True)
        assert b.done["coll_seq"].tolist() == [0, 1, 2]
        assert b.done["start"].tolist() == [1000 * (s + 1) + 10 * r for s in range(3)]
        assert b.done["end"].tolist() == [1000 * (s + 1) + 10 * r + 7 for s in range(3)]
    with RingReader(ring_path(shm_dir, 0xBBBB, 0)) as rr:
        d = records_to_dicts(rr.poll().done, rr.header())
    assert [(x["func"], x["peer"], x["bytes"]) for x in d] == [("Send", 1, 32)]
    assert len(list(shm_dir.glob("*.ring"))) == 5


def test_default_kernel_times_are_epoch_ns(plugin_lib: Path, shm_dir: Path) -> None:
    _, c = one_comm(plugin_lib, 5, 0x90)
    t0 = time.time_ns()
    c.collective("AllReduce", 1, "ncclFloat32")
    t1 = time.time_ns()
    with RingReader(ring_path(shm_dir, 0x90, 0)) as r:
        b = r.poll()
    assert t0 <= int(b.done["start"][0]) < int(b.done["end"][0]) <= t1 + 1


def test_bad_arguments(plugin_lib: Path, shm_dir: Path) -> None:
    with pytest.raises(ValueError, match="version 3"):
        NcclStandIn(plugin_lib, 3)
    _, c = one_comm(plugin_lib, 7, 0x91)
    with pytest.raises(ValueError, match="1 kernel times for 2 channels"):
        c.collective("AllReduce", 1, "ncclFloat32", 2, kernel_times=[(1, 2)])
    with pytest.raises(ValueError, match="'Send' or 'Recv'"):
        c.p2p("Bcast", 1, "ncclFloat32", peer=1)
    with pytest.raises(OSError):
        NcclStandIn(shm_dir / "missing.so")


def test_format_c() -> None:
    s1 = ctypes.create_string_buffer(b"ring /dev/shm/x")
    s2 = ctypes.create_string_buffer(b"abcdef")
    args = [ctypes.addressof(s1), (1 << 32) - 3, 7, 255, ctypes.addressof(s2), 12]
    got = format_c("%s: %d %llu %x [%5.2s] %05d %%", args)
    assert got == "ring /dev/shm/x: -3 7 ff [   ab] 00012 %"
