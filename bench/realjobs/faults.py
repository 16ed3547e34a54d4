"""Faults injected into a running job from outside it, as a cluster has them.

Each injector acts on one rank's process (its pid, from the workload's pid file) and
has ``start()`` and ``stop()``; ``stop()`` undoes everything (a stopped process is
continued, a cgroup is emptied and removed, a hog is ended), also after a failure.

- ``DutyStop``: SIGSTOP for ``stop_ms`` of every ``period_ms``, then SIGCONT (a
  throttled or descheduled process).
- ``CpuQuota``: the process in a cgroup of its own with a CFS quota of ``share`` of
  one CPU (cgroup v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``; v2 ``cpu.max``).
- ``CpuHog``: a busy process pinned to the rank's CPU, busy ``duty`` of every 10 ms
  period (the workload runs with ``--pin``, so the rank's CPU is known).

- ``NetRate``: the job's network limited to ``mbit`` Mbit/s: it runs in a network
  namespace of its own (``ip netns``; the runner puts it there), whose loopback
  gets a token-bucket qdisc (``tc`` ``tbf``): a link that trained down, or one
  shared with another job's traffic. Every rank's collectives slow alike.

The data-loader sleep and the slowed island bridge live inside the job (the
workload's ``--loader-sleep-*`` and ``--bridge-delay-ms``); ``InJob`` stands for
them here, so that every mechanism has the same shape.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

from bench.realjobs.workloads import pinned_cpu

CG_V1 = Path("/sys/fs/cgroup/cpu")
CG_V2 = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000


class Injector(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


class InJob:
    """A fault the job applies itself from its onset step: nothing to do outside."""

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None


class DutyStop:
    """SIGSTOP ``stop_ms`` of every ``period_ms``, from a thread of the grid's process."""

    def __init__(self, pid: int, stop_ms: float, period_ms: float = 100.0) -> None:
        if not 0 < stop_ms < period_ms:
            raise ValueError(f"stop_ms={stop_ms}: must be in (0, period_ms={period_ms})")
        self.pid, self.stop_s, self.period_s = pid, stop_ms / 1e3, period_ms / 1e3
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duty-stop", daemon=True)

    def _run(self) -> None:
        # paced by CLOCK_MONOTONIC deadlines, so a late wake-up does not drift the cycle
        t = time.monotonic()
        while not self._done.is_set():
            try:
                os.kill(self.pid, signal.SIGSTOP)
                self._done.wait(max(0.0, t + self.stop_s - time.monotonic()))
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                return  # the rank ended
            t += self.period_s
            self._done.wait(max(0.0, t - time.monotonic()))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)  # never leave it stopped


def cgroup_version() -> int:
    """1 where cgroup v1's cpu controller is mounted, 2 on a unified (v2) host, else 0."""
    if (CG_V1 / "cpu.cfs_quota_us").exists():
        return 1
    if (CG_V2 / "cgroup.controllers").exists():
        return 2
    return 0


class CpuQuota:
    """The process moved into cgroup ``name`` with a quota of ``share`` of one CPU."""

    def __init__(self, pid: int, share: float, name: str) -> None:
        if not 0 < share < 1:
            raise ValueError(f"share={share}: a CPU quota must be in (0, 1) of one CPU")
        self.pid, self.share, self.version = pid, share, cgroup_version()
        if self.version == 0:
            raise RuntimeError("no cgroup cpu controller (v1 cpu or v2 unified) to set a quota in")
        root = CG_V1 if self.version == 1 else CG_V2
        self.root, self.dir = root, root / name
        self._home: Path | None = None

    def _origin(self) -> Path:
        # where the process was: its line for this hierarchy in /proc/<pid>/cgroup
        for line in Path(f"/proc/{self.pid}/cgroup").read_text().splitlines():
            _, ctrl, path = line.split(":", 2)
            if (self.version == 1 and "cpu" in ctrl.split(",")) or (
                self.version == 2 and ctrl == ""
            ):
                return self.root / path.lstrip("/")
        return self.root

    def start(self) -> None:
        self._home = self._origin()
        self.dir.mkdir(exist_ok=True)
        quota = int(self.share * CFS_PERIOD_US)
        if self.version == 1:
            (self.dir / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (self.dir / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.dir / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")
        (self.dir / "cgroup.procs").write_text(str(self.pid))  # every thread of it

    def stop(self) -> None:
        if not self.dir.exists():
            return
        home = self._home or self.root
        with contextlib.suppress(ProcessLookupError, OSError):
            (home / "cgroup.procs").write_text(str(self.pid))
        for _ in range(50):  # rmdir fails while a task is still leaving
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.02)


_HOG = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
busy, period = float(sys.argv[2]) * 0.01, 0.01
t = time.monotonic()
while True:
    end = t + busy
    while time.monotonic() < end:
        pass
    t += period
    time.sleep(max(0.0, t - time.monotonic()))
"""


class CpuHog:
    """A process busy ``duty`` (0..1] of every 10 ms on CPU ``cpu``."""

    def __init__(self, cpu: int, duty: float) -> None:
        if not 0 < duty <= 1:
            raise ValueError(f"duty={duty}: the hog's busy share must be in (0, 1]")
        self.cpu, self.duty = cpu, duty
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", _HOG, str(self.cpu), str(self.duty)])

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def ranks_on_cpu(cpu: int, world: int) -> list[int]:
    """The ranks of a ``--pin``ned workload that share CPU ``cpu``."""
    return [r for r in range(world) if pinned_cpu(r, world) == cpu]


class NetRate:
    """Network namespace ``ns``'s loopback limited to ``mbit`` Mbit/s (``tc`` ``tbf``)."""

    def __init__(self, ns: str, mbit: float) -> None:
        if not mbit > 0:
            raise ValueError(f"mbit={mbit}: a rate must be positive")
        self.ns, self.mbit = ns, mbit

    def _tc(self, *args: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.ns, "tc", "qdisc", *args], check=True)

    def start(self) -> None:
        # a 1 MB burst and 1 s of queue: gloo's connections reset under a 64 kB burst
        self._tc(
            "add",
            "dev",
            "lo",
            "root",
            "tbf",
            "rate",
            f"{self.mbit:g}mbit",
            "burst",
            "1mb",
            "latency",
            "1s",
        )

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, FileNotFoundError):
            self._tc("del", "dev", "lo", "root")


class NetNamespace:
    """A network namespace of its own for one run, its loopback up; ``close()`` removes it."""

    def __init__(self, name: str) -> None:
        self.name = name
        subprocess.run(["ip", "netns", "add", name], check=True)
        try:
            subprocess.run(
                ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True
            )
        except subprocess.CalledProcessError:
            self.close()
            raise

    def wrap(self, cmd: list[str]) -> list[str]:
        # (``ip netns exec`` mounts a fresh /sys: the agent reads no cgroup or NIC there)
        return ["ip", "netns", "exec", self.name, *cmd]

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False)
