"""A real DDP job for the tests of ``artemis run`` and the in-process detector.

``python tests/ddp_job.py --world 4 --steps 240 [--stall-rank R --stall-from S --stall-ms M]``
spawns WORLD gloo-backed ranks through the ``artemis`` backend (one CPU thread
each). From step S, rank R's data loader sleeps M ms per step before handing
out the batch (an input stall: the process is idle, not busy). With
``--detector DIR`` each rank also runs ``artemis.job.Detector`` writing
DIR/findings.jsonl (no agent, no coordinator). With ``--truth DIR`` its all-reduce
goes through a comm hook that times it, and each rank writes DIR/truth-r<rank>.json:
per collective, its start and completion on the rank's clock with its threads' summed
CPU time and run delay at both, what the tests judge the detector's flags of the
healthy ranks against (tests/rank_truth.py). Exit code: ``--exit-code``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
from typing import Any

from rank_truth import StepTruth
from torch_exit import exit_when_done
from torch_rank import detector_from_args, join_artemis_group, spawn_ranks, tanh_mlp


def _loader(rank: int, args: argparse.Namespace) -> Any:
    import torch

    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        if rank == args.stall_rank and step == args.stall_from and args.mark:
            import torch.distributed as dist

            # where the stall starts in the collectives' numbering (what windows count)
            seq = dist.group.WORLD.next_coll_seq()
            with open(args.mark, "w") as fh:
                json.dump({"step": step, "coll_seq": seq}, fh)
        if rank == args.stall_rank and step >= args.stall_from:
            time.sleep(args.stall_ms / 1e3)  # waiting on storage: idle
        yield torch.randn(128, 64, generator=g), torch.randn(128, 1, generator=g)


@exit_when_done
def _worker(rank: int, args: argparse.Namespace, init: str) -> None:
    # Python's stacks on a fatal signal: one rank once died of SIGABRT ("terminate
    # called without an active exception") after its ring was finished
    faulthandler.enable(all_threads=True)
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist = join_artemis_group(init, rank, args.world)
    det = detector_from_args(args)
    torch.manual_seed(0)
    model = DDP(tanh_mlp(64, 256, 256, 1))
    truth = StepTruth(rank, args.truth, args.world) if args.truth else None
    if truth is not None:
        truth.install(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in _loader(rank, args):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    if truth is not None:
        truth.write()
    if det is not None:
        det.close()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--stall-rank", type=int, default=-1)
    p.add_argument("--stall-from", type=int, default=0)
    p.add_argument("--stall-ms", type=float, default=60.0)
    p.add_argument("--window-steps", type=int, default=20)
    p.add_argument("--detector", default="", help="folder: run artemis.job.Detector")
    p.add_argument("--settings", default="{}", help="detector settings (JSON)")
    p.add_argument("--mark", default="", help="JSON file: where the stall started")
    p.add_argument("--truth", default="", help="folder: each rank's own record of its gaps")
    p.add_argument("--exit-code", type=int, default=0)
    args = p.parse_args()
    spawn_ranks(_worker, args, args.world, "ddp-job-")
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
