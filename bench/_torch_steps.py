"""The DDP part of bench/torch_backend.py (its item 2): step time of a real DDP job
through ``artemis`` against gloo, interleaved at the step, per scheduler setting, and
bare ``all_reduce`` calls over real gloo; the workers run in spawned processes. The
job is the benches' MLP or the real-job grid's GPT (bench/realjobs/workloads.py:
transformer blocks, AdamW, token batches), the same model, optimizer and batch in
every arm.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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


def mlp() -> Any:
    """The benches' small DDP model (64 -> 256 -> 256 -> 1, tanh)."""
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
    rank: int, init: str, out: str, setting: str, seed: int, iters: int, warmup: int, workload: str
) -> None:
    _set_sched(rank, setting)
    import gc
    import resource

    import artemis.job  # noqa: F401
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from bench._interleave import orders
    from bench.realjobs.workloads import batches, model_and_loss

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
            m, opt, loss = model_and_loss(workload)
            models[name] = (DDP(m, process_group=groups[name]), opt, loss)

    batch = next(batches(workload, rank, 1))
    spin_ns = 0
    clock, cpu = time.perf_counter_ns, time.process_time_ns

    def switches() -> int:
        # context switches of every thread of the process (gloo's too)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_nvcsw + ru.ru_nivcsw

    def step(name: str) -> tuple[int, int, int]:
        model, opt, loss = models[name]
        s0 = switches()
        t0, c0 = clock(), cpu()
        opt.zero_grad()
        loss(model, batch).backward()
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


def _step_run(setting: str, seed: int, workload: str) -> list[dict[str, Any]]:
    """One run of the interleaved DDP job (2 fresh rank processes); both ranks' data."""
    import torch.multiprocessing as mp

    d = Path(tempfile.mkdtemp(prefix="bench-ddp-"))
    os.environ["ARTEMIS_JOB"] = "bench-ddp"
    os.environ["ARTEMIS_SHM_DIR"] = rings = _ring_dir()
    mp.start_processes(
        _ddp_worker,
        args=(str(d / "store"), str(d), setting, seed, DDP_ITERS, DDP_WARMUP, workload),
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


def print_step_times(
    cpp_own: float | None,
    workload: str = "mlp",
    n_runs: int = DDP_RUNS,
    settings: tuple[str, ...] = DDP_SETTINGS,
    allreduce: bool = True,
) -> None:
    """The step-time table of ``workload`` (``mlp`` or ``gpt``); then, with
    ``allreduce``, the bare all_reduce table."""
    asked, settings = settings, tuple(s for s in settings if "fifo" not in s or _fifo_permitted())
    arms = "gloo, gloo-aa (a second gloo group: the A/A control), artemis, gloo+1%"
    print(
        f"\nDDP step time, {workload} job, 2 gloo ranks, step-interleaved: {n_runs} runs per setting, "
        f"each {DDP_ITERS} iterations (after {DDP_WARMUP} discarded) of one step of each "
        f"arm ({arms}: the positive control, spinning 1% of gloo's warm-up step), in "
        "shuffled blocks of all 24 orders; per iteration the ratio of an arm's step to "
        "gloo's; median [95% bootstrap interval]; rank 0. Settings: cfs = the default "
        "scheduler; fifo = the ranks SCHED_FIFO; pinned = each rank on its own core:"
    )
    if len(settings) < len(asked):
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
    for r in range(n_runs):
        for setting in settings:  # alternated, so the load drifts over all of them
            ranks = _step_run(setting, r, workload)
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
    if allreduce:
        _print_allreduce(settings[-1])
