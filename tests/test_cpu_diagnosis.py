"""CPU-time host diagnosis: the summariser's ``gap_busy_pct`` from per-record CPU times,
and the diagnosis telling an input stall (idle gap) from CPU contention (busy gap)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from artemis.agent.summary import WindowSummarizer
from artemis.agent.telemetry.base import merge
from artemis.cli.run_summary import one_line, summary_lines
from artemis.detect.diagnosis import diagnose
from artemis.detect.incident_record import record
from artemis.detect.incident_state import Incident
from artemis.detect.monitor import JobMonitor
from artemis.detect.node_kind import cost_unit, is_cpu
from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import GPU_FIELDS, HOST_FIELDS, RankWindow, Telemetry
from artemis.ring import format as rf
from artemis.sim.scenario import Scenario, load_scenario
from test_incidents import SCENARIOS, T0, drive, sim_windows


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


# --------------------------------------------------------------------------- a CPU job
# (issue 31, item 9) A CPU rank reports what its host source measures and nothing of a
# GPU: its agent runs no GPU source, so `merge` lists every GPU field as missing.

GPU_TEL = Telemetry(vendor="nvidia", sm_mhz=1400.0, cpu_pct=20.0, ncpu=8)
CPU_TEL = merge([{"cpu_pct": 20.0, "steal_pct": 0.0, "load1": 2.0, "ncpu": 8}])


def test_a_cpu_rank_is_one_with_host_telemetry_and_nothing_of_a_gpu() -> None:
    assert is_cpu(CPU_TEL) and not is_cpu(GPU_TEL)
    assert not is_cpu(Telemetry(vendor="amd", cpu_pct=10.0))  # a vendor alone says GPU
    assert not is_cpu(Telemetry())  # nothing says what it runs on: not called a CPU
    assert set(GPU_FIELDS) <= set(CPU_TEL.missing)  # what the agent sends


def test_a_cpu_rank_misses_only_what_a_cpu_node_could_report() -> None:
    peers = [merge([{"cpu_pct": 20.0, "steal_pct": 0.0, "load1": 2.0, "ncpu": 8}])] * 3
    c = diagnose(CPU_TEL, peers, slowdown=0.15)
    assert c.kind == "unknown"
    assert c.missing and not set(c.missing) & set(GPU_FIELDS), c.missing
    assert set(c.missing) <= set(HOST_FIELDS)
    # the text says what was checked on a CPU rank, names no GPU signal and lists no
    # missing field (the run summary names them once per job)
    assert "CPU rank" in c.text and "SM clock" not in c.text and "missing" not in c.text
    # a GPU rank's missing still names its absent GPU fields
    g = diagnose(Telemetry(vendor="nvidia", cpu_pct=20.0, ncpu=8), [], slowdown=0.15)
    assert "sm_mhz" in g.missing and "missing" not in g.text


def test_host_contention_on_a_cpu_rank_names_no_gpu_clock() -> None:
    peers = [merge([{"psi_cpu_some": 2.0, "load1": 1.0, "ncpu": 8, "gap_busy_pct": 95.0}])] * 3
    rank = merge([{"psi_cpu_some": 60.0, "load1": 20.0, "ncpu": 8, "gap_busy_pct": 90.0}])
    c = diagnose(rank, peers)
    assert c.kind == "host" and "GPU" not in c.text and "clocks" not in c.text, c.text


def _cpu_windows(sc: Scenario) -> list[tuple[int, list[RankWindow]]]:
    """The scenario's windows as CPU nodes would send them: the simulated host fields
    only (the host source), the GPU ones missing."""
    return [
        (
            w,
            [
                dataclasses.replace(
                    rw,
                    telemetry=merge(
                        [{k: v for k, v in rw.telemetry.to_dict().items() if k in HOST_FIELDS}]
                    ),
                )
                for rw in rows
            ],
        )
        for w, rows in sim_windows(sc)
    ]


def _run(sc: Scenario, windows: list[tuple[int, list[RankWindow]]]) -> tuple[list[Any], ...]:
    m = JobMonitor("cpujob", Settings(), nranks=sc.ranks)
    outs = drive(m, windows)
    outs.append(m.finish(wall=T0 + 1000))
    lines = [f.to_json() for o in outs for f in o.findings]
    recs = [r for o in outs for r in o.incidents]
    rows = [r for o in outs for r in o.incident_rows if r["row"] == "subject"]
    return lines, recs, rows


@pytest.fixture(scope="module")
def flagship() -> Scenario:
    sc = load_scenario(SCENARIOS / "flagship.toml")  # rank 2's clocks locked from window 16
    return dataclasses.replace(sc, islands=("nvidia",) * sc.ranks)


def test_a_cpu_job_speaks_cpu(flagship: Scenario) -> None:
    lines, recs, rows = _run(flagship, _cpu_windows(flagship))
    flagged = [f for f in lines if f["state"] in ("flagged", "ongoing")]
    assert flagged and all(f["rank"] == 2 for f in flagged)
    for f in lines:  # `missing` on every line, only what a CPU node could report
        assert not set(f["missing"]) & set(GPU_FIELDS), f["missing"]
        if f["cause"]:
            assert "SM clock" not in f["cause"]["text"] and "missing:" not in f["cause"]["text"]
    # the human text: the live lines list no missing field; the summary names them once
    assert all("sm_mhz" not in one_line(f) for f in flagged)
    text = summary_lines(lines)
    said = [s for s in text if "telemetry not reported" in s]
    assert len(said) == 1 and "sm_mhz" not in said[0], text
    last = recs[-1]
    assert last["cost"]["unit"] == "cpu" and last["cost"]["gpu_hours"] > 0
    check = last["escalation"]["check"]
    assert "nvidia-smi" not in check and "top -H -p" in check and "schedstat" in check, check
    # the pace from onset: the subject's rows start at its onset, not at its flag
    inc_rows = [r["window"] for r in rows if r["incident"] == last["id"]]
    assert last["since"] < last["opened"]["window"]
    assert inc_rows == list(range(last["since"], last["closed"]["window"] + 1)), inc_rows


def test_the_same_job_on_gpus_keeps_gpu_hours(flagship: Scenario) -> None:
    lines, recs, _ = _run(flagship, sim_windows(flagship))
    assert recs[-1]["cost"]["unit"] == "gpu" and recs[-1]["cause"]["kind"] == "clocks"
    assert "nvidia-smi" in recs[-1]["escalation"]["check"]
    assert any("SM " in (f["cause"] or {}).get("text", "") for f in lines)


def test_cost_unit_of_a_window(flagship: Scenario) -> None:
    (_, rows), *_ = _cpu_windows(flagship)
    cpu = WindowColumns.from_records(rows)
    assert cost_unit(cpu) == "cpu"
    one_gpu = [dataclasses.replace(rows[0], telemetry=GPU_TEL), *rows[1:]]
    assert cost_unit(WindowColumns.from_records(one_gpu)) == "gpu"  # any GPU: GPU-hours
    bare = [dataclasses.replace(r, telemetry=Telemetry()) for r in rows]
    assert cost_unit(WindowColumns.from_records(bare)) == "gpu"  # nothing known: the contract's


def test_an_incident_record_refuses_an_unknown_unit() -> None:
    inc = Incident("i", "rank", "2", 2, [2], None, [], {"window": 3, "time": None}, 1)
    assert record(inc, "j", "r", 4, None, "cpu")["cost"]["unit"] == "cpu"
    with pytest.raises(ValueError, match="cost unit 'tpu' is not one of gpu, cpu"):
        record(inc, "j", "r", 4, None, "tpu")
