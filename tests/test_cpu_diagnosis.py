"""CPU-time host diagnosis: the summariser's ``gap_busy_pct`` from per-record CPU times,
and the diagnosis telling an input stall (idle gap) from CPU contention (busy gap)."""

from __future__ import annotations

import numpy as np
from artemis.agent.summary import WindowSummarizer
from artemis.detect.diagnosis import diagnose
from artemis.protocol.records import Telemetry
from artemis.ring import format as rf


def _records(n: int, gap_ns: int, coll_ns: int, cpu_in_gap_ns: int) -> np.ndarray:
    """n collectives, one per step: a gap of gap_ns (cpu_in_gap_ns of it busy), then coll_ns."""
    r = np.zeros(n, dtype=rf.SLOT_CPU_DTYPE)
    t, cpu = 1_000_000, 5_000
    for i in range(n):
        t += gap_ns
        cpu += cpu_in_gap_ns
        r[i]["start"], r[i]["cpu_start_ns"] = t, cpu
        t += coll_ns
        cpu += coll_ns // 10  # some CPU inside the collective: not part of the gap
        r[i]["end"], r[i]["cpu_end_ns"] = t, cpu
    r["kind"], r["state"], r["clock"] = rf.KIND_COLL, rf.STATE_DONE, rf.REC_HOST
    r["func"], r["bytes"] = rf.FUNC_CODES["AllReduce"], 4096
    r["coll_seq"] = np.arange(n)
    return r


def _windows(cpu_in_gap_ns: int, cpu_times: bool = True) -> list[float | None]:
    recs = _records(40, gap_ns=10_000_000, coll_ns=2_000_000, cpu_in_gap_ns=cpu_in_gap_ns)
    if not cpu_times:
        recs["cpu_start_ns"] = recs["cpu_end_ns"] = 0
    s = WindowSummarizer("j", "c", 0, 2, "h", window_steps=10, colls_per_step=1, clock_kind="host")
    s.feed(recs)
    return [w.telemetry.gap_busy_pct for w in s.flush()]


def test_gap_busy_is_cpu_time_in_the_gaps_over_their_length() -> None:
    assert _windows(2_500_000) == [25.0] * 4  # 2.5 ms of CPU in each 10 ms gap
    assert _windows(10_000_000) == [100.0] * 4
    assert _windows(0) == [0.0] * 4
    assert _windows(2_500_000, cpu_times=False) == [None] * 4  # a ring without CPU slots


PEERS = [Telemetry(gap_busy_pct=95.0, psi_cpu_some=2.0, load1=1.0, ncpu=8)] * 3


def test_idle_gap_is_an_input_stall() -> None:
    c = diagnose(Telemetry(gap_busy_pct=8.0, psi_cpu_some=2.0, load1=1.0, ncpu=8), PEERS)
    assert c.kind == "host"
    assert c.text.startswith("input stall: the process was idle for 92% of its compute gap")
    assert c.evidence["gap_busy_pct"] == 8.0 and c.evidence["peers_gap_busy_pct"] == 95.0


def test_busy_gap_with_pressure_is_contention() -> None:
    c = diagnose(Telemetry(gap_busy_pct=90.0, psi_cpu_some=60.0, load1=20.0, ncpu=8), PEERS)
    assert c.kind == "host"
    assert c.text.startswith("host CPU contention (CPU pressure 60%")
    assert "busy 90% of its compute gap" in c.text
    assert c.evidence["psi_cpu_some"] == 60.0 and c.evidence["gap_busy_pct"] == 90.0


def test_idle_gap_on_a_crowded_host_is_still_a_stall_relative_to_its_peers() -> None:
    # every gap waits for a core here (peers 40% busy); the stalled rank is far below
    peers = [Telemetry(gap_busy_pct=40.0, psi_cpu_some=80.0, load1=24.0, ncpu=8)] * 3
    c = diagnose(Telemetry(gap_busy_pct=9.0, psi_cpu_some=80.0, load1=24.0, ncpu=8), peers)
    assert c.kind == "host" and c.text.startswith("input stall")
    # a rank as busy as its crowded peers is no stall; and contention that every
    # peer shares does not tell this rank from them (diagnosis by consistency:
    # evidence present on this rank and absent on its peers), so nothing is named
    c = diagnose(Telemetry(gap_busy_pct=35.0, psi_cpu_some=80.0, load1=24.0, ncpu=8), peers)
    assert c.kind == "unknown" and "input stall" not in c.text


def test_period_is_found_past_a_real_jobs_start_up_collectives() -> None:
    # DDP's start-up (an all_gather, parameter broadcasts, the first bucket
    # pass) precedes the steady pattern of 2 collectives per step.
    n = 200
    recs = _records(n, gap_ns=1_000_000, coll_ns=100_000, cpu_in_gap_ns=0)
    recs["bytes"][1::2] = 1024
    recs["func"][:6] = [rf.FUNC_CODES[f] for f in ("AllGather", "Broadcast", "Broadcast")] * 2
    recs["bytes"][:6] = [8, 144, 330756, 28, 4, 330756]
    s = WindowSummarizer("j", "c", 0, 2, "h", window_steps=10, clock_kind="host")
    s.feed(recs)
    assert s.colls_per_step == 2
    assert len(s.flush()) == 10
