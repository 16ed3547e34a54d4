"""The real-job grid's workloads: DDP training scripts on the ``artemis`` backend.

``python -m bench.realjobs.workloads --model gpt|conv|mlp|lstm --out DIR [options]`` spawns
``--world`` ranks (gloo through ``artemis``, one CPU thread each, a file store under
DIR). Each rank writes ``DIR/pid<rank>`` before its first step (the grid's injectors
act on those processes from outside), and at its end ``DIR/trace<rank>.json``: per
step, the collective sequence number and CLOCK_MONOTONIC at the step's start (what
the grid's windows and slowdown are computed from). From ``--fault-from``, rank 0
writes ``DIR/onset.json`` (step, coll_seq, time) once, at the start of that step:
the grid starts its external faults on seeing it. The faults that live inside a job
start there too: ``--loader-sleep-rank R --loader-sleep-ms M`` (rank R's data loader
sleeps M ms before each batch: an input stall) and ``--bridge-delay-ms D`` (with
``--islands``: every bridge exchange between the island leaders takes D ms longer).
``--pin``: rank r runs on one CPU of those it may use, in blocks (`pinned_cpu`: ranks
0-1 on the first of 2 CPUs, 2-3 on the second), for the CPU hog.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# GPT: byte vocabulary, a short context, two pre-norm transformer blocks
GPT_VOCAB, GPT_CTX, GPT_DIM, GPT_HEADS, GPT_LAYERS, GPT_BATCH = 256, 64, 64, 4, 2, 4
MODELS = ("gpt", "conv", "mlp", "lstm")
# LSTM: a word-level language model the way others write one: batches bucketed by
# length (each rank's lengths its own, so steps differ by rank), ACCUM micro-batches
# a step under DDP's no_sync, and rank 0 evaluating every EVAL_EVERY steps
LSTM_VOCAB, LSTM_DIM, LSTM_HIDDEN, LSTM_BATCH, LSTM_LEN = 1000, 64, 128, 8, (16, 64)
ACCUM, EVAL_EVERY = 2, 40


def gpt() -> Any:
    """A small GPT language model: token and position embeddings, pre-norm causal
    self-attention blocks with a 4x MLP, a tied output head."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(GPT_DIM), nn.LayerNorm(GPT_DIM)
            self.attn = nn.MultiheadAttention(GPT_DIM, GPT_HEADS, batch_first=True)
            self.mlp = nn.Sequential(
                nn.Linear(GPT_DIM, 4 * GPT_DIM), nn.GELU(), nn.Linear(4 * GPT_DIM, GPT_DIM)
            )
            mask = torch.triu(torch.ones(GPT_CTX, GPT_CTX, dtype=torch.bool), diagonal=1)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, x: Any) -> Any:
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(GPT_VOCAB, GPT_DIM)
            self.pos = nn.Parameter(torch.zeros(1, GPT_CTX, GPT_DIM))
            self.blocks = nn.Sequential(*(Block() for _ in range(GPT_LAYERS)))
            self.ln = nn.LayerNorm(GPT_DIM)

        def forward(self, idx: Any) -> Any:
            x = self.blocks(self.tok(idx) + self.pos)
            return self.ln(x) @ self.tok.weight.T  # the head shares the embedding

    return GPT()


def conv() -> Any:
    """A small conv net on 3x32x32 images, 10 classes."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    )


def lstm() -> Any:
    """An LSTM language model: embedding, one LSTM layer, a linear output head."""
    from torch import nn

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(LSTM_VOCAB, LSTM_DIM)
            self.rnn = nn.LSTM(LSTM_DIM, LSTM_HIDDEN, batch_first=True)
            self.out = nn.Linear(LSTM_HIDDEN, LSTM_VOCAB)

        def forward(self, x: Any) -> Any:
            return self.out(self.rnn(self.emb(x))[0])

    return LM()


def model_and_loss(name: str) -> tuple[Any, Any, Any]:
    """(model, optimizer, loss of a batch) for a workload name."""
    import torch

    from bench._torch_steps import mlp

    f = torch.nn.functional
    if name == "gpt":
        m = gpt()
        opt: Any = torch.optim.AdamW(m.parameters(), lr=3e-4)

        def lm_loss(model: Any, b: Any) -> Any:
            logits = model(b[:, :-1])
            return f.cross_entropy(logits.reshape(-1, GPT_VOCAB), b[:, 1:].reshape(-1))

        return m, opt, lm_loss
    if name == "conv":
        m = conv()
        return (
            m,
            torch.optim.SGD(m.parameters(), lr=0.01),
            lambda model, b: f.cross_entropy(model(b[0]), b[1]),
        )
    if name == "mlp":
        m = mlp()
        return (
            m,
            torch.optim.SGD(m.parameters(), lr=0.01),
            lambda model, b: f.mse_loss(model(b[0]), b[1]),
        )
    if name == "lstm":
        m = lstm()

        def seq_loss(model: Any, b: Any) -> Any:
            logits = model(b[:, :-1])
            return f.cross_entropy(logits.reshape(-1, LSTM_VOCAB), b[:, 1:].reshape(-1))

        return m, torch.optim.Adam(m.parameters(), lr=1e-3), seq_loss
    raise ValueError(f"--model {name!r}: one of {', '.join(MODELS)}")


def batches(name: str, rank: int, steps: int) -> Iterator[Any]:
    """Synthetic batches, seeded per rank (token windows for the GPT)."""
    import torch

    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        if name == "gpt":
            yield torch.randint(0, GPT_VOCAB, (GPT_BATCH, GPT_CTX + 1), generator=g)
        elif name == "lstm":  # ACCUM micro-batches, each of its own bucket's length
            yield [
                torch.randint(0, LSTM_VOCAB, (LSTM_BATCH, n + 1), generator=g)
                for n in torch.randint(*LSTM_LEN, (ACCUM,), generator=g).tolist()
            ]
        elif name == "conv":
            yield torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        else:
            yield torch.randn(128, 64, generator=g), torch.randn(128, 1, generator=g)


def pinned_cpu(rank: int, world: int) -> int:
    """The CPU a ``--pin``ned rank runs on: consecutive ranks share one, as a node's
    local ranks take its cores in blocks. Not ``rank mod CPUs``: on 2 CPUs that pairs
    ranks 0 and 2, and that pair's median gap before any fault was 5-21% over
    ranks 1 and 3's in 20 of 20 hog runs (median 12%), which the grid counted as
    false flags; in blocks neither pair was slower by habit (-22% to +13%, median
    +3%, 20 runs; bench/README.md "Real jobs")."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[rank * len(cpus) // world]


def _write(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)  # the grid polls for it: never a half-written file


def _worker(rank: int, args: argparse.Namespace, init: str) -> None:
    if args.pin:
        os.sched_setaffinity(0, {pinned_cpu(rank, args.world)})
    import artemis.job  # noqa: F401  (registers the backend)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group(
        "artemis", init_method=f"file://{init}", rank=rank, world_size=args.world
    )
    out = Path(args.out)
    _write(out / f"pid{rank}", os.getpid())
    torch.manual_seed(0)
    m, opt, loss = model_and_loss(args.model)
    model = DDP(m)
    pg: Any = dist.group.WORLD
    seqs: list[int] = []
    times: list[int] = []
    for step, b in enumerate(batches(args.model, rank, args.steps)):
        seqs.append(pg.next_coll_seq())
        times.append(time.monotonic_ns())
        faulted = 0 <= args.fault_from <= step
        if step == args.fault_from:
            if rank == 0:
                _write(out / "onset.json", {"step": step, "coll_seq": seqs[-1], "t_ns": times[-1]})
            pg.bridge_delay_s = args.bridge_delay_ms / 1e3
        if faulted and rank == args.loader_sleep_rank:
            time.sleep(args.loader_sleep_ms / 1e3)  # waiting on storage: idle
        opt.zero_grad()
        micro = b if isinstance(b, list) else [b]
        for mb in micro[:-1]:  # accumulated without a collective, as DDP users do
            with model.no_sync():
                loss(model, mb).backward()
        loss(model, micro[-1]).backward()
        opt.step()
        if args.model == "lstm" and rank == 0 and step % EVAL_EVERY == EVAL_EVERY - 1:
            with torch.no_grad():  # evaluation on rank 0 only: the others wait for it
                m(micro[0][:, :-1])
    seqs.append(pg.next_coll_seq())
    times.append(time.monotonic_ns())
    _write(out / f"trace{rank}.json", {"coll_seq": seqs, "t_ns": times})
    dist.destroy_process_group()
    # end here: torch's exit-time race in gloo (tests/torch_exit.py); all is written
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, default="gpt")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--out", required=True, help="folder for pid, onset and trace files")
    p.add_argument("--fault-from", type=int, default=-1)
    p.add_argument("--loader-sleep-rank", type=int, default=-1)
    p.add_argument("--loader-sleep-ms", type=float, default=0.0)
    p.add_argument("--bridge-delay-ms", type=float, default=0.0)
    p.add_argument("--islands", default="", help="ARTEMIS_ISLANDS: one island per rank")
    p.add_argument("--pin", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch.multiprocessing as mp

    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.islands:
        os.environ["ARTEMIS_ISLANDS"] = args.islands  # the spawned ranks inherit it
    with tempfile.TemporaryDirectory(prefix="realjob-") as d:
        init = os.path.join(d, "store")
        mp.start_processes(_worker, args=(args, init), nprocs=args.world, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
