"""Real PyTorch DDP (CPU, gloo, 3 processes): an uneven split with the plan's weights trains
exactly like the uniform split.

Every rank also computes the reference locally: plain SGD on the whole global batch
of each step. Then, over the process group, the same 5 steps are trained as

* ``uniform``   DDP, uniform split, stock all-reduce (what a job without Artemis does);
* ``hook``      DDP, ``WeightedAllreduce`` comm hook, a plan published on a real plan
                file switching to [6, 2, 4] at step 2 (read by ``RebalanceClient``);
* ``loss``      DDP, loss multiplied by ``grad_weight``, plan [3, 5, 4] from step 0;
* ``manual``    no DDP: ``scale_gradients`` + all_reduce / world, plan [5, 4, 3];
* ``unweighted`` the [6, 2, 4] plan without weights: the control that must differ.

The rendezvous is a FileStore in the test's tmp folder, so concurrent test runs on
the same machine cannot collide on a port.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from artemis.agent.plans import publish_plan  # noqa: E402
from artemis.job import (  # noqa: E402
    RebalanceClient,
    UnevenBatchSplitter,
    global_mean_loss,
    install_weighted_allreduce,
    scale_gradients,
)
from artemis.rebalance.files import read_acks  # noqa: E402
from torch_exit import exit_when_done  # noqa: E402
from torch_workers import spawn_and_join  # noqa: E402

WORLD = 3
GB = 12
STEPS = 5
LR = 0.1
JOIN_TIMEOUT_S = 75.0


def _acks(shm: Path, job: str) -> dict[int, tuple[str, int]]:
    return {r: (a["id"], a["step"]) for r, a in read_acks(shm, job).items()}


def _model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
    ).double()


def _data() -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, GB, 4, generator=g, dtype=torch.float64)
    y = torch.randn(STEPS, GB, 1, generator=g, dtype=torch.float64)
    return x, y


def _params(m: Any) -> list[list[float]]:
    return [p.detach().flatten().tolist() for p in m.parameters()]


def _reference() -> dict[str, Any]:
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    x, y = _data()
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x[s]), y[s])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return {"params": _params(m), "losses": losses}


def _train(rank: int, client: RebalanceClient, how: str) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = _data()
    split = UnevenBatchSplitter(client)
    base = _model()
    model: Any = base if how == "manual" else DDP(base)
    hook = install_weighted_allreduce(model, client) if how == "hook" else None
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, sizes = [], []
    for s in range(STEPS):
        xs, ys = split.split(s, x[s], y[s])
        sizes.append(client.split_for_step(s))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        if hook is not None:
            hook.set_step(s)
        scaled = loss * client.grad_weight(s) if how == "loss" else loss
        scaled.backward()
        if how == "manual":
            scale_gradients(model, client.grad_weight(s))
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(WORLD)
        opt.step()
        losses.append(global_mean_loss(loss, len(xs), GB))
    return {"params": _params(base), "losses": losses, "sizes": sizes}


@exit_when_done
def _worker(rank: int, init_file: str, shm: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        res: dict[str, Any] = {"reference": _reference()}
        if rank == 0:  # the node agent's part: one plan file per job on this node
            publish_plan(shm, "hook", {"id": "p-hook", "apply_at_step": 2, "samples": [6, 2, 4]})
            publish_plan(shm, "loss", {"id": "p-loss", "apply_at_step": 0, "samples": [3, 5, 4]})
            publish_plan(shm, "manual", {"id": "p-man", "apply_at_step": 1, "samples": [5, 4, 3]})
            publish_plan(shm, "unw", {"id": "p-unw", "apply_at_step": 2, "samples": [6, 2, 4]})
        dist.barrier()
        res["uniform"] = _train(
            rank, RebalanceClient(rank, WORLD, GB, job="none", shm_dir=shm), "uniform"
        )
        for how, job in (("hook", "hook"), ("loss", "loss"), ("manual", "manual")):
            res[how] = _train(rank, RebalanceClient(rank, WORLD, GB, job=job, shm_dir=shm), how)
        res["unweighted"] = _train(
            rank, RebalanceClient(rank, WORLD, GB, job="unw", shm_dir=shm), "uniform"
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(res))


def test_uneven_split_with_weights_matches_uniform(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    ctx = spawn_and_join(
        _worker,
        (str(tmp_path / "store"), str(shm), str(tmp_path)),
        WORLD,
        JOIN_TIMEOUT_S,
        what="DDP workers",
    )
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    ref = res[0]["reference"]

    def close(a: list[list[float]], b: list[list[float]], tol: float = 1e-9) -> bool:
        return all(
            torch.allclose(torch.tensor(u), torch.tensor(v), rtol=0.0, atol=tol)
            for u, v in zip(a, b, strict=True)
        )

    for r in range(WORLD):
        assert close(res[r]["reference"]["params"], ref["params"], 0.0)  # same init, same data
        for how in ("uniform", "hook", "loss", "manual"):
            got = res[r][how]
            assert close(got["params"], ref["params"]), (how, r)
            assert got["losses"] == pytest.approx(ref["losses"], abs=1e-12), (how, r)
        # without the weights the uneven split trains something else: the check can fail
        assert not close(res[r]["unweighted"]["params"], ref["params"], 1e-6)
    # the splits really were uneven, switched together at the plan's step
    assert res[0]["hook"]["sizes"] == [[4, 4, 4]] * 2 + [[6, 2, 4]] * 3
    assert res[0]["loss"]["sizes"] == [[3, 5, 4]] * 5
    assert res[0]["manual"]["sizes"] == [[4, 4, 4]] + [[5, 4, 3]] * 4
    assert all(res[r]["hook"]["sizes"] == res[0]["hook"]["sizes"] for r in range(WORLD))
    # and every rank acknowledged each plan once, at its step
    assert _acks(shm, "hook") == {r: ("p-hook", 2) for r in range(WORLD)}
    assert _acks(shm, "loss") == {r: ("p-loss", 0) for r in range(WORLD)}
    # a job with no plan only declares the split it started with
    assert _acks(shm, "none") == {r: ("uniform", 0) for r in range(WORLD)}
    assert not any(p.is_alive() for p in ctx.processes)
    assert os.listdir(tmp_path / "shm")  # the files lived where the agent put them
