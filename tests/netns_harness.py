"""Network partitions between real namespaces, for tests/test_partition.py.

`Link` makes two network namespaces of its own (names with this process's pid,
deleted at the end) joined by one point-to-point link in user space: a TUN
device in each, an address of 10.213.0.0/30 on each, and tests/netns_tun.py
forwarding packets between them. Nothing else is routed: traffic goes only
between the two namespaces. On that link the test makes its faults:

- `down()` / `up()`: `ip link set <B's device> down/up`, a blackout (packets to
  the coordinator find no route; those in flight towards B are dropped);
- `impair(loss, delay_ms)`: each packet lost with probability `loss`, the rest
  delayed (real packets: the kernels' TCP retransmits what was lost).

`inside(ns)` moves the calling thread into a namespace (setns) and back, so the
processes it starts are born there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from netns_tun import CLONE_NEWNET
from netns_tun import setns as _setns

HERE = Path(__file__).resolve().parent
SUBNET = "10.213.0"
C_ADDR, B_ADDR = f"{SUBNET}.1", f"{SUBNET}.2"
_libc = ctypes.CDLL(None, use_errno=True)


def unavailable() -> str | None:
    """Why this machine cannot run the partition tests (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2 is not installed (tests/setup/install-iproute2.sh)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun (the user-space link needs TUN devices)"
    probe = f"artprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def inside(ns: str) -> Iterator[None]:
    """The calling thread in namespace `ns` meanwhile (children start there)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(f"/var/run/netns/{ns}")
        try:
            yield
        finally:
            if _libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the test's namespace")
    finally:
        os.close(home)


class Link:
    """Namespaces `c` (the coordinator's) and `b` (node B's) and the link between them."""

    def __init__(self, work: Path, tag: str = "") -> None:
        pid = os.getpid()
        self.c = f"art{tag}{pid}c"
        self.b = f"art{tag}{pid}b"
        self.dev_c, self.dev_b = "artc0", "artb0"
        self.work = work
        self.control = work / "link.ctl"
        self.log = work / "link.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.events: list[tuple[str, float]] = []  # (what, monotonic time)

    def __enter__(self) -> Link:
        for ns in (self.c, self.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        self.control.write_text("0 0\n")
        fh = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "netns_tun.py"),
                self.c,
                self.dev_c,
                self.b,
                self.dev_b,
                str(self.control),
                "14",
            ],
            stdin=subprocess.PIPE,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
        fh.close()
        for _ in range(200):
            if b"ready" in self.log.read_bytes() or self.proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.05"])
        if self.proc.poll() is not None:
            raise RuntimeError(f"TUN forwarder failed: {self.log.read_text()}")
        _ip("-n", self.c, "addr", "add", C_ADDR, "peer", B_ADDR, "dev", self.dev_c)
        _ip("-n", self.b, "addr", "add", B_ADDR, "peer", C_ADDR, "dev", self.dev_b)
        _ip("-n", self.c, "link", "set", self.dev_c, "up")
        _ip("-n", self.b, "link", "set", self.dev_b, "up")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for ns in (self.b, self.c):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    # -- faults --------------------------------------------------------------

    def _mark(self, what: str) -> None:
        import time

        self.events.append((what, time.monotonic()))

    def down(self) -> None:
        _ip("-n", self.b, "link", "set", self.dev_b, "down")
        self._mark("down")

    def up(self) -> None:
        _ip("-n", self.b, "link", "set", self.dev_b, "up")
        self._mark("up")

    def impair(self, loss: float, delay_ms: float) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(f"{loss} {delay_ms}\n")
        os.replace(tmp, self.control)
        self._mark(f"impair {loss} {delay_ms}")

    def exec_in(self, ns: str) -> list[str]:
        """The command prefix that runs a program in namespace `ns`."""
        return ["ip", "netns", "exec", ns]
