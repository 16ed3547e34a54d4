"""The narrow interface between the RDMA transport and a verbs implementation.

Two implementations exist: ``verbs.VerbsAdapter`` (pyverbs, a real RDMA NIC or
Soft-RoCE) and ``loopback.LoopbackAdapter`` (in-process, for tests and
benchmarks, with fault injection). The transport never calls pyverbs itself.

Life of an adapter::

    open(buffer_size, recv_buffers, send_slots)   device, PD, CQ, completion
                                                  channel, RC QP (INIT), MRs
    local_info()                                  qpn, psn, gid, lid, mtu -> peer
    connect(remote_info)                          INIT -> RTR -> RTS
    post_recv / post_send                         work requests
    fileno(); get_event(); ack(n); arm(); poll()  completions, for loop.add_reader
    close()

Completion handling follows ``ibv_get_cq_event(3)``: when ``fileno()`` is
readable, take every pending event (``get_event`` until False), ``ack``
them, ``arm`` again, and only then ``poll`` the CQ dry, so a completion that
lands between the last poll and the re-arm still raises an event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# Receive work requests carry this bit in their wr_id so a completion tells
# which queue it belongs to even when it failed (a failed completion's opcode
# is undefined in verbs).
RECV_TAG = 1 << 62

Info = dict[str, int | str]
"""What one side tells the other over the side channel: qpn, psn, gid, lid, mtu."""


@dataclass(frozen=True)
class Completion:
    """One work completion, already decoded."""

    recv: bool  # a receive (index = buffer) or a send (index = wr_id)
    index: int
    ok: bool
    status: str = ""  # why it failed, in words
    data: bytes = b""  # a successful receive: the bytes that landed


class AdapterError(ConnectionError):
    """A verbs call failed (device gone, QP in error, bad remote info)."""


class RdmaAdapter(Protocol):
    def open(self, buffer_size: int, recv_buffers: int, send_slots: int) -> None:
        """Open the device and create PD, CQ, completion channel, QP (INIT) and
        two registered regions: ``recv_buffers`` and ``send_slots`` buffers of
        ``buffer_size`` bytes."""
        ...

    def local_info(self) -> Info:
        """qpn, psn, gid, lid and mtu of this end, for the peer."""
        ...

    def connect(self, remote: Info) -> None:
        """Move the QP INIT -> RTR -> RTS towards ``remote``."""
        ...

    def post_recv(self, buf_index: int) -> None: ...

    def post_send(self, slot: int, wr_id: int, data: bytes) -> None:
        """Copy ``data`` into send slot ``slot`` and post a signalled SEND."""
        ...

    def fileno(self) -> int:
        """The completion channel's fd (non-blocking), for ``loop.add_reader``."""
        ...

    def arm(self) -> None:
        """Request a notification for the next completion (``req_notify``)."""
        ...

    def get_event(self) -> bool:
        """Take one completion event if one is pending; never blocks."""
        ...

    def ack(self, events: int) -> None: ...

    def poll(self, max_entries: int) -> list[Completion]:
        """Up to ``max_entries`` completions; never blocks."""
        ...

    def close(self) -> None:
        """Destroy everything; idempotent."""
        ...


class AdapterFactory(Protocol):
    """Makes an adapter for one connection (``VerbsAdapter`` and ``LoopbackAdapter`` fit)."""

    def __call__(self, device: str | None, port: int, gid_index: int) -> RdmaAdapter: ...
