"""HostSource on fixture /proc trees; expectations computed from the fixture numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
from artemis.agent.telemetry import HostSource, RankTarget

# user nice system idle iowait irq softirq steal guest guest_nice
STAT0 = [1000, 50, 300, 8000, 200, 10, 20, 40, 0, 0]
STAT1 = [1600, 50, 500, 8900, 260, 20, 30, 100, 0, 0]


def write_stat(root: Path, cpu: list[int], ncpu: int = 3) -> None:
    lines = ["cpu  " + " ".join(map(str, cpu))]
    lines += [f"cpu{i} " + " ".join(["1"] * len(cpu)) for i in range(ncpu)]
    lines += ["intr 12345 0 0", "ctxt 999", "btime 1700000000", "processes 4242"]
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/stat").write_text("\n".join(lines) + "\n")


def write_pid_stat(root: Path, pid: int, utime: int, stime: int) -> None:
    d = root / f"proc/{pid}"
    d.mkdir(parents=True, exist_ok=True)
    # the name holds spaces and a parenthesis, as python scripts' threads may
    fields = ["S", "1", "1", "1", "0", "-1", "4194304", "100", "0", "0", "0"]
    fields += [str(utime), str(stime), "0", "0", "20", "0", "8", "0", "12345"]
    (d / "stat").write_text(f"{pid} (pt main) x) " + " ".join(fields) + "\n")


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_cpu_shares_from_stat_deltas(tmp_path: Path) -> None:
    write_stat(tmp_path, STAT0)
    src = HostSource(tmp_path)
    write_stat(tmp_path, STAT1)
    got = src.sample(RankTarget(rank=0))
    d = [b - a for a, b in zip(STAT0[:8], STAT1[:8], strict=True)]
    total = sum(d)
    busy = d[0] + d[1] + d[2] + d[5] + d[6]
    assert got["cpu_pct"] == pytest.approx(100 * busy / total)
    assert got["steal_pct"] == pytest.approx(100 * d[7] / total)
    assert got["iowait_pct"] == pytest.approx(100 * d[4] / total)
    assert got["ncpu"] == 3
    # the next rank of the pass, no tick later: the same (host-wide) shares
    again = src.sample(RankTarget(rank=1))
    assert again["cpu_pct"] == got["cpu_pct"] and again["steal_pct"] == got["steal_pct"]


def test_every_rank_of_a_pass_gets_the_hosts_shares_until_they_are_stale(tmp_path: Path) -> None:
    write_stat(tmp_path, STAT0)
    clock = FakeClock()
    src = HostSource(tmp_path, clock=clock)
    assert "cpu_pct" not in src.sample(RankTarget(rank=0))  # no tick since the source was made
    write_stat(tmp_path, STAT1)
    clock.t += 0.5
    first = [src.sample(RankTarget(rank=r)) for r in range(4)]  # one pass over 4 ranks
    assert all(s["cpu_pct"] == first[0]["cpu_pct"] for s in first), first
    # the next delta is taken from STAT1 (the pass moved nothing on): all idle ticks
    write_stat(tmp_path, [*STAT1[:3], STAT1[3] + 1000, *STAT1[4:]])
    clock.t += 0.5
    assert src.sample(RankTarget(rank=0))["cpu_pct"] == pytest.approx(0.0)
    clock.t += 11.0  # no tick for longer than SHARES_MAX_AGE_S: missing
    assert "cpu_pct" not in src.sample(RankTarget(rank=0))


def test_psi_load_and_missing_files(tmp_path: Path) -> None:
    write_stat(tmp_path, STAT0)
    (tmp_path / "proc/loadavg").write_text("3.25 2.10 1.05 4/812 98765\n")
    src = HostSource(tmp_path)
    got = src.sample(RankTarget(rank=0))
    assert got["load1"] == 3.25
    assert "psi_cpu_some" not in got  # kernel without PSI
    (tmp_path / "proc/pressure").mkdir()
    (tmp_path / "proc/pressure/cpu").write_text(
        "some avg10=12.34 avg60=5.00 avg300=1.00 total=123456\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert src.sample(RankTarget(rank=0))["psi_cpu_some"] == 12.34
    empty = HostSource(tmp_path / "nothing").sample(RankTarget(rank=0, pid=1))
    assert empty == {}


def test_process_cpu_as_percent_of_one_core(tmp_path: Path) -> None:
    write_stat(tmp_path, STAT0)
    clock = FakeClock()
    src = HostSource(tmp_path, clock=clock, clk_tck=100)
    write_pid_stat(tmp_path, 4242, utime=500, stime=100)
    first = src.sample(RankTarget(rank=0, pid=4242))
    assert "proc_cpu_pct" not in first  # primes the pid
    clock.t += 2.0
    write_pid_stat(tmp_path, 4242, utime=640, stime=150)
    got = src.sample(RankTarget(rank=0, pid=4242))
    ticks = (640 + 150) - (500 + 100)
    assert got["proc_cpu_pct"] == pytest.approx(100 * ticks / 100 / 2.0)
    # the process went away: missing, not zero
    (tmp_path / "proc/4242/stat").unlink()
    clock.t += 1.0
    assert "proc_cpu_pct" not in src.sample(RankTarget(rank=0, pid=4242))


def test_on_the_real_proc_values_are_in_range() -> None:
    import os

    src = HostSource()
    src.sample(RankTarget(rank=0, pid=os.getpid()))
    sum(i * i for i in range(200_000))  # burn some CPU between samples
    got = src.sample(RankTarget(rank=0, pid=os.getpid()))
    assert got["ncpu"] == os.cpu_count() or got["ncpu"] >= 1
    assert 0.0 <= float(got.get("proc_cpu_pct", 0.0)) <= 100.0 * (os.cpu_count() or 1)
    for k in ("cpu_pct", "steal_pct", "iowait_pct"):
        if k in got:
            assert 0.0 <= float(got[k]) <= 100.0
