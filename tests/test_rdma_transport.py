"""RdmaTransport end to end over the loopback adapter.

Real pieces everywhere except the NIC: the TCP side channel on 127.0.0.1,
the HMAC handshake from artemis.protocol.auth, the completion fd on the event
loop, the stream state machine. The loopback adapter stands in for the QP.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgpack
import pytest
from artemis.protocol.rdma.loopback import LoopbackAdapter, LoopbackFaults
from artemis.protocol.rdma.stream import ConnState
from artemis.protocol.rdma.transport import (
    RdmaChannel,
    RdmaHandshakeError,
    RdmaTransport,
    RdmaUnavailable,
    make_transport,
)
from artemis.protocol.rdma.verbs import probe
from artemis.protocol.transport import ChannelClosed, FrameChannel

SECRET = b"correct horse battery staple"
pytestmark = pytest.mark.timeout(30)


class Factory:
    """Makes loopback adapters and remembers them, so tests can inject faults."""

    def __init__(self, faults: LoopbackFaults | None = None) -> None:
        self.made: list[LoopbackAdapter] = []
        self.faults = faults

    def __call__(self, device: str | None, port: int, gid_index: int) -> LoopbackAdapter:
        a = LoopbackAdapter(device, port, gid_index, faults=self.faults)
        self.made.append(a)
        return a


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 25))


async def until(cond: Callable[[], bool], limit: int = 100_000) -> None:
    """Yield to the loop until ``cond`` holds (a bound, not a sleep)."""
    for _ in range(limit):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def frames_of(sizes: list[int]) -> list[bytes]:
    return [bytes((i * 13 + j) % 256 for j in range(n)) for i, n in enumerate(sizes)]


Serve = Callable[[FrameChannel], Awaitable[None]]


async def serve(
    transport: RdmaTransport, handler: Serve
) -> tuple[Any, asyncio.Queue[FrameChannel]]:
    accepted: asyncio.Queue[FrameChannel] = asyncio.Queue()

    async def wrapped(ch: FrameChannel) -> None:
        accepted.put_nowait(ch)
        await handler(ch)

    listener = await transport.listen("127.0.0.1:0", wrapped)
    return listener, accepted


def test_frames_round_trip_both_ways_with_auth() -> None:
    size = 4096
    sizes = [0, 1, 4085, 4086, 4087, size, 3 * size + 5, 1 << 20, 7]
    frames = frames_of(sizes)
    fs, fc = Factory(), Factory()

    async def echo(ch: FrameChannel) -> None:
        for _ in frames:
            await ch.send(await ch.recv())

    async def main() -> None:
        server = RdmaTransport(fs, buffer_size=size, buffers=8, secret=SECRET)
        client = RdmaTransport(fc, buffer_size=size, buffers=8, secret=SECRET)
        listener, _ = await serve(server, echo)
        ch = await client.connect(listener.address)
        assert ch.peer == listener.address

        async def sender() -> None:
            for f in frames:
                await ch.send(f)

        task = asyncio.ensure_future(sender())
        got = [await ch.recv() for _ in frames]
        await task
        assert got == frames
        await ch.close()
        await listener.close()
        # credits were never exceeded: no SEND ever waited for a buffer
        assert [a.rnr_waits for a in fs.made + fc.made] == [0, 0]

    run(main())


def test_orderly_close_delivers_everything_then_closed() -> None:
    frames = frames_of([10, 5000, 0, 70000] * 5)
    received: list[bytes] = []

    async def main() -> None:
        finished = asyncio.Event()

        async def sink(ch: FrameChannel) -> None:
            try:
                while True:
                    received.append(await ch.recv())
            except ChannelClosed:
                finished.set()

        server = RdmaTransport(Factory(), buffer_size=1024, buffers=4)
        listener, _ = await serve(server, sink)
        ch = await RdmaTransport(Factory(), buffer_size=1024, buffers=4).connect(listener.address)
        for f in frames:
            await ch.send(f)
        await ch.close()
        await finished.wait()
        assert received == frames
        with pytest.raises(ChannelClosed):
            await ch.send(b"after close")
        with pytest.raises(ChannelClosed):
            await ch.recv()
        await listener.close()

    run(main())


@pytest.mark.parametrize(
    ("server_secret", "client_secret", "why"),
    [
        (SECRET, b"wrong secret", "failed authentication"),
        (SECRET, None, "requires a shared secret|authentication required"),
        (None, SECRET, "failed authentication"),
    ],
)
def test_handshake_refusals(
    server_secret: bytes | None, client_secret: bytes | None, why: str
) -> None:
    fs = Factory()
    handled: list[FrameChannel] = []

    async def handler(ch: FrameChannel) -> None:
        handled.append(ch)

    async def main() -> None:
        listener, _ = await serve(RdmaTransport(fs, secret=server_secret), handler)
        with pytest.raises(RdmaHandshakeError, match=why):
            await RdmaTransport(Factory(), secret=client_secret).connect(listener.address)
        await listener.close()

    run(main())
    assert handled == []
    if client_secret is not None:
        # The wrong secret is found before the coordinator makes a queue pair.
        assert fs.made == []


def test_impostor_agent_gets_no_queue_pair() -> None:
    """A client that cannot prove the secret, speaking the side channel by hand."""
    fs = Factory()

    async def send(w: asyncio.StreamWriter, msg: dict[str, Any]) -> None:
        body = msgpack.packb(msg, use_bin_type=True)
        w.write(len(body).to_bytes(4, "big") + body)
        await w.drain()

    async def recv(r: asyncio.StreamReader) -> dict[str, Any]:
        n = int.from_bytes(await r.readexactly(4), "big")
        msg = msgpack.unpackb(await r.readexactly(n), raw=False)
        assert isinstance(msg, dict)
        return msg

    async def main() -> None:
        listener, _ = await serve(RdmaTransport(fs, secret=SECRET), lambda ch: ch.close())
        host, port = listener.address.rsplit(":", 1)
        r, w = await asyncio.open_connection(host, int(port))
        await send(w, {"t": "hello", "v": 1, "nonce": os.urandom(32), "auth": True})
        challenge = await recv(r)
        assert challenge["t"] == "challenge" and len(challenge["proof"]) == 32
        await send(w, {"t": "auth", "proof": os.urandom(32), "info": {"qpn": 1}})
        answer = await recv(r)
        assert answer == {"t": "error", "reason": "authentication failed"}
        assert await r.read() == b""  # and the coordinator hangs up
        w.close()
        await listener.close()

    run(main())
    assert fs.made == []


def test_reader_that_stops_makes_send_wait_with_bounded_memory() -> None:
    limit = 64 * 1024
    frame = bytes(range(256)) * 40  # 10 KiB
    fs, fc = Factory(), Factory()

    async def main() -> None:
        gate = asyncio.Event()
        got: list[bytes] = []

        async def slow(ch: FrameChannel) -> None:
            await gate.wait()
            for _ in range(100):
                got.append(await ch.recv())

        server = RdmaTransport(fs, buffer_size=2048, buffers=4, max_queued_bytes=limit)
        listener, _ = await serve(server, slow)
        ch = await RdmaTransport(fc, buffer_size=2048, buffers=4, max_queued_bytes=limit).connect(
            listener.address
        )
        assert isinstance(ch, RdmaChannel)
        sent = 0

        async def sender() -> None:
            nonlocal sent
            for _ in range(100):
                await ch.send(frame)
                sent += 1

        task = asyncio.ensure_future(sender())
        await until(lambda: ch.stream.data_credits == 0 and not ch.stream.can_queue(len(frame)))
        for _ in range(1000):  # let the loop run: nothing may move now
            await asyncio.sleep(0)
        assert not task.done() and sent < 100
        assert ch.stream.queued_bytes <= limit
        # credits, not the NIC, stopped the sender: no SEND waited for a buffer
        assert fc.made[0].rnr_waits == 0 and fs.made[0].rnr_waits == 0
        gate.set()
        await task
        await until(lambda: len(got) == 100)
        assert got == [frame] * 100
        await ch.close()
        await listener.close()

    run(main())


def test_peer_that_stops_reposting_blocks_sender_without_overrun() -> None:
    limit = 32 * 1024
    fs = Factory(LoopbackFaults(stop_reposting=True))
    fc = Factory()

    async def main() -> None:
        async def reader(ch: FrameChannel) -> None:
            while True:
                await ch.recv()

        server = RdmaTransport(fs, buffer_size=1024, buffers=4, max_queued_bytes=limit)
        listener, _ = await serve(server, reader)
        ch = await RdmaTransport(fc, buffer_size=1024, buffers=4, max_queued_bytes=limit).connect(
            listener.address
        )
        assert isinstance(ch, RdmaChannel)

        async def sender() -> None:
            while True:
                await ch.send(bytes(1000))

        task = asyncio.ensure_future(sender())
        # SENDs wait at the NIC (RNR) for buffers that never come back
        await until(lambda: not ch.stream.can_queue(1000) and fc.made[0].rnr_waits > 0)
        for _ in range(1000):
            await asyncio.sleep(0)
        assert not task.done()
        assert ch.stream.queued_bytes <= limit
        assert ch.stream.inflight <= ch.stream.config.send_slots
        task.cancel()
        await ch.close()
        await listener.close()

    run(main())


@pytest.mark.parametrize("fault", ["lose", "duplicate", "reorder"])
def test_bad_completion_fails_cleanly_and_reconnect_works(fault: str) -> None:
    at = 6
    faults = LoopbackFaults(**{f"{fault}_recv": {at}})
    frames = frames_of([300] * 20)

    async def main() -> None:
        got: list[bytes] = []
        outcome: list[BaseException] = []

        async def collect(ch: FrameChannel) -> None:
            try:
                while True:
                    got.append(await ch.recv())
            except ChannelClosed as ex:
                outcome.append(ex)

        fs = Factory(faults)
        server = RdmaTransport(fs, buffer_size=256, buffers=4)
        listener, _ = await serve(server, collect)
        ch = await RdmaTransport(Factory(), buffer_size=256, buffers=4).connect(listener.address)
        with pytest.raises(ChannelClosed):
            for f in frames:
                await ch.send(f)
            await until(lambda: bool(outcome))
            await ch.recv()  # the coordinator dropped us: the agent sees it
        await until(lambda: bool(outcome))
        assert "expected" in str(outcome[0])  # ordering check tripped, with the reason
        assert got == frames[: len(got)] and len(got) < len(frames)
        await ch.close()
        # A new connection after the failure works.
        fs.faults = None
        got.clear()
        ch2 = await RdmaTransport(Factory(), buffer_size=256, buffers=4).connect(listener.address)
        for f in frames:
            await ch2.send(f)
        await until(lambda: len(got) == len(frames))
        assert got == frames
        await ch2.close()
        await listener.close()

    run(main())


def test_peer_vanishing_is_seen_by_the_other_side() -> None:
    async def main() -> None:
        accepted: list[RdmaChannel] = []
        release = asyncio.Event()

        async def hold(ch: FrameChannel) -> None:
            assert isinstance(ch, RdmaChannel)
            accepted.append(ch)
            await release.wait()

        listener, _ = await serve(RdmaTransport(Factory()), hold)
        ch = await RdmaTransport(Factory()).connect(listener.address)
        await ch.send(b"last words")
        await until(lambda: bool(accepted))
        # Abrupt loss: the agent's process dies (no CLOSE message, sockets drop).
        assert isinstance(ch, RdmaChannel)
        ch._teardown()
        ch._writer.transport.abort()
        assert await accepted[0].recv() == b"last words"  # what arrived is kept
        with pytest.raises(ChannelClosed, match="went away"):
            await accepted[0].recv()
        release.set()
        await listener.close()

    run(main())


def test_make_transport_selection() -> None:
    ok, why = probe()
    if not ok:
        with pytest.raises(RdmaUnavailable, match="fallback_tcp") as err:
            make_transport({"transport": "rdma"})
        assert why in str(err.value)  # the probe's reason reaches the operator
        # The fallback to TCP is build_transport's (tests/test_daemon_lifecycle.py).
        with pytest.raises(RdmaUnavailable):
            make_transport({"fallback_tcp": True})
    t = make_transport(
        {"device": "x", "port": 2, "gid_index": 3, "buffers": 8, "secret": SECRET},
        adapter_factory=Factory(),
    )
    assert isinstance(t, RdmaTransport)
    assert (t.device, t.port, t.gid_index, t.config.buffers, t.secret) == ("x", 2, 3, 8, SECRET)
    with pytest.raises(ValueError, match="tcp"):
        make_transport({"transport": "tcp"})
    assert ConnState.ESTABLISHED.value == "established"
