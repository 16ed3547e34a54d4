"""The lockstep model: what a synchronous job's collectives look like, step by step.

Pure and deterministic for a given scenario and seed. Only the GPUs and the
training loop are simulated; everything downstream (plugin, rings, agents,
coordinator) is real.

One step of an island (one communicator per island, as NCCL and RCCL cannot
share one):
  compute_0 -> collective_0 -> compute_1 -> collective_1 ... collective_{C-1}
A collective starts on a rank when that rank arrives (its kernel launches and
waits inside for the others) and ends for everyone when the last rank arrives
plus the transfer time. With two or more islands the island leaders then
exchange over a bridge (a record in the leader's ring, as a bridge such as
GPUBridge would write) and every rank waits for it inside a Broadcast on its
island's communicator, so waiting for the other island is time inside a
collective, never compute gap.

Each host gets its own device-clock offset: nothing downstream may assume that
clocks agree across hosts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from artemis.sim.physics import fault_state
from artemis.sim.scenario import COMPUTE_FAULTS, Scenario

TRANSFER_FRAC = 0.10  # share of a healthy step spent transferring in collectives
BRIDGE_FRAC = 0.03  # bridge exchange per step, relative to step_ms
BCAST_MS = 0.05  # the island broadcast after the bridge
LAUNCH_MS = 0.01  # arrival at the broadcast right after the previous collective
HOST_CLOCK_OFFSET_NS = 1_000_000_000_000  # per host: clocks never agree across hosts
# Tensor parallelism (`[job] tp`): each step first runs the layers' TP all-reduces
# inside each group (sizes differ, so a step is their period, as the agent infers
# it), taking TP_SHARE of the compute before them; the data-parallel buckets follow.
TP_BYTES = (16 << 20, 8 << 20, 8 << 20, 4 << 20)
TP_SHARE = 0.4
TP_FRAC = 0.04  # TP transfer per step, relative to step_ms


@dataclass(frozen=True)
class CollSpec:
    func: str
    bytes: int
    weight: float  # share of the step's compute that precedes this collective
    transfer_share: float  # share of the step's transfer time


def step_pattern(colls: int) -> tuple[CollSpec, ...]:
    """A realistic step: all-reduce buckets of different sizes (first bucket largest),
    preceded by a small all-gather when there are four or more collectives."""
    specs: list[CollSpec] = []
    n_ar = colls
    if colls >= 4:
        specs.append(CollSpec("AllGather", 4 << 20, 0.05, 0.05))
        n_ar -= 1
    sizes = [int(2 ** (26 - min(i, 4))) for i in range(n_ar)]  # 64 MiB, 32 MiB, ...
    total = float(sum(sizes))
    rest = 1.0 - sum(s.weight for s in specs)
    rest_t = 1.0 - sum(s.transfer_share for s in specs)
    # Backward compute before each bucket decreases along the step.
    raw_w = np.linspace(1.5, 0.5, n_ar) if n_ar > 1 else np.ones(1)
    raw_w = raw_w / raw_w.sum() * rest
    for i, b in enumerate(sizes):
        specs.append(CollSpec("AllReduce", b, float(raw_w[i]), rest_t * b / total))
    return tuple(specs)


@dataclass
class WindowTimes:
    """Everything that happens in one window, in virtual ns per host clock.

    arrive[s, r, k]: device time rank r starts collective k of step s.
    end[s, r, k]:    device time collective k of step s ends on rank r.
    bridge[s, i]:    (start, end) of island i's leader bridge record, if islands > 1.
    """

    window: int
    steps: range
    arrive: np.ndarray  # int64 [S, R, K]
    end: np.ndarray  # int64 [S, R, K]
    bridge_start: np.ndarray | None  # int64 [S, I]
    bridge_end: np.ndarray | None  # int64 [S, I]
    compute_ms: np.ndarray  # float [S, R] compute time per step, for checks
    hang_rank: int | None = None  # the rank that stops arriving in this window
    hang_step: int | None = None
    # tp > 1: the TP collectives of each step, on each rank's group communicator
    tp_arrive: np.ndarray | None = None  # int64 [S, R, len(TP_BYTES)]
    tp_end: np.ndarray | None = None


class LockstepModel:
    def __init__(self, scenario: Scenario) -> None:
        self.sc = scenario
        self.pattern = step_pattern(scenario.collectives_per_step)
        self.islands = scenario.island_names
        self.multi = len(self.islands) > 1
        self.island_of = np.array([self.islands.index(i) for i in scenario.islands])
        self.leaders = [scenario.island_ranks(i)[0] for i in self.islands]
        self.rng = np.random.default_rng(scenario.seed)
        self.host_offset = np.array(
            [
                (scenario.host_of(r) + 1) * HOST_CLOCK_OFFSET_NS + 7919 * scenario.host_of(r)
                for r in range(scenario.ranks)
            ],
            dtype=np.int64,
        )
        # Virtual time (ns since job start, common reference before host offsets).
        self.t_ns = 0
        self.speed = np.array([scenario.speed(r) for r in range(scenario.ranks)])
        # The noise model's own stream, so a scenario without its keys draws the
        # very compute noise it drew before they existed.
        self.rng_x = np.random.default_rng([scenario.seed, 0xA17E])
        if scenario.rank_spread > 0:
            # Healthy GPUs differ: a fixed per-rank speed offset (binning, cooling).
            off = self.rng_x.standard_normal(scenario.ranks) * scenario.rank_spread
            self.speed = self.speed / np.clip(1.0 + off, 0.5, None)

    @property
    def colls_per_step(self) -> int:
        """Collectives per step on each island communicator (with the bridge broadcast)."""
        return len(self.pattern) + (1 if self.multi else 0)

    def slowdowns(self, window: int) -> tuple[np.ndarray, np.ndarray, float]:
        """Per-rank compute slowdown, per-island transfer slowdown, bridge slowdown."""
        sc = self.sc
        comp = np.zeros(sc.ranks)
        xfer = np.zeros(len(self.islands))
        link = 0.0
        for f in sc.faults:
            if not f.active(window):
                continue
            lvl = f.level(window)
            if f.kind in COMPUTE_FAULTS:
                # the physical model: e.g. a thermal fault's slowdown follows from its clocks
                comp[list(f.ranks)] += fault_state(f.kind, f.slowdown, lvl, 0.0).slowdown
            elif f.kind == "software":
                # its kernels and its collectives' transfers alike (physics.fault_state)
                s = fault_state(f.kind, f.slowdown, lvl, 0.0).slowdown
                comp[list(f.ranks)] += s
                for i in sorted({int(self.island_of[r]) for r in f.ranks}):
                    xfer[i] += s
            elif f.kind == "island":
                comp[list(f.ranks)] += f.slowdown * lvl
            elif f.kind == "collective" and f.island is not None:
                xfer[self.islands.index(f.island)] += f.slowdown * lvl
            elif f.kind == "link":
                link += f.slowdown * lvl
        return comp, xfer, link

    def _recurring_stalls(self, w: int, compute: np.ndarray) -> np.ndarray:
        """`stalls` faults: the rank sleeps `slowdown` x step_ms before a pseudo-random
        `share` of its steps, whatever its share of the batch (a fixed wait, not work).
        Drawn from the fault's own stream, so the other draws stay as they were."""
        for f in self.sc.faults:
            lvl = f.level(w) if f.kind == "stalls" else 0.0
            if lvl <= 0:
                continue
            ranks = list(f.ranks)
            u = np.random.default_rng([f.seed, w, 0x57A1]).random((compute.shape[0], len(ranks)))
            compute = compute.copy()
            compute[:, ranks] += np.where(u < f.share, f.slowdown * lvl * self.sc.step_ms, 0.0)
        return compute

    def hang_at(self, window: int) -> int | None:
        for f in self.sc.faults:
            if f.kind == "hang" and f.start_window == window:
                return f.ranks[0]
        return None

    def window(self, w: int, samples: np.ndarray | None = None) -> WindowTimes:
        """Times for window w. `samples` ([steps, ranks] or [ranks]) scales compute
        when the job honours a rebalance plan; None = the uniform split."""
        sc = self.sc
        S, R, K = sc.window_steps, sc.ranks, self.colls_per_step
        comp_slow, xfer_slow, link_slow = self.slowdowns(w)
        uniform = sc.global_batch / sc.ranks
        share = (
            np.ones((S, R))
            if samples is None
            else np.broadcast_to(np.asarray(samples, float) / uniform, (S, R))
        )
        base = sc.step_ms / self.speed * (1.0 + comp_slow)  # [R]
        noise = self.rng.standard_normal((S, R))
        compute = base[None, :] * share * np.clip(1.0 + sc.noise * noise, 0.2, None)  # [S, R]
        x = self.rng_x
        if sc.shared_jitter > 0:
            # data-dependent step length (sequence lengths, MoE routing): every rank alike
            compute = compute * np.clip(
                1.0 + sc.shared_jitter * x.standard_normal((S, 1)), 0.2, None
            )
        if sc.stall_prob > 0:
            # one-off stalls (GC, page faults, a slow read): rare, exponential length
            hit = x.random((S, R)) < sc.stall_prob
            compute = compute + np.where(hit, x.exponential(sc.stall_ms, (S, R)), 0.0)
        compute = self._recurring_stalls(w, compute)
        weights = np.array([p.weight for p in self.pattern])
        nI = len(self.islands)
        # Transfers and bridges vary step to step too (congestion, adaptive routing).
        transfer_ms = (
            sc.step_ms * TRANSFER_FRAC * np.array([p.transfer_share for p in self.pattern])
        )[None, None, :] * np.clip(1.0 + sc.noise * x.standard_normal((S, nI, 1)), 0.2, None)
        bridge_ms = (
            sc.step_ms
            * BRIDGE_FRAC
            * (1.0 + link_slow)
            * np.clip(1.0 + sc.noise * x.standard_normal(S), 0.2, None)
        )

        if sc.tp > 1:
            return self._window_tp(w, compute, weights, transfer_ms[:, 0, :], xfer_slow[0])

        arrive = np.zeros((S, R, K), dtype=np.int64)
        end = np.zeros((S, R, K), dtype=np.int64)
        b_start = np.zeros((S, nI), dtype=np.int64) if self.multi else None
        b_end = np.zeros((S, nI), dtype=np.int64) if self.multi else None
        members = [np.flatnonzero(self.island_of == i) for i in range(nI)]
        ms = 1_000_000.0
        t = float(self.t_ns)
        for s in range(S):
            island_end = np.zeros(nI)
            for i, idx in enumerate(members):
                ti = t
                for k in range(len(self.pattern)):
                    a = ti + compute[s, idx] * weights[k] * ms
                    e = a.max() + transfer_ms[s, i, k] * (1.0 + xfer_slow[i]) * ms
                    arrive[s, idx, k] = a.astype(np.int64)
                    end[s, idx, k] = int(e)
                    ti = e
                island_end[i] = ti
            if self.multi:
                assert b_start is not None and b_end is not None
                b = island_end.max() + bridge_ms[s] * ms
                for i, idx in enumerate(members):
                    b_start[s, i] = int(island_end[i])
                    b_end[s, i] = int(b)
                    arrive[s, idx, K - 1] = int(island_end[i] + LAUNCH_MS * ms)
                    end[s, idx, K - 1] = int(b + BCAST_MS * ms)
                t = b + BCAST_MS * ms
            else:
                t = island_end.max()
        self.t_ns = int(t)
        off = self.host_offset
        arrive += off[None, :, None]
        end += off[None, :, None]
        if b_start is not None and b_end is not None:
            lead_off = off[np.array(self.leaders)]
            b_start += lead_off[None, :]
            b_end += lead_off[None, :]
        steps = range(w * S, (w + 1) * S)
        return WindowTimes(
            w,
            steps,
            arrive,
            end,
            b_start,
            b_end,
            compute,
            hang_rank=self.hang_at(w),
            hang_step=steps.start if self.hang_at(w) is not None else None,
        )

    def _window_tp(
        self,
        w: int,
        compute: np.ndarray,
        weights: np.ndarray,
        transfer_ms: np.ndarray,
        xfer_slow: float,
    ) -> WindowTimes:
        """One island with tensor parallelism: groups of `tp` consecutive ranks, each
        on its own communicator, and one data-parallel communicator per TP position.
        Each rank keeps its own time: a collective ends for its members when the
        last of them arrives plus the transfer, so a slow rank delays its group's
        TP collectives and, through its partners, every DP communicator."""
        sc = self.sc
        S, R, K, tp = sc.window_steps, sc.ranks, len(self.pattern), sc.tp
        T = len(TP_BYTES)
        G = R // tp
        tp_w = TP_SHARE * np.asarray(TP_BYTES, float) / sum(TP_BYTES)
        tp_ms = (sc.step_ms * TP_FRAC * np.asarray(TP_BYTES, float) / sum(TP_BYTES))[
            None, None, :
        ] * np.clip(1.0 + sc.noise * self.rng_x.standard_normal((S, G, 1)), 0.2, None)
        dp_w = weights * (1.0 - TP_SHARE)
        arrive = np.zeros((S, R, K), dtype=np.int64)
        end = np.zeros((S, R, K), dtype=np.int64)
        tp_arrive = np.zeros((S, R, T), dtype=np.int64)
        tp_end = np.zeros((S, R, T), dtype=np.int64)
        ms = 1_000_000.0
        t = np.full(R, float(self.t_ns))
        for s in range(S):
            for j in range(T):
                a = t + compute[s] * tp_w[j] * ms
                last = a.reshape(G, tp).max(axis=1)  # per TP group
                t = np.repeat(last + tp_ms[s, :, j] * ms, tp)
                tp_arrive[s, :, j] = a.astype(np.int64)
                tp_end[s, :, j] = t.astype(np.int64)
            for k in range(K):
                a = t + compute[s] * dp_w[k] * ms
                last = a.reshape(G, tp).max(axis=0)  # per DP communicator (TP position)
                t = np.tile(last + transfer_ms[s, k] * (1.0 + xfer_slow) * ms, G)
                arrive[s, :, k] = a.astype(np.int64)
                end[s, :, k] = t.astype(np.int64)
        self.t_ns = int(t.max())
        off = self.host_offset
        arrive += off[None, :, None]
        end += off[None, :, None]
        tp_arrive += off[None, :, None]
        tp_end += off[None, :, None]
        steps = range(w * S, (w + 1) * S)
        hang = self.hang_at(w)
        return WindowTimes(
            w,
            steps,
            arrive,
            end,
            None,
            None,
            compute,
            hang_rank=hang,
            hang_step=steps.start if hang is not None else None,
            tp_arrive=tp_arrive,
            tp_end=tp_end,
        )
