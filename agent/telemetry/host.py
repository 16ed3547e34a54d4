"""Host signals from /proc, read under a ``root`` folder so tests use fixture trees.

* ``cpu_pct``, ``steal_pct``, ``iowait_pct``: from the ``cpu`` line of
  ``/proc/stat`` (user nice system idle iowait irq softirq steal ...), as the
  change since the previous sample over the change of the total. Busy =
  user + nice + system + irq + softirq (guest time is already inside user);
  steal and iowait are reported on their own. The source reads /proc/stat once
  when built, so the first sample already has a delta. These are the host's, not
  a rank's: the agent samples each rank of the host in turn, microseconds apart,
  so a sample with no tick elapsed since the last delta reports that delta's
  shares (and moves nothing on), up to SHARES_MAX_AGE_S old; older: missing. (Each
  sample used to consume the delta, and every rank but the first of a pass had
  no CPU shares at all.)
* ``psi_cpu_some``: ``some avg10`` of ``/proc/pressure/cpu`` (absent on kernels
  without PSI: missing).
* ``load1``: first field of ``/proc/loadavg``.
* ``ncpu``: the ``cpuN`` lines of ``/proc/stat`` (online CPUs).
* ``proc_cpu_pct``: the rank process's utime + stime (fields 14 and 15 of
  ``/proc/<pid>/stat``, in clock ticks, ``SC_CLK_TCK``) since the previous
  sample for that pid, over the elapsed monotonic time, as % of one core. The
  first sample of a pid only primes it (missing).
* ``run_delay_pct``: the rank process's run delay (2nd field of
  ``/proc/<pid>/schedstat``, ns: time runnable but waiting for a CPU) since the
  previous sample, over the elapsed monotonic time, in %. It is the main
  thread's (the one that drives the steps). First sample of a pid: missing.
* ``cg_throttled_pct``, ``cg_nr_throttled``: the CPU quota of the process's
  cgroup, from its ``cpu.stat``. The cgroup is the ``cpu`` controller's line
  of ``/proc/<pid>/cgroup`` under ``sys/fs/cgroup/cpu`` (or ``cpu,cpuacct``)
  on cgroup v1, else the ``0::`` line under ``sys/fs/cgroup`` (v2).
  ``throttled_time`` (v1, ns) or ``throttled_usec`` (v2) since the previous
  sample over the elapsed time, in % (summed over CPUs, so it may pass 100);
  ``nr_throttled`` as a running total (the window gets its increase). A cgroup
  without a quota reports 0. The first read of a cgroup the process moved into
  since its last sample, where that cgroup has a quota and its counters all began
  since then (``nr_periods`` x the period), gives the share of its whole life
  (``_fresh_share``); any other first read only primes the delta.
* ``stopped_pct``: the share of the time the rank process was stopped (state T
  or t: SIGSTOP, a scheduler's suspend), sampled about every 20 ms on a thread
  (``procstate.StateSampler``), since the previous sample. Only where the
  source is built with ``states`` (the agent): a process cannot watch itself
  stopped, so the in-process Detector reports it missing.

* ``nic_symbol_errors``, ``nic_link_downed``, ``nic_rcv_errors``,
  ``nic_xmit_wait``: the host's InfiniBand/RoCE port error counters under
  ``sys/class/infiniband`` (``nic.NicCounters``), increases since the previous
  sample summed over ports; absent on a host without RDMA ports.

A file that is absent or unreadable leaves its fields missing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from artemis.agent.telemetry.base import RankTarget, RunningTotals
from artemis.agent.telemetry.nic import NicCounters
from artemis.agent.telemetry.procstate import StateSampler


def _read(path: str | Path) -> str | None:
    """The file's text, or None when absent or unreadable.

    Plain ``os.open``/``os.read``: a sample reads seven small files, and
    ``Path.read_text`` (a buffered text stream, the path parsed again) cost 3x the
    system calls' own time (17-39 us a file against 6-11 us; bench/README.md
    "detector's CPU"). Read to the end: /proc/stat grows with the CPUs and IRQs."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_stat(text: str) -> tuple[list[int] | None, int]:
    """(aggregate cpu counters, number of cpuN lines) from /proc/stat text."""
    agg: list[int] | None = None
    ncpu = 0
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue  # (not split: the intr line holds a field per IRQ, thousands on a big host)
        parts = line.split()
        if parts[0] == "cpu":
            agg = [int(x) for x in parts[1:]]
        elif parts[0].startswith("cpu") and parts[0][3:].isdigit():
            ncpu += 1
    return agg, ncpu


def cpu_shares(prev: list[int], cur: list[int]) -> dict[str, float] | None:
    """cpu/steal/iowait % between two /proc/stat cpu lines; None if no tick elapsed."""
    width = min(len(prev), len(cur), 8)  # user..steal; guest is counted in user
    d = [cur[i] - prev[i] for i in range(width)] + [0] * (8 - width)
    total = sum(d)
    if total <= 0:
        return None
    user, nice, system, _idle, iowait, irq, softirq, steal = d
    return {
        "cpu_pct": 100.0 * (user + nice + system + irq + softirq) / total,
        "steal_pct": 100.0 * steal / total,
        "iowait_pct": 100.0 * iowait / total,
    }


def parse_psi_some_avg10(text: str) -> float | None:
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "some":
            for kv in parts[1:]:
                k, _, v = kv.partition("=")
                if k == "avg10":
                    return float(v)
    return None


def parse_pid_cpu_ticks(text: str) -> int | None:
    """utime + stime from /proc/<pid>/stat (the name may hold spaces and parens)."""
    rest = text[text.rfind(")") + 1 :].split()
    # rest[0] is field 3 (state); utime and stime are fields 14 and 15
    if len(rest) < 13:
        return None
    return int(rest[11]) + int(rest[12])


def parse_schedstat_delay_ns(text: str) -> int | None:
    """Run delay (ns) from /proc/<pid>/schedstat: on-CPU ns, run-delay ns, timeslices."""
    parts = text.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


def parse_cgroup_paths(text: str) -> tuple[str | None, str | None]:
    """(v1 cpu controller path, v2 path) from /proc/<pid>/cgroup text."""
    v1 = v2 = None
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v1, v2


def parse_cpu_stat(text: str) -> tuple[int, int, int | None] | None:
    """(nr_throttled, throttled ns, nr_periods or None) from a cgroup's cpu.stat (v1 ns,
    v2 usec)."""
    kv: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            kv[parts[0]] = int(parts[1])
    if "nr_throttled" not in kv:
        return None
    if "throttled_time" in kv:
        return kv["nr_throttled"], kv["throttled_time"], kv.get("nr_periods")
    if "throttled_usec" in kv:
        return kv["nr_throttled"], kv["throttled_usec"] * 1000, kv.get("nr_periods")
    return None


def read_cfs_period_ns(folder: Path) -> int | None:
    """The CFS period of a cgroup with a CPU quota, in ns: v1 ``cpu.cfs_period_us``
    (where ``cpu.cfs_quota_us`` is not -1), v2 the second field of ``cpu.max`` (where
    the first is not ``max``); None without a quota or the files."""
    quota = _read(folder / "cpu.cfs_quota_us")
    if quota is not None:
        period = _read(folder / "cpu.cfs_period_us")
        if quota.strip() == "-1" or period is None or not period.strip().isdigit():
            return None
        return int(period) * 1000
    cpu_max = _read(folder / "cpu.max")
    if cpu_max is None:
        return None
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max" or not parts[1].isdigit():
        return None
    return int(parts[1]) * 1000


# Where cgroup v1 mounts the cpu controller (distributions differ).
CGROUP_V1_CPU = ("sys/fs/cgroup/cpu", "sys/fs/cgroup/cpu,cpuacct", "sys/fs/cgroup/cpuacct,cpu")

SHARES_MAX_AGE_S = 10.0


class HostSource:
    """Host CPU, pressure, load and the rank process's own CPU use."""

    name = "host"

    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        clock: Callable[[], float] = time.monotonic,
        clk_tck: int | None = None,
        states: StateSampler | None = None,
    ) -> None:
        self.root = Path(root)
        self.states = states
        self._clock = clock
        self._clk_tck = clk_tck or os.sysconf("SC_CLK_TCK")
        self._prev_stat: list[int] | None = None
        self._shares: tuple[float, dict[str, float]] | None = None  # (when, shares)
        self._prev_pid: dict[int, tuple[float, int]] = {}
        self._prev_delay: dict[int, tuple[float, int]] = {}
        # (pid, cpu.stat path) -> (when, throttled ns): a process moved to another
        # cgroup starts a new delta
        self._prev_cg: dict[tuple[int, Path], tuple[float, int]] = {}
        self._cg_totals = RunningTotals()
        # pid -> (its /proc/<pid>/cgroup text, the cpu.stat path that text resolved to):
        # resolving stats up to four paths; the text, read every sample, says a move
        self._cg_where: dict[int, tuple[str, Path]] = {}
        self._proc = str(self.root / "proc")
        text = _read(f"{self._proc}/stat")
        if text is not None:
            self._prev_stat = parse_stat(text)[0]
        self._nic = NicCounters(self.root)

    def sample(self, target: RankTarget) -> dict[str, object]:
        out: dict[str, object] = {}
        text = _read(f"{self._proc}/stat")
        if text is not None:
            agg, ncpu = parse_stat(text)
            if ncpu:
                out["ncpu"] = ncpu
            if agg is not None:
                now = self._clock()
                if self._prev_stat is None:
                    self._prev_stat = agg
                elif (shares := cpu_shares(self._prev_stat, agg)) is not None:
                    # (no tick elapsed: None, and the next delta still starts at prev)
                    self._shares = (now, shares)
                    self._prev_stat = agg
                if self._shares is not None and now - self._shares[0] <= SHARES_MAX_AGE_S:
                    out.update(self._shares[1])
        psi = _read(f"{self._proc}/pressure/cpu")
        if psi is not None:
            v = parse_psi_some_avg10(psi)
            if v is not None:
                out["psi_cpu_some"] = v
        load = _read(f"{self._proc}/loadavg")
        if load is not None and load.split():
            out["load1"] = float(load.split()[0])
        if target.pid is not None:
            pct = self._proc_cpu(target.pid)
            if pct is not None:
                out["proc_cpu_pct"] = pct
            out.update(self._sched(target.pid))
            if self.states is not None and (st := self.states.take(target.pid)) is not None:
                out["stopped_pct"] = st
        out.update(self._nic.sample())
        return out

    def _proc_cpu(self, pid: int) -> float | None:
        text = _read(f"{self._proc}/{pid}/stat")
        now = self._clock()
        ticks = parse_pid_cpu_ticks(text) if text is not None else None
        if ticks is None:
            self._prev_pid.pop(pid, None)
            return None
        prev = self._prev_pid.get(pid)
        self._prev_pid[pid] = (now, ticks)
        if prev is None or now <= prev[0] or ticks < prev[1]:
            return None  # first sight of this pid (or a new process under the same pid)
        return 100.0 * (ticks - prev[1]) / self._clk_tck / (now - prev[0])

    def _rate(
        self, prev: dict[Any, tuple[float, int]], key: Any, value: int | None
    ) -> float | None:
        """% of wall time: ns of ``value`` gained since the previous read of ``key``."""
        now = self._clock()
        if value is None:
            prev.pop(key, None)
            return None
        last = prev.get(key)
        prev[key] = (now, value)
        if last is None or now <= last[0] or value < last[1]:
            return None  # first sight (or a new process, a reset counter)
        return 100.0 * (value - last[1]) / 1e9 / (now - last[0])

    def _sched(self, pid: int) -> dict[str, object]:
        """Run delay and cgroup throttling of the process (see the module doc)."""
        out: dict[str, object] = {}
        text = _read(f"{self._proc}/{pid}/schedstat")
        delay = parse_schedstat_delay_ns(text) if text is not None else None
        if (pct := self._rate(self._prev_delay, pid, delay)) is not None:
            out["run_delay_pct"] = pct
        stat_path = self._cpu_stat_path(pid)
        text = _read(stat_path) if stat_path is not None else None
        cg = parse_cpu_stat(text) if text is not None else None
        if stat_path is None or cg is None:
            self._cg_where.pop(pid, None)  # resolved afresh next time (a cgroup removed)
            for k in [k for k in self._prev_cg if k[0] == pid]:
                del self._prev_cg[k]
            return out
        total = self._cg_totals.add(stat_path, "nr_throttled", cg[0], scope=pid)
        if total is not None:
            out["cg_nr_throttled"] = total
        key = (pid, stat_path)
        fresh = None if key in self._prev_cg else self._fresh_share(pid, stat_path, cg)
        if (pct := self._rate(self._prev_cg, key, cg[1])) is not None:
            out["cg_throttled_pct"] = pct
        elif fresh is not None:
            out["cg_throttled_pct"] = fresh
        return out

    def _fresh_share(
        self, pid: int, stat_path: Path, cg: tuple[int, int, int | None]
    ) -> float | None:
        """A process just moved into a cgroup with a quota: the throttled % of that
        cgroup's whole life, where its counters all began since this process's last
        sample (its periods, `nr_periods` x the period, span no more than that). The
        quota then held from the move on; without this the first sample after it
        only primed a delta, and a window or two (the agent samples each second)
        went without the figure (the real-job grid's quota cell, DETECTOR.md "The
        host's evidence"). Otherwise None: when the counters began is not known.
        The last sample is the one of the cgroup it left (its delta's key, dropped here)."""
        left = [k for k in self._prev_cg if k[0] == pid]
        last = max((self._prev_cg.pop(k)[0] for k in left), default=None)
        periods = cg[2]
        if last is None or not periods:
            return None
        period = read_cfs_period_ns(stat_path.parent)
        if period is None:
            return None
        life = periods * period
        if life > (self._clock() - last) * 1e9 + period:
            return None
        return 100.0 * cg[1] / life

    def _cpu_stat_path(self, pid: int) -> Path | None:
        text = _read(f"{self._proc}/{pid}/cgroup")
        if text is None:
            return None
        known = self._cg_where.get(pid)
        if known is not None and known[0] == text:
            return known[1]
        path = self._resolve_cpu_stat(text)
        if path is not None:
            self._cg_where[pid] = (text, path)
        return path

    def _resolve_cpu_stat(self, text: str) -> Path | None:
        """The cpu.stat of the cgroup that /proc/<pid>/cgroup ``text`` names, if present."""
        v1, v2 = parse_cgroup_paths(text)
        if v1 is not None:
            for mount in CGROUP_V1_CPU:
                p = self.root / mount / v1.lstrip("/") / "cpu.stat"
                if p.exists():
                    return p
        if v2 is not None:
            p = self.root / "sys/fs/cgroup" / v2.lstrip("/") / "cpu.stat"
            if p.exists():
                return p
        return None
