"""Real 4-rank PyTorch jobs (gloo through the ``artemis`` backend) for the islands and
several-communicator tests.

``python tests/islands_job.py --layout islands --islands nvidia,nvidia,amd,amd
--steps N [--slow-from S --bridge-delay-ms D]``: DDP over the whole job, its
all_reduce composed by island (``ARTEMIS_ISLANDS``). From step S every island
leader's bridge exchange takes D ms longer (``ArtemisProcessGroup.bridge_delay_s``:
extra time inside the bridge transfer, a slow link between the islands).

``python tests/islands_job.py --layout tp --steps N [--slow-rank R --slow-from S
--slow-ms M]``: two tensor-parallel pairs ({0,1}, {2,3}: a row-parallel MLP whose
partial outputs are all-reduced in the pair, forward and backward) with data
parallel across the pairs ({0,2}, {1,3}: the gradients all-reduced), each group a
``dist.new_group`` of the artemis backend. From step S rank R's input takes M ms
longer (it sleeps before its forward pass). Each step ends with the job's mean loss
all-reduced over the whole job (for the log, as trainers do): three communicators
per rank, of which the job-wide one is each rank's largest.

``--compute-ms C``: each step also spends C ms of modelled device time (a sleep).
``--mark FILE``: rank 0 writes where the slowdown started (step, and coll_seq on
the communicator the test windows by). ``--detector DIR``: run
``artemis.job.Detector`` writing DIR/findings.jsonl. Exit code: ``--exit-code``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from torch_exit import exit_when_done
from torch_rank import detector_from_args, join_artemis_group, spawn_ranks, tanh_mlp


def _islands(rank: int, args: argparse.Namespace, dist: Any) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    pg = dist.group.WORLD
    torch.manual_seed(0)
    model = DDP(tanh_mlp(64, 256, 256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        if step == args.slow_from and args.bridge_delay_ms > 0:
            if rank == 0 and args.mark:
                _mark(args.mark, step, pg.next_coll_seq())
            pg.bridge_delay_s = args.bridge_delay_ms / 1e3
        x, y = torch.randn(128, 64, generator=g), torch.randn(128, 1, generator=g)
        opt.zero_grad()
        _device_compute(args)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _tp(rank: int, args: argparse.Namespace, dist: Any) -> None:
    import torch
    from torch.distributed.nn.functional import all_reduce

    # every rank makes every group, in the same order (new_group's contract)
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
    torch.manual_seed(rank % 2)  # each TP position holds its own shard, alike across pairs
    w1 = torch.nn.Parameter(torch.randn(64, 64) * 0.1)  # column shard of layer 1
    w2 = torch.nn.Parameter(torch.randn(64, 1) * 0.1)  # row shard of layer 2
    opt = torch.optim.SGD([w1, w2], lr=0.01)
    g = torch.Generator().manual_seed(100 + rank // 2)  # one batch per pair
    for step in range(args.steps):
        if rank == args.slow_rank and step == args.slow_from and args.mark:
            _mark(args.mark, step, dist.group.WORLD.next_coll_seq())
        if rank == args.slow_rank and step >= args.slow_from:
            time.sleep(args.slow_ms / 1e3)  # its input is late
        x, y = torch.randn(64, 64, generator=g), torch.randn(64, 1, generator=g)
        opt.zero_grad()
        _device_compute(args)
        out = all_reduce(torch.tanh(x @ w1) @ w2, group=tp)  # row-parallel: sum the partials
        loss = torch.nn.functional.mse_loss(out, y)
        loss.backward()
        flat = torch.cat([w1.grad.reshape(-1), w2.grad.reshape(-1)])
        dist.all_reduce(flat, group=dp)
        flat /= 2
        w1.grad.copy_(flat[: w1.numel()].view_as(w1))
        w2.grad.copy_(flat[w1.numel() :].view_as(w2))
        opt.step()
        logged = loss.detach().reshape(1) / 4
        dist.all_reduce(logged)  # the job's mean loss, for the log


def _device_compute(args: argparse.Namespace) -> None:
    # The step's device time (a GPU's kernels, during which the host thread waits):
    # a sleep, so it does not compete for the other ranks' cores on a shared CPU.
    if args.compute_ms > 0:
        time.sleep(args.compute_ms / 1e3)


def _mark(path: str, step: int, coll_seq: int) -> None:
    with open(path, "w") as fh:
        json.dump({"step": step, "coll_seq": coll_seq}, fh)


@exit_when_done
def _worker(rank: int, args: argparse.Namespace, init: str) -> None:
    dist = join_artemis_group(init, rank, 4)
    det = detector_from_args(args)
    (_islands if args.layout == "islands" else _tp)(rank, args, dist)
    if det is not None:
        det.close()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--layout", choices=("islands", "tp"), required=True)
    p.add_argument("--islands", default="", help="ARTEMIS_ISLANDS for the ranks")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--slow-from", type=int, default=-1)
    p.add_argument("--bridge-delay-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--compute-ms", type=float, default=0.0, help="device time per step")
    p.add_argument("--window-steps", type=int, default=20)
    p.add_argument("--detector", default="", help="folder: run artemis.job.Detector")
    p.add_argument("--settings", default="{}", help="detector settings (JSON)")
    p.add_argument("--mark", default="")
    p.add_argument("--exit-code", type=int, default=0)
    args = p.parse_args()
    if args.islands:
        os.environ["ARTEMIS_ISLANDS"] = args.islands  # the spawned ranks inherit it
    spawn_ranks(_worker, args, 4, "islands-job-")
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
