"""artemis-agent plugin-path / dump-ring / rings, run as the installed console script."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from artemis.ring import format as rf
from artemis.ring.writer import REC_HOST, BridgeRingWriter

AGENT = str(Path(sys.executable).parent / "artemis-agent")
COMM = 0xFEEDFACE00000001


def _agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT, *args], capture_output=True, text=True, timeout=60, env=env or dict(os.environ)
    )


def _ring(d: Path, rank: int = 0, n: int = 3, cap: int = 16, job: str = "jobA") -> BridgeRingWriter:
    w = BridgeRingWriter(d, job, COMM, rank, 4, cap, host="h1")
    for t in range(n):
        w.append(peer=1, nbytes=1000 + t, start=10 * t, end=10 * t + 4, coll_seq=t)
    return w


def _set_in_flight(path: Path, ticket: int) -> None:
    """Turn the slot of ``ticket`` into an IN_FLIGHT record, as the plugin writes one."""
    import mmap

    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, 0)
    os.close(fd)
    hdr = np.frombuffer(mm, dtype=rf.HEADER_DTYPE, count=1)
    slots = np.frombuffer(mm, dtype=rf.SLOT_DTYPE, offset=rf.HEADER_SIZE)
    s = slots[ticket % len(slots)]
    s["lock"] += 1
    s["seq"] = ticket
    s["state"] = rf.STATE_IN_FLIGHT
    s["end"] = 0
    s["lock"] += 1
    hdr["write_index"] = max(int(hdr["write_index"][0]), ticket + 1)
    del hdr, slots, s
    mm.close()


def test_plugin_path_prints_existing_absolute_path(plugin_lib: Path) -> None:
    p = _agent("plugin-path")
    assert p.returncode == 0, p.stderr
    out = Path(p.stdout.strip())
    assert out.is_absolute() and out.is_file()
    assert out.name == "libnccl-profiler-artemis.so"
    from artemis.agent.plugin_path import plugin_path

    assert out == plugin_path()


def test_plugin_path_error_names_both_places(tmp_path: Path) -> None:
    # The real module, copied where neither _plugin/ nor ../profiler_plugin/build exist.
    src = Path(__file__).resolve().parents[1] / "agent" / "plugin_path.py"
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    shutil.copy(src, pkg / "plugin_path.py")
    spec = importlib.util.spec_from_file_location("pp_copy", pkg / "plugin_path.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(FileNotFoundError) as ei:
        mod.plugin_path()
    msg = str(ei.value)
    assert str(pkg / "_plugin" / "libnccl-profiler-artemis.so") in msg
    assert str(tmp_path / "profiler_plugin" / "build" / "libnccl-profiler-artemis.so") in msg
    assert "make plugin" in msg


def test_dump_ring_prints_json_lines(tmp_path: Path) -> None:
    w = _ring(tmp_path, n=3)
    w.append(peer=0, nbytes=7, start=1, end=2, coll_seq=9, clock=REC_HOST)
    _set_in_flight(w.path, 4)
    p = _agent("dump-ring", str(w.path))
    assert p.returncode == 0, p.stderr
    recs = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["seq"] for r in recs] == [0, 1, 2, 3, 4]
    assert [r["state"] for r in recs] == ["done"] * 4 + ["in_flight"]
    r0 = recs[0]
    assert (r0["comm"], r0["rank"], r0["kind"], r0["func"], r0["bytes"]) == (
        "feedface00000001",
        0,
        "bridge",
        "Bridge",
        1000,
    )
    assert (r0["start_ns"], r0["end_ns"], r0["clock"], r0["units"], r0["coll_seq"]) == (
        0,
        4,
        "device",
        "ns",
        0,
    )
    assert recs[3]["clock"] == "host" and recs[3]["coll_seq"] == 9
    required = {"comm", "rank", "seq", "coll_seq", "kind", "func", "dtype", "bytes", "start_ns"}
    required |= {"end_ns", "clock", "units", "state", "enqueue_ns", "nchannels", "algo", "proto"}
    assert all(required | {"peer"} <= set(r) for r in recs)
    w.close()


def test_dump_ring_reports_losses_on_stderr(tmp_path: Path) -> None:
    w = _ring(tmp_path, n=20, cap=4)
    p = _agent("dump-ring", str(w.path))
    assert p.returncode == 0
    assert [json.loads(x)["seq"] for x in p.stdout.splitlines()] == [16, 17, 18, 19]
    assert "16 record(s) lost" in p.stderr
    w.close()


def test_dump_ring_follow_until_finished(tmp_path: Path) -> None:
    w = _ring(tmp_path, n=2, cap=64)
    _set_in_flight(w.path, 2)
    proc = subprocess.Popen(
        [AGENT, "dump-ring", "--follow", "--interval", "0.01", str(w.path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = [json.loads(proc.stdout.readline()) for _ in range(3)]
    assert [(r["seq"], r["state"]) for r in first] == [(0, "done"), (1, "done"), (2, "in_flight")]
    # The in-flight op completes (same ticket rewritten DONE), more arrive, then finish.
    w._next = 2
    for t in range(2, 6):
        w.append(peer=1, nbytes=t, start=t, end=t + 1, coll_seq=t)
    w.finish()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    rest = [json.loads(x) for x in out.splitlines()]
    assert [(r["seq"], r["state"]) for r in rest] == [(t, "done") for t in range(2, 6)]
    w.close()


def test_dump_ring_corrupt_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.r0.ring"
    bad.write_bytes(b"\0" * 100)
    p = _agent("dump-ring", str(bad))
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and str(bad) in lines[0] and "shorter than the 512-byte header" in lines[0]
    )
    p = _agent("dump-ring", str(tmp_path / "missing.ring"))
    assert p.returncode == 2 and "missing.ring: cannot open" in p.stderr


def test_rings_json_and_table(tmp_path: Path) -> None:
    w0 = _ring(tmp_path, rank=0, n=3)
    w1 = _ring(tmp_path, rank=1, n=20, cap=4)
    w1.finish()
    p = _agent("rings", "--shm-dir", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert [(r["rank"], r["records"], r["lost"], r["finished"]) for r in rows] == [
        (0, 3, 0, False),
        (1, 20, 16, True),
    ]
    assert all(r["job"] == "jobA" and r["comm"] == "feedface00000001" for r in rows)
    assert all(r["pid"] == os.getpid() for r in rows)
    assert all(
        (r["minor"], r["slot_minor"], r["writer_flags"]) == (rf.RING_MINOR, 0, 0) for r in rows
    )
    env = dict(os.environ, ARTEMIS_SHM_DIR=str(tmp_path))
    t = _agent("rings", env=env)
    assert t.returncode == 0, t.stderr
    assert "jobA" in t.stdout and "feedface00000001" in t.stdout and "True" in t.stdout
    w0.close()
    w1.close()


def test_rings_lists_bad_file_and_continues(tmp_path: Path) -> None:
    w = _ring(tmp_path, rank=0, n=2)
    bad = tmp_path / "jobA.0000000000000000.r9.ring"
    bad.write_bytes(b"X" * 600)
    p = _agent("rings", "--shm-dir", str(tmp_path), "--json")
    assert p.returncode == 2
    assert [json.loads(x)["rank"] for x in p.stdout.splitlines()] == [0]
    assert str(bad) in p.stderr and "bad magic" in p.stderr
    p = _agent("rings", "--shm-dir", str(tmp_path / "nowhere"))
    assert p.returncode == 2 and "no such ring folder" in p.stderr
    w.close()


def test_dump_ring_of_a_plugin_ring(plugin_lib: Path, shm_dir: Path) -> None:
    from artemis.sim.nccl import NcclStandIn

    n = NcclStandIn(plugin_lib, 7)
    c = n.comm_init(0xD00D, 2, 4)
    c.collective("AllReduce", 256, "ncclFloat16", kernel_times=[(700, 800), (650, 820)])
    c.begin_collective("AllReduce", 256, "ncclFloat16")
    p = _agent("dump-ring", str(shm_dir / "testjob.000000000000d00d.r2.ring"))
    assert p.returncode == 0, p.stderr
    recs = [json.loads(x) for x in p.stdout.splitlines()]
    assert [
        (r["seq"], r["coll_seq"], r["func"], r["bytes"], r["state"], r["start_ns"], r["end_ns"])
        for r in recs
    ] == [(0, 0, "AllReduce", 512, "done", 650, 820), (1, 1, "AllReduce", 512, "in_flight", 0, 0)]
    assert recs[0]["clock"] == "device" and recs[0]["rank"] == 2 and recs[0]["nchannels"] == 2
    p = _agent("rings", "--shm-dir", str(shm_dir), "--json")
    row = json.loads(p.stdout)
    assert (row["records"], row["in_flight"], row["finished"], row["plugin_version"]) == (
        2,
        1,
        False,
        7,
    )
    assert (row["minor"], row["slot_minor"]) == (rf.RING_MINOR, 0)  # the plugin writes the newest
    n.finalize()
