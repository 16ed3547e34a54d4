"""The ``artemis`` torch.distributed backend's overhead (issue 15's goals).

1. CPU per collective of the wrapper: ``all_reduce`` of a 4-float tensor through
   the backend's two paths wrapping torch's do-nothing ``fake`` process group
   (the Python ``ArtemisProcessGroup``; the C++ ``TimedBackend`` of job/csrc, when
   built, around the fake group's c10d backend), against the same call on the fake
   group itself; process CPU time (``time.process_time_ns``), interleaved runs,
   median. Goal: <= 5 us. Then the C++ path's pieces timed alone in C (clock
   reads, one ring record + completion, one future callback), and its cost in
   process-CPU clock reads.
2. Step time of a real DDP job (2 gloo ranks, one CPU thread each): the same
   model and data trained through ``artemis`` (its default group: the C++ path
   when built), through an ``artemis`` group on the Python path, through a plain
   gloo group and through a second plain gloo group (an A/A control: the noise
   floor of the comparison) in the same processes, alternated in rounds; median
   step time per round, the ratio of the medians; the same rounds' process CPU per
   step; and the C++ wrapper's cost per step (collectives per step x its cost per
   collective). Goal: <= 1% on CPU DDP.

3. Where the Python path's CPU goes: the cost of one read of each clock (CPU time of
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
ROUNDS = 20
STEPS = 40
DET_STEPS = 400
DET_RUNS = 3


def _cpu_per_collective() -> tuple[float, float, float | None]:
    """us of process CPU per all_reduce: fake alone, through the Python path, through
    the C++ path (None when it is not built); medians of interleaved runs."""
    import artemis.job  # noqa: F401
    import torch
    import torch.distributed as dist
    from artemis.job.backend import ArtemisCppGroup, ArtemisProcessGroup, load_ext
    from torch.testing._internal.distributed.fake_pg import FakeStore

    shm = tempfile.mkdtemp(prefix="bench-artemis-")
    os.environ["ARTEMIS_SHM_DIR"], os.environ["ARTEMIS_JOB"] = shm, "bench"
    store = FakeStore()
    dist.init_process_group("fake", store=store, rank=0, world_size=2)
    fake: Any = dist.group.WORLD
    ours = ArtemisProcessGroup(store, 0, 2, timedelta(seconds=30), inner=fake)
    groups: dict[str, Any] = {"fake": fake, "python": ours}
    if load_ext() is not None:
        # the C++ path wraps the fake group's c10d backend (its do-nothing collectives)
        fake_backend = fake._get_backend(torch.device("cpu"))
        groups["cpp"] = ArtemisCppGroup(
            store, 0, 2, timedelta(seconds=30), group_id="bench-cpp", inner=fake_backend
        )
    t = torch.ones(4)
    opts = dist.AllreduceOptions()

    def per_call(pg: Any) -> float:
        c0 = time.process_time_ns()
        for _ in range(CALLS):
            pg.allreduce([t], opts)
        return (time.process_time_ns() - c0) / CALLS / 1e3

    for g in groups.values():
        per_call(g)  # warm up (and create the ring)
    got: dict[str, list[float]] = {k: [] for k in groups}
    for _ in range(RUNS):
        for name, g in groups.items():
            got[name].append(per_call(g))
    for g in groups.values():
        if g is not fake:
            g.close_rings()
    dist.destroy_process_group()
    med = {k: statistics.median(v) for k, v in got.items()}
    return med["fake"], med["python"], med.get("cpp")


def _cpp_pieces() -> dict[str, float]:
    """ns of thread CPU per piece of the C++ hot path, timed alone in C (medians of 5
    runs): each clock read, one ring record + completion (mutex, seqlock, stores),
    one completion callback on a done future."""
    import torch
    from artemis.job.backend import load_ext
    from artemis.job.ring_writer import RingWriter

    ext = load_ext()
    if ext is None:
        return {}
    n = 200_000

    def med(f: Any) -> float:
        return statistics.median(f() for _ in range(5))

    d = tempfile.mkdtemp(prefix="bench-pieces-")
    rw = RingWriter(d, "pieces", 1, 0, 1, clock_kind="host", cpu_times=True)
    path = str(rw.path)
    rw.close(finish=False)
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    world: Any = dist.group.WORLD
    tb = ext.TimedBackend(world._get_backend(torch.device("cpu")), None, path, 0, 1)
    out = {
        "CLOCK_MONOTONIC read (vDSO)": med(lambda: ext.clock_read_ns("monotonic", n)),
        "CLOCK_PROCESS_CPUTIME_ID read (a system call)": med(
            lambda: ext.clock_read_ns("process_cputime", n)
        ),
        "ring record + completion (mutex, seqlock, 2x12 stores)": med(
            lambda: tb.bench_record_ns(n // 4)
        ),
        "completion callback on a done future (addCallback)": med(
            lambda: ext.bench_callback_ns(n // 4)
        ),
    }
    tb.close_ring()
    dist.destroy_process_group()
    return out


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
    os.environ["ARTEMIS_BACKEND_IMPL"] = "python"  # read when a group is made
    py = dist.new_group(backend="artemis")
    del os.environ["ARTEMIS_BACKEND_IMPL"]
    models = {}
    # a second plain gloo group: an A/A control, the harness's own noise floor
    gloo_aa = dist.new_group(backend="gloo")
    groups = {"artemis": dist.group.WORLD, "artemis-py": py, "gloo": gloo, "gloo-aa": gloo_aa}
    for name, g in groups.items():
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
    times: dict[str, list[float]] = {k: [] for k in groups}
    times.update({f"{k}-cpu": [] for k in groups})
    times["path"] = [type(dist.group.WORLD).__name__]  # type: ignore[list-item]
    names = list(groups)
    for r in range(ROUNDS + 1):
        k = r % len(names)
        order = names[k:] + names[:k]  # each backend first in turn
        for name in order:
            model, opt = models[name]
            dist.barrier(group=gloo)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(STEPS):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            if r:  # round 0 warms both up
                times[name].append((time.perf_counter() - t0) / STEPS * 1e3)
                # the process's CPU (every thread: gloo's too) per step: less swayed
                # by the other processes on the machine than the wall clock
                times[f"{name}-cpu"].append((time.process_time() - c0) / STEPS * 1e3)
    # collectives per step on the artemis group (the wrapper's cost per step is that
    # many times its cost per collective)
    steps_run = (ROUNDS + 1) * STEPS
    times["colls_per_step"] = [dist.group.WORLD.next_coll_seq() / steps_run]  # type: ignore[union-attr]
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(times))


def _step_times() -> dict[str, Any]:
    import torch.multiprocessing as mp

    d = Path(tempfile.mkdtemp(prefix="bench-ddp-"))
    os.environ["ARTEMIS_SHM_DIR"], os.environ["ARTEMIS_JOB"] = str(d / "shm"), "bench-ddp"
    mp.start_processes(
        _ddp_worker, args=(str(d / "store"), str(d / "times.json")), nprocs=2, start_method="spawn"
    )
    times: dict[str, Any] = json.loads((d / "times.json").read_text())
    return times


def main() -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: skipped")
        return 0
    base, wrapped, cpp = _cpu_per_collective()
    print(f"CPU per all_reduce, medians of {RUNS} interleaved runs of {CALLS} calls:")
    print("| inner | us per call |")
    print("|---|---:|")
    print(f"| fake (do-nothing) alone | {base:.2f} |")
    print(f"| artemis, Python path, wrapping fake | {wrapped:.2f} |")
    print(f"| its own cost | {wrapped - base:.2f} (goal <= 5) |")
    if cpp is None:
        print("| artemis, C++ path | not built (make backend-ext) |")
    else:
        print(f"| artemis, C++ path, wrapping fake's c10d backend | {cpp:.2f} |")
        print(f"| its own cost | {cpp - base:.2f} (goal <= 5) |")
    pieces = _cpp_pieces()
    if pieces and cpp is not None:
        print("\nThe C++ hot path's pieces, timed alone in C (ns of thread CPU, medians of 5):")
        print("| piece | ns | per collective |")
        print("|---|---:|---:|")
        per = {
            "CLOCK_MONOTONIC read (vDSO)": 3,
            "CLOCK_PROCESS_CPUTIME_ID read (a system call)": 2,
            "ring record + completion (mutex, seqlock, 2x12 stores)": 1,
            "completion callback on a done future (addCallback)": 1,
        }
        total = 0.0
        for name, ns in pieces.items():
            total += ns * per[name]
            print(f"| {name} | {ns:.0f} | x{per[name]} = {ns * per[name]:.0f} |")
        own = (cpp - base) * 1e3
        print(f"| sum of the pieces | | {total:.0f} |")
        print(f"| the rest (dispatch, the inner Work's future, vectors) | | {own - total:.0f} |")
        print(
            f"| the wrapper's own cost, in process-CPU clock reads | | "
            f"{own / pieces['CLOCK_PROCESS_CPUTIME_ID read (a system call)']:.1f} reads |"
        )
    t = _step_times()
    g = statistics.median(t["gloo"])
    print(
        f"\nDDP step time, 2 gloo ranks, medians of {ROUNDS} alternated rounds of {STEPS} steps "
        f"(the default artemis group took {t['path'][0]}):"
    )
    print("| backend | ms per step | / gloo | rounds (ms) |")
    print("|---|---:|---:|---|")
    for name in ("gloo", "gloo-aa", "artemis", "artemis-py"):
        m = statistics.median(t[name])
        print(f"| {name} | {m:.2f} | {m / g:.3f} | {', '.join(f'{v:.1f}' for v in t[name])} |")
    paired = [a / b for a, b in zip(t["artemis"], t["gloo"], strict=True)]
    print(
        f"| artemis / gloo, median of per-round ratios | | "
        f"{statistics.median(paired):.3f} (goal <= 1.01) | |"
    )
    if cpp is not None:
        per_step = t["colls_per_step"][0]
        print(
            f"| the C++ wrapper's CPU per step: {per_step:.2f} collectives x "
            f"{cpp - base:.2f} us | | {(per_step * (cpp - base) / 1e3) / g * 100:.3f}% "
            "of gloo's step | |"
        )
    gc = statistics.median(t["gloo-cpu"])
    print("\nThe same rounds' process CPU per step (every thread of rank 0's process):")
    print("| backend | CPU ms per step | / gloo |")
    print("|---|---:|---:|")
    for name in ("gloo", "gloo-aa", "artemis", "artemis-py"):
        m = statistics.median(t[f"{name}-cpu"])
        print(f"| {name} | {m:.3f} | {m / gc:.3f} |")
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
