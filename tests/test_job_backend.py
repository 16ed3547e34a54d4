"""The ``artemis`` torch.distributed backend on real gloo (2 CPU processes, spawned).

One spawn (torch start-up is slow on this machine) checks, on every rank:

* every collective type through ``artemis`` gives exactly the result of the same
  call on a plain gloo group (the reference), and lands a DONE record of its
  function in the rank's ring, with host times and CPU times, on both of the
  backend's paths: the default group takes the C++ path (job/csrc, when built:
  this test checks that it is the one taken), a second group the Python path
  (``ARTEMIS_BACKEND_IMPL=python`` at its creation);
* 50 steps of DDP and of FSDP (CPU) through ``artemis`` (the default group) leave
  parameters and gradients bit-identical to the same training on plain gloo.

The parent then reads the rings with the agent's own reader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch_rank as tr  # noqa: E402
from artemis.agent.fingerprint import ring_software  # noqa: E402
from artemis.ring import format as rf  # noqa: E402
from artemis.ring.reader import RingReader  # noqa: E402
from torch_exit import exit_when_done  # noqa: E402
from torch_workers import spawn_and_join, train_on_group  # noqa: E402

WORLD = 2
STEPS = 50
JOIN_TIMEOUT_S = 150.0
JOB = "bk"


def _collectives(dist: Any, rank: int, g: Any) -> dict[str, Any]:
    """Run each collective on group ``g``; return its outputs as lists."""
    out: dict[str, Any] = {}
    t = torch.arange(4.0, dtype=torch.float64) * (rank + 1) + 0.1
    out["all_reduce"] = tr.all_reduced(dist, t, g)
    out["all_reduce_max"] = tr.all_reduced(dist, t, g, op=dist.ReduceOp.MAX)
    out["all_gather"] = tr.all_gathered(dist, t, g, WORLD)
    o = torch.zeros(4 * WORLD, dtype=torch.float64)
    dist.all_gather_into_tensor(o, t, group=g)
    out["all_gather_into_tensor"] = o.tolist()
    r = torch.zeros(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(r, t, group=g)
    out["reduce_scatter_tensor"] = r.tolist()
    r = torch.zeros(2, dtype=torch.float64)
    dist.reduce_scatter(r, [t[:2] + i for i in range(WORLD)], group=g)
    out["reduce_scatter"] = r.tolist()
    b = t.clone()
    dist.broadcast(b, src=1, group=g)
    out["broadcast"] = b.tolist()
    o = torch.zeros(WORLD, dtype=torch.float64)
    dist.all_to_all_single(o, torch.arange(float(WORLD), dtype=torch.float64) + 10 * rank, group=g)
    out["all_to_all_single"] = o.tolist()
    lst = [torch.zeros(1, dtype=torch.float64) for _ in range(WORLD)]
    dist.all_to_all(
        lst, [torch.ones(1, dtype=torch.float64) * (rank * 10 + i) for i in range(WORLD)], group=g
    )
    out["all_to_all"] = [x.tolist() for x in lst]
    red = t.clone()
    dist.reduce(red, dst=0, group=g)
    out["reduce"] = red.tolist() if rank == 0 else None
    dist.barrier(group=g)
    if rank == 0:
        dist.send(t, dst=1, group=g)
        out["send_recv"] = None
    else:
        rv = torch.zeros(4, dtype=torch.float64)
        dist.recv(rv, src=0, group=g)
        out["send_recv"] = rv.tolist()
    out["future"] = tr.all_reduce_future(dist, t, g)
    return out


def _model() -> Any:
    torch.manual_seed(0)
    return tr.tanh_mlp(16, 32, 32, 1)


def _train(kind: str, rank: int, g: Any) -> dict[str, Any]:
    """50 steps of DDP or FSDP2 on group ``g``; final params and last grads."""
    return train_on_group(_model(), kind, g, rank, STEPS, lr=0.05)


@exit_when_done
def _worker(rank: int, init_file: str, shm: str, out: str) -> None:
    os.environ["ARTEMIS_SHM_DIR"] = shm
    os.environ["ARTEMIS_JOB"] = JOB
    os.environ["NCCL_FP_BACKEND"] = "on"  # kept in the fingerprint's env
    os.environ["NCCL_FP_TOKEN"] = "s3cret"  # left out
    dist = tr.join_artemis_group(init_file, rank, WORLD)
    try:
        res: dict[str, Any] = {"backend": dist.get_backend()}
        gloo = dist.new_group(backend="gloo")
        os.environ["ARTEMIS_BACKEND_IMPL"] = "python"  # read when a group is made
        pyg = dist.new_group(backend="artemis")
        del os.environ["ARTEMIS_BACKEND_IMPL"]
        world = dist.group.WORLD
        res["classes"] = [type(world).__name__, type(pyg).__name__]
        res["rings"] = [str(world.ring_path()), str(pyg.ring_path())]
        res["ours"] = _collectives(dist, rank, None)
        res["ours_py"] = _collectives(dist, rank, pyg)
        res["ref"] = _collectives(dist, rank, gloo)
        dist.barrier()
        for kind in ("ddp", "fsdp"):
            res[f"{kind}_ours"] = _train(kind, rank, dist.group.WORLD)
            res[f"{kind}_ref"] = _train(kind, rank, gloo)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(res))


@pytest.mark.slow
def test_artemis_backend_matches_gloo_and_records(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    spawn_and_join(
        _worker, (str(tmp_path / "store"), str(shm), str(tmp_path)), WORLD, JOIN_TIMEOUT_S
    )
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    from artemis.job.backend import load_ext

    # The C++ path is the default group's when it is built (`make backend-ext`).
    cpp = "ArtemisCppGroup" if load_ext() is not None else "ArtemisProcessGroup"
    for r in range(WORLD):
        assert res[r]["backend"] == "artemis"
        assert res[r]["classes"] == [cpp, "ArtemisProcessGroup"]
        assert res[r]["ours"] == res[r]["ref"]  # every collective: the inner backend's result
        assert res[r]["ours_py"] == res[r]["ref"]  # on the Python path too
        for kind in ("ddp", "fsdp"):
            assert res[r][f"{kind}_ours"] == res[r][f"{kind}_ref"], kind  # bit for bit
    # the values are real: a reduction over both ranks happened
    assert res[0]["ours"]["all_reduce"] == pytest.approx([0.2, 3.2, 6.2, 9.2])
    assert res[1]["ours"]["send_recv"] == pytest.approx([0.1, 1.1, 2.1, 3.1])

    # Rings: one per rank for each artemis group (the gloo reference group is not ours).
    rings = sorted(shm.glob(f"{JOB}.*.ring"))
    assert len(rings) == 2 * WORLD, rings
    world_rings = {res[r]["rings"][0] for r in range(WORLD)}
    assert world_rings | {res[r]["rings"][1] for r in range(WORLD)} == {str(p) for p in rings}
    want = {
        rf.FUNC_CODES[n]
        for n in ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AlltoAll", "Reduce")
    }
    for path in rings:
        with RingReader(path) as rd:
            h = rd.header()
            assert h.backend and h.cpu_times and h.clock_kind == "host"
            assert h.finished  # destroy_process_group finishes the rings
            # The software fingerprint: torch's version and the kept env; no NCCL on CPU.
            sw = ring_software(h)
            assert sw["torch"] == torch.__version__ and "nccl" not in sw
            assert sw["env"]["NCCL_FP_BACKEND"] == "on" and "NCCL_FP_TOKEN" not in sw["env"]
            b = rd.poll()
            assert len(b.in_flight) == 0
            d = b.done
            coll = d[d["kind"] == rf.KIND_COLL]
            p2p = d[d["kind"] == rf.KIND_P2P]
            assert want <= set(coll["func"].tolist())
            assert 0 in set(coll["func"].tolist())  # the barrier
            # coll_seq numbers the collectives 0, 1, 2, ... identically on every rank
            assert coll["coll_seq"].tolist() == list(range(len(coll)))
            assert len(p2p) == 1 and p2p["func"][0] in (
                rf.FUNC_CODES["Send"],
                rf.FUNC_CODES["Recv"],
            )
            assert (d["clock"] == rf.REC_HOST).all()
            assert (d["end"] >= d["start"]).all() and (d["start"] >= d["enqueue_ns"]).all()
            assert (d["cpu_end_ns"] >= d["cpu_start_ns"]).all() and (d["cpu_start_ns"] > 0).all()
            if str(path) in world_rings:
                # DDP and FSDP collectives landed too: far more than the explicit ones
                assert len(coll) > 2 * STEPS
            else:
                # each explicit one once: the outputs' collectives less send/recv (p2p),
                # plus the barrier
                assert len(coll) == len(res[0]["ours_py"])


def test_import_registers_without_importing_torch() -> None:
    """``import artemis.job`` loads no torch; the backend is registered once torch.distributed
    loads (in either import order)."""
    import subprocess
    import sys

    code = (
        "import sys, artemis.job\n"
        "assert 'torch' not in sys.modules\n"
        "import torch.distributed as dist\n"
        "assert 'ARTEMIS' in dist.Backend._plugins, dist.Backend._plugins\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    code2 = (
        "import torch.distributed as dist, artemis.job\nassert 'ARTEMIS' in dist.Backend._plugins\n"
    )
    subprocess.run([sys.executable, "-c", code2], check=True, timeout=120)


@pytest.mark.gpu
def test_cuda_events_land_device_times() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here: the CUDA-event path of the artemis backend needs one")
    pytest.skip("needs two GPUs for a 2-rank NCCL communicator (NCCL refuses two ranks on one GPU)")
