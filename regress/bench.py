"""The fixed micro-benchmark of `artemis regress`, measured through torch.

The imperative shell (processes, clocks, devices): what it returns is plain data,
the samples of every item in seconds per operation, judged by regress/core.py.
The items are fixed per device, so that two runs of a node compare item by item
(regress/README.md "The benchmark"):

- ``gemm/<dtype>x<n>``: an n x n by n x n matrix product; on CPU float32, n = 512,
  on one thread (a fixed amount of work that does not depend on the core count);
  on GPU 0 bfloat16, n = 8192. A sample is the mean of ``inner`` products.
- ``all_reduce/<size>``: a sum of float32 over the node's local ranks, one process
  per rank (gloo on CPU, NCCL/RCCL on GPU, rank r on GPU r), rendezvous through a
  TCPStore on 127.0.0.1 that this process hosts. A sample is the mean of ``inner``
  operations, the slowest rank's (max over the ranks, per sample).
- ``h2d/<size>``: a pinned host buffer copied to GPU 0; absent on a node without a GPU.

On CPU the rank processes are forked once this process has imported torch (as a
DataLoader's workers are: no CUDA, no thread pool yet), so a run costs one import
of torch. On GPU they are spawned (CUDA does not survive a fork), before this
process imports torch when their number is known (``--ranks``), so the imports
overlap. They wait, idle, on the store while the GEMM and the copy are measured,
then run their sweep: no two parts of the benchmark are measured at the same time.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger("artemis.regress")

WARMUP = 3  # operations before the samples (allocators, connections, kernel selection)


class BenchError(Exception):
    """The benchmark could not run (no GPU where one was asked for, a rank failed)."""


@dataclass(frozen=True)
class Item:
    name: str  # "gemm/f32x512": the key runs are compared by
    benchmark: str  # "gemm" | "all_reduce" | "h2d"
    size: int  # n for a GEMM, bytes for the others
    inner: int  # operations per sample


def _size_name(nbytes: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div and nbytes % div == 0:
            return f"{nbytes // div}{unit}"
    return f"{nbytes}B"


def items_for(device: str) -> list[Item]:
    """The benchmark's items on ``device`` ("cpu" | "cuda"), in the order measured."""
    if device == "cuda":
        gemm = [Item("gemm/bf16x8192", "gemm", 8192, 20)]
        sweep = [(1 << 20, 20), (16 << 20, 10), (256 << 20, 4)]
        h2d = [Item(f"h2d/{_size_name(256 << 20)}", "h2d", 256 << 20, 4)]
    else:
        gemm = [Item("gemm/f32x512", "gemm", 512, 8)]
        sweep = [(4 << 10, 20), (64 << 10, 10), (1 << 20, 4)]
        h2d = []
    ar = [Item(f"all_reduce/{_size_name(b)}", "all_reduce", b, n) for b, n in sweep]
    return [*gemm, *ar, *h2d]


@dataclass(frozen=True)
class BenchOptions:
    device: str = "auto"  # auto | cpu | cuda
    ranks: int | None = None  # local ranks of the all_reduce (default: the GPUs, or 2 on CPU)
    repeats: int = 11  # samples per item
    cpus: tuple[int, ...] = ()  # pin the measuring processes here (rank r: cpus[r % len])
    timeout_s: float = 120.0


@dataclass
class Measurement:
    device: str
    ranks: int
    backend: str
    items: list[Item]
    samples: dict[str, list[float]]  # item name -> seconds per operation, one per sample
    absent: dict[str, str] = field(default_factory=dict)  # benchmark -> why it did not run
    meta: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0


# --------------------------------------------------------------------------- rank processes


def _rank_main(
    rank: int,
    world: int,
    device: str,
    cpus: Sequence[int],
    items: Sequence[tuple[str, int, int]],
    repeats: int,
    timeout_s: float,
    portq: Any,
    resq: Any,
) -> None:
    """One local rank of the all_reduce sweep (a spawned process)."""
    try:
        import torch
        import torch.distributed as dist

        port = portq.get(timeout=timeout_s)
        if cpus:
            # Before the process group exists: gloo's and NCCL's threads inherit the mask.
            os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
        torch.set_num_threads(1)
        td = dt.timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=td)
        cuda = device == "cuda"
        if cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            store=dist.PrefixStore("pg", store),
            rank=rank,
            world_size=world,
            timeout=td,
        )
        dev = torch.device("cuda", rank) if cuda else torch.device("cpu")

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize(dev)

        x = torch.ones(1, device=dev)
        dist.all_reduce(x)  # every connection up before we say ready
        sync()
        store.set(f"ready/{rank}", "1")
        store.wait(["go"])
        out: dict[str, list[float]] = {}
        for name, nbytes, inner in items:
            buf = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
            for _ in range(WARMUP):
                dist.all_reduce(buf)
            sync()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(inner):
                    dist.all_reduce(buf)
                sync()
                times.append((time.perf_counter() - t0) / inner)
            # The slowest rank's time, sample by sample.
            tt = torch.tensor(times, dtype=torch.float64, device=dev)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            out[name] = [float(v) for v in tt.cpu().tolist()]
        resq.put((rank, out, None))
        dist.destroy_process_group()
    except BaseException:
        resq.put((rank, None, traceback.format_exc()))


class _Ranks:
    """The spawned rank processes and the queues to them."""

    def __init__(self, device: str, world: int, opts: BenchOptions, items: Sequence[Item]) -> None:
        ctx: Any = mp.get_context("spawn" if device == "cuda" else "fork")
        self.portq = ctx.Queue()
        self.resq = ctx.Queue()
        self.world = world
        spec = [(it.name, it.size, it.inner) for it in items]
        self.procs = [
            ctx.Process(
                target=_rank_main,
                args=(
                    r,
                    world,
                    device,
                    tuple(opts.cpus),
                    spec,
                    opts.repeats,
                    opts.timeout_s,
                    self.portq,
                    self.resq,
                ),
                name=f"artemis-regress-rank{r}",
                daemon=True,
            )
            for r in range(world)
        ]
        for p in self.procs:
            p.start()

    def _poll_error(self) -> None:
        try:
            rank, _, err = self.resq.get_nowait()
        except queue.Empty:
            pass
        else:
            raise BenchError(f"all_reduce rank {rank} failed:\n{err}")
        dead = [p for p in self.procs if p.exitcode not in (None, 0)]
        if dead:
            raise BenchError(f"all_reduce rank process {dead[0].name} exited {dead[0].exitcode}")

    def wait_ready(self, store: Any, deadline: float) -> None:
        keys = [f"ready/{r}" for r in range(self.world)]
        while not store.check(keys):
            self._poll_error()
            if time.monotonic() > deadline:
                raise BenchError("all_reduce ranks not ready before the timeout")
            time.sleep(0.02)  # polling a deadline, not waiting for an event

    def results(self, deadline: float) -> dict[str, list[float]]:
        got: dict[int, dict[str, list[float]]] = {}
        while len(got) < self.world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError("all_reduce sweep did not finish before the timeout")
            try:
                rank, out, err = self.resq.get(timeout=min(left, 0.5))
            except queue.Empty:
                dead = [p for p in self.procs if p.exitcode not in (None, 0)]
                if dead:
                    raise BenchError(
                        f"all_reduce rank process {dead[0].name} exited {dead[0].exitcode}"
                    ) from None
                continue
            if err is not None:
                raise BenchError(f"all_reduce rank {rank} failed:\n{err}")
            got[rank] = out
        return got[0]  # every rank holds the same per-sample maxima

    def close(self, failed: bool) -> None:
        """Join the ranks; after a failure they may be waiting for a go that never
        comes, so they are killed at once."""
        if not failed:
            for p in self.procs:
                p.join(timeout=10)
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


# --------------------------------------------------------------------------- in this process


def _gemm(torch: Any, dev: Any, item: Item, repeats: int) -> list[float]:
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    g = torch.Generator().manual_seed(0)
    a = torch.randn(item.size, item.size, generator=g).to(dev, dtype)
    b = torch.randn(item.size, item.size, generator=g).to(dev, dtype)
    c = torch.empty_like(a)
    for _ in range(WARMUP):
        torch.mm(a, b, out=c)
    if cuda:
        torch.cuda.synchronize(dev)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(item.inner):
            torch.mm(a, b, out=c)
        if cuda:
            torch.cuda.synchronize(dev)
        times.append((time.perf_counter() - t0) / item.inner)
    return times


def _h2d(torch: Any, dev: Any, item: Item, repeats: int) -> list[float]:
    host = torch.ones(item.size, dtype=torch.uint8).pin_memory()
    dst = torch.empty(item.size, dtype=torch.uint8, device=dev)
    for _ in range(WARMUP):
        dst.copy_(host, non_blocking=True)
    torch.cuda.synchronize(dev)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(item.inner):
            dst.copy_(host, non_blocking=True)
        torch.cuda.synchronize(dev)
        times.append((time.perf_counter() - t0) / item.inner)
    return times


def measure(opts: BenchOptions) -> Measurement:
    """Run the whole benchmark once; raises ``BenchError`` when it cannot."""
    if opts.device not in ("auto", "cpu", "cuda"):
        raise BenchError(f"device {opts.device!r}: expected auto, cpu or cuda")
    if opts.repeats < 3:
        raise BenchError("repeats: at least 3 (a median and its quartiles)")
    allowed = os.sched_getaffinity(0)
    if not set(opts.cpus) <= allowed:
        raise BenchError(
            f"cpus {sorted(set(opts.cpus) - allowed)}: not among this process's CPUs "
            f"{sorted(allowed)}"
        )
    start = time.monotonic()
    deadline = start + opts.timeout_s
    failed = True
    ranks: _Ranks | None = None
    device = opts.device
    world = opts.ranks or 2
    if device == "cuda" and opts.ranks is not None:
        ranks = _Ranks(device, world, opts, _sweep(items_for(device)))
    try:
        import torch
        import torch.distributed as dist

        has_gpu = torch.cuda.is_available()
        if device == "auto":
            device = "cuda" if has_gpu else "cpu"
        if device == "cuda":
            if not has_gpu:
                raise BenchError("device cuda: torch sees no GPU")
            world = opts.ranks or torch.cuda.device_count()
            if world > torch.cuda.device_count():
                raise BenchError(f"{world} ranks but {torch.cuda.device_count()} GPUs")
        if world < 1:
            raise BenchError("ranks: at least 1")
        items = items_for(device)
        if ranks is None:
            ranks = _Ranks(device, world, opts, _sweep(items))
        td = dt.timedelta(seconds=opts.timeout_s)
        master = dist.TCPStore("127.0.0.1", 0, None, True, timeout=td, wait_for_workers=False)
        for _ in range(world):
            ranks.portq.put(master.port)
        ranks.wait_ready(master, deadline)

        dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        before = os.sched_getaffinity(0)
        threads = torch.get_num_threads()
        samples: dict[str, list[float]] = {}
        try:
            if opts.cpus:
                os.sched_setaffinity(0, set(opts.cpus))
            torch.set_num_threads(1)
            for it in items:
                if it.benchmark == "gemm":
                    samples[it.name] = _gemm(torch, dev, it, opts.repeats)
                elif it.benchmark == "h2d":
                    samples[it.name] = _h2d(torch, dev, it, opts.repeats)
        finally:
            os.sched_setaffinity(0, before)
            torch.set_num_threads(threads)
        master.set("go", "1")
        samples.update(ranks.results(deadline))
        absent = {} if device == "cuda" else {"h2d": "no GPU on this node"}
        meta = {
            "torch": torch.__version__,
            "cpus": list(opts.cpus),
            "repeats": opts.repeats,
            "gemm_threads": 1,
            "inner": {it.name: it.inner for it in items},
        }
        failed = False
        return Measurement(
            device=device,
            ranks=world,
            backend="nccl" if device == "cuda" else "gloo",
            items=items,
            samples={it.name: samples[it.name] for it in items},
            absent=absent,
            meta=meta,
            elapsed_s=time.monotonic() - start,
        )
    finally:
        if ranks is not None:
            ranks.close(failed)


def _sweep(items: Sequence[Item]) -> list[Item]:
    return [it for it in items if it.benchmark == "all_reduce"]
