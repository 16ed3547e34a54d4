"""In-process stand-in for an RC queue pair, with fault injection.

``LoopbackAdapter`` implements ``adapter.RdmaAdapter`` without a device: two
adapters in one process find each other through the ``gid`` they exchange
over the (real) side channel, and a posted SEND is copied into the head of the
peer's posted receive queue, exactly as an RC QP places it. Completions go to
a per-adapter queue and are signalled through a real pipe fd, armed and
acknowledged like a verbs completion channel, so the transport's
``loop.add_reader`` path is the one used with hardware.

What it models faithfully: in-order placement into posted buffers, a SEND
completing only once placed, RNR (a SEND waits while the peer has no posted
buffer; counted in ``rnr_waits``: with correct credits it stays 0), buffer
overflow as an error completion, and a vanished peer as "retry exceeded".
Events are raised only for completions that arrive while armed, so a consumer
that forgets to drain after re-arming hangs here as it would on a NIC.

Faults, per adapter (``faults``): lose, duplicate or reorder (swap with the
next) the n-th receive completion (1-based), and stop re-posting receive
buffers (post_recv is accepted and ignored, as by a peer whose software stopped
refilling its queue).

Scope: endpoints pair within one process (any thread; a lock guards shared
state). It does not cross processes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections import deque
from dataclasses import dataclass, field

from artemis.protocol.rdma.adapter import AdapterError, Completion, Info

_LOCK = threading.RLock()
_ENDPOINTS: dict[str, LoopbackAdapter] = {}
GID_PREFIX = "loopback:"


@dataclass
class LoopbackFaults:
    lose_recv: set[int] = field(default_factory=set)
    duplicate_recv: set[int] = field(default_factory=set)
    reorder_recv: set[int] = field(default_factory=set)
    stop_reposting: bool = False


class LoopbackAdapter:
    """One end of an in-process RC connection (see module doc)."""

    def __init__(
        self,
        device: str | None = None,
        port: int = 1,
        gid_index: int = 0,
        faults: LoopbackFaults | None = None,
    ) -> None:
        self.device = device or "loopback"
        self.port = port
        self.gid_index = gid_index
        self.faults = faults or LoopbackFaults()
        self.rnr_waits = 0
        self.sends_posted = 0
        self.recvs_posted = 0
        self._token = secrets.token_hex(8)
        self._qpn = secrets.randbits(24)
        self._psn = secrets.randbits(24)
        self._buffer_size = 0
        self._recv_slots = 0
        self._send_slots = 0
        self._rq: deque[int] = deque()
        self._outq: deque[tuple[int, bytes]] = deque()  # SENDs posted, not yet placed
        self._rnr_head: int | None = None  # wr_id already counted as waiting
        self._cq: deque[Completion] = deque()
        self._held: Completion | None = None  # a receive completion being reordered
        self._recv_count = 0
        self._armed = False
        self._peer: LoopbackAdapter | None = None
        self._state = "reset"
        self._rfd = -1
        self._wfd = -1

    # ---------------------------------------------------------------- set-up

    def open(self, buffer_size: int, recv_buffers: int, send_slots: int) -> None:
        if self._state != "reset":
            raise AdapterError("adapter already opened")
        self._buffer_size = buffer_size
        self._recv_slots = recv_buffers
        self._send_slots = send_slots
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._state = "init"
        with _LOCK:
            _ENDPOINTS[self._token] = self

    def local_info(self) -> Info:
        return {
            "qpn": self._qpn,
            "psn": self._psn,
            "gid": GID_PREFIX + self._token,
            "lid": 0,
            "mtu": 4096,
        }

    def connect(self, remote: Info) -> None:
        if self._state != "init":
            raise AdapterError(f"connect in state {self._state}")
        gid = str(remote.get("gid", ""))
        with _LOCK:
            peer = _ENDPOINTS.get(gid.removeprefix(GID_PREFIX))
            if not gid.startswith(GID_PREFIX) or peer is None:
                raise AdapterError(f"no loopback endpoint with gid {gid!r}")
            if peer._qpn != remote.get("qpn"):
                raise AdapterError(f"qpn {remote.get('qpn')} does not match endpoint {gid}")
            self._peer = peer
            self._state = "rts"

    # ---------------------------------------------------------------- work requests

    def post_recv(self, buf_index: int) -> None:
        if self._state == "closed":
            raise AdapterError("post_recv on a closed adapter")
        if not 0 <= buf_index < self._recv_slots:
            raise AdapterError(f"receive buffer {buf_index} out of range")
        self.recvs_posted += 1
        if self.faults.stop_reposting and self.recvs_posted > self._recv_slots:
            return  # the first fill goes in; re-posts are "forgotten"
        with _LOCK:
            if buf_index in self._rq:
                raise AdapterError(f"receive buffer {buf_index} posted twice")
            self._rq.append(buf_index)
            peer = self._peer
            if peer is not None:
                peer._place()

    def post_send(self, slot: int, wr_id: int, data: bytes) -> None:
        if self._state != "rts":
            raise AdapterError(f"post_send in state {self._state}")
        if not 0 <= slot < self._send_slots:
            raise AdapterError(f"send slot {slot} out of range")
        if len(data) > self._buffer_size:
            raise AdapterError(f"{len(data)} bytes do not fit a {self._buffer_size}-byte slot")
        self.sends_posted += 1
        with _LOCK:
            self._outq.append((wr_id, bytes(data)))
            self._place()

    def _place(self) -> None:
        """Move posted SENDs into the peer's posted buffers, in order (lock held)."""
        peer = self._peer
        while self._outq:
            wr_id, data = self._outq[0]
            if peer is None or peer._state == "closed":
                self._outq.popleft()
                self._complete(Completion(False, wr_id, False, "retry exceeded (peer gone)"))
                continue
            if not peer._rq:
                if self._rnr_head != wr_id:
                    self._rnr_head = wr_id
                    self.rnr_waits += 1
                return
            self._outq.popleft()
            buf = peer._rq.popleft()
            if len(data) > peer._buffer_size:
                peer._arrive(Completion(True, buf, False, "local length error"))
                self._complete(Completion(False, wr_id, False, "remote invalid request"))
                continue
            peer._arrive(Completion(True, buf, True, data=data))
            self._complete(Completion(False, wr_id, True))

    def _arrive(self, c: Completion) -> None:
        """A receive completion lands here; faults apply (lock held)."""
        self._recv_count += 1
        n = self._recv_count
        f = self.faults
        if n in f.lose_recv:
            return
        if n in f.reorder_recv and self._held is None:
            self._held = c
            return
        self._complete(c)
        if n in f.duplicate_recv:
            self._complete(c)
        if self._held is not None and self._held is not c:
            held, self._held = self._held, None
            self._complete(held)

    def _complete(self, c: Completion) -> None:
        if self._state == "closed":
            return
        self._cq.append(c)
        if self._armed:
            self._armed = False
            # A full pipe already holds unread events: readable anyway.
            with contextlib.suppress(BlockingIOError):
                os.write(self._wfd, b"\x01")

    # ---------------------------------------------------------------- completions

    def fileno(self) -> int:
        return self._rfd

    def arm(self) -> None:
        with _LOCK:
            self._armed = True

    def get_event(self) -> bool:
        try:
            return bool(os.read(self._rfd, 1))
        except BlockingIOError:
            return False

    def ack(self, events: int) -> None:
        """Events need no acknowledgement here; kept for the interface."""

    def poll(self, max_entries: int) -> list[Completion]:
        with _LOCK:
            out: list[Completion] = []
            while self._cq and len(out) < max_entries:
                out.append(self._cq.popleft())
            return out

    # ---------------------------------------------------------------- teardown

    def close(self) -> None:
        with _LOCK:
            if self._state == "closed":
                return
            self._state = "closed"
            _ENDPOINTS.pop(self._token, None)
            self._cq.clear()
            self._outq.clear()
            peer, self._peer = self._peer, None
            if peer is not None:
                # SENDs the peer had waiting for us now fail, as after the
                # retry timeout of a real RC QP whose remote end is destroyed.
                peer._place()
        for fd in (self._rfd, self._wfd):
            if fd >= 0:
                os.close(fd)
        self._rfd = self._wfd = -1
