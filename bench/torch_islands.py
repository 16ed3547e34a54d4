"""What composing by island costs a real DDP job (``ARTEMIS_ISLANDS``).

4 gloo ranks (one CPU thread each), islands ``a,a,b,b``. The same model and data
are trained in the same processes through three groups, alternated in rounds:

* ``gloo``: a plain gloo group (the baseline);
* ``artemis``: the ``artemis`` backend without islands (a group made with
  ``ARTEMIS_ISLANDS`` unset);
* ``artemis islands``: the job's default group, its all_reduce composed by island
  (reduce in the island, the leaders over the bridge, broadcast back) on a worker
  thread, with bridge records.

Median step time per round; the table gives the medians and the ratios against
gloo measured in the same run. There is no goal for the islands path: it stands
in for a mixed-vendor job, and its cost here is that of three gloo hops and a
thread hand-off instead of one ring all-reduce.

Run: ``python -m bench torch_islands``. Skipped without torch.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench._torch_steps import mlp

ROUNDS = 7
STEPS = 30
WORLD = 4
NAMES = ("gloo", "artemis", "artemis islands")


def _worker(rank: int, init: str, out: str) -> None:
    import artemis.job  # noqa: F401
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("artemis", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    gloo = dist.new_group(backend="gloo")
    islands = os.environ.pop("ARTEMIS_ISLANDS")
    plain = dist.new_group(backend="artemis")  # made without islands
    os.environ["ARTEMIS_ISLANDS"] = islands
    groups = {"gloo": gloo, "artemis": plain, "artemis islands": dist.group.WORLD}
    models = {}
    for name, g in groups.items():
        torch.manual_seed(0)
        m = mlp()
        models[name] = (DDP(m, process_group=g), torch.optim.SGD(m.parameters(), lr=0.01))
    x, y = torch.randn(128, 64), torch.randn(128, 1)
    times: dict[str, list[float]] = {n: [] for n in NAMES}
    for r in range(ROUNDS + 1):
        order = NAMES[r % 3 :] + NAMES[: r % 3]  # each group goes first in turn
        for name in order:
            model, opt = models[name]
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            for _ in range(STEPS):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            if r:  # round 0 warms every group up
                times[name].append((time.perf_counter() - t0) / STEPS * 1e3)
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(times))


def _step_times() -> dict[str, list[float]]:
    import torch.multiprocessing as mp

    d = Path(tempfile.mkdtemp(prefix="bench-islands-"))
    os.environ["ARTEMIS_SHM_DIR"], os.environ["ARTEMIS_JOB"] = str(d / "shm"), "bench-islands"
    os.environ["ARTEMIS_ISLANDS"] = "a,a,b,b"
    try:
        mp.start_processes(
            _worker,
            args=(str(d / "store"), str(d / "times.json")),
            nprocs=WORLD,
            start_method="spawn",
        )
    finally:
        os.environ.pop("ARTEMIS_ISLANDS", None)
    times: dict[str, list[float]] = json.loads((d / "times.json").read_text())
    return times


def main() -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: skipped")
        return 0
    t = _step_times()
    med = {n: statistics.median(t[n]) for n in NAMES}
    print(
        f"DDP step time, {WORLD} gloo ranks, islands a,a,b,b, medians of {ROUNDS} "
        f"alternated rounds of {STEPS} steps:"
    )
    print("| group | ms per step | / gloo | rounds (ms) |")
    print("|---|---:|---:|---|")
    for n in NAMES:
        rounds = ", ".join(f"{v:.1f}" for v in t[n])
        print(f"| {n} | {med[n]:.2f} | {med[n] / med['gloo']:.3f} | {rounds} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
