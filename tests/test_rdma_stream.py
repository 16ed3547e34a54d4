"""The RDMA stream state machine, exhaustively, against a simulated RC wire.

The simulator models what an RC queue pair guarantees and nothing more: each
direction's SENDs are placed in posting order into the receiver's receive
queue head, a receive completion appears at the receiver and then a send
completion at the sender, and completions are handed to the stream in
whatever interleaving hypothesis picks. Placing a SEND when the receiver has no
posted buffer would be an RNR on a real NIC: the simulator treats it as a
broken credit invariant and fails the test.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import pytest
from artemis.protocol.rdma.stream import (
    HEADER,
    HEADER_SIZE,
    KIND_DATA,
    ConnState,
    FrameTooLarge,
    PeerParams,
    PostRecv,
    PostSend,
    RdmaStream,
    StreamConfig,
    StreamError,
    StreamFull,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BUF = 64  # small buffers so that frames of a few hundred bytes span several


@dataclass
class Side:
    name: str
    stream: RdmaStream
    rq: deque[int] = field(default_factory=deque)  # buffers posted on the "NIC"
    cq: deque[tuple[str, int, bytes]] = field(default_factory=deque)
    slots_in_use: set[int] = field(default_factory=set)
    to_send: deque[bytes] = field(default_factory=deque)
    sent: list[bytes] = field(default_factory=list)
    got: list[bytes] = field(default_factory=list)
    reading: bool = True
    stalled: bool = False  # stops polling its CQ (a hung peer)
    peak_queued: int = 0
    peak_buffered: int = 0


class Wire:
    """Two streams joined by a simulated RC connection."""

    def __init__(self, cfg_a: StreamConfig, cfg_b: StreamConfig, rng: random.Random) -> None:
        self.rng = rng
        self.a = Side("a", RdmaStream(cfg_a))
        self.b = Side("b", RdmaStream(cfg_b))
        self.wire: dict[str, deque[tuple[int, int, bytes]]] = {"a": deque(), "b": deque()}
        self.fault_hook: dict[str, object] = {}
        for me, peer in ((self.a, self.b), (self.b, self.a)):
            me.stream.begin_exchange()
            c = peer.stream.config
            me.stream.on_exchanged(PeerParams(c.buffers, c.ctrl_buffers, c.buffer_size))
        for side in (self.a, self.b):
            self.apply(side, side.stream.on_rtr())
            side.stream.on_rts()
        for side in (self.a, self.b):
            self.apply(side, side.stream.on_peer_ready())

    def peer(self, side: Side) -> Side:
        return self.b if side is self.a else self.a

    def apply(self, side: Side, actions: list[PostSend | PostRecv]) -> None:
        peer = self.peer(side)
        for act in actions:
            if isinstance(act, PostRecv):
                assert act.buf_index not in side.rq, "buffer posted twice"
                assert 0 <= act.buf_index < side.stream.config.recv_buffers
                side.rq.append(act.buf_index)
            else:
                assert act.slot not in side.slots_in_use, "send slot reused while in flight"
                assert len(act.data) <= peer.stream.config.buffer_size
                side.slots_in_use.add(act.slot)
                self.wire[side.name].append((act.wr_id, act.slot, act.data))
        # The credit invariant: every message in flight towards the peer has a
        # posted buffer waiting for it.
        assert len(self.wire[side.name]) <= len(peer.rq), "sender exceeded the receiver's buffers"
        side.peak_queued = max(side.peak_queued, side.stream.queued_bytes)
        side.peak_buffered = max(side.peak_buffered, side.stream.buffered_bytes)

    # ---- the moves a scheduler may pick

    def moves(self) -> list[tuple[str, Side]]:
        out: list[tuple[str, Side]] = []
        for side in (self.a, self.b):
            if self.wire[side.name]:
                out.append(("place", side))
            if side.cq and not side.stalled:
                out.append(("complete", side))
            if (
                side.to_send
                and side.stream.sendable
                and side.stream.can_queue(len(side.to_send[0]))
            ):
                out.append(("queue", side))
            if side.reading and side.stream.frames_ready:
                out.append(("read", side))
        return out

    def step(self, move: str, side: Side) -> None:
        if move == "place":
            wr_id, slot, data = self.wire[side.name].popleft()
            peer = self.peer(side)
            assert peer.rq, "RNR: SEND placed with no posted receive buffer"
            buf = peer.rq.popleft()
            peer.cq.append(("recv", buf, data))
            side.cq.append(("send", wr_id, b""))
            side.slots_in_use.discard(slot)
        elif move == "complete":
            kind, ident, data = side.cq.popleft()
            hook = self.fault_hook.get(side.name)
            entries = [(kind, ident, data)]
            if callable(hook):
                entries = hook(kind, ident, data, side.cq)
            for kind, ident, data in entries:
                if kind == "recv":
                    self.apply(side, side.stream.on_recv_completion(ident, data))
                else:
                    self.apply(side, side.stream.on_send_completion(ident))
        elif move == "queue":
            frame = side.to_send.popleft()
            side.sent.append(frame)
            self.apply(side, side.stream.queue_frame(frame))
        elif move == "read":
            while (frame := side.stream.pop_frame()) is not None:
                side.got.append(frame)
            self.apply(side, side.stream.after_pop())

    def run(self, max_steps: int = 200_000) -> int:
        for n in range(max_steps):
            moves = self.moves()
            if not moves:
                return n
            self.step(*self.rng.choice(moves))
        raise AssertionError("no quiescence: livelock")


def cfg(
    buffers: int = 4, ctrl: int = 2, size: int = BUF, slots: int = 6, **kw: int
) -> StreamConfig:
    return StreamConfig(
        buffers=buffers, ctrl_buffers=ctrl, buffer_size=size, send_slots=slots, **kw
    )


# Seeded generators drive the interleaving: cheap for hypothesis to draw, and
# every failure replays exactly from its seed.
rngs = st.integers(0, 2**32 - 1).map(random.Random)
frame_sizes = st.integers(0, 5 * (BUF - HEADER_SIZE) + 3)
frames_st = st.lists(frame_sizes, max_size=25)


def make_frames(sizes: list[int], tag: int) -> list[bytes]:
    # Distinct content per frame and per position: any mix-up shows.
    return [bytes((tag * 31 + i * 7 + j) % 251 for j in range(n)) for i, n in enumerate(sizes)]


configs = st.builds(
    cfg,
    buffers=st.integers(1, 6),
    ctrl=st.integers(1, 3),
    size=st.sampled_from([HEADER_SIZE + 1, HEADER_SIZE + 7, BUF]),
    slots=st.integers(1, 8),
    # 50 is more than any buffer count: only the "peer is out of credits"
    # rule can hand grants back then.
    credit_batch=st.sampled_from([0, 1, 50]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames_st, frames_st, configs, configs, rngs)
def test_frames_arrive_intact_and_in_order(
    sizes_a: list[int],
    sizes_b: list[int],
    cfg_a: StreamConfig,
    cfg_b: StreamConfig,
    rng: random.Random,
) -> None:
    w = Wire(cfg_a, cfg_b, rng)
    w.a.to_send.extend(make_frames(sizes_a, 1))
    w.b.to_send.extend(make_frames(sizes_b, 2))
    w.run()
    # Quiescent: nothing left anywhere, and every frame arrived whole, in order.
    assert w.b.got == w.a.sent == make_frames(sizes_a, 1)
    assert w.a.got == w.b.sent == make_frames(sizes_b, 2)
    for side in (w.a, w.b):
        assert side.stream.state is ConnState.ESTABLISHED
        assert side.stream.inflight == 0 and not side.slots_in_use
        assert side.stream.posted == side.stream.config.recv_buffers


@settings(max_examples=100, deadline=None)
@given(frames_st, configs, configs, rngs)
def test_orderly_close_delivers_everything_first(
    sizes: list[int], cfg_a: StreamConfig, cfg_b: StreamConfig, rng: random.Random
) -> None:
    w = Wire(cfg_a, cfg_b, rng)
    for frame in make_frames(sizes, 3):
        while not w.a.stream.can_queue(len(frame)):
            w.step(*rng.choice(w.moves()))
        w.a.sent.append(frame)
        w.apply(w.a, w.a.stream.queue_frame(frame))
    w.apply(w.a, w.a.stream.close())
    assert w.a.stream.state is ConnState.CLOSING
    assert not w.a.stream.sendable
    w.run()
    assert w.b.got == w.a.sent
    assert w.a.stream.state is ConnState.CLOSED
    assert w.b.stream.state is ConnState.CLOSED and w.b.stream.peer_closed
    with pytest.raises(StreamError):
        w.b.stream.queue_frame(b"late")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), rngs)
def test_reader_that_stops_bounds_memory_then_resumes(
    buffers: int, frames_per_limit: int, rng: random.Random
) -> None:
    frame = bytes(range(100))
    limit = frames_per_limit * len(frame)
    c = cfg(buffers=buffers, max_queued_bytes=limit, max_buffered_bytes=limit)
    w = Wire(c, c, rng)
    w.b.reading = False
    w.a.to_send.extend([frame] * 200)
    w.run()
    # Stuck by back-pressure, not by a bug: sender's queue is full, nothing in flight.
    assert w.a.to_send
    assert not w.a.stream.can_queue(len(frame))
    assert w.a.stream.data_credits == 0
    assert w.a.peak_queued <= limit
    frag = BUF - HEADER_SIZE
    assert w.b.peak_buffered <= limit + len(frame) + buffers * frag
    delivered_before = w.b.stream.frames_ready
    w.b.reading = True
    w.run()
    assert delivered_before > 0
    assert w.b.got == w.a.sent and len(w.b.got) == 200


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 3), rngs)
def test_stalled_peer_never_overrun_and_sender_memory_bounded(
    buffers: int, ctrl: int, rng: random.Random
) -> None:
    limit = 1000
    c = cfg(buffers=buffers, ctrl=ctrl, max_queued_bytes=limit)
    w = Wire(c, c, rng)
    w.b.stalled = True  # never polls its CQ: never re-posts, never grants
    w.a.to_send.extend([bytes(300)] * 50)
    w.run()
    # The wire held at most what b had posted (asserted on every action),
    # a spent exactly b's data credits, and its queue stayed within the limit.
    assert len(w.b.cq) <= buffers + ctrl
    assert w.a.stream.data_credits == 0
    assert w.a.peak_queued <= limit
    assert w.a.to_send  # send() would be waiting now
    w.b.stalled = False
    w.run()
    assert w.b.got == w.a.sent and len(w.b.got) == 50


# ---------------------------------------------------------------- faults


def _fault_hook(kind: str, which: str, at: int):  # type: ignore[no-untyped-def]
    """A CQ filter that loses, duplicates or reorders the at-th completion of ``which``."""
    seen = {"n": 0}

    def hook(k: str, ident: int, data: bytes, cq: deque[tuple[str, int, bytes]]):  # type: ignore[no-untyped-def]
        if k != which:
            return [(k, ident, data)]
        seen["n"] += 1
        if seen["n"] != at:
            return [(k, ident, data)]
        if kind == "lose":
            return []
        if kind == "duplicate":
            return [(k, ident, data), (k, ident, data)]
        # reorder: hand over the next completion of the same kind first
        for i, entry in enumerate(cq):
            if entry[0] == which:
                del cq[i]
                return [entry, (k, ident, data)]
        return [(k, ident, data)]

    return hook


@settings(max_examples=200, deadline=None)
@given(
    st.lists(frame_sizes, min_size=1, max_size=15),
    st.sampled_from(["lose", "duplicate", "reorder"]),
    st.sampled_from(["recv", "send"]),
    st.integers(1, 30),
    rngs,
)
def test_bad_completions_fail_cleanly_never_corrupt(
    sizes: list[int], fault: str, which: str, at: int, rng: random.Random
) -> None:
    c = cfg(buffers=3, ctrl=2)
    w = Wire(c, c, rng)
    frames = make_frames(sizes, 5)
    w.a.to_send.extend(frames)
    victim = w.b if which == "recv" else w.a
    hook = _fault_hook(fault, which, at)
    fired = {"later": False, "fault": False}

    def watching(k, ident, data, cq):  # type: ignore[no-untyped-def]
        if fired["fault"] and k == which:
            fired["later"] = True
        out = hook(k, ident, data, cq)
        if len(out) != 1 or out[0] != (k, ident, data):
            fired["fault"] = True
            if len(out) > 1 and fault == "duplicate":
                fired["later"] = True  # the duplicate itself comes right after
            if len(out) == 2 and fault == "reorder":
                fired["later"] = True
        return out

    w.fault_hook[victim.name] = watching
    try:
        w.run()
    except StreamError:
        assert victim.stream.state is ConnState.FAILED
        assert victim.stream.error
        # no further completion is accepted, nothing more is ever delivered
        assert victim.stream.on_recv_completion(0, b"x" * HEADER_SIZE) == []
    else:
        # Undetected only when no completion of that kind came after the fault.
        assert not fired["later"]
    # Whatever arrived is a prefix of what was sent, byte for byte.
    assert w.b.got == frames[: len(w.b.got)]
    if not fired["fault"]:
        assert w.b.got == frames


def _established(c: StreamConfig) -> RdmaStream:
    s = RdmaStream(c)
    s.begin_exchange()
    s.on_exchanged(PeerParams(c.buffers, c.ctrl_buffers, c.buffer_size))
    s.on_rtr()
    s.on_rts()
    s.on_peer_ready()
    return s


def msg(kind: int, flags: int, seq: int, payload: bytes = b"", grant: int = 0) -> bytes:
    return HEADER.pack(kind, flags, grant, 0, seq) + payload


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"short", "shorter than the header"),
        (msg(KIND_DATA, 0, 0, b"x"), "without a FIRST"),
        (msg(KIND_DATA, 3, 1, b"x"), "sequence 1, expected 0"),
        (msg(9, 3, 0), "unknown message kind"),
        (msg(2, 0, 0, b"payload"), "carries a payload"),
        (msg(KIND_DATA, 3, 0, grant=99), "more credits"),
    ],
)
def test_malformed_messages_fail_the_stream(data: bytes, why: str) -> None:
    s = _established(cfg())
    with pytest.raises(StreamError, match=why):
        s.on_recv_completion(0, data)
    assert s.state is ConnState.FAILED and s.frames_ready == 0


def test_first_inside_frame_and_close_mid_frame_fail() -> None:
    s = _established(cfg())
    s.on_recv_completion(0, msg(KIND_DATA, 1, 0, b"ab"))
    with pytest.raises(StreamError, match="inside an unfinished frame"):
        s.on_recv_completion(1, msg(KIND_DATA, 3, 1, b"cd"))
    s = _established(cfg())
    s.on_recv_completion(0, msg(KIND_DATA, 1, 0, b"ab"))
    with pytest.raises(StreamError, match="middle of a frame"):
        s.on_recv_completion(1, msg(3, 0, 1))


def test_peer_exceeding_credits_is_refused() -> None:
    # A reader that is full withholds grants: the peer's two data credits
    # are spent after two DATA messages, and a third one is an overrun.
    s = _established(cfg(buffers=2, ctrl=1, max_buffered_bytes=1))
    s.on_recv_completion(0, msg(KIND_DATA, 3, 0, b"z"))
    s.on_recv_completion(1, msg(KIND_DATA, 3, 1, b"z"))
    assert s.frames_ready == 2 and s.credit_messages_sent == 0
    with pytest.raises(StreamError, match="without a credit"):
        s.on_recv_completion(2, msg(KIND_DATA, 3, 2, b"z"))


def test_failed_work_request_fails_stream() -> None:
    s = _established(cfg())
    acts = s.queue_frame(b"hello")
    send = next(a for a in acts if isinstance(a, PostSend))
    with pytest.raises(StreamError, match="retry exceeded"):
        s.on_send_completion(send.wr_id, ok=False, status="retry exceeded")
    with pytest.raises(StreamError):
        s.queue_frame(b"more")


def test_send_side_limits() -> None:
    s = _established(cfg(max_queued_bytes=100, buffers=1, slots=1))
    with pytest.raises(FrameTooLarge):
        s.queue_frame(bytes(101))
    s.queue_frame(bytes(60))  # one fragment goes out on the only credit ...
    s.queue_frame(bytes(40))  # ... the rest waits in the queue, counted whole
    assert s.queued_bytes == 100 and s.inflight == 1
    assert not s.can_queue(1)
    with pytest.raises(StreamFull):
        s.queue_frame(b"x")


def test_connection_states_and_reconnect() -> None:
    s = RdmaStream(cfg())
    assert s.state is ConnState.INIT
    with pytest.raises(StreamError):
        s.on_rtr()  # no exchange yet
    s.begin_exchange()
    with pytest.raises(StreamError):
        s.on_exchanged(PeerParams(0, 1, BUF))
    s.on_exchanged(PeerParams(4, 2, BUF))
    acts = s.on_rtr()
    assert [a.buf_index for a in acts if isinstance(a, PostRecv)] == list(range(6))
    assert s.state is ConnState.RTR
    s.on_rts()
    s.queue_frame(b"early")  # queued before the peer is ready: held back
    assert s.inflight == 0
    assert any(isinstance(a, PostSend) for a in s.on_peer_ready())
    s.fail("peer vanished")
    assert s.state is ConnState.FAILED and s.error == "peer vanished"
    assert s.close() == []
    # A new connection is a new stream: it works from scratch.
    w = Wire(cfg(), cfg(), random.Random(7))
    w.a.to_send.extend(make_frames([0, 1, 500], 9))
    w.run()
    assert w.b.got == make_frames([0, 1, 500], 9)
