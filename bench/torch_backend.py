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
   the wrapper's cost over a real backend rather than over ``fake``. The same
   step-time table again for the real-job grid's GPT job (a transformer, AdamW, token
   batches: bench/realjobs/workloads.py; issue 31's goal <= 1% too). (This part's
   code: bench/_torch_steps.py.)
3. Where the Python path's CPU goes: the cost of one read of each clock (CPU time of
   the reading thread, 50k reads), and the wrapper's cost with its CPU clock
   (``time.process_time_ns``, what the ring contract asks: process CPU time at
   each record's start and end) replaced by ``time.thread_time_ns`` and by a
   constant, interleaved in one run (an ablation: only the first keeps the contract).
4. The in-process detector's CPU on a real DDP job (4 gloo ranks through
   ``artemis``, ``artemis.job.Detector`` on every rank, 20-step windows, its
   default 0.5 s poll): CPU time of the detector's threads
   (``/proc/self/task/<tid>/schedstat``) per second of wall time (ms per s: a
   tenth of a percent of a core each, issue 31's unit) and over the CPU time of
   every thread of the rank's process (its share), over the training loop after
   a warm-up of DET_WARM steps (the step period found, the first windows out:
   one-time costs, not the poll's).

Run: ``python -m bench torch_backend``; ``python -m bench.torch_backend detector
[RUNS]`` for part 4 alone. Skipped without torch.
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

from bench._torch_steps import mlp, print_step_times

RUNS = 7
CALLS = 20_000
DET_STEPS = 400
DET_WARM = 60  # steps before the measured ones: three 20-step windows
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
    m = mlp()
    model, opt = DDP(m), torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = torch.randn(128, 64), torch.randn(128, 1)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    for _ in range(DET_WARM):
        step()

    def det_threads() -> dict[int, bool]:
        """tid -> whether it is the summarising thread (rank 0's others receive, score)."""
        return {
            t.native_id: t.name.endswith("_summarise_loop")
            for t in threading.enumerate()
            if t.name.startswith("artemis-detector") and t.native_id is not None
        }

    tids = det_threads()
    d0 = {t: _task_cpu_ns(t) for t in tids}
    all0, w0 = _all_tasks_cpu_ns(), time.monotonic_ns()
    for _ in range(DET_STEPS):
        step()
    det_ns = sum_ns = 0
    for t, summarising in det_threads().items():
        with contextlib.suppress(OSError, ValueError):  # a detector thread that just ended
            ns = _task_cpu_ns(t) - d0.get(t, 0)
            det_ns += ns
            sum_ns += ns if summarising else 0
    all_ns, wall_ns = _all_tasks_cpu_ns() - all0, time.monotonic_ns() - w0
    det.close()
    dist.destroy_process_group()
    Path(out, f"share{rank}.json").write_text(
        json.dumps({"det_ns": det_ns, "sum_ns": sum_ns, "all_ns": all_ns, "wall_ns": wall_ns})
    )


def _detector_share(world: int = 4) -> list[dict[str, int]]:
    import torch.multiprocessing as mp

    d = Path(tempfile.mkdtemp(prefix="bench-det-"))
    os.environ["ARTEMIS_SHM_DIR"], os.environ["ARTEMIS_JOB"] = str(d / "shm"), "bench-det"
    mp.start_processes(
        _detector_worker, args=(str(d / "store"), str(d), world), nprocs=world, start_method="spawn"
    )
    return [json.loads((d / f"share{r}.json").read_text()) for r in range(world)]


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
    print_step_times(None if cpp is None else cpp - base)
    # the real-job grid's GPT (issue 31): transformer blocks, AdamW, token batches
    print_step_times(None if cpp is None else cpp - base, workload="gpt", allreduce=False)
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
    detector_main()
    return 0


def detector_main(runs: int = DET_RUNS) -> int:
    """Part 4: the in-process detector's CPU, ``runs`` fresh 4-rank jobs."""
    shares: list[list[float]] = [[], []]
    rates: list[list[float]] = [[], []]  # detector CPU, ms per second of wall time
    scoring: list[float] = []  # rank 0's receiving and scoring threads, ms per s
    per_window: list[float] = []  # the same, ms per window scored (about DET_STEPS / 20)
    for _ in range(runs):
        rows = _detector_share()
        for k, part in ((0, rows[:1]), (1, rows[1:])):
            shares[k] += [100.0 * r["det_ns"] / r["all_ns"] for r in part]
            rates[k] += [1e3 * r["det_ns"] / r["wall_ns"] for r in part]
        scoring.append(1e3 * (rows[0]["det_ns"] - rows[0]["sum_ns"]) / rows[0]["wall_ns"])
        per_window.append((rows[0]["det_ns"] - rows[0]["sum_ns"]) / 1e6 / (DET_STEPS / 20))
    print(
        f"\nIn-process detector's CPU, 4 ranks, {DET_STEPS} steps after {DET_WARM}, "
        f"20-step windows, 0.5 s poll, {runs} runs, load average "
        f"{os.getloadavg()[0]:.1f} (% of a core: ms of the detector threads' CPU per s / 10; "
        f"share: of the process's CPU):"
    )
    print("| rank | % of a core, median | share %, median | ms per s, runs | share %, runs |")
    print("|---|---:|---:|---|---|")
    for k, who in ((0, "0 (summarises and scores)"), (1, "1-3 (summarise, send)")):
        print(
            f"| {who} | {statistics.median(rates[k]) / 10:.2f} | "
            f"{statistics.median(shares[k]):.2f} | "
            f"{', '.join(f'{v:.1f}' for v in rates[k])} | "
            f"{', '.join(f'{v:.2f}' for v in shares[k])} |"
        )
    print(
        f"| of rank 0's: receiving and scoring | {statistics.median(scoring) / 10:.2f} | | "
        f"{', '.join(f'{v:.1f}' for v in scoring)} | |"
    )
    print(
        f"\nRank 0's receiving and scoring: {statistics.median(per_window):.1f} ms of CPU per "
        f"window of 4 ranks (runs: {', '.join(f'{v:.1f}' for v in per_window)}); this job's "
        "windows are 20 short steps, a few a second: a job of longer windows pays it less often."
    )
    return 0


def ddp_main(workload: str = "mlp") -> int:
    """The DDP step-time part alone (``python -m bench.torch_backend ddp`` for the MLP,
    ``ddp-gpt`` for the GPT job)."""
    print_step_times(None, workload=workload, allreduce=workload == "mlp")
    return 0


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    if args in (["ddp"], ["ddp-gpt"]):
        raise SystemExit(ddp_main("gpt" if args == ["ddp-gpt"] else "mlp"))
    if args[:1] == ["detector"] and len(args) <= 2:
        if len(args) == 2 and not args[1].isdigit():
            raise SystemExit(f"detector RUNS: a number of runs, not {args[1]!r}")
        raise SystemExit(detector_main(int(args[1]) if len(args) == 2 else DET_RUNS))
    raise SystemExit(main())
