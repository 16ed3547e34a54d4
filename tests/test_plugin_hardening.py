"""The plugin on the paths a real cluster hits first (issue 16), through the real ABI.

Self Send/Recv (every all-to-all has one), KernelCh events that never come, a
full ring folder, and RCCL loading the plugin under the NCCL name.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from artemis.ring.reader import RingReader, records_to_dicts
from artemis.sim.nccl import NcclStandIn, p2p_nchannels
from standin_comms import one_comm, ring_path


@pytest.mark.parametrize("version", (4, 6, 7))
def test_self_send_recv_never_blinds_the_plugin(
    plugin_lib: Path, shm_dir: Path, version: int
) -> None:
    # NCCL gives a self Send/Recv nChannels >= 1 but no proxy op, so no KernelCh
    # event follows. Before the fix each such op held a handle for ever: the
    # pool (512) ran out after 256 pairs and later all-reduces were dropped.
    _, c = one_comm(plugin_lib, version, 0x5E1F, 1, 4)
    kt = [(100, 200), (110, 210)]
    for _ in range(2000):
        c.send_recv_self(1024, "ncclFloat32")
        c.collective("AllReduce", 256, "ncclFloat32", kernel_times=kt)
    with RingReader(ring_path(shm_dir, 0x5E1F, 1)) as r:
        h = r.header()
        b = r.poll()
        recs = records_to_dicts(b.done, h)
    assert h.dropped == 0 and len(b.in_flight) == 0 and b.lost == 0
    ar = [x for x in recs if x["func"] == "AllReduce"]
    assert len(ar) == 2000
    assert all(x["clock"] == "device" and (x["start_ns"], x["end_ns"]) == (100, 210) for x in ar)
    assert [x["coll_seq"] for x in ar] == list(range(2000))
    selfs = [x for x in recs if x["kind"] == "p2p"]
    assert len(selfs) == 4000 and {x["peer"] for x in selfs} == {1}
    assert [x["func"] for x in selfs[:2]] == ["Send", "Recv"]
    # Host-timed, as the op has no device times, and it reports NCCL's channel count.
    assert all(x["clock"] == "host" and x["state"] == "done" for x in selfs)
    assert all(x["enqueue_ns"] <= x["start_ns"] <= x["end_ns"] for x in selfs)
    assert {x["nchannels"] for x in selfs} == {p2p_nchannels(4096, 4)} and p2p_nchannels(0, 4) == 1
    c.finalize()


def _header_u64(path: Path, off: int) -> int:
    return int.from_bytes(path.read_bytes()[off : off + 8], "little")


HOST_FALLBACK_OFF = 312  # artemis_ring.h: header.host_fallback


def test_ops_whose_kernel_events_never_come_are_reclaimed(
    plugin_lib: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NCCL 2.31 can drop an op's KernelCh events when it runs out of memory.
    # Such an op is reclaimed once an op 64 tickets later completed with device
    # times and it is older than the reclaim age (0 here; 2 s by default):
    # host clock, start = end = its enqueue time, counted.
    monkeypatch.setenv("ARTEMIS_RECLAIM_AGE_MS", "0")
    _, c = one_comm(plugin_lib, 7, 0xD0)
    kt = [(10, 20), (11, 21)]
    lost = c.begin_collective("AllReduce", 8, "ncclFloat32")  # its kernel events never come
    late = c.begin_collective("AllReduce", 8, "ncclFloat32")  # its come, but late
    for _ in range(62):
        c.collective("AllReduce", 8, "ncclFloat32", kernel_times=kt)
    late.complete([(5, 6), (5, 7)])  # within 64 tickets: still timed by the device
    for _ in range(20):  # the plugin moves its device mark in steps of 16 tickets
        c.collective("AllReduce", 8, "ncclFloat32", kernel_times=kt)
    path = ring_path(shm_dir, 0xD0, 0)
    with RingReader(path) as r:
        b = r.poll()
        recs = {x["seq"]: x for x in records_to_dicts(b.done, r.header())}
        assert len(b.in_flight) == 0 and r.header().dropped == 0
        first = recs[0]
        assert first["clock"] == "host" and first["start_ns"] == first["end_ns"]
        assert first["start_ns"] == first["enqueue_ns"]
        assert (recs[1]["clock"], recs[1]["start_ns"], recs[1]["end_ns"]) == ("device", 5, 7)
        assert all(recs[s]["clock"] == "device" for s in range(2, 84))
        assert _header_u64(path, HOST_FALLBACK_OFF) == 1
        # Events that come after the reclaim find the op's bits clear: nothing changes.
        lost.complete(kt)
        assert len(r.poll().done) == 0 and r.header().dropped == 0
    # Many such ops never exhaust the handle pool (512).
    for _ in range(2000):
        c.begin_collective("AllReduce", 8, "ncclFloat32")
        c.collective("AllReduce", 8, "ncclFloat32", kernel_times=kt)
    with RingReader(path) as r:
        assert r.header().dropped == 0
    assert _header_u64(path, HOST_FALLBACK_OFF) >= 1 + 2000 - 64
    c.finalize()


def test_self_p2p_counted_as_host_fallback(plugin_lib: Path, shm_dir: Path) -> None:
    _, c = one_comm(plugin_lib, 5, 0xD1, 2, 4)
    ops = c.group_p2p(
        [("Send", 4, "ncclInt8", 2), ("Recv", 4, "ncclInt8", 2), ("Send", 4, "ncclInt8", 3)]
    )
    for op in ops:
        op.complete()
    path = ring_path(shm_dir, 0xD1, 2)
    with RingReader(path) as r:
        recs = records_to_dicts(r.poll().done, r.header())
    assert [(x["func"], x["peer"], x["clock"]) for x in recs] == [
        ("Send", 2, "host"),
        ("Recv", 2, "host"),
        ("Send", 3, "device"),
    ]
    assert _header_u64(path, HOST_FALLBACK_OFF) == 2


_FULL_SHM_CHILD = """
import sys
from artemis.sim.nccl import NcclStandIn
n = NcclStandIn(sys.argv[1], 6)
c = n.comm_init(0xF011, rank=0, nranks=2)
for _ in range(3000):  # 3000 records: 190 KiB of slots, far past the 64 KiB folder
    c.collective("AllReduce", 8, "ncclFloat32", kernel_times=[(1, 2), (1, 3)])
print(len(n.log_lines), c.context is not None)
for line in n.log_lines:
    print(line)
"""


def _in_tiny_tmpfs(
    tmp_path: Path, plugin_lib: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Runs the child in a private mount namespace whose ring folder is a 64 KiB tmpfs."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    shm = tmp_path / "tiny"
    shm.mkdir()
    script = tmp_path / "child.py"
    script.write_text(_FULL_SHM_CHILD)
    # No exec: the shell reports a child killed by SIGBUS as 135, as a job launcher would.
    cmd = (
        f"mount -t tmpfs -o size=64k artemis-tiny {shlex.quote(str(shm))} || exit 99; "
        f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {shlex.quote(str(plugin_lib))}"
    )
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.strip()}")
    full_env = {**os.environ, **env, "ARTEMIS_SHM_DIR": str(shm), "ARTEMIS_JOB": "full"}
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )
    if proc.returncode == 99:
        pytest.skip(f"cannot mount a tmpfs in the namespace: {proc.stderr.strip()}")
    return proc


def test_full_shm_folder_disables_the_plugin_instead_of_killing_the_job(
    tmp_path: Path, plugin_lib: Path
) -> None:
    # Before the fix the ring was only ftruncate'd: the first store to a page
    # the tmpfs could not back raised SIGBUS in the job (exit 135).
    proc = _in_tiny_tmpfs(tmp_path, plugin_lib, {"ARTEMIS_RING_SLOTS": "8192"})
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    lines = proc.stdout.splitlines()
    assert lines[0] == "1 False", proc.stdout  # one log line, no context: off for this comm
    assert "No space left on device" in lines[1] and "full." in lines[1], lines[1]


def test_a_ring_that_fits_in_the_tiny_folder_still_records(
    tmp_path: Path, plugin_lib: Path
) -> None:
    proc = _in_tiny_tmpfs(tmp_path, plugin_lib, {"ARTEMIS_RING_SLOTS": "64"})
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stdout.splitlines()[0] == "1 True", proc.stdout  # the INFO line, a context


def _header_u32(path: Path, off: int) -> int:
    return int.from_bytes(path.read_bytes()[off : off + 4], "little")


# artemis_ring.h offsets (minor 1)
TICK_SOURCE_OFF, WRITER_FLAGS_OFF, NCCL_VERSION_OFF = 292, 296, 300
TICK_SRC_NONE, TICK_SRC_DEFAULT, TICK_SRC_HIP = 0, 1, 2
WRITER_RCCL, WRITER_ENV = 1, 8


def test_rccl_is_detected_from_the_process_not_the_file_name(
    plugin_lib: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # RCCL resolves NCCL_PROFILER_PLUGIN=artemis to libnccl-profiler-artemis.so
    # (its profiler prefix is NCCL's). Before the fix the plugin decided from
    # its own file name and marked RCCL's 100 MHz ticks as ns.
    assert plugin_lib.name == "libnccl-profiler-artemis.so"
    monkeypatch.setenv("ARTEMIS_STANDIN_HIP_DEVICE", "3")
    monkeypatch.setenv("ARTEMIS_STANDIN_HIP_WALLCLOCK_KHZ_3", "25000")
    n = NcclStandIn(plugin_lib, 6, runtime="rccl")
    c = n.comm_init(0xAD, rank=0, nranks=2)
    c.collective("AllReduce", 8, "ncclFloat32", kernel_times=[(100, 350), (110, 300)])
    path = ring_path(shm_dir, 0xAD, 0)
    with RingReader(path) as r:
        h = r.header()
        recs = records_to_dicts(r.poll().done, h)
    assert (h.clock_kind, h.tick_hz) == ("device_ticks", 25_000_000)  # GPU 3's own rate
    assert (recs[0]["units"], recs[0]["start_ns"], recs[0]["end_ns"]) == ("ticks", 100, 350)
    assert _header_u32(path, TICK_SOURCE_OFF) == TICK_SRC_HIP
    assert _header_u32(path, WRITER_FLAGS_OFF) & WRITER_RCCL
    assert _header_u32(path, NCCL_VERSION_OFF) == 22803
    assert "RCCL 22803" in n.log_lines[0] and "from HIP" in n.log_lines[0], n.log_lines


def test_rccl_without_a_hip_rate_uses_the_configured_default(
    plugin_lib: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARTEMIS_STANDIN_HIP_WALLCLOCK_KHZ_0", "0")  # the query fails
    n = NcclStandIn(plugin_lib, 7, runtime="rccl")
    n.comm_init(0xAE, rank=0, nranks=2)
    monkeypatch.setenv("ARTEMIS_TICK_HZ", "50000000")
    n.comm_init(0xAF, rank=0, nranks=2)
    for comm, hz in ((0xAE, 100_000_000), (0xAF, 50_000_000)):
        path = ring_path(shm_dir, comm, 0)
        with RingReader(path) as r:
            assert (r.header().clock_kind, r.header().tick_hz) == ("device_ticks", hz)
        assert _header_u32(path, TICK_SOURCE_OFF) == TICK_SRC_DEFAULT


def test_nccl_runtime_gives_ns_and_its_version(plugin_lib: Path, shm_dir: Path) -> None:
    for version in (4, 7):
        n = NcclStandIn(plugin_lib, version, runtime="nccl")
        n.comm_init(0xB0 + version, rank=0, nranks=2)
        path = ring_path(shm_dir, 0xB0 + version, 0)
        with RingReader(path) as r:
            assert (r.header().clock_kind, r.header().tick_hz) == ("device_ns", 0)
        assert _header_u32(path, NCCL_VERSION_OFF) == 23003
        assert _header_u32(path, WRITER_FLAGS_OFF) == WRITER_ENV  # not RCCL; its env sidecar
        assert _header_u32(path, TICK_SOURCE_OFF) == TICK_SRC_NONE
    # Called from no NCCL at all (plain ctypes): the version is unknown (0).
    n = NcclStandIn(plugin_lib, 6)
    n.comm_init(0xB9, rank=0, nranks=2)
    assert _header_u32(ring_path(shm_dir, 0xB9, 0), NCCL_VERSION_OFF) == 0
