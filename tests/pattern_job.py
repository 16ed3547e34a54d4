"""A DDP job whose script adds collectives of its own, for `artemis run`'s step inference.

``python tests/pattern_job.py --world 2 --steps 300 --log-every 10 --barrier-every 100``:
each step is one DDP gradient bucket; every ``--log-every`` steps the script all-reduces
its loss (4 bytes), every ``--barrier-every`` steps it meets a barrier (an epoch's end,
a checkpoint), as training scripts do. ``--varying``: each step also all-reduces a
tensor of a new size, so the collectives repeat in no pattern at all.
"""

from __future__ import annotations

import argparse
import sys

from torch_exit import exit_when_done
from torch_rank import join_artemis_group, spawn_ranks, tanh_mlp


@exit_when_done
def _worker(rank: int, args: argparse.Namespace, init: str) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist = join_artemis_group(init, rank, args.world)
    torch.manual_seed(0)
    model = DDP(tanh_mlp(32, 128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        x, y = torch.randn(64, 32, generator=g), torch.randn(64, 1, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if args.log_every and step % args.log_every == 0:
            dist.all_reduce(loss.detach().clone())
        if args.barrier_every and step % args.barrier_every == args.barrier_every - 1:
            dist.barrier()
        if args.varying:
            dist.all_reduce(torch.ones(step + 1))
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--log-every", type=int, default=0)
    p.add_argument("--barrier-every", type=int, default=0)
    p.add_argument("--varying", action="store_true")
    args = p.parse_args()
    spawn_ranks(_worker, args, args.world, "pattern-job-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
