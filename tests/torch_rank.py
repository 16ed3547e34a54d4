"""What the spawned torch ranks of the tests' jobs share: joining the ``artemis``
group, the small tanh MLPs they train, and the in-process Detector a job script
runs when asked to (``--detector DIR --window-steps N --settings JSON``).

Imported by the job scripts (tests/ddp_job.py, tests/islands_job.py) as well as by
the test modules, so it imports neither pytest nor, at import time, torch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any


def spawn_ranks(worker: Callable[..., None], args: Any, world: int, prefix: str) -> None:
    """``worker(rank, args, init)`` in ``world`` spawned processes, joined; ``init`` is
    a fresh file store's path (a new folder named ``prefix``)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        init = os.path.join(d, "store")
        mp.start_processes(worker, args=(args, init), nprocs=world, start_method="spawn")


def join_artemis_group(init_file: str, rank: int, world: int) -> Any:
    """This rank's default group on the ``artemis`` backend (one CPU thread, a file
    store at ``init_file``); returns ``torch.distributed``."""
    import artemis.job  # noqa: F401  (registers the backend)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "artemis", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    return dist


def tanh_mlp(*widths: int) -> Any:
    """Linear layers from ``widths[0]`` through each width in turn, a tanh between two.

    The layers are made in order, so under one ``torch.manual_seed`` the weights are
    those of the same ``Sequential`` written out by hand.
    """
    import torch

    layers: list[Any] = []
    for i, (w_in, w_out) in enumerate(itertools.pairwise(widths)):
        if i:
            layers.append(torch.nn.Tanh())
        layers.append(torch.nn.Linear(w_in, w_out))
    return torch.nn.Sequential(*layers)


def detector_from_args(args: argparse.Namespace) -> Any:
    """The job scripts' ``artemis.job.Detector`` writing DIR/findings.jsonl, or None
    without ``--detector``."""
    if not args.detector:
        return None
    import artemis.job

    return artemis.job.Detector(
        jsonl=os.path.join(args.detector, "findings.jsonl"),
        window_steps=args.window_steps,
        **json.loads(args.settings),
    )


def all_reduced(dist: Any, t: Any, g: Any, **op: Any) -> list[Any]:
    """``all_reduce`` of a copy of ``t`` on group ``g`` (``op``: its ``op=``), as a list."""
    a = t.clone()
    dist.all_reduce(a, group=g, **op)
    return a.tolist()


def all_gathered(dist: Any, t: Any, g: Any, world: int) -> list[Any]:
    """``all_gather`` of ``t`` over the ``world`` ranks of group ``g``, as lists."""
    parts = [t.new_zeros(t.shape) for _ in range(world)]
    dist.all_gather(parts, t, group=g)
    return [x.tolist() for x in parts]


def all_reduce_future(dist: Any, t: Any, g: Any) -> list[Any]:
    """An async ``all_reduce`` of a copy of ``t``, its result read from the Work's future."""
    w = dist.all_reduce(t.clone(), group=g, async_op=True)
    return [x.tolist() for x in w.get_future().wait()]
