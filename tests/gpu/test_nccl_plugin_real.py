"""The real thing: NCCL (PyTorch's own) loads our plugin on a one-GPU machine.

Runs only where a CUDA build of PyTorch sees a GPU (skipped elsewhere, with
the reason). What a single GPU can make NCCL emit, read from the NCCL source
(2.27 to 2.30, ``src/enqueue.cc``, ``src/plugin/profiler.cc``):

* **A one-rank communicator's collectives emit no profiler event at all.**
  ``taskAppend`` sends every collective of a 1-rank communicator to
  ``ncclLaunchOneRank`` (a ``cudaMemcpyAsync``, or one small kernel for
  PreMulSum) and returns before ``collTaskAppend``: no task, no kernel plan,
  so no Coll, KernelCh, CollApi or GroupApi event. The plugin must still
  create the ring at ``init`` (header: 1 rank, the global rank, the API
  version NCCL accepted), write no record, and mark the ring finished at
  ``finalize``. That is what it records there, and exactly what is asserted.
* **Self Send/Recv on a one-rank communicator goes through the planner.**
  ``p2pTaskAppend`` queues it, the plan launches a kernel and NCCL emits a P2p
  event per Send and Recv (with ``nChannels >= 1``), but ``addP2pToPlan``
  adds no proxy op for a self pair (``selfSend ? 0 : 2``), so no KernelCh
  event ever follows. The plugin must complete such ops without device
  times, timed on the host (issue 16 item 1): every Send and Recv is recorded,
  each completed one with a host clock and start <= end; the last pair may
  still wait for the reclaim that the next event of the communicator (or its
  age) triggers, but nothing else may stay in flight.
* **Two ranks on one GPU** are refused up to NCCL 2.29 ("Duplicate GPU
  detected"); from 2.30 ``NCCL_MULTI_RANK_GPU_ENABLE=1`` allows them
  (``src/init.cc``). Such a 2-rank communicator takes the normal path: Coll
  and KernelCh events, so device-timed all-reduce records in both rings.
  Skipped, with the reason, when PyTorch's NCCL is older.

``tests/gpu/run.sh`` runs these with the NVML checks on a lent machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to PyTorch", allow_module_level=True)

pytestmark = pytest.mark.gpu

N = 20  # operations per check


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _nccl_version() -> tuple[int, ...]:
    v = torch.cuda.nccl.version()
    if isinstance(v, int):  # older PyTorch: 2.18.3 -> 21803
        return (v // 10000, (v // 100) % 100, v % 100)
    return tuple(int(x) for x in v)


def _run(script: str, shm: Path, timeout: float = 150, **extra: str) -> str:
    from artemis.agent.plugin_path import plugin_path

    env = dict(os.environ)
    env.update(
        NCCL_PROFILER_PLUGIN=str(plugin_path()),
        NCCL_DEBUG="INFO",
        NCCL_DEBUG_SUBSYS="INIT,ENV",
        ARTEMIS_SHM_DIR=str(shm),
        ARTEMIS_JOB="gpucheck",
        N_OPS=str(N),
        **extra,
    )
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = r.stdout[-3000:] + r.stderr[-3000:]
    if r.returncode == 3 and "NO_NCCL_LIBRARY" in r.stdout:
        pytest.skip("PyTorch's NCCL library could not be found for ctypes: " + r.stdout.strip())
    assert r.returncode == 0, out
    return out


def _rings(shm: Path, out: str) -> list[tuple[Any, list[dict[str, Any]], int]]:
    """(header, records done, records in flight) of every ring the run left."""
    from artemis.ring.reader import RingReader, records_to_dicts

    paths = sorted(shm.glob("gpucheck.*.ring"))
    assert paths, f"no ring written; NCCL said:\n{out}"
    got = []
    for p in paths:
        with RingReader(p) as rd:
            h = rd.header()
            batch = rd.poll()
            got.append((h, records_to_dicts(batch.done, h), len(batch.in_flight)))
    return got


WORLD1 = """
    import os, torch, torch.distributed as dist
    dist.init_process_group(
        "nccl", init_method=os.environ["INIT"], rank=0, world_size=1,
        device_id=torch.device("cuda:0"),
    )
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(int(os.environ["N_OPS"])):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    assert float(x[0]) == 1.0
    dist.destroy_process_group()
"""


def test_one_rank_collectives_reach_no_plugin_event(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    out = _run(WORLD1, shm, INIT=f"tcp://127.0.0.1:{_free_port()}", RANK="0")
    rings = _rings(shm, out)
    assert len(rings) == 1, [h.path.name for h, _, _ in rings]
    h, done, in_flight = rings[0]
    assert (h.nranks, h.rank, h.global_rank) == (1, 0, 0)
    assert h.plugin_version in (4, 5, 6, 7)
    # ncclLaunchOneRank: no task, no plan, no event -> not one record
    assert (done, in_flight, h.write_index, h.dropped) == ([], 0, 0, 0)
    assert h.finished, "finalize must mark the ring finished"


SELF_P2P = r"""
    import ctypes, os, sys, torch

    torch.cuda.init()
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    y = torch.zeros_like(x)

    def nccl_library():
        # PyTorch's own NCCL: the one its process has mapped, else its wheel's.
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "libnccl.so" in path:
                    return ctypes.CDLL(path)
        for name in ("libnccl.so.2", "libnccl.so"):
            try:
                return ctypes.CDLL(name)
            except OSError:
                pass
        print("NO_NCCL_LIBRARY: not mapped by torch and not on the loader path")
        sys.exit(3)

    lib = nccl_library()

    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]  # NCCL_UNIQUE_ID_BYTES

    lib.ncclCommInitRank.argtypes = [
        ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    for fn in (lib.ncclSend, lib.ncclRecv):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]

    def ok(rc):
        assert rc == 0, f"NCCL error {rc}"

    uid = UniqueId()
    ok(lib.ncclGetUniqueId(ctypes.byref(uid)))
    comm = ctypes.c_void_p()
    ok(lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0))
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    FLOAT32 = 7  # ncclFloat32
    for _ in range(int(os.environ["N_OPS"])):
        ok(lib.ncclGroupStart())
        ok(lib.ncclSend(x.data_ptr(), x.numel(), FLOAT32, 0, comm, stream))
        ok(lib.ncclRecv(y.data_ptr(), y.numel(), FLOAT32, 0, comm, stream))
        ok(lib.ncclGroupEnd())
    torch.cuda.synchronize()
    assert torch.equal(x, y)
    ok(lib.ncclCommDestroy(comm))
"""


def test_self_send_recv_completes_on_host_time(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    out = _run(SELF_P2P, shm, RANK="0")
    rings = _rings(shm, out)
    assert len(rings) == 1
    h, done, in_flight = rings[0]
    assert h.nranks == 1
    p2p = [r for r in done if r["kind"] == "p2p"]
    assert [r for r in done if r["kind"] != "p2p"] == []
    assert all(r["clock"] == "host" and r["start_ns"] <= r["end_ns"] for r in p2p), p2p[:4]
    assert all(r["peer"] == 0 and r["bytes"] == 4 << 20 for r in p2p), p2p[:4]
    sends = sum(r["func"] == "Send" for r in p2p)
    recvs = sum(r["func"] == "Recv" for r in p2p)
    # every op claimed one record; at most the last pair still awaits its reclaim
    assert h.write_index == 2 * N
    assert in_flight <= 2 and sends + recvs + in_flight == 2 * N
    assert sends >= N - 1 and recvs >= N - 1


TWO_RANKS = """
    import os, torch, torch.distributed as dist
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)  # both ranks on the one GPU
    dist.init_process_group(
        "nccl", init_method=os.environ["INIT"], rank=rank, world_size=2,
        device_id=torch.device("cuda:0"),
    )
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(int(os.environ["N_OPS"])):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""


def test_two_ranks_on_one_gpu_give_device_times(tmp_path: Path) -> None:
    if _nccl_version() < (2, 30, 0):
        pytest.skip(
            f"PyTorch's NCCL {'.'.join(map(str, _nccl_version()))} refuses two ranks on one "
            "GPU (NCCL_MULTI_RANK_GPU_ENABLE exists from 2.30)"
        )
    from artemis.agent.plugin_path import plugin_path

    shm = tmp_path / "shm"
    init = f"tcp://127.0.0.1:{_free_port()}"
    env = dict(os.environ)
    env.update(
        NCCL_PROFILER_PLUGIN=str(plugin_path()),
        NCCL_MULTI_RANK_GPU_ENABLE="1",
        ARTEMIS_SHM_DIR=str(shm),
        ARTEMIS_JOB="gpucheck",
        N_OPS=str(N),
        INIT=init,
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(TWO_RANKS)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=150)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    # the job's communicator: 2 ranks, one ring per rank (PyTorch may add others)
    rings = [x for x in _rings(shm, "\n".join(outs)) if x[0].nranks == 2]
    assert sorted(h.global_rank for h, _, _ in rings) == [0, 1], [h.path.name for h, _, _ in rings]
    for h, done, in_flight in rings:
        ar = [r for r in done if r["func"] == "AllReduce"]
        assert len(ar) == N, (h.path.name, len(ar))
        assert all(r["clock"] == "device" and r["start_ns"] < r["end_ns"] for r in ar)
        assert in_flight == 0
