"""A real DDP job that follows rebalance plans, for tests/test_torch_rebalance.py.

``python tests/torch_rebalance_job.py --steps 400 --slow-rank 2 --per-sample-ms 1.5 --out F``
spawns WORLD gloo-backed ranks through the ``artemis`` backend. Every rank builds
the same global batch per step (seeded by the step), keeps its slice of it
(``UnevenBatchSplitter``, sized by the plan in force, read by ``RebalanceClient``
from the file the node agent publishes) and weights its gradients
(``install_weighted_allreduce``), so the update stays the global-batch mean.

The slow rank models a slower device on CPU: ``--per-sample-ms`` sleeps that
long per local sample each step (its time scales with its share of the batch,
and a sleep takes no core from the other ranks); ``--stall-ms`` instead sleeps a
fixed time per step, whatever its share (a slowdown no split can help), from
step ``--slow-from`` on.

Rank 0 writes ``--out``: per step, the wall time the step ended (its own clock),
the plan in force and the split, so the test measures the job's own samples/s
before and after a plan.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from torch_exit import exit_when_done
from torch_rank import spawn_ranks


@exit_when_done
def _worker(rank: int, args: argparse.Namespace, init: str) -> None:
    import artemis.job
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group(
        "artemis", init_method=f"file://{init}", rank=rank, world_size=args.world
    )
    client = artemis.job.RebalanceClient(rank, args.world, args.global_batch)
    split = artemis.job.UnevenBatchSplitter(client)
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    )
    hook = artemis.job.install_weighted_allreduce(model, client)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rows: list[dict[str, Any]] = []
    for step in range(args.steps):
        g = torch.Generator().manual_seed(step)  # the same global batch on every rank
        x = torch.randn(args.global_batch, 32, generator=g)
        y = torch.randn(args.global_batch, 1, generator=g)
        xs, ys = split.split(step, x, y)
        if rank == args.slow_rank and step >= args.slow_from:
            # a slower device: time per local sample (or a fixed stall per step)
            time.sleep((args.per_sample_ms * len(xs) + args.stall_ms) / 1e3)
        hook.set_step(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        opt.step()
        if rank == 0:
            rows.append(
                {
                    "step": step,
                    "t": time.monotonic(),
                    "plan": client.plan_for_step(step),
                    "split": client.split_for_step(step),
                }
            )
    if rank == 0 and args.out:
        with open(args.out, "w") as fh:
            json.dump({"global_batch": args.global_batch, "steps": rows}, fh)
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--per-sample-ms", type=float, default=0.0)
    p.add_argument("--stall-ms", type=float, default=0.0)
    p.add_argument("--slow-from", type=int, default=0, help="first step of the slowdown")
    p.add_argument("--out", default="", help="JSON file: rank 0's steps")
    args = p.parse_args()
    spawn_ranks(_worker, args, args.world, "rebalance-job-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
