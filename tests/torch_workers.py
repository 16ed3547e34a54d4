"""What the spawned-torch tests share: starting and joining their ranks, and the
small DDP/FSDP2 training whose result a rank compares against gloo's.

torch is imported inside the functions: the test modules skip themselves with
``pytest.importorskip("torch")`` before they import this.
"""

from __future__ import annotations

import time
from typing import Any

import pytest


def spawn_and_join(
    worker: Any, args: tuple[Any, ...], nprocs: int, timeout: float, what: str = "workers"
) -> Any:
    """Spawns ``nprocs`` ranks of ``worker``; fails the test if they are not done in ``timeout`` s.

    Ranks still alive then are killed, so a hung collective does not outlive the test.
    Returns torch's process context, for checks on the ranks' processes.
    """
    import torch.multiprocessing as mp

    ctx = mp.start_processes(worker, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                pytest.fail(f"{what} did not finish within {timeout} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    return ctx


def train_on_group(
    model: Any, kind: str, g: Any, rank: int, steps: int, lr: float, dtype: Any = None
) -> dict[str, Any]:
    """``steps`` of DDP or FSDP2 (``kind``) of ``model`` on group ``g``; final params and last grads.

    The batches come from a generator seeded by the rank, so two groups given the
    same model and rank see the same data and their results can be compared exactly.
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    if kind == "ddp":
        model = DDP(model, process_group=g, bucket_cap_mb=0.001)  # several buckets
    else:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(g, "cpu")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        model = fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen, dtype=dtype)
        y = torch.randn(8, 1, generator=gen, dtype=dtype)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    def full(p: Any) -> Any:
        return p.full_tensor() if hasattr(p, "full_tensor") else p

    return {
        "params": [full(p.detach()).flatten().tolist() for p in model.parameters()],
        "grads": [full(p.grad).flatten().tolist() for p in model.parameters()],
    }
