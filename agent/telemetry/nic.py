"""InfiniBand / RoCE port error counters from sysfs, read under an injectable root.

The kernel exposes each RDMA port's PMA counters as one decimal number per file
in ``/sys/class/infiniband/<device>/ports/<port>/counters/``
(Documentation/ABI/stable/sysfs-class-infiniband). Four of them say a link is
sick, and each becomes a telemetry field, the increase over the window summed
over the host's ports:

=====================  ==================  =========================================
field                  counter file        what a rise means
=====================  ==================  =========================================
``nic_symbol_errors``  ``symbol_error``    bit errors on the wire (cable, optics)
``nic_link_downed``    ``link_downed``     the link went down and retrained
``nic_rcv_errors``     ``port_rcv_errors`` packets received with errors, dropped
``nic_xmit_wait``      ``port_xmit_wait``  ticks the port had data but no credit:
                                           congestion or a slow peer
=====================  ==================  =========================================

The counters are cumulative; the IB PMA ones saturate at their width (16 bits
for ``symbol_error``, 8 for ``link_downed``) instead of wrapping, so a
saturated counter shows no further rise until someone clears it. A counter
that went down was cleared (``perfquery -R``): its new value counts as the
increase. The reader reports running totals since it was built, summed over
ports (``base.COUNT_FIELDS``: the window accumulator turns them into the
increase over the window); a port that appears later starts at its first
read. A host without RDMA ports (or a root without ``sys/class/infiniband``)
yields nothing, so the fields are reported missing, never zero.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from artemis.agent.telemetry.base import RunningTotals

NIC_COUNTERS: dict[str, str] = {
    "nic_symbol_errors": "symbol_error",
    "nic_link_downed": "link_downed",
    "nic_rcv_errors": "port_rcv_errors",
    "nic_xmit_wait": "port_xmit_wait",
}


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # absent, EINVAL from the driver, garbage
        return None


def read_port_counters(
    root: str | os.PathLike[str] = "/", devices: Iterable[str] | None = None
) -> dict[tuple[str, str], dict[str, int]]:
    """(device, port) -> field -> cumulative counter value, for every readable port."""
    base = Path(root) / "sys/class/infiniband"
    wanted = set(devices) if devices is not None else None
    out: dict[tuple[str, str], dict[str, int]] = {}
    try:
        devs = sorted(p for p in base.iterdir() if wanted is None or p.name in wanted)
    except OSError:
        return out
    for dev in devs:
        try:
            ports = sorted((dev / "ports").iterdir())
        except OSError:
            continue
        for port in ports:
            vals = {
                f: v
                for f, name in NIC_COUNTERS.items()
                if (v := _read_int(port / "counters" / name)) is not None
            }
            if vals:
                out[(dev.name, port.name)] = vals
    return out


class NicCounters:
    """Running totals of the port error counters since it was built, summed over ports."""

    def __init__(
        self, root: str | os.PathLike[str] = "/", devices: Iterable[str] | None = None
    ) -> None:
        self.root = root
        self.devices = None if devices is None else tuple(devices)
        self._totals = RunningTotals()

    def sample(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for port, vals in read_port_counters(self.root, self.devices).items():
            for f, v in vals.items():
                total = self._totals.add(port, f, v)
                if total is not None:
                    out[f] = total
        return out
