"""The ``artemis`` torch.distributed backend's overhead (issue 15's goals).

1. CPU per collective of the wrapper: ``all_reduce`` of a 4-float tensor through
   ``ArtemisProcessGroup`` wrapping torch's do-nothing ``fake`` process group,
   against the same call on the fake group itself; process CPU time
   (``time.process_time_ns``), interleaved runs, median. Goal: <= 5 us.
2. Step time of a real DDP job (2 gloo ranks, one CPU thread each): the same
   model and data trained through ``artemis`` and through a plain gloo group in
   the same processes, alternated in rounds; median step time per round, the
   ratio of the medians. Goal: <= 1% on CPU DDP.

Run: ``python -m bench torch_backend``. Skipped without torch.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

RUNS = 7
CALLS = 20_000
ROUNDS = 6
STEPS = 40


def _cpu_per_collective() -> tuple[float, float]:
    import artemis.job  # noqa: F401
    import torch
    import torch.distributed as dist
    from artemis.job.backend import ArtemisProcessGroup
    from torch.testing._internal.distributed.fake_pg import FakeStore

    shm = tempfile.mkdtemp(prefix="bench-artemis-")
    os.environ["ARTEMIS_SHM_DIR"], os.environ["ARTEMIS_JOB"] = shm, "bench"
    store = FakeStore()
    dist.init_process_group("fake", store=store, rank=0, world_size=2)
    fake = dist.group.WORLD
    ours = ArtemisProcessGroup(store, 0, 2, timedelta(seconds=30), inner=fake)
    t = torch.ones(4)
    opts = dist.AllreduceOptions()

    def per_call(pg: Any) -> float:
        c0 = time.process_time_ns()
        for _ in range(CALLS):
            pg.allreduce([t], opts)
        return (time.process_time_ns() - c0) / CALLS / 1e3

    per_call(fake), per_call(ours)  # warm up (and create the ring)
    base, wrapped = [], []
    for _ in range(RUNS):
        base.append(per_call(fake))
        wrapped.append(per_call(ours))
    ours.close_rings()
    dist.destroy_process_group()
    return statistics.median(base), statistics.median(wrapped)


def _ddp_worker(rank: int, init: str, out: str) -> None:
    import artemis.job  # noqa: F401
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("artemis", init_method=f"file://{init}", rank=rank, world_size=2)
    gloo = dist.new_group(backend="gloo")
    models = {}
    for name, g in (("artemis", dist.group.WORLD), ("gloo", gloo)):
        torch.manual_seed(0)
        m = torch.nn.Sequential(
            torch.nn.Linear(64, 256),
            torch.nn.Tanh(),
            torch.nn.Linear(256, 256),
            torch.nn.Tanh(),
            torch.nn.Linear(256, 1),
        )
        models[name] = (DDP(m, process_group=g), torch.optim.SGD(m.parameters(), lr=0.01))
    x, y = torch.randn(128, 64), torch.randn(128, 1)
    times: dict[str, list[float]] = {"artemis": [], "gloo": []}
    for r in range(ROUNDS + 1):
        order = ("artemis", "gloo") if r % 2 else ("gloo", "artemis")
        for name in order:
            model, opt = models[name]
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            for _ in range(STEPS):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            if r:  # round 0 warms both up
                times[name].append((time.perf_counter() - t0) / STEPS * 1e3)
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(times))


def _step_times() -> dict[str, list[float]]:
    import torch.multiprocessing as mp

    d = Path(tempfile.mkdtemp(prefix="bench-ddp-"))
    os.environ["ARTEMIS_SHM_DIR"], os.environ["ARTEMIS_JOB"] = str(d / "shm"), "bench-ddp"
    mp.start_processes(
        _ddp_worker, args=(str(d / "store"), str(d / "times.json")), nprocs=2, start_method="spawn"
    )
    times: dict[str, list[float]] = json.loads((d / "times.json").read_text())
    return times


def main() -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: skipped")
        return 0
    base, wrapped = _cpu_per_collective()
    print(f"CPU per all_reduce, medians of {RUNS} interleaved runs of {CALLS} calls:")
    print("| inner | us per call |")
    print("|---|---:|")
    print(f"| fake (do-nothing) alone | {base:.2f} |")
    print(f"| artemis wrapping fake | {wrapped:.2f} |")
    print(f"| wrapper's own cost | {wrapped - base:.2f} (goal <= 5) |")
    t = _step_times()
    a, g = statistics.median(t["artemis"]), statistics.median(t["gloo"])
    print(f"\nDDP step time, 2 gloo ranks, medians of {ROUNDS} alternated rounds of {STEPS} steps:")
    print("| backend | ms per step | rounds (ms) |")
    print("|---|---:|---|")
    print(f"| gloo | {g:.2f} | {', '.join(f'{v:.1f}' for v in t['gloo'])} |")
    print(f"| artemis | {a:.2f} | {', '.join(f'{v:.1f}' for v in t['artemis'])} |")
    print(f"| ratio | {a / g:.3f} (goal <= 1.01) | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
