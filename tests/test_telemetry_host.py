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
    import time

    src = HostSource()
    src.sample(RankTarget(rank=0, pid=os.getpid()))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.2:  # burn CPU between samples, 20 clock ticks or so
        sum(i * i for i in range(20_000))
    got = src.sample(RankTarget(rank=0, pid=os.getpid()))
    span = time.monotonic() - t0
    assert got["ncpu"] == os.cpu_count() or got["ncpu"] >= 1
    # utime and stime count whole clock ticks: over a short span a rate is off by up to
    # a tick at each end (a fresh clone's make test read 224% of 2 CPUs over ~20 ms)
    tick = 100.0 / os.sysconf("SC_CLK_TCK") / span
    assert 0.0 <= float(got.get("proc_cpu_pct", 0.0)) <= 100.0 * (os.cpu_count() or 1) + 2 * tick
    for k in ("cpu_pct", "steal_pct", "iowait_pct"):
        if k in got:
            assert 0.0 <= float(got[k]) <= 100.0


# -- run delay and cgroup throttling (issue 31: host causes by fit) -----------


def write_sched(root: Path, pid: int, delay_ns: int, cgroup: str, cpu_stat: str) -> None:
    d = root / f"proc/{pid}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "schedstat").write_text(f"123456789 {delay_ns} 42\n")
    (d / "cgroup").write_text(cgroup)
    (d / "stat").write_text(f"{pid} (x) S" + " 0" * 49 + "\n")


V1_CGROUP = "12:memory:/job\n4:cpu,cpuacct:/slurm/job1/rank3\n0::/\n"
V2_CGROUP = "0::/kubepods/pod1/rank3\n"


def test_run_delay_and_v1_cgroup_throttling_as_deltas(tmp_path: Path) -> None:
    write_stat(tmp_path, STAT0)
    clock = FakeClock()
    src = HostSource(tmp_path, clock=clock, clk_tck=100)
    cg = tmp_path / "sys/fs/cgroup/cpu,cpuacct/slurm/job1/rank3"
    cg.mkdir(parents=True)
    stat = "nr_periods {p}\nnr_throttled {n}\nthrottled_time {t}\n"
    cg.joinpath("cpu.stat").write_text(stat.format(p=100, n=10, t=2_000_000_000))
    write_sched(tmp_path, 77, 5_000_000_000, V1_CGROUP, "")
    first = src.sample(RankTarget(rank=0, pid=77))
    assert "run_delay_pct" not in first and "cg_throttled_pct" not in first  # primes
    assert first["cg_nr_throttled"] == 0  # a running total, from this first read
    clock.t += 2.0
    cg.joinpath("cpu.stat").write_text(stat.format(p=120, n=16, t=2_600_000_000))
    write_sched(tmp_path, 77, 5_500_000_000, V1_CGROUP, "")
    got = src.sample(RankTarget(rank=0, pid=77))
    assert got["run_delay_pct"] == pytest.approx(100 * 0.5 / 2.0)  # 0.5 s waiting in 2 s
    assert got["cg_throttled_pct"] == pytest.approx(100 * 0.6 / 2.0)
    assert got["cg_nr_throttled"] == 6


def test_v2_cgroup_throttled_usec(tmp_path: Path) -> None:
    write_stat(tmp_path, STAT0)
    clock = FakeClock()
    src = HostSource(tmp_path, clock=clock)
    cg = tmp_path / "sys/fs/cgroup/kubepods/pod1/rank3"
    cg.mkdir(parents=True)
    stat = "usage_usec 1\nnr_periods 9\nnr_throttled {n}\nthrottled_usec {t}\n"
    cg.joinpath("cpu.stat").write_text(stat.format(n=3, t=100_000))
    write_sched(tmp_path, 78, 0, V2_CGROUP, "")
    src.sample(RankTarget(rank=0, pid=78))
    clock.t += 1.0
    cg.joinpath("cpu.stat").write_text(stat.format(n=5, t=350_000))
    got = src.sample(RankTarget(rank=0, pid=78))
    assert got["cg_throttled_pct"] == pytest.approx(25.0)
    assert got["cg_nr_throttled"] == 2
    assert got["run_delay_pct"] == 0.0


def test_a_cgroup_move_and_a_removed_cgroup_are_followed(tmp_path: Path) -> None:
    """The cpu.stat path is resolved once per /proc/<pid>/cgroup text (it is read every
    sample): a move to another cgroup reads the new one's counters, a removed cgroup's
    fields go missing, and one made again under the same name is found again."""
    write_stat(tmp_path, STAT0)
    clock = FakeClock()
    src = HostSource(tmp_path, clock=clock)
    stat = "nr_periods 9\nnr_throttled {n}\nthrottled_usec {t}\n"
    a, b = (tmp_path / f"sys/fs/cgroup/job/{x}" for x in "ab")
    for d in (a, b):
        d.mkdir(parents=True)
    a.joinpath("cpu.stat").write_text(stat.format(n=0, t=0))
    b.joinpath("cpu.stat").write_text(stat.format(n=0, t=4_000_000))
    write_sched(tmp_path, 80, 0, "0::/job/a\n", "")
    target = RankTarget(rank=0, pid=80)
    src.sample(target)
    clock.t += 1.0
    a.joinpath("cpu.stat").write_text(stat.format(n=1, t=100_000))
    assert src.sample(target)["cg_throttled_pct"] == pytest.approx(10.0)
    write_sched(tmp_path, 80, 0, "0::/job/b\n", "")  # moved: b's counters, a new delta
    clock.t += 1.0
    assert "cg_throttled_pct" not in src.sample(target)
    clock.t += 1.0
    b.joinpath("cpu.stat").write_text(stat.format(n=0, t=4_500_000))
    assert src.sample(target)["cg_throttled_pct"] == pytest.approx(50.0)
    b.joinpath("cpu.stat").unlink()  # the cgroup removed (its process not yet moved)
    clock.t += 1.0
    assert "cg_throttled_pct" not in src.sample(target)
    b.joinpath("cpu.stat").write_text(stat.format(n=0, t=0))  # and made again
    src.sample(target)
    clock.t += 1.0
    b.joinpath("cpu.stat").write_text(stat.format(n=0, t=200_000))
    assert src.sample(target)["cg_throttled_pct"] == pytest.approx(20.0)


def test_a_move_into_a_fresh_cgroup_with_a_quota_reads_at_once(tmp_path: Path) -> None:
    """A process moved since its last sample into a cgroup whose counters all began
    since then (nr_periods x the period within that span) gets the share of that
    cgroup's life at the first read, not a primed delta: the quota held from the
    move on. A cgroup older than the last sample, or one without a quota, still
    only primes (when its counters began is not known)."""
    write_stat(tmp_path, STAT0)
    clock = FakeClock()
    src = HostSource(tmp_path, clock=clock)
    stat = "nr_periods {p}\nnr_throttled {n}\nthrottled_usec {t}\n"
    home, fresh, old, free = (tmp_path / f"sys/fs/cgroup/job/{x}" for x in ("home", "q", "o", "f"))
    for d in (home, fresh, old, free):
        d.mkdir(parents=True)
    home.joinpath("cpu.stat").write_text(stat.format(p=0, n=0, t=0))
    write_sched(tmp_path, 81, 0, "0::/job/home\n", "")
    target = RankTarget(rank=0, pid=81)
    assert "cg_throttled_pct" not in src.sample(target)  # first sight: primes
    # moved 0.8 s ago into q (35% of a CPU a 100 ms period): 8 periods, 0.2 s throttled
    clock.t += 1.0
    fresh.joinpath("cpu.max").write_text("35000 100000\n")
    fresh.joinpath("cpu.stat").write_text(stat.format(p=8, n=6, t=200_000))
    write_sched(tmp_path, 81, 0, "0::/job/q\n", "")
    got = src.sample(target)
    assert got["cg_throttled_pct"] == pytest.approx(100 * 0.2 / 0.8)
    # then deltas as before
    clock.t += 1.0
    fresh.joinpath("cpu.stat").write_text(stat.format(p=18, n=14, t=450_000))
    assert src.sample(target)["cg_throttled_pct"] == pytest.approx(25.0)
    # o's counters span 50 periods (5 s) against 1 s since the last read: not known
    clock.t += 1.0
    old.joinpath("cpu.max").write_text("35000 100000\n")
    old.joinpath("cpu.stat").write_text(stat.format(p=50, n=40, t=1_000_000))
    write_sched(tmp_path, 81, 0, "0::/job/o\n", "")
    assert "cg_throttled_pct" not in src.sample(target)
    # f has no quota ("max"): no period to span its life with
    clock.t += 1.0
    free.joinpath("cpu.max").write_text("max 100000\n")
    free.joinpath("cpu.stat").write_text(stat.format(p=3, n=0, t=0))
    write_sched(tmp_path, 81, 0, "0::/job/f\n", "")
    assert "cg_throttled_pct" not in src.sample(target)


def test_the_cfs_period_of_v1_and_v2_quotas(tmp_path: Path) -> None:
    from artemis.agent.telemetry.host import read_cfs_period_ns

    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert read_cfs_period_ns(v1) is None  # no quota
    (v1 / "cpu.cfs_quota_us").write_text("35000\n")
    assert read_cfs_period_ns(v1) == 100_000_000
    (v2 / "cpu.max").write_text("max 100000\n")
    assert read_cfs_period_ns(v2) is None
    (v2 / "cpu.max").write_text("20000 50000\n")
    assert read_cfs_period_ns(v2) == 50_000_000
    assert read_cfs_period_ns(tmp_path) is None  # neither file


def test_no_schedstat_or_cgroup_leaves_the_fields_missing(tmp_path: Path) -> None:
    write_stat(tmp_path, STAT0)
    write_pid_stat(tmp_path, 79, utime=1, stime=1)
    src = HostSource(tmp_path)
    for _ in range(2):
        got = src.sample(RankTarget(rank=0, pid=79))
    assert not {"run_delay_pct", "cg_throttled_pct", "cg_nr_throttled"} & set(got)


def test_the_window_gets_the_increase_of_nr_throttled() -> None:
    from artemis.agent.telemetry.base import TelemetryAccumulator

    acc = TelemetryAccumulator()
    for total, pct in ((0, 10.0), (4, 30.0), (9, 20.0)):
        acc.add({"cg_nr_throttled": total, "cg_throttled_pct": pct})
    t = acc.result()
    assert t.cg_nr_throttled == 9 and t.cg_throttled_pct == pytest.approx(20.0)


CG_V1_CPU = Path("/sys/fs/cgroup/cpu")


def test_on_the_real_host_run_delay_and_a_cgroup_quota_throttle() -> None:
    """A real busy child process: its schedstat run delay is read, and a child
    cgroup with a 5% CPU quota (cgroup v1) it is moved into throttles it, read from
    the first sample after the move."""
    import os
    import subprocess
    import sys
    import time

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    src = HostSource()
    target = RankTarget(rank=0, pid=busy.pid)
    try:
        src.sample(target)
        time.sleep(0.5)
        got = src.sample(target)
        if not Path(f"/proc/{busy.pid}/schedstat").exists():
            pytest.skip("kernel without /proc/<pid>/schedstat (no CONFIG_SCHED_INFO)")
        assert 0.0 <= float(got["run_delay_pct"]) <= 100.0 * 1.05
        if not (CG_V1_CPU / "cpu.stat").exists():
            pytest.skip("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
        cg = CG_V1_CPU / f"artemis-test-{os.getpid()}"
        try:
            cg.mkdir()
        except OSError as exc:
            pytest.skip(f"cannot create a cgroup here ({exc})")
        try:
            (cg / "cpu.cfs_period_us").write_text("100000")
            (cg / "cpu.cfs_quota_us").write_text("5000")
            (cg / "cgroup.procs").write_text(str(busy.pid))
            time.sleep(0.6)
            # moved since the last sample into a cgroup whose periods all came since:
            # its figure at once (the share of its life), then deltas
            first = src.sample(target)
            assert float(first["cg_throttled_pct"]) > 30.0, first
            time.sleep(1.5)
            got = src.sample(target)
            # 5 ms per 100 ms period: throttled most of the time
            assert float(got["cg_throttled_pct"]) > 30.0, got
            assert int(got["cg_nr_throttled"]) > int(first["cg_nr_throttled"]), (first, got)
            # the kernel counts the throttled wait as run delay
            assert float(got["run_delay_pct"]) > 30.0, got
        finally:
            (CG_V1_CPU / "cgroup.procs").write_text(str(busy.pid))
            cg.rmdir()
    finally:
        busy.kill()
        busy.wait()
