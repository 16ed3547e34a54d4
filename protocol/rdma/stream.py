"""Sans-IO state machine of one reliable-connected (RC) RDMA connection.

Frames travel as two-sided SEND/RECV messages into receive buffers that the
peer registered and posted in advance, all of one fixed size. Nothing here
touches a device, a socket or a clock: the caller feeds completions in and
carries the returned actions (post a send, post a receive) out to an adapter.

Wire format of one message (one SEND, at most one peer buffer long)::

    kind u8 | flags u8 | data grant u16 | ctrl grant u16 | seq u32 | payload

* ``kind``: DATA (a fragment of a frame), CREDIT (grants only), CLOSE.
* ``flags``: FIRST / LAST fragment of a frame (a frame that fits in one
  buffer carries both; an empty frame is one DATA message with no payload).
* ``seq``: per-direction message number, so a lost, duplicated or reordered
  completion is seen at once and fails the stream instead of corrupting it.
* grants: receive buffers the sender of this message has re-posted for the
  other side since its last grant.

Credits. Each side posts ``buffers`` data buffers plus ``ctrl_buffers``
control buffers. A DATA message spends one data credit; CREDIT and CLOSE spend
one control credit. Because control messages have their own small budget, a
side can always hand grants back even when the data credits of both sides are
exhausted, and because a received control message never triggers another
control message, two idle peers cannot ping-pong grants forever. Control
credits come back piggybacked on whatever the peer sends next.

Receive buffers are re-posted as soon as their bytes are copied out, so a
posted buffer is always waiting for every credit the peer holds (the sender
never overruns the receiver and the NIC never needs an RNR retry). What the
local reader has not consumed is bounded differently: past
``max_buffered_bytes`` of undelivered frames, data grants are withheld, so
the peer runs out of credits and its ``send`` waits (back-pressure).

Memory on the send side is bounded by ``max_queued_bytes``: ``can_queue``
says whether a frame fits and ``queue_frame`` refuses one that does not
(``StreamFull``); the async layer waits on ``can_queue`` before queuing. A
single frame larger than ``max_queued_bytes`` can never fit and is refused
with ``FrameTooLarge``.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from dataclasses import dataclass

HEADER = struct.Struct("!BBHHI")
HEADER_SIZE = HEADER.size  # 10 bytes

KIND_DATA = 1
KIND_CREDIT = 2
KIND_CLOSE = 3

FLAG_FIRST = 0x01
FLAG_LAST = 0x02

SEQ_MOD = 1 << 32
MAX_GRANT = 0xFFFF


class StreamError(ConnectionError):
    """The connection broke its protocol (lost, duplicated or reordered
    completion, bad header, credit overrun, failed work request). The stream
    is FAILED; nothing after the fault is delivered."""


class StreamFull(RuntimeError):
    """``queue_frame`` was called while the frame does not fit (see ``can_queue``)."""


class FrameTooLarge(ValueError):
    """A frame larger than ``max_queued_bytes`` can never be sent."""


class ConnState(enum.Enum):
    INIT = "init"
    EXCHANGING = "exchanging"  # side channel: auth, QP numbers, buffer sizes
    RTR = "rtr"  # QP ready to receive, receive buffers posted
    RTS = "rts"  # QP ready to send, waiting for the peer's "ready"
    ESTABLISHED = "established"
    CLOSING = "closing"  # CLOSE queued behind pending data
    CLOSED = "closed"
    FAILED = "failed"


# Frames may be queued before the connection is up; they go out once it is.
_SENDABLE = frozenset(
    {ConnState.INIT, ConnState.EXCHANGING, ConnState.RTR, ConnState.RTS, ConnState.ESTABLISHED}
)
# Receive buffers are posted at RTR, and the peer may send as soon as it has
# seen our "ready", possibly before we have processed its own.
_RECEIVING = frozenset({ConnState.RTR, ConnState.RTS, ConnState.ESTABLISHED, ConnState.CLOSING})


@dataclass(frozen=True)
class PostSend:
    """Copy ``data`` into send slot ``slot`` and post it as a SEND with ``wr_id``."""

    wr_id: int
    slot: int
    data: bytes


@dataclass(frozen=True)
class PostRecv:
    """Post receive buffer ``buf_index`` (again)."""

    buf_index: int


Action = PostSend | PostRecv


@dataclass(frozen=True)
class StreamConfig:
    """Local sizing. The peer's sizing arrives through ``on_exchanged``."""

    buffers: int = 64  # data receive buffers (data credits granted to the peer)
    ctrl_buffers: int = 4  # control receive buffers (control credits for the peer)
    buffer_size: int = 64 * 1024
    send_slots: int = 68  # registered send buffers; sends in flight at most
    max_queued_bytes: int = 16 * 1024 * 1024
    max_buffered_bytes: int = 16 * 1024 * 1024
    credit_batch: int = 0  # grant explicitly once this many are owed; 0 = buffers // 2

    def __post_init__(self) -> None:
        if not 1 <= self.buffers <= MAX_GRANT:
            raise ValueError(f"buffers must be in 1..{MAX_GRANT}, got {self.buffers}")
        if not 1 <= self.ctrl_buffers <= MAX_GRANT:
            raise ValueError(f"ctrl_buffers must be in 1..{MAX_GRANT}, got {self.ctrl_buffers}")
        if self.buffer_size <= HEADER_SIZE:
            raise ValueError(f"buffer_size must exceed the {HEADER_SIZE}-byte header")
        if self.send_slots < 1:
            raise ValueError("send_slots must be >= 1")
        if self.max_queued_bytes < 1 or self.max_buffered_bytes < 1:
            raise ValueError("byte limits must be >= 1")

    @property
    def recv_buffers(self) -> int:
        """Receive buffers registered and posted in all."""
        return self.buffers + self.ctrl_buffers

    @property
    def batch(self) -> int:
        return self.credit_batch if self.credit_batch > 0 else max(1, self.buffers // 2)


@dataclass(frozen=True)
class PeerParams:
    """What the side channel told us about the peer's receive side."""

    buffers: int
    ctrl_buffers: int
    buffer_size: int

    def validate(self) -> None:
        if not 1 <= self.buffers <= MAX_GRANT:
            raise StreamError(f"peer announced {self.buffers} data buffers")
        if not 1 <= self.ctrl_buffers <= MAX_GRANT:
            raise StreamError(f"peer announced {self.ctrl_buffers} control buffers")
        if self.buffer_size <= HEADER_SIZE:
            raise StreamError(f"peer announced buffers of {self.buffer_size} bytes")


class RdmaStream:
    """One RC connection: credits, fragmentation, ordering, connection states."""

    def __init__(self, config: StreamConfig | None = None) -> None:
        self.config = config or StreamConfig()
        self.state = ConnState.INIT
        self.error: str | None = None
        self.peer_closed = False
        self._peer: PeerParams | None = None
        # --- send side
        self._queue: deque[bytes] = deque()  # whole frames not yet fully posted
        self._queue_offset = 0  # bytes of _queue[0] already fragmented out
        self._queued_bytes = 0
        self._data_credits = 0  # peer data buffers we may still fill
        self._ctrl_credits = 0
        self._free_slots: list[int] = list(range(self.config.send_slots - 1, -1, -1))
        self._inflight: deque[tuple[int, int]] = deque()  # (seq, slot) in posting order
        self._send_seq = 0
        self._close_seq: int | None = None
        self._close_wanted = False
        # --- receive side
        self._posted: deque[int] = deque()  # receive buffers, in posting order
        self._recv_seq = 0
        self._owed_data = 0  # re-posted data buffers not yet granted
        self._owed_ctrl = 0
        self._peer_data_credits = self.config.buffers  # our view of the peer's credits
        self._peer_ctrl_credits = self.config.ctrl_buffers
        self._partial: list[bytes] = []
        self._partial_bytes = 0
        self._in_frame = False
        self._frames: deque[bytes] = deque()
        self._ready_bytes = 0  # complete frames not popped yet
        # --- counters (for tests, logs and the benchmark)
        self.messages_sent = 0
        self.messages_received = 0
        self.credit_messages_sent = 0

    # ------------------------------------------------------------ connection

    def begin_exchange(self) -> None:
        self._expect(ConnState.INIT)
        self.state = ConnState.EXCHANGING

    def on_exchanged(self, peer: PeerParams) -> None:
        self._expect(ConnState.EXCHANGING)
        peer.validate()
        self._peer = peer
        self._data_credits = peer.buffers
        self._ctrl_credits = peer.ctrl_buffers

    def on_rtr(self) -> list[Action]:
        """The QP can receive: post every receive buffer, before the peer may send."""
        self._expect(ConnState.EXCHANGING)
        if self._peer is None:
            raise StreamError("on_rtr before on_exchanged")
        self.state = ConnState.RTR
        actions: list[Action] = []
        for i in range(self.config.recv_buffers):
            self._posted.append(i)
            actions.append(PostRecv(i))
        return actions

    def on_rts(self) -> None:
        self._expect(ConnState.RTR)
        self.state = ConnState.RTS

    def on_peer_ready(self) -> list[Action]:
        """The peer has posted its receive buffers: we may send."""
        self._expect(ConnState.RTS)
        self.state = ConnState.ESTABLISHED
        return self._pump()

    def close(self) -> list[Action]:
        """Start an orderly close: CLOSE goes out after everything queued."""
        if self.state in (ConnState.CLOSED, ConnState.FAILED, ConnState.CLOSING):
            return []
        if self.state is not ConnState.ESTABLISHED or self.peer_closed:
            self.state = ConnState.CLOSED
            return []
        self.state = ConnState.CLOSING
        self._close_wanted = True
        return self._pump()

    def shutdown(self) -> None:
        """Local teardown (the QP is being destroyed): CLOSED unless already FAILED."""
        if self.state is not ConnState.FAILED:
            self.state = ConnState.CLOSED

    def fail(self, reason: str) -> None:
        """Move to FAILED (idempotent; the first reason is kept)."""
        if self.state is not ConnState.FAILED:
            self.error = reason
            self.state = ConnState.FAILED

    # ------------------------------------------------------------ send side

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    @property
    def inflight(self) -> int:
        """SENDs posted and not yet completed."""
        return len(self._inflight)

    @property
    def data_credits(self) -> int:
        return self._data_credits

    @property
    def sendable(self) -> bool:
        """Whether frames may still be queued (not closing, closed or failed)."""
        return self.state in _SENDABLE and not self.peer_closed

    def can_queue(self, size: int) -> bool:
        if size > self.config.max_queued_bytes:
            return False
        return self._queued_bytes + size <= self.config.max_queued_bytes

    def queue_frame(self, frame: bytes) -> list[Action]:
        if not self.sendable:
            raise StreamError(f"cannot send: connection is {self.state.value}")
        size = len(frame)
        if size > self.config.max_queued_bytes:
            raise FrameTooLarge(
                f"frame of {size} bytes exceeds the {self.config.max_queued_bytes}-byte limit"
            )
        if not self.can_queue(size):
            raise StreamFull(f"{self._queued_bytes} bytes queued; wait for can_queue({size})")
        self._queue.append(bytes(frame))
        self._queued_bytes += size
        return self._pump()

    def on_send_completion(self, wr_id: int, ok: bool = True, status: str = "") -> list[Action]:
        if self.state is ConnState.FAILED or (
            self.state is ConnState.CLOSED and not self._inflight
        ):
            return []
        if not ok:
            return self._fault(f"send work request {wr_id} failed: {status or 'error'}")
        if not self._inflight:
            return self._fault(f"send completion {wr_id} with nothing in flight (duplicate?)")
        seq, slot = self._inflight[0]
        if wr_id != seq:
            # RC completes sends in posting order: anything else is a lost,
            # duplicated or reordered completion.
            return self._fault(f"send completion {wr_id} out of order (expected {seq})")
        self._inflight.popleft()
        self._free_slots.append(slot)
        if self._close_seq is not None and seq == self._close_seq:
            self.state = ConnState.CLOSED
            return []
        return self._pump()

    # ------------------------------------------------------------ receive side

    @property
    def posted(self) -> int:
        """Receive buffers posted right now."""
        return len(self._posted)

    @property
    def buffered_bytes(self) -> int:
        """Received bytes the reader has not taken: complete frames plus a partial one."""
        return self._ready_bytes + self._partial_bytes

    def pop_frame(self) -> bytes | None:
        """The next whole frame, or None. Frames completed before a failure
        stay readable; nothing after the fault ever is."""
        if not self._frames:
            return None
        frame = self._frames.popleft()
        self._ready_bytes -= len(frame)
        return frame

    def after_pop(self) -> list[Action]:
        """Call after popping frames: grants withheld for a full reader may go out."""
        return self._pump()

    @property
    def frames_ready(self) -> int:
        return len(self._frames)

    def on_recv_completion(
        self, buf_index: int, data: bytes, ok: bool = True, status: str = ""
    ) -> list[Action]:
        if self.state in (ConnState.FAILED, ConnState.CLOSED):
            return []  # flushed receives after teardown carry nothing
        if self.state not in _RECEIVING:
            return self._fault(f"receive completion in state {self.state.value}")
        if not ok:
            return self._fault(f"receive work request {buf_index} failed: {status or 'error'}")
        if not self._posted or self._posted[0] != buf_index:
            head = self._posted[0] if self._posted else None
            return self._fault(
                f"receive completion for buffer {buf_index}, expected {head} "
                "(lost, duplicated or reordered completion)"
            )
        if len(data) < HEADER_SIZE:
            return self._fault(f"message of {len(data)} bytes is shorter than the header")
        if len(data) > self.config.buffer_size:
            return self._fault(f"message of {len(data)} bytes overflows the buffer")
        kind, flags, grant, ctrl_grant, seq = HEADER.unpack_from(data)
        if seq != self._recv_seq:
            return self._fault(
                f"message sequence {seq}, expected {self._recv_seq} "
                "(lost, duplicated or reordered message)"
            )
        if self.peer_closed:
            return self._fault("message after the peer's CLOSE")
        payload = data[HEADER_SIZE:]
        if kind == KIND_DATA:
            if self._peer_data_credits < 1:
                return self._fault("peer sent data without a credit")
            self._peer_data_credits -= 1
        elif kind in (KIND_CREDIT, KIND_CLOSE):
            if payload:
                return self._fault(f"control message of kind {kind} carries a payload")
            if self._peer_ctrl_credits < 1:
                return self._fault("peer sent a control message without a credit")
            self._peer_ctrl_credits -= 1
        else:
            return self._fault(f"unknown message kind {kind}")
        # The message is valid: consume the buffer and re-post it at once (its
        # bytes are already copied out), then apply the peer's grants.
        self._posted.popleft()
        self._posted.append(buf_index)
        self._recv_seq = (self._recv_seq + 1) % SEQ_MOD
        self.messages_received += 1
        actions: list[Action] = [PostRecv(buf_index)]
        if kind == KIND_DATA:
            self._owed_data += 1
        else:
            self._owed_ctrl += 1
        assert self._peer is not None
        self._data_credits += grant
        self._ctrl_credits += ctrl_grant
        if self._data_credits > self._peer.buffers or self._ctrl_credits > self._peer.ctrl_buffers:
            return self._fault("peer granted more credits than it has buffers")
        if kind == KIND_DATA:
            err = self._take_fragment(flags, payload)
            if err:
                return self._fault(err)
        elif kind == KIND_CLOSE:
            if self._in_frame:
                return self._fault("peer closed in the middle of a frame")
            self.peer_closed = True
            self.state = ConnState.CLOSED
            return actions
        actions.extend(self._pump())
        return actions

    def _take_fragment(self, flags: int, payload: bytes) -> str | None:
        first = bool(flags & FLAG_FIRST)
        if first and self._in_frame:
            return "FIRST fragment inside an unfinished frame"
        if not first and not self._in_frame:
            return "continuation fragment without a FIRST"
        if self._partial_bytes + len(payload) > self.config.max_buffered_bytes:
            return f"incoming frame exceeds the {self.config.max_buffered_bytes}-byte limit"
        self._in_frame = True
        self._partial.append(payload)
        self._partial_bytes += len(payload)
        if flags & FLAG_LAST:
            frame = b"".join(self._partial) if len(self._partial) > 1 else self._partial[0]
            self._partial = []
            self._partial_bytes = 0
            self._in_frame = False
            self._frames.append(frame)
            self._ready_bytes += len(frame)
        return None

    # ------------------------------------------------------------ internals

    def _expect(self, state: ConnState) -> None:
        if self.state is not state:
            raise StreamError(f"expected state {state.value}, in {self.state.value}")

    def _fault(self, reason: str) -> list[Action]:
        self.fail(reason)
        raise StreamError(reason)

    def _withholding(self) -> bool:
        # Only complete frames count: a frame in reassembly must be able to
        # finish, or a frame near the limit would deadlock both sides.
        return self._ready_bytes >= self.config.max_buffered_bytes

    def _grants(self) -> tuple[int, int]:
        """Grants to piggyback on the next message, and forget them as owed."""
        data = 0 if self._withholding() else min(self._owed_data, MAX_GRANT)
        ctrl = min(self._owed_ctrl, MAX_GRANT)
        self._owed_data -= data
        self._owed_ctrl -= ctrl
        self._peer_data_credits += data
        self._peer_ctrl_credits += ctrl
        return data, ctrl

    def _post(self, kind: int, flags: int, payload: bytes | memoryview) -> PostSend:
        slot = self._free_slots.pop()
        grant, ctrl_grant = self._grants()
        seq = self._send_seq
        self._send_seq = (seq + 1) % SEQ_MOD
        self._inflight.append((seq, slot))
        self.messages_sent += 1
        return PostSend(seq, slot, HEADER.pack(kind, flags, grant, ctrl_grant, seq) + payload)

    def _credit_due(self) -> bool:
        if self._owed_data == 0 or self._withholding():
            return False
        # Grant in batches; but grant at once when the peer, as far as we can
        # tell, has no data credit left (it may be blocked on us).
        return self._owed_data >= self.config.batch or self._peer_data_credits == 0

    def _pump(self) -> list[Action]:
        if self.state not in (ConnState.ESTABLISHED, ConnState.CLOSING):
            return []
        assert self._peer is not None
        frag = self._peer.buffer_size - HEADER_SIZE
        actions: list[Action] = []
        while self._free_slots:
            if self._queue and self._data_credits >= 1:
                frame = self._queue[0]
                start = self._queue_offset
                end = min(len(frame), start + frag)
                flags = (FLAG_FIRST if start == 0 else 0) | (FLAG_LAST if end == len(frame) else 0)
                self._data_credits -= 1
                actions.append(self._post(KIND_DATA, flags, memoryview(frame)[start:end]))
                if end == len(frame):
                    self._queue.popleft()
                    self._queue_offset = 0
                    self._queued_bytes -= len(frame)
                else:
                    self._queue_offset = end
                continue
            if self._ctrl_credits < 1:
                break
            if self._close_wanted and not self._queue:
                self._close_wanted = False
                self._ctrl_credits -= 1
                post = self._post(KIND_CLOSE, 0, b"")
                self._close_seq = post.wr_id
                actions.append(post)
                break
            if self._credit_due():
                self._ctrl_credits -= 1
                self.credit_messages_sent += 1
                actions.append(self._post(KIND_CREDIT, 0, b""))
                continue
            break
        return actions
