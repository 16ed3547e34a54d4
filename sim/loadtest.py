"""`artemis loadtest`: many synthetic agents against a real coordinator, over the real protocol.

Each simulated agent is the real agent's uplinks (`agent/uplinks.py`: `AgentLink`s
over TCP, the HMAC handshake with the given secret, the outbox, acks, resends, and a
coordinator fleet's redirects followed to each job's owner): only the training job
behind it is synthetic. Agent a watches ranks [a*K, (a+1)*K) of one job and, once per
window, sends one columnar `windows` message (protocol minor 1.1) with those
ranks' summaries of that window, built as arrays (no per-rank objects, so the
generator is not the bottleneck). Windows are paced at one per `window_s`.

The synthetic job is synchronous: every rank computes `gap_ms` per step, a
rank given `--straggler RANK:SLOWDOWN` computes `SLOWDOWN` times longer (a step-time
factor > 1: 1.3 is 30% slower; scenario files say `slowdown = 0.3`, a fraction), and
the step time is set by the slowest rank; the others wait the difference in
their collectives. A small deterministic per-rank spread (0.2 %) keeps the
peers realistic without ever reaching a suspicion threshold.

The run's communicator hash is random per run, as NCCL's is, so a second run
of the same job id is a new run to the coordinator, not a resend.

The outcome is what the coordinator acknowledged: `LoadResult.acked` counts
the summaries in messages the coordinator acked ("the app has it"). Whether
they were scored and who was flagged is for the coordinator's own outputs
(findings JSONL, /metrics) to say.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog
from artemis.agent.uplinks import Uplinks
from artemis.protocol.addresses import parse_address_list
from artemis.protocol.client import AgentIdentity
from artemis.protocol.columns import COLUMNS, WindowColumns
from artemis.protocol.messages import PROTOCOL_VERSION, RankInfo, Windows
from artemis.protocol.tcp import TcpTransport

log = structlog.get_logger("artemis.loadtest")

STEPS_PER_WINDOW = 50
COLLS_PER_STEP = 4
GAP_MS = 80.0  # a healthy rank's compute per step
TRANSFER_MS = 18.0  # collective time once every rank arrived
SPREAD = 0.002  # per-rank deterministic spread of the healthy ranks' gap


@dataclass(frozen=True)
class LoadSpec:
    """What to play: `ranks` ranks of job `job`, `ranks_per_agent` per agent, `windows` windows."""

    coordinator: str
    secret: bytes
    ranks: int
    ranks_per_agent: int
    windows: int
    window_s: float = 1.0
    stragglers: Mapping[int, float] = field(default_factory=dict)
    job: str = "loadtest"
    comm: str = field(default_factory=lambda: secrets.token_hex(8))
    connect_timeout_s: float = 60.0
    ack_timeout_s: float = 120.0
    # The first `old_agents` agents speak protocol minor 1.0 (one map per rank), as
    # agents not yet upgraded do; the others speak PROTOCOL_VERSION (columns).
    old_agents: int = 0

    def __post_init__(self) -> None:
        parse_address_list(self.coordinator)  # AddressListError (a ValueError) names the entry
        if self.ranks < 1 or self.ranks_per_agent < 1 or self.windows < 1:
            raise ValueError("ranks, ranks_per_agent and windows must be >= 1")
        if not (self.window_s >= 0 and math.isfinite(self.window_s)):
            raise ValueError(f"window_s must be a finite number >= 0, got {self.window_s}")
        for r, slow in self.stragglers.items():
            if not (0 <= r < self.ranks):
                raise ValueError(f"straggler rank {r} is not in [0, {self.ranks})")
            if not (slow > 1 and math.isfinite(slow)):
                raise ValueError(
                    f"straggler rank {r}: expected a step-time factor > 1 ({FACTOR_HINT}),"
                    f" got {slow}"
                )

    @property
    def agents(self) -> int:
        return -(-self.ranks // self.ranks_per_agent)

    def agent_ranks(self, a: int) -> range:
        return range(a * self.ranks_per_agent, min(self.ranks, (a + 1) * self.ranks_per_agent))


@dataclass
class LoadResult:
    sent: int = 0  # rank-window summaries queued
    acked: int = 0  # of them, in messages the coordinator acked
    messages: int = 0
    connect_s: float = 0.0
    send_s: float = 0.0  # from the first window's send to the last ack
    late_windows: int = 0  # windows the generator could not start on time

    @property
    def ok(self) -> bool:
        return self.sent > 0 and self.acked == self.sent


# A factor, not a fraction: a factor of 0.25 once ran silently as a rank four times
# faster, which no straggler test means.
FACTOR_HINT = "1.3 = 30% slower"


def parse_straggler(text: str) -> tuple[int, float]:
    """`RANK:SLOWDOWN` (e.g. `17:1.3`) -> (17, 1.3). SLOWDOWN is a step-time factor > 1."""
    rank_s, sep, slow_s = text.partition(":")
    try:
        if not sep:
            raise ValueError
        rank, slow = int(rank_s), float(slow_s)
    except ValueError:
        raise ValueError(
            f"expected RANK:SLOWDOWN, SLOWDOWN a step-time factor (e.g. 17:1.3, {FACTOR_HINT}),"
            f" got {text!r}"
        ) from None
    if not (slow > 1 and math.isfinite(slow)):
        raise ValueError(
            f"expected a step-time factor > 1 ({FACTOR_HINT}), got {slow_s!r} in {text!r}"
        )
    return rank, slow


class _Template:
    """One agent's batch, built once; each window changes only the window-numbered columns."""

    def __init__(self, spec: LoadSpec, a: int) -> None:
        ranks = np.asarray(spec.agent_ranks(a), dtype=np.int64)
        n = int(ranks.size)
        host = f"lt-{a:05d}"
        slow = np.ones(n)
        for r, s in spec.stragglers.items():
            if ranks[0] <= r <= ranks[-1]:
                slow[r - ranks[0]] = s
        # Healthy spread is a fixed function of the rank, within +-SPREAD.
        spread = 1.0 + SPREAD * (((ranks * 7919) % 1000) / 500.0 - 1.0)
        gap = GAP_MS * np.where(slow != 1.0, slow, spread)
        slowest = GAP_MS * max([1.0 + SPREAD, *spec.stragglers.values()])
        step = slowest + TRANSFER_MS
        cols: dict[str, Any] = {}
        for name, kind in COLUMNS.items():
            if kind == "i":
                cols[name] = np.zeros(n, np.int64)
            elif kind in ("f", "of", "oi"):
                cols[name] = np.full(n, 0.0 if kind == "f" else math.nan)
            elif kind == "m":
                cols[name] = [()] * n
            else:
                cols[name] = [None] * n
        cols.update(
            job=[spec.job] * n,
            comm=[spec.comm] * n,
            host=[host] * n,
            clock=["device"] * n,
            island=["nvidia"] * n,
            hw_class=["H100"] * n,
            rank=ranks,
            nranks=np.full(n, spec.ranks, np.int64),
            gap_ms=gap,
            coll_ms=step - gap,
            step_ms=np.full(n, step),
            collectives=np.full(n, STEPS_PER_WINDOW * COLLS_PER_STEP, np.int64),
            bytes=np.full(n, STEPS_PER_WINDOW * COLLS_PER_STEP * (64 << 20), np.int64),
            samples=np.full(n, 32.0),
            tel_vendor=["nvidia"] * n,
            tel_gpu_model=["NVIDIA H100 80GB HBM3"] * n,
            tel_gpu_index=(ranks % 8).astype(np.float64),
            tel_sm_mhz=np.full(n, 1980.0),
            tel_sm_mhz_max=np.full(n, 1980.0),
            tel_temp_c=np.full(n, 60.0),
            tel_power_w=np.full(n, 500.0),
            tel_power_limit_w=np.full(n, 700.0),
            tel_throttle=[{"hw_thermal": False, "sw_power_cap": False}] * n,
            tel_pcie_gen=np.full(n, 5.0),
            tel_pcie_gen_max=np.full(n, 5.0),
            tel_pcie_width=np.full(n, 16.0),
            tel_pcie_width_max=np.full(n, 16.0),
            tel_cpu_pct=np.full(n, 30.0),
            tel_steal_pct=np.full(n, 0.0),
            tel_psi_cpu_some=np.full(n, 0.5),
            tel_load1=np.full(n, 8.0),
            tel_ncpu=np.full(n, 96.0),
            tel_proc_cpu_pct=np.full(n, 100.0),
        )
        self.n = n
        self.host = host
        self.cols = cols
        self.ranks = ranks

    def batch(self, w: int) -> WindowColumns:
        cols = dict(self.cols)
        n = self.n
        steps = STEPS_PER_WINDOW
        colls = steps * COLLS_PER_STEP
        cols["window"] = np.full(n, w, np.int64)
        cols["step_lo"] = np.full(n, w * steps, np.int64)
        cols["step_hi"] = np.full(n, (w + 1) * steps, np.int64)
        cols["coll_lo"] = np.full(n, w * colls, np.int64)
        cols["coll_hi"] = np.full(n, (w + 1) * colls, np.int64)
        return WindowColumns(n, cols)


async def run_load(spec: LoadSpec) -> LoadResult:
    """Connect every agent, send `spec.windows` windows paced at `window_s`, wait for the acks."""
    res = LoadResult()
    templates = [_Template(spec, a) for a in range(spec.agents)]
    links: list[Uplinks] = []
    addresses = parse_address_list(spec.coordinator)
    for t in templates:
        ident = AgentIdentity(
            agent_id=f"loadtest-{spec.job}-{t.host}",
            host=t.host,
            agent_version="loadtest",
            ranks=tuple(RankInfo(spec.job, spec.comm, int(r), spec.ranks) for r in t.ranks),
        )
        # The agent's own uplinks: a fleet's redirects are followed as an agent does.
        links.append(
            Uplinks(
                TcpTransport(),
                addresses,
                spec.secret,
                ident,
                outbox_capacity=spec.windows + 16,
                outbox_max_bytes=1 << 31,
                version=(1, 0) if len(links) < spec.old_agents else PROTOCOL_VERSION,
                backoff_base=0.05,
                backoff_cap=2.0,
            )
        )
    t0 = time.perf_counter()
    for link in links:
        link.start()
    try:
        await asyncio.gather(*(link.wait_connected(spec.connect_timeout_s) for link in links))
        res.connect_s = time.perf_counter() - t0
        log.info("loadtest agents connected", agents=len(links), seconds=round(res.connect_s, 2))
        last: list[int] = [0] * len(links)
        start = time.perf_counter()
        for w in range(spec.windows):
            due = start + w * spec.window_s
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif w and delay < -spec.window_s:
                res.late_windows += 1
            for i, (t, link) in enumerate(zip(templates, links, strict=True)):
                last[i] = link.enqueue(Windows(host=t.host, columns=t.batch(w)))
                res.sent += t.n
                res.messages += 1
            # Let the links write what was queued before building the next window.
            await asyncio.sleep(0)
        acked = await asyncio.gather(
            *(
                link.wait_acked(seq, spec.ack_timeout_s)
                for link, seq in zip(links, last, strict=True)
            ),
            return_exceptions=True,
        )
        res.send_s = time.perf_counter() - start
        for t, link, ok in zip(templates, links, acked, strict=True):
            # Acks are cumulative: the last seq acked means every earlier one was, unless
            # the outbox dropped some (it never does here: it holds every window).
            if ok is True and link.stats.dropped == 0:
                res.acked += t.n * spec.windows
    finally:
        await asyncio.gather(*(link.close(timeout=1.0) for link in links), return_exceptions=True)
    return res
