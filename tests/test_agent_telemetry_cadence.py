"""The agent's live samples each cover a real span, also when windows are shorter
than the sampling interval.

A sample's rates (run delay, stopped, throttled, CPU shares) cover the time since
the sample before it. A window that ends with no sample gets one at its close; the
periodic sample due soon after used to be taken anyway, covered a sliver (0.1 s), and
was its next window's only sample: on the real-job grid that read a run delay of
189% and no stopped figure at all (the state sampler needs 10 samples) in about one
window in seven, and a rank stopped 24% of every 100 ms lost its second measured
window in a row. Here a real ``Agent`` reads a real ring whose windows close every
0.85 s while the daemon's loop samples each second; a probe source (the narrow
interface hardware sources implement) records when it was sampled.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from artemis.agent.config import AgentConfig
from artemis.agent.daemon import Agent
from artemis.agent.telemetry.base import RankTarget
from artemis.ring.format import FUNC_CODES, KIND_COLL
from artemis.ring.writer import RingWriter

MS = 1_000_000
WINDOW_STEPS = 5
STEP_S = 0.17  # a window every 0.85 s: shorter than the 1 s interval
INTERVAL_S = 1.0
TICK_S = 0.02


class Probe:
    name = "probe"

    def __init__(self) -> None:
        self.now = 0.0
        self.at: dict[int, list[float]] = {}

    def sample(self, target: RankTarget) -> dict[str, object]:
        self.at.setdefault(target.rank, []).append(self.now)
        return {"run_delay_pct": 30.0}


def test_no_sample_covers_a_sliver_and_every_window_has_one(tmp_path: Path) -> None:
    rings = [RingWriter(tmp_path, "cad", 0xC0, r, 2) for r in range(2)]
    probe = Probe()
    shipped: list[Any] = []

    def send(msg: object) -> int:
        shipped.extend(msg.windows)  # type: ignore[attr-defined]
        return len(shipped)

    cfg = AgentConfig(
        shm_dir=str(tmp_path), host="h", window_steps=WINDOW_STEPS, telemetry_interval_s=INTERVAL_S
    )
    agent = Agent(cfg, [probe], send, lambda: 0)
    agent.scan()
    step, last_tel, now = 0, 0.0, 0.0
    while now < 30.0:
        probe.now = now
        while (step + 1) * STEP_S <= now:  # the job's steps up to now
            t = int((1 + step * STEP_S) * 1e9)
            for r, w in enumerate(rings):
                w.record(
                    kind=KIND_COLL,
                    func=FUNC_CODES["AllReduce"],
                    coll_seq=step,
                    nbytes=4,
                    start=t + (r + 1) * MS,
                    end=t + 5 * MS,
                )
            step += 1
        agent.ship(agent.tick(now))  # the daemon's loop: windows first, then samples
        if now - last_tel >= INTERVAL_S:
            agent.sample_telemetry(now)
            last_tel = now
        now = round(now + TICK_S, 6)
    for w in rings:
        w.close()
    assert len(shipped) > 2 * 25  # 30 s of 0.85 s windows, 2 ranks
    for rank, at in probe.at.items():
        spans = [b - a for a, b in itertools.pairwise(at)]
        assert min(spans) >= INTERVAL_S / 2 - TICK_S, (rank, sorted(spans)[:5])
    # and every window still has its telemetry
    assert all(w.telemetry.run_delay_pct == 30.0 for w in shipped)
