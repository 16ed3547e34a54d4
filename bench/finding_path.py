"""The path of a finding, measured (issue 28 "How the path is counted").

The product files whose code runs while one window flows from its ring slots to its
findings line: ``python -m bench.finding_path`` prints their count and list.

In process, the stages the daemons run: rings written by ``ring.writer.RingWriter``
(standing in for the profiler plugin, whose C files the real path adds: they are not
Python and not counted here), read by ``ring.reader.RingReader``, summarised by
``agent.summary.WindowSummarizer``, sent as a ``Windows`` message through the protocol
codec (encode, then ``FrameDecoder``), taken by the coordinator (``Coordinator``, with its
assembly journal), assembled and scored by its core, and written as a findings line.

Four ranks on two hosts, rank 1 slow from window 1. The first windows go through the
whole path untraced (imports, warm caches, the detector's history: rank 1 flagged); then
the last window's slots are written and its flow, from the first poll to its findings
line, is traced with ``sys.setprofile``: every Python function that runs is counted by
the file that holds it. The agent's telemetry sources (NVML, /proc) and the TCP
transport are not on this in-process path.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

from artemis.agent.summary import WindowSummarizer
from artemis.common.logs import setup_logging
from artemis.coordinator.journal import AssemblyJournal
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.service import Coordinator
from artemis.coordinator.sinks import FindingsWriter
from artemis.detect.settings import Settings
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.messages import RankInfo, Windows
from artemis.protocol.server import PeerInfo
from artemis.rebalance.outputs import PlansWriter
from artemis.ring import format as rf
from artemis.ring.reader import RingReader
from artemis.ring.writer import RingWriter

REPO = Path(__file__).resolve().parents[1]
NOT_PRODUCT = ("tests", "bench", "docs", "deploy", ".venv", "build")  # not the product
JOB, COMM, RANKS = "path", 0x5A17, 4
SLOW_RANK = 1
STEPS, COLLS = 10, 2  # steps per window, collectives per step
WINDOWS = 6  # windows 0..4 warm the path up; window 5 is traced
MS = 1_000_000
ALLREDUCE = 2


class Job:
    """Rings of a lockstep job: each step, every rank computes (rank 1 30 ms longer from
    window 1) and then joins two all-reduces that end when the last rank arrives."""

    def __init__(self, shm: Path) -> None:
        self.rings = [
            RingWriter(shm, JOB, COMM, r, RANKS, 1024, host=f"h{r // 2}") for r in range(RANKS)
        ]
        self.t = MS
        self.seq = 0

    def window(self, w: int) -> None:
        for _ in range(STEPS):
            compute = [100 * MS + (30 * MS if r == SLOW_RANK and w >= 1 else 0) for r in range(4)]
            arrive = [self.t + c for c in compute]
            end = max(arrive) + 5 * MS
            for r, ring in enumerate(self.rings):
                ring.record(
                    kind=rf.KIND_COLL, func=ALLREDUCE, coll_seq=self.seq, nbytes=4096,
                    start=arrive[r], end=end,
                )  # fmt: skip
                ring.record(
                    kind=rf.KIND_COLL, func=ALLREDUCE, coll_seq=self.seq + 1, nbytes=4096,
                    start=end + MS, end=end + 6 * MS,
                )  # fmt: skip
            self.seq += COLLS
            self.t = end + 6 * MS

    def close(self) -> None:
        for ring in self.rings:
            ring.close()


class Agents:
    """The agents' side of the path: poll each ring, summarise, one Windows frame per host."""

    def __init__(self, shm: Path) -> None:
        self.readers = [RingReader(p) for p in sorted(shm.glob("*.ring"))]
        self.summ: list[WindowSummarizer] = []
        for rd in self.readers:
            h = rd.header()
            self.summ.append(
                WindowSummarizer(
                    job=h.job, comm=h.comm, rank=h.rank, nranks=h.nranks, host=f"h{h.rank // 2}",
                    window_steps=STEPS, colls_per_step=COLLS, clock_kind=h.clock_kind,
                    tick_hz=h.tick_hz or None,
                )
            )  # fmt: skip

    def frames(self, final: bool = False) -> dict[str, bytes]:
        by_host: dict[str, list[Any]] = {}
        for rd, s in zip(self.readers, self.summ, strict=True):
            batch = rd.poll()
            s.add_lost(batch.lost)
            s.feed(batch.done)
            by_host.setdefault(s.host, []).extend(s.take_windows(final=final))
        return {h: encode(Windows(host=h, windows=ws)) for h, ws in by_host.items() if ws}

    def close(self) -> None:
        for rd in self.readers:
            rd.close()


def peer(host: str) -> PeerInfo:
    h = int(host[1:])
    ranks = tuple(RankInfo(JOB, f"{COMM:016x}", r, RANKS) for r in (2 * h, 2 * h + 1))
    return PeerInfo(host, host, "t", "i", ranks, "127.0.0.1:1", (1, 1), 0.0, 1)


class Tracer:
    """Every product file a Python function of which runs while on."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self._seen: dict[str, str | None] = {}

    def _product(self, filename: str) -> str | None:
        if filename not in self._seen:
            p = Path(filename).resolve()
            rel = None
            if p.suffix == ".py" and p.is_relative_to(REPO):  # not "<string>" and the like
                rel = str(p.relative_to(REPO))
                if rel.split("/", 1)[0] in NOT_PRODUCT:
                    rel = None
            self._seen[filename] = rel
        return self._seen[filename]

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            rel = self._product(frame.f_code.co_filename)
            if rel is not None:
                self.files.add(rel)


async def _deliver(c: Coordinator, frames: dict[str, bytes]) -> None:
    for host, data in frames.items():
        for msg in FrameDecoder().feed(data):
            assert isinstance(msg, Windows), msg
            await c.on_message(peer(host), msg)


def measure(tmp: Path) -> tuple[list[str], dict[str, Any]]:
    """The product files of one window's flow, and the findings line it wrote."""
    job = Job(tmp / "shm")
    agents = Agents(tmp / "shm")
    out = tmp / "findings.jsonl"
    c = Coordinator(
        Settings(),
        FindingsWriter(out),
        PlansWriter(tmp / "plans.jsonl"),
        Metrics(),
        deadline_s=30.0,
        grace_s=0.0,
        clock=lambda: 0.0,
    )  # fmt: skip  (no grace: every agent is connected before the first window)
    c.restore(AssemblyJournal(tmp / "findings.assembly"))
    for h in ("h0", "h1"):
        c.on_connect(peer(h))
    tracer = Tracer()

    async def run() -> None:
        for w in range(WINDOWS):
            job.window(w)
            last = w == WINDOWS - 1
            if last:
                sys.setprofile(tracer)
            try:
                await _deliver(c, agents.frames(final=last))
            finally:
                sys.setprofile(None)

    try:
        asyncio.run(run())
    finally:
        c.flush()  # the findings lines reach the file
        agents.close()
        job.close()
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    mine = [f for f in lines if f["window"] == WINDOWS - 1]
    if not mine:
        raise SystemExit(f"window {WINDOWS - 1} wrote no findings line: {lines}")
    return sorted(tracer.files), mine[0]


def main() -> int:
    setup_logging(level="ERROR")  # the scored windows' log lines are not this tool's output
    with tempfile.TemporaryDirectory(prefix="artemis-path-") as d:
        files, line = measure(Path(d))
    print(
        f"the path of a finding: {len(files)} Python product files"
        f" (window {line['window']}, rank {line['rank']} {line['state']};"
        " the plugin's C files are not counted)"
    )
    for f in files:
        print(f"  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
