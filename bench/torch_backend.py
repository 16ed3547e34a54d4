"""The ``artemis`` torch.distributed backend's overhead (issue 15's goals).

1. CPU per collective of the wrapper: ``all_reduce`` of a 4-float tensor through
   the backend's two paths wrapping torch's do-nothing ``fake`` process group
   (the Python ``ArtemisProcessGroup``; the C++ ``TimedBackend`` of job/csrc, when
   built, around the fake group's c10d backend), against the same call on the fake
   group itself; process CPU time (``time.process_time_ns``), interleaved runs,
   median. Goal: <= 5 us. Then the C++ path's pieces timed alone in C (clock
   reads, one ring record + completion, one future callback), and its cost in
   process-CPU clock reads.
2. Step time of a real DDP job (2 gloo ranks, one CPU thread each), interleaved at
   the step: four identical DDP models (same seed) in the same processes, each on
   its own group: plain gloo, a second plain gloo group (the A/A control: the
   harness's noise floor), ``artemis`` (its default path: C++ when built) and a
   third gloo group whose step spins 1% of gloo's step (the positive control: what
   a 1% overhead looks like). Each iteration runs one step of each, in an order
   from shuffled blocks of all 24 orders (bench/_interleave.py); per iteration the
   ratio of each arm's step (wall and process CPU) to gloo's, their median with a
   bootstrap interval; several runs (fresh processes) per scheduler setting: the
   default one, the ranks ``SCHED_FIFO`` (where permitted), and that with each rank
   pinned to a core. With the collectives per step and the C++ wrapper's cost per
   step from its cost per collective. Goal: <= 1% on CPU DDP. Then bare
   ``all_reduce`` calls over real gloo, artemis against gloo, interleaved per call:
   the wrapper's cost over a real backend rather than over ``fake``.
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
import random
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

RUNS = 7
CALLS = 20_000
DDP_RUNS = 3
DDP_ITERS = 960
DDP_WARMUP = 48
DDP_EPOCH = 240  # iterations between rebuilds of the models (10 blocks of the 24 orders)
DDP_REWARM = 4  # iterations after each rebuild, not timed
SPIN_SHARE = 0.01
DDP_SETTINGS = ("cfs", "fifo", "fifo+pinned")
FIFO_PRIORITY = 10
AR_ITERS = 3000
AR_SIZES = (4, 82_945)  # floats: a tiny all_reduce, and the DDP model's one bucket
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
    from artemis.job.backend import CLOSE_WAIT_S, load_ext
    from artemis.ring.writer import RingWriter

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
    tb = ext.TimedBackend(
        world._get_backend(torch.device("cpu")), None, path, 0, 1, close_wait_s=CLOSE_WAIT_S
    )
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
    import artemis.job.python_path as python_path  # its hot path reads _cpu
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
    keep = python_path._cpu

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
                python_path._cpu = clock
                got[name].append(per_call(ours) - base)
    finally:
        python_path._cpu = keep
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


def _mlp() -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 1),
    )


def _exit_now() -> None:
    """End a rank without tearing its objects down: freeing the last DDP model at exit
    ran ~ProcessGroupGloo under the GIL while one of gloo's threads, holding the mutex
    that destructor waits for, was taking the GIL (to free a Work's thread-local
    state): a deadlock that hung one rank for good. Its results are written by now."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _ring_dir() -> str:
    """Where the DDP parts' rings go: tmpfs, as in a deployment (/dev/shm/artemis is the
    default), not the disk that holds /tmp here (a file-backed mapping's writes fault
    again after each writeback)."""
    shm = "/dev/shm"
    return tempfile.mkdtemp(prefix="bench-ddp-", dir=shm if os.path.isdir(shm) else None)


def _set_sched(rank: int, setting: str) -> None:
    # before any thread starts, so gloo's and torch's threads inherit them
    if "pinned" in setting:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    if "fifo" in setting:
        # real-time FIFO: no other task on the machine preempts a rank (the kernel's
        # RT throttling still leaves them 5% of each second); a dedicated machine's view
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(FIFO_PRIORITY))


def _allreduce_worker(rank: int, init: str, out: str, setting: str) -> None:
    """Bare all_reduces (no DDP), interleaved per call over two plain gloo groups and an
    artemis one: the wrapper's cost over a real gloo backend, not over ``fake``."""
    _set_sched(rank, setting)
    import artemis.job  # noqa: F401
    import torch
    import torch.distributed as dist

    from bench._interleave import orders

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    arms = {"artemis": "artemis", "gloo": "gloo", "gloo-aa": "gloo"}
    groups = {name: dist.new_group(backend=b) for name, b in arms.items()}
    res: dict[str, Any] = {}
    clock, cpu = time.perf_counter_ns, time.process_time_ns
    for n in AR_SIZES:
        t = torch.ones(n)
        wall: dict[str, list[int]] = {k: [] for k in arms}
        proc: dict[str, list[int]] = {k: [] for k in arms}
        for i, order in enumerate(orders(list(arms), AR_ITERS + 100, n)):
            for name in order:
                t0, c0 = clock(), cpu()
                dist.all_reduce(t, group=groups[name])
                t1, c1 = clock(), cpu()
                if i >= 100:
                    wall[name].append(t1 - t0)
                    proc[name].append(c1 - c0)
        res[str(n)] = {"wall": wall, "cpu": proc}
    dist.destroy_process_group()
    if rank == 0:
        Path(out, "ar.json").write_text(json.dumps(res))
    _exit_now()


def _print_allreduce(setting: str) -> None:
    import torch.multiprocessing as mp

    from bench._interleave import median_ci, ratios

    d = Path(tempfile.mkdtemp(prefix="bench-ar-"))
    rings = _ring_dir()
    os.environ["ARTEMIS_SHM_DIR"], os.environ["ARTEMIS_JOB"] = rings, "bench-ar"
    mp.start_processes(
        _allreduce_worker, args=(str(d / "store"), str(d), setting), nprocs=2, start_method="spawn"
    )
    shutil.rmtree(rings, ignore_errors=True)
    res = json.loads((d / "ar.json").read_text())
    print(
        f"\nBare all_reduce over real gloo (2 ranks, {setting}, {AR_ITERS} iterations of one "
        "call per group, shuffled orders; rank 0; medians, paired ratio [95% bootstrap]):"
    )
    print(
        "| floats | gloo us (wall) | artemis us (wall) | artemis / gloo (wall) | "
        "A/A (wall) | gloo us (CPU) | artemis - gloo (CPU us) | artemis / gloo (CPU) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, r in res.items():
        w, c = r["wall"], r["cpu"]

        def med(v: list[int]) -> float:
            return statistics.median(v) / 1e3

        rw = median_ci(ratios(w["artemis"], w["gloo"]))
        aa = median_ci(ratios(w["gloo-aa"], w["gloo"]))
        rc = median_ci(ratios(c["artemis"], c["gloo"]))
        dc = statistics.median((a - b) / 1e3 for a, b in zip(c["artemis"], c["gloo"], strict=True))
        print(
            f"| {n} | {med(w['gloo']):.1f} | {med(w['artemis']):.1f} | "
            f"{rw[0]:.4f} [{rw[1]:.4f}, {rw[2]:.4f}] | {aa[0]:.4f} | {med(c['gloo']):.1f} | "
            f"{dc:+.1f} | {rc[0]:.4f} [{rc[1]:.4f}, {rc[2]:.4f}] |"
        )


def _ddp_worker(
    rank: int, init: str, out: str, setting: str, seed: int, iters: int, warmup: int
) -> None:
    _set_sched(rank, setting)
    import gc
    import resource

    import artemis.job  # noqa: F401
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from bench._interleave import orders

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    arms = {"gloo": "gloo", "gloo-aa": "gloo", "artemis": "artemis", "gloo+1%": "gloo"}
    # the same on both ranks, which must make groups and models in the same order
    rng = random.Random(seed)
    # every arm its own group, made the same way (new_group, so none is WORLD), in
    # an order shuffled per run: no arm is always the first made
    groups: dict[str, Any] = {}
    for name in rng.sample(list(arms), len(arms)):
        groups[name] = dist.new_group(backend=arms[name])
    models: dict[str, Any] = {}

    def build() -> None:
        # The models are made again every epoch, in a shuffled order, so that which
        # arm's tensors get which memory changes: with a fixed order the first model
        # made stepped ~0.5% slower than the others (its forward too) on every run.
        models.clear()
        gc.collect()
        for name in rng.sample(list(arms), len(arms)):
            torch.manual_seed(0)
            m = _mlp()
            models[name] = (
                DDP(m, process_group=groups[name]),
                torch.optim.SGD(m.parameters(), lr=0.01),
            )

    x, y = torch.randn(128, 64), torch.randn(128, 1)
    mse = torch.nn.functional.mse_loss
    spin_ns = 0
    clock, cpu = time.perf_counter_ns, time.process_time_ns

    def switches() -> int:
        # context switches of every thread of the process (gloo's too)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_nvcsw + ru.ru_nivcsw

    def step(name: str) -> tuple[int, int, int]:
        model, opt = models[name]
        s0 = switches()
        t0, c0 = clock(), cpu()
        opt.zero_grad()
        mse(model(x), y).backward()
        opt.step()
        if name == "gloo+1%":  # a known extra: 1% of gloo's step, busy, on every rank
            end = clock() + spin_ns
            while clock() < end:
                pass
        t1, c1 = clock(), cpu()
        return t1 - t0, c1 - c0, switches() - s0

    build()
    warm: list[int] = []
    for order in orders(list(arms), warmup, seed + 1000):
        for name in order:
            w, _, _ = step(name)
            if name == "gloo":
                warm.append(w)
    spin_ns = int(SPIN_SHARE * statistics.median(warm[len(warm) // 2 :]))
    plan = orders(list(arms), iters, seed)
    wall: dict[str, list[int]] = {k: [] for k in arms}
    proc: dict[str, list[int]] = {k: [] for k in arms}
    csw: dict[str, int] = dict.fromkeys(arms, 0)
    load0 = os.getloadavg()
    art = groups["artemis"]
    colls = 0
    for e in range(0, iters, DDP_EPOCH):
        build()
        for order in orders(list(arms), DDP_REWARM, seed + 2000 + e):  # not timed
            for name in order:
                step(name)
        seq0 = art.next_coll_seq() if hasattr(art, "next_coll_seq") else 0
        # Python's cyclic collector would run at random points of some arm's step;
        # the loop makes no cycles worth collecting, so it is off while timing
        gc.collect()
        gc.disable()
        for order in plan[e : e + DDP_EPOCH]:
            for name in order:
                w, c, n = step(name)
                wall[name].append(w)
                proc[name].append(c)
                csw[name] += n
        gc.enable()
        colls += (art.next_coll_seq() if hasattr(art, "next_coll_seq") else 0) - seq0
    load1 = os.getloadavg()
    path = type(art).__name__
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "wall": wall,
                "cpu": proc,
                "path": path,
                # collectives per timed step on the artemis group
                "colls_per_step": colls / len(wall["artemis"]),
                "spin_ns": spin_ns,
                "load": [load0[0], load1[0]],
                "csw_per_step": {k: v / iters for k, v in csw.items()},
                "affinity": sorted(os.sched_getaffinity(0)),
            }
        )
    )
    _exit_now()


def _step_run(setting: str, seed: int) -> list[dict[str, Any]]:
    """One run of the interleaved DDP job (2 fresh rank processes); both ranks' data."""
    import torch.multiprocessing as mp

    d = Path(tempfile.mkdtemp(prefix="bench-ddp-"))
    os.environ["ARTEMIS_JOB"] = "bench-ddp"
    os.environ["ARTEMIS_SHM_DIR"] = rings = _ring_dir()
    mp.start_processes(
        _ddp_worker,
        args=(str(d / "store"), str(d), setting, seed, DDP_ITERS, DDP_WARMUP),
        nprocs=2,
        start_method="spawn",
    )
    shutil.rmtree(rings, ignore_errors=True)
    return [json.loads((d / f"rank{r}.json").read_text()) for r in range(2)]


def _step_stats(run: dict[str, Any]) -> dict[str, Any]:
    """One rank's run: paired per-iteration ratios of each arm against ``gloo``, wall
    and process CPU, medians with bootstrap intervals."""
    from bench._interleave import median_ci, ratios

    wall, cpu = run["wall"], run["cpu"]
    out: dict[str, Any] = {
        "gloo_ms": statistics.median(wall["gloo"]) / 1e6,
        "iters": len(wall["gloo"]),
    }
    for arm in ("gloo-aa", "artemis", "gloo+1%"):
        out[arm] = median_ci(ratios(wall[arm], wall["gloo"]))
        out[f"{arm}-cpu"] = median_ci(ratios(cpu[arm], cpu["gloo"]))
        # the paired difference, in us: what the arm adds per step
        out[f"{arm}-us"] = statistics.median(
            (a - b) / 1e3 for a, b in zip(wall[arm], wall["gloo"], strict=True)
        )
    return out


def _fifo_permitted() -> bool:
    """Whether this process may make its ranks real-time (root, or CAP_SYS_NICE)."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(FIFO_PRIORITY))
    except (PermissionError, OSError):
        return False
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return True


def _print_step_times(cpp_own: float | None) -> None:
    settings = [s for s in DDP_SETTINGS if "fifo" not in s or _fifo_permitted()]
    arms = "gloo, gloo-aa (a second gloo group: the A/A control), artemis, gloo+1%"
    print(
        f"\nDDP step time, 2 gloo ranks, step-interleaved: {DDP_RUNS} runs per setting, "
        f"each {DDP_ITERS} iterations (after {DDP_WARMUP} discarded) of one step of each "
        f"arm ({arms}: the positive control, spinning 1% of gloo's warm-up step), in "
        "shuffled blocks of all 24 orders; per iteration the ratio of an arm's step to "
        "gloo's; median [95% bootstrap interval]; rank 0. Settings: cfs = the default "
        "scheduler; fifo = the ranks SCHED_FIFO; pinned = each rank on its own core:"
    )
    if len(settings) < len(DDP_SETTINGS):
        print("(SCHED_FIFO is not permitted here: the fifo settings are skipped)")
    print(
        "| setting | run | load avg | gloo ms | ctx sw / step: gloo, artemis | "
        "A/A: gloo-aa / gloo | "
        "artemis / gloo | artemis - gloo (us) | gloo+1% / gloo | CPU: A/A | "
        "CPU: artemis | CPU: +1% |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def ci(v: tuple[float, float, float]) -> str:
        return f"{v[0]:.4f} [{v[1]:.4f}, {v[2]:.4f}]"

    summary: dict[str, list[dict[str, Any]]] = {k: [] for k in settings}
    info: dict[str, Any] = {}
    for r in range(DDP_RUNS):
        for setting in settings:  # alternated, so the load drifts over all of them
            ranks = _step_run(setting, seed=r)
            s = _step_stats(ranks[0])
            info = ranks[0]
            s["csw"] = info["csw_per_step"]
            summary[setting].append(s)
            load = info["load"]
            print(
                f"| {setting} | {r + 1} | {load[0]:.2f}-{load[1]:.2f} | {s['gloo_ms']:.2f} | "
                f"{info['csw_per_step']['gloo']:.2f}, {info['csw_per_step']['artemis']:.2f} | "
                f"{ci(s['gloo-aa'])} | {ci(s['artemis'])} | "
                f"{s['artemis-us']:+.1f} | {ci(s['gloo+1%'])} | {s['gloo-aa-cpu'][0]:.4f} | "
                f"{s['artemis-cpu'][0]:.4f} | {s['gloo+1%-cpu'][0]:.4f} |",
                flush=True,
            )
    print("\nMedians of the runs, [lowest, highest run]:")
    print(
        "| setting | A/A: gloo-aa / gloo | artemis / gloo | gloo+1% / gloo | "
        "artemis - gloo (us) | CPU: A/A | CPU: artemis | ctx sw / step: gloo, artemis |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for setting, rows in summary.items():

        def runs(key: str, rows: list[dict[str, Any]] = rows) -> str:
            v = [x[key][0] if isinstance(x[key], tuple) else x[key] for x in rows]
            return f"{statistics.median(v):.4f} [{min(v):.4f}, {max(v):.4f}]"

        us = [x["artemis-us"] for x in rows]
        print(
            f"| {setting} | {runs('gloo-aa')} | {runs('artemis')} (goal <= 1.01) | "
            f"{runs('gloo+1%')} | {statistics.median(us):+.1f} [{min(us):+.1f}, {max(us):+.1f}] | "
            f"{runs('gloo-aa-cpu')} | {runs('artemis-cpu')} | "
            f"{statistics.median(x['csw']['gloo'] for x in rows):.2f}, "
            f"{statistics.median(x['csw']['artemis'] for x in rows):.2f} |"
        )
    gloo_ms = min(statistics.median(x["gloo_ms"] for x in rows) for rows in summary.values())
    per_step = info["colls_per_step"]
    print(
        f"(the artemis group took the {info['path']} path; {per_step:.2f} collectives per "
        "step on it)"
    )
    if cpp_own is not None:
        print(
            f"The C++ wrapper's CPU per step from its cost per collective: {per_step:.2f} x "
            f"{cpp_own:.2f} us = {per_step * cpp_own:.2f} us, "
            f"{per_step * cpp_own / 1e3 / gloo_ms * 100:.3f}% of the fastest setting's "
            f"{gloo_ms:.2f} ms gloo step"
        )
    _print_allreduce(settings[-1])


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
    _print_step_times(None if cpp is None else cpp - base)
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


def ddp_main() -> int:
    """The DDP step-time part alone (``python -m bench.torch_backend ddp``)."""
    _print_step_times(None)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(ddp_main() if sys.argv[1:] == ["ddp"] else main())
