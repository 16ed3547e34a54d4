"""A lossy, slow link between two network namespaces, in user space: two TUN devices.

Run by tests/netns_harness.py as `python tests/netns_tun.py NS_A DEV_A NS_B DEV_B
CONTROL SEED`. It opens a TUN device (IFF_TUN, no packet info) inside each
namespace (setns, then /dev/net/tun) and forwards every IP packet read from one
to the other. The kernel has no netem here, so this is where packets are lost
and delayed: each packet is dropped with probability `loss` and the others are
written `delay_ms` after they were read, in order. Real packets are lost, so the
kernels' TCP retransmits them, as on a bad link. `CONTROL` is a file of one line
`loss delay_ms`, read again whenever it changes (the test changes the link while
traffic flows). Writing into a device that is down (`ip link set DEV down`: the
test's blackout) fails; the packet is then dropped, as a cable pulled would.
It exits when stdin closes (its parent's end) or on SIGTERM.
"""

from __future__ import annotations

import ctypes
import fcntl
import heapq
import os
import random
import select
import signal
import struct
import sys
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000

_libc = ctypes.CDLL(None, use_errno=True)


def setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def main(argv: list[str]) -> int:
    ns_a, dev_a, ns_b, dev_b, control, seed = argv
    own = "/proc/self/ns/net"
    home = os.open(own, os.O_RDONLY)
    setns(f"/var/run/netns/{ns_a}")
    fa = open_tun(dev_a)
    setns(f"/var/run/netns/{ns_b}")
    fb = open_tun(dev_b)
    if _libc.setns(home, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns back")
    os.close(home)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    rng = random.Random(int(seed))
    loss, delay = 0.0, 0.0
    stamp = None
    other = {fa: fb, fb: fa}
    queue: list[tuple[float, int, int, bytes]] = []  # (due, order, fd, packet)
    n = 0
    counts = {"forwarded": 0, "dropped": 0, "failed": 0}
    print("ready", flush=True)
    while True:
        try:
            st = os.stat(control)
            if (st.st_mtime_ns, st.st_size) != stamp:
                stamp = (st.st_mtime_ns, st.st_size)
                with open(control) as fh:
                    parts = fh.read().split()
                if len(parts) == 2:
                    loss, delay = float(parts[0]), float(parts[1]) / 1000.0
                    print(f"link: loss {loss} delay {delay * 1000:.0f} ms {counts}", flush=True)
        except (OSError, ValueError):
            pass
        now = time.monotonic()
        wait = 0.05 if not queue else max(0.0, min(0.05, queue[0][0] - now))
        ready, _, _ = select.select([fa, fb, sys.stdin], [], [], wait)
        if sys.stdin in ready and not sys.stdin.read(1):
            return 0
        now = time.monotonic()
        for fd in (fa, fb):
            if fd not in ready:
                continue
            for _ in range(256):
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    break
                if loss and rng.random() < loss:
                    counts["dropped"] += 1
                    continue
                n += 1
                heapq.heappush(queue, (now + delay, n, other[fd], pkt))
        while queue and queue[0][0] <= time.monotonic():
            _, _, fd, pkt = heapq.heappop(queue)
            try:
                os.write(fd, pkt)
                counts["forwarded"] += 1
            except OSError:
                counts["failed"] += 1  # the device is down: the packet is lost


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
