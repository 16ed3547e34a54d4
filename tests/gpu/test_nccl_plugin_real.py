"""The real thing: PyTorch on NCCL loads our plugin and device-timed records land in the ring.

Runs only where a CUDA build of PyTorch sees a GPU (skipped here with the reason).
One rank, one process, the real NCCL: NCCL_PROFILER_PLUGIN points at the
compiled plugin, a few all-reduces run, and the ring must hold one DONE record
per collective with device timing (clock "device", start < end).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to PyTorch", allow_module_level=True)

pytestmark = pytest.mark.gpu

SCRIPT = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(int(os.environ["N_COLL"])):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    """
)


def test_nccl_loads_plugin_and_device_times_land_in_the_ring(tmp_path: Path) -> None:
    from artemis.agent.plugin_path import plugin_path
    from artemis.agent.ring import RingReader, records_to_dicts

    shm = tmp_path / "shm"
    env = dict(os.environ)
    env.update(
        NCCL_PROFILER_PLUGIN=str(plugin_path()),
        NCCL_DEBUG="INFO",
        NCCL_DEBUG_SUBSYS="INIT,ENV",
        ARTEMIS_SHM_DIR=str(shm),
        ARTEMIS_JOB="gpucheck",
        N_COLL="20",
        RANK="0",
    )
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-4000:]
    rings = sorted(shm.glob("gpucheck.*.ring"))
    assert rings, f"no ring written; NCCL said:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
    with RingReader(rings[0]) as rd:
        h = rd.header()
        done = rd.poll().done
        rows = records_to_dicts(done, h)
    allreduce = [x for x in rows if x["func"] == "AllReduce"]
    assert len(allreduce) >= 20
    assert all(x["clock"] == "device" and x["start_ns"] < x["end_ns"] for x in allreduce)
    assert h.plugin_version in (4, 5, 6, 7) and h.global_rank == 0
