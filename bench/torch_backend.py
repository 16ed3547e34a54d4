"""The ``artemis`` torch.distributed backend's overhead (issue 15's goals).

1. CPU per collective of the wrapper: ``all_reduce`` of a 4-float tensor through
   ``ArtemisProcessGroup`` wrapping torch's do-nothing ``fake`` process group,
   against the same call on the fake group itself; process CPU time
   (``time.process_time_ns``), interleaved runs, median. Goal: <= 5 us.
2. Step time of a real DDP job (2 gloo ranks, one CPU thread each): the same
   model and data trained through ``artemis`` and through a plain gloo group in
   the same processes, alternated in rounds; median step time per round, the
   ratio of the medians. Goal: <= 1% on CPU DDP.

3. Where the wrapper's CPU goes: the cost of one read of each clock (CPU time of
   the reading thread, 50k reads), and the wrapper's cost with its CPU clock
   (``time.process_time_ns``, what the ring contract asks: process CPU time at
   each record's start and end) replaced by ``time.thread_time_ns`` and by a
   constant, interleaved in one run (an ablation: only the first keeps the contract).
4. The in-process detector's CPU share on a real DDP job (4 gloo ranks through
   ``artemis``, ``artemis.job.Detector`` on every rank, 20-step windows): CPU time
   of the detector's threads (``/proc/self/task/<tid>/schedstat``) over the CPU
   time of every thread of the rank's process, over the training loop.

Run: ``python -m bench torch_backend``. Skipped without torch.
"""

from __future__ import annotations

import contextlib
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
DET_STEPS = 400
DET_RUNS = 3


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


def _clock_costs() -> dict[str, float]:
    """ns of CPU per read of each clock (median of 5 runs of 50k reads)."""

    def cost(f: Any, n: int = 50_000) -> float:
        runs = []
        for _ in range(5):
            c0 = time.thread_time_ns()
            for _ in range(n):
                f()
            runs.append((time.thread_time_ns() - c0) / n)
        return statistics.median(runs)

    empty = cost(lambda: None)
    return {
        "time.monotonic_ns (vDSO)": cost(time.monotonic_ns) - empty,
        "time.process_time_ns (CLOCK_PROCESS_CPUTIME_ID)": cost(time.process_time_ns) - empty,
        "time.thread_time_ns (CLOCK_THREAD_CPUTIME_ID)": cost(time.thread_time_ns) - empty,
    }


def _cpu_clock_ablation() -> dict[str, float]:
    """Wrapper's own us per all_reduce with its CPU clock swapped (interleaved runs)."""
    import artemis.job.backend as backend
    import torch
    import torch.distributed as dist
    from artemis.job.backend import ArtemisProcessGroup
    from torch.testing._internal.distributed.fake_pg import FakeStore

    shm = tempfile.mkdtemp(prefix="bench-artemis-")
    os.environ["ARTEMIS_SHM_DIR"], os.environ["ARTEMIS_JOB"] = shm, "bench-clock"
    store = FakeStore()
    dist.init_process_group("fake", store=store, rank=0, world_size=2)
    fake = dist.group.WORLD
    ours = ArtemisProcessGroup(store, 0, 2, timedelta(seconds=30), inner=fake)
    t = torch.ones(4)
    opts = dist.AllreduceOptions()
    clocks = {
        "process_time_ns (the contract)": time.process_time_ns,
        "thread_time_ns": time.thread_time_ns,
        "a constant (no read)": lambda: 0,
    }
    keep = backend._cpu

    def per_call(pg: Any, n: int = CALLS // 2) -> float:
        c0 = time.process_time_ns()
        for _ in range(n):
            pg.allreduce([t], opts)
        return (time.process_time_ns() - c0) / n / 1e3

    per_call(ours)
    got: dict[str, list[float]] = {k: [] for k in clocks}
    try:
        for _ in range(RUNS):
            base = per_call(fake)
            for name, clock in clocks.items():
                backend._cpu = clock
                got[name].append(per_call(ours) - base)
    finally:
        backend._cpu = keep
        ours.close_rings()
        dist.destroy_process_group()
    return {k: statistics.median(v) for k, v in got.items()}


def _task_cpu_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat") as fh:
        return int(fh.read().split()[0])  # ns on a CPU


def _all_tasks_cpu_ns() -> int:
    total = 0
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError):  # a thread that just ended
            total += _task_cpu_ns(int(tid))
    return total


def _detector_worker(rank: int, init: str, out: str, world: int) -> None:
    import threading

    import artemis.job
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("artemis", init_method=f"file://{init}", rank=rank, world_size=world)
    det = artemis.job.Detector(jsonl=os.path.join(out, "findings.jsonl"), window_steps=20)
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 1),
    )
    model, opt = DDP(m), torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = torch.randn(128, 64), torch.randn(128, 1)

    def det_threads() -> list[int]:
        return [
            t.native_id
            for t in threading.enumerate()
            if t.name.startswith("artemis-detector") and t.native_id is not None
        ]

    tids = det_threads()
    d0 = {t: _task_cpu_ns(t) for t in tids}
    all0, w0 = _all_tasks_cpu_ns(), time.monotonic_ns()
    for _ in range(DET_STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    tids = det_threads()
    det_ns = 0
    for t in tids:
        with contextlib.suppress(OSError, ValueError):  # a detector thread that just ended
            det_ns += _task_cpu_ns(t) - d0.get(t, 0)
    all_ns, wall_ns = _all_tasks_cpu_ns() - all0, time.monotonic_ns() - w0
    det.close()
    dist.destroy_process_group()
    Path(out, f"share{rank}.json").write_text(
        json.dumps({"det_ns": det_ns, "all_ns": all_ns, "wall_ns": wall_ns})
    )


def _detector_share(world: int = 4) -> list[dict[str, int]]:
    import torch.multiprocessing as mp

    d = Path(tempfile.mkdtemp(prefix="bench-det-"))
    os.environ["ARTEMIS_SHM_DIR"], os.environ["ARTEMIS_JOB"] = str(d / "shm"), "bench-det"
    mp.start_processes(
        _detector_worker, args=(str(d / "store"), str(d), world), nprocs=world, start_method="spawn"
    )
    return [json.loads((d / f"share{r}.json").read_text()) for r in range(world)]


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
    print("\nCPU per clock read (ns, median of 5 runs of 50k reads, empty loop subtracted):")
    print("| clock | ns per read |")
    print("|---|---:|")
    for name, ns in _clock_costs().items():
        print(f"| {name} | {ns:.0f} |")
    abl = _cpu_clock_ablation()
    print(
        f"\nThe wrapper's own CPU per all_reduce by CPU clock (medians of {RUNS} interleaved runs):"
    )
    print("| CPU clock read at record start and end | us per call over fake |")
    print("|---|---:|")
    for name, us in abl.items():
        print(f"| {name} | {us:.2f} |")
    shares: list[list[float]] = [[], []]
    rates: list[list[float]] = [[], []]  # detector CPU, ms per second of wall time
    for _ in range(DET_RUNS):
        rows = _detector_share()
        for k, part in ((0, rows[:1]), (1, rows[1:])):
            shares[k] += [100.0 * r["det_ns"] / r["all_ns"] for r in part]
            rates[k] += [1e3 * r["det_ns"] / r["wall_ns"] for r in part]
    print(
        f"\nIn-process detector's CPU share, 4 ranks, {DET_STEPS} steps, 20-step windows, "
        f"{DET_RUNS} runs (detector threads' CPU / the process's CPU):"
    )
    print("| rank | median % | detector CPU, ms per s | runs (%) |")
    print("|---|---:|---:|---|")
    for k, who in ((0, "0 (summarises and scores)"), (1, "1-3 (summarise, send)")):
        print(
            f"| {who} | {statistics.median(shares[k]):.2f} | {statistics.median(rates[k]):.1f} | "
            f"{', '.join(f'{v:.2f}' for v in shares[k])} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
