"""RDMA transport: ``artemis.protocol.transport.Transport`` over an RC queue pair.

A connection starts on a small TCP side channel (the ``rc_pingpong``
pattern; rdma_cm has no fd an event loop could wait on):

1. agent -> ``hello``  {v, nonce_a, auth}
2. coord -> ``challenge`` {v, nonce_c, auth, proof("coordinator", nonce_a, nonce_c)}
3. agent checks the proof, then -> ``auth`` {proof("agent", ...), info}
4. coord checks the proof, creates its QP, then -> ``info`` {info}
5. each side moves its QP INIT -> RTR -> RTS, posts its receive buffers and
   sends ``ready``; a side sends RDMA data only after the peer's ``ready``.

``info`` is the QP's address (qpn, psn, gid, lid, mtu) plus the receive
sizing (buffers, ctrl_buffers, buffer_size). The proofs are
``artemis.protocol.auth``'s mutual HMAC, as on TCP, and run before any RDMA
resource exists for the peer, so an unauthenticated client costs no QP. A
refusal is an ``error`` message with a reason, then the socket closes.

After set-up the side channel stays open and idle: its end means the peer is
gone (an idle RC QP would not notice). Frames move as in ``stream.py``;
completions arrive through the adapter's completion-channel fd registered
with ``loop.add_reader``: take events, ack, re-arm, then drain the CQ.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any, NoReturn

import msgpack
import structlog
from artemis.common.aio import cancel_all
from artemis.protocol import auth
from artemis.protocol.rdma.adapter import AdapterError, AdapterFactory, Info, RdmaAdapter
from artemis.protocol.rdma.stream import (
    MAX_GRANT,
    Action,
    ConnState,
    FrameTooLarge,
    PeerParams,
    PostRecv,
    RdmaStream,
    StreamConfig,
    StreamError,
)
from artemis.protocol.transport import (
    ChannelClosed,
    Handler,
    Transport,
    format_address,
    parse_address,
)

log = structlog.get_logger("artemis.protocol.rdma")

SIDE_VERSION = 1
SIDE_MAX_BYTES = (
    4096  # a side-channel message; bounds what an unauthenticated peer can make us read
)
POLL_BATCH = 64
MAX_BUFFER_SIZE = 16 * 1024 * 1024


class RdmaHandshakeError(ConnectionError):
    """The side-channel set-up failed: refused authentication, version, bad info."""


class RdmaUnavailable(RuntimeError):
    """``transport = "rdma"`` was asked for where RDMA cannot run."""


async def _send_msg(writer: asyncio.StreamWriter, msg: dict[str, Any]) -> None:
    body = msgpack.packb(msg, use_bin_type=True)
    writer.write(len(body).to_bytes(4, "big") + body)
    await writer.drain()


async def _recv_msg(reader: asyncio.StreamReader, expect: str) -> dict[str, Any]:
    try:
        n = int.from_bytes(await reader.readexactly(4), "big")
        if n > SIDE_MAX_BYTES:
            raise RdmaHandshakeError(f"side-channel message of {n} bytes (limit {SIDE_MAX_BYTES})")
        msg = msgpack.unpackb(await reader.readexactly(n), raw=False)
    except asyncio.IncompleteReadError:
        raise RdmaHandshakeError(f"side channel closed while waiting for {expect!r}") from None
    except (ValueError, msgpack.UnpackException) as ex:
        raise RdmaHandshakeError(f"malformed side-channel message: {ex}") from ex
    if not isinstance(msg, dict):
        raise RdmaHandshakeError("malformed side-channel message: not a map")
    if msg.get("t") == "error":
        raise RdmaHandshakeError(f"peer refused: {msg.get('reason', 'no reason given')}")
    if msg.get("t") != expect:
        raise RdmaHandshakeError(f"expected {expect!r} on the side channel, got {msg.get('t')!r}")
    return msg


def _remote_info(raw: object) -> tuple[Info, PeerParams]:
    if not isinstance(raw, dict):
        raise RdmaHandshakeError("peer sent no QP info")
    try:
        info: Info = {
            "qpn": int(raw["qpn"]),
            "psn": int(raw["psn"]),
            "gid": str(raw["gid"]),
            "lid": int(raw["lid"]),
            "mtu": int(raw["mtu"]),
        }
        params = PeerParams(int(raw["buffers"]), int(raw["ctrl_buffers"]), int(raw["buffer_size"]))
    except (KeyError, TypeError, ValueError) as ex:
        raise RdmaHandshakeError(f"bad QP info from peer: {ex!r}") from ex
    if params.buffer_size > MAX_BUFFER_SIZE:
        raise RdmaHandshakeError(f"peer buffers of {params.buffer_size} bytes are too large")
    try:
        params.validate()
    except StreamError as ex:
        raise RdmaHandshakeError(str(ex)) from ex
    return info, params


class RdmaChannel:
    """One RC connection carrying whole frames (``FrameChannel``)."""

    def __init__(
        self,
        adapter: RdmaAdapter,
        stream: RdmaStream,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
    ) -> None:
        self._adapter = adapter
        self._stream = stream
        self._reader = reader
        self._writer = writer
        self._peer = peer
        self._loop = asyncio.get_running_loop()
        self._waiters: list[asyncio.Future[None]] = []
        self._send_lock = asyncio.Lock()
        self._closed = False
        self._gone: str | None = None  # why the channel cannot carry frames any more
        self._watch: asyncio.Task[None] | None = None
        self._fd = adapter.fileno()
        # Arm before the first work request, so no completion can slip by.
        adapter.arm()
        self._loop.add_reader(self._fd, self._on_readable)
        self._reading = True

    # ---------------------------------------------------------------- FrameChannel

    @property
    def peer(self) -> str:
        return self._peer

    @property
    def stream(self) -> RdmaStream:
        """The state machine, for tests and diagnostics."""
        return self._stream

    async def send(self, frame: bytes) -> None:
        async with self._send_lock:  # concurrent senders keep their order
            while True:
                self._check_sendable()
                if self._stream.can_queue(len(frame)):
                    break
                if len(frame) > self._stream.config.max_queued_bytes:
                    raise FrameTooLarge(
                        f"frame of {len(frame)} bytes exceeds the "
                        f"{self._stream.config.max_queued_bytes}-byte limit"
                    )
                await self._wait()
            self._run(lambda: self._stream.queue_frame(frame))
            self._check_sendable()

    async def recv(self) -> bytes:
        while True:
            frame = self._stream.pop_frame()
            if frame is not None:
                # The reader made room: grants it had withheld may go out.
                self._run(self._stream.after_pop)
                return frame
            if (
                self._closed
                or self._gone
                or self._stream.state
                in (
                    ConnState.CLOSED,
                    ConnState.FAILED,
                )
            ):
                raise ChannelClosed(self._why())
            await self._wait()

    async def close(self, timeout: float = 2.0) -> None:
        if self._closed:
            return
        self._closed = True
        if self._gone is None and self._stream.state is ConnState.ESTABLISHED:
            # Orderly: CLOSE goes out behind queued data; its completion means
            # the peer's NIC has it, so tearing down afterwards loses nothing.
            self._run(self._stream.close)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._until_closed(), timeout)
        self._teardown()
        with contextlib.suppress(Exception):
            self._writer.close()
            await asyncio.wait_for(self._writer.wait_closed(), timeout)
        self._notify()

    # ---------------------------------------------------------------- internals

    def _why(self) -> str:
        if self._gone:
            return f"channel to {self._peer}: {self._gone}"
        if self._stream.error:
            return f"channel to {self._peer} failed: {self._stream.error}"
        if self._stream.peer_closed:
            return f"{self._peer} closed the channel"
        return f"channel to {self._peer} is closed"

    def _check_sendable(self) -> None:
        if self._closed or self._gone or not self._stream.sendable:
            raise ChannelClosed(self._why())

    async def _wait(self) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(fut)
        await fut

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _until_closed(self) -> None:
        while self._stream.state not in (ConnState.CLOSED, ConnState.FAILED) and not self._gone:
            await self._wait()

    def _execute(self, actions: list[Action]) -> None:
        for act in actions:
            if isinstance(act, PostRecv):
                self._adapter.post_recv(act.buf_index)
            else:
                self._adapter.post_send(act.slot, act.wr_id, act.data)

    def _run(self, step: Any) -> None:
        """Run one stream input and carry out its actions; failures end the channel."""
        try:
            self._execute(step())
        except (StreamError, AdapterError) as ex:
            self._fail(str(ex))
        self._notify()

    def _fail(self, reason: str) -> None:
        if self._gone is None:
            self._gone = reason
            log.warning("rdma channel failed", peer=self._peer, reason=reason)
        self._stream.fail(reason)
        self._stop_reading()

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)

    def _on_readable(self) -> None:
        try:
            events = 0
            while self._adapter.get_event():
                events += 1
            self._adapter.ack(events)
            self._adapter.arm()  # re-arm first, then drain: nothing lands unseen
            self._drain()
        except (StreamError, AdapterError) as ex:
            self._fail(str(ex))
        self._notify()

    def _drain(self) -> None:
        while True:
            batch = self._adapter.poll(POLL_BATCH)
            for c in batch:
                if c.recv:
                    acts = self._stream.on_recv_completion(c.index, c.data, c.ok, c.status)
                else:
                    acts = self._stream.on_send_completion(c.index, c.ok, c.status)
                self._execute(acts)
            if len(batch) < POLL_BATCH:
                return

    def start_watch(self) -> None:
        self._watch = asyncio.ensure_future(self._watch_side())

    async def _watch_side(self) -> None:
        """The side channel's end means the peer is gone (or closed after CLOSE)."""
        with contextlib.suppress(Exception):
            while await self._reader.read(4096):
                pass  # nothing is expected after set-up; ignore stray bytes
        if self._closed:
            return
        # Whatever the peer sent before leaving is already in our CQ: take it,
        # so frames it sent (and its CLOSE) are delivered before we give up.
        if self._reading:
            try:
                self._drain()
            except (StreamError, AdapterError) as ex:
                self._fail(str(ex))
        if self._stream.state not in (ConnState.CLOSED, ConnState.FAILED):
            self._fail("peer went away (side channel closed)")
        self._notify()

    def _teardown(self) -> None:
        self._stop_reading()
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()
        self._stream.shutdown()
        try:
            self._adapter.close()
        except AdapterError as ex:
            log.warning("rdma teardown failed", peer=self._peer, reason=str(ex))


class RdmaListener:
    def __init__(self, server: asyncio.base_events.Server, tasks: set[asyncio.Task[None]]) -> None:
        self._server = server
        self._tasks = tasks
        host, port = server.sockets[0].getsockname()[:2]
        self._address = format_address(str(host), int(port))

    @property
    def address(self) -> str:
        return self._address

    async def close(self) -> None:
        self._server.close()
        await cancel_all(self._tasks)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)


class RdmaTransport:
    """Agent and coordinator ends of the RDMA transport (see module doc)."""

    name = "rdma"

    def __init__(
        self,
        adapter_factory: AdapterFactory,
        device: str | None = None,
        port: int = 1,
        gid_index: int = -1,  # < 0: the adapter chooses (verbs.choose_gid_index)
        buffer_size: int = 64 * 1024,
        buffers: int = 64,
        secret: bytes | None = None,
        *,
        ctrl_buffers: int = 4,
        max_queued_bytes: int = 16 * 1024 * 1024,
        handshake_timeout: float = 10.0,
    ) -> None:
        if not 1 <= buffers <= MAX_GRANT:
            raise ValueError(f"buffers must be in 1..{MAX_GRANT}")
        if buffer_size > MAX_BUFFER_SIZE:
            raise ValueError(f"buffer_size must be at most {MAX_BUFFER_SIZE}")
        self.adapter_factory = adapter_factory
        self.device = device
        self.port = port
        self.gid_index = gid_index
        self.secret = secret
        self.handshake_timeout = handshake_timeout
        self.config = StreamConfig(
            buffers=buffers,
            ctrl_buffers=ctrl_buffers,
            buffer_size=buffer_size,
            send_slots=buffers + ctrl_buffers,
            max_queued_bytes=max_queued_bytes,
            max_buffered_bytes=max_queued_bytes,
        )

    # ---------------------------------------------------------------- shared steps

    def _open(self) -> tuple[RdmaAdapter, RdmaStream]:
        adapter = self.adapter_factory(self.device, self.port, self.gid_index)
        c = self.config
        try:
            adapter.open(c.buffer_size, c.recv_buffers, c.send_slots)
            stream = RdmaStream(c)
            stream.begin_exchange()
        except BaseException:
            adapter.close()  # idempotent: whatever open() got to is released
            raise
        return adapter, stream

    def _info(self, adapter: RdmaAdapter) -> dict[str, int | str]:
        c = self.config
        return {
            **adapter.local_info(),
            "buffers": c.buffers,
            "ctrl_buffers": c.ctrl_buffers,
            "buffer_size": c.buffer_size,
        }

    async def _establish(
        self,
        adapter: RdmaAdapter,
        stream: RdmaStream,
        raw_remote: object,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
    ) -> RdmaChannel:
        info, params = _remote_info(raw_remote)
        stream.on_exchanged(params)
        adapter.connect(info)
        ch = RdmaChannel(adapter, stream, reader, writer, peer)
        try:
            ch._execute(stream.on_rtr())  # receive buffers posted before "ready"
            stream.on_rts()
            await _send_msg(writer, {"t": "ready"})
            await _recv_msg(reader, "ready")
            ch._run(stream.on_peer_ready)
        except BaseException:
            ch._teardown()
            raise
        ch.start_watch()
        return ch

    # ---------------------------------------------------------------- agent side

    async def connect(self, address: str) -> RdmaChannel:
        host, port = parse_address(address)
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), self.handshake_timeout
        )
        try:
            return await asyncio.wait_for(
                self._client(reader, writer, address), self.handshake_timeout
            )
        except BaseException:
            writer.close()
            raise

    async def _client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str
    ) -> RdmaChannel:
        secret = self.secret
        na = auth.make_nonce()
        await _send_msg(
            writer, {"t": "hello", "v": SIDE_VERSION, "nonce": na, "auth": bool(secret)}
        )
        m = await _recv_msg(reader, "challenge")
        nc = m.get("nonce")
        if not isinstance(nc, bytes):
            raise RdmaHandshakeError("coordinator sent no nonce")
        proof = b""
        if secret:
            theirs = m.get("proof")
            if not isinstance(theirs, bytes) or not auth.check(
                secret, "coordinator", na, nc, theirs
            ):
                raise RdmaHandshakeError(
                    f"coordinator at {address} failed authentication (different secret?)"
                )
            proof = auth.proof(secret, "agent", na, nc)
        elif m.get("auth"):
            raise RdmaHandshakeError(f"coordinator at {address} requires a shared secret")
        adapter, stream = self._open()
        try:
            await _send_msg(writer, {"t": "auth", "proof": proof, "info": self._info(adapter)})
            m = await _recv_msg(reader, "info")
            return await self._establish(adapter, stream, m.get("info"), reader, writer, address)
        except BaseException:
            adapter.close()
            raise

    # ---------------------------------------------------------------- coordinator side

    async def listen(self, address: str, handler: Handler) -> RdmaListener:
        host, port = parse_address(address)
        tasks: set[asyncio.Task[None]] = set()

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            if task is not None:
                tasks.add(task)
            peername = writer.get_extra_info("peername")
            peer = (
                format_address(str(peername[0]), int(peername[1]))
                if isinstance(peername, tuple)
                else str(peername)
            )
            ch: RdmaChannel | None = None
            try:
                ch = await asyncio.wait_for(
                    self._server(reader, writer, peer), self.handshake_timeout
                )
                await handler(ch)
            except asyncio.CancelledError:
                pass
            except (RdmaHandshakeError, AdapterError, ConnectionError, asyncio.TimeoutError) as ex:
                log.warning("rdma connection refused", peer=peer, reason=str(ex) or repr(ex))
            except Exception:
                # Last line of defence: one connection never takes the listener down.
                log.exception("rdma connection handler failed", peer=peer)
            finally:
                if ch is not None:
                    await ch.close()
                else:
                    writer.close()
                if task is not None:
                    tasks.discard(task)

        server = await asyncio.start_server(on_client, host, port, reuse_address=True)
        return RdmaListener(server, tasks)

    async def _server(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> RdmaChannel:
        secret = self.secret
        m = await _recv_msg(reader, "hello")
        if m.get("v") != SIDE_VERSION:
            await self._refuse(
                writer,
                f"side-channel version {m.get('v')!r} not supported (this end speaks {SIDE_VERSION})",
            )
        na = m.get("nonce")
        if not isinstance(na, bytes) or len(na) < 16:
            await self._refuse(writer, "hello without a valid nonce")
        if secret and not m.get("auth"):
            await self._refuse(writer, "authentication required: configure the shared secret")
        nc = auth.make_nonce()
        proof = auth.proof(secret, "coordinator", na, nc) if secret else b""
        await _send_msg(
            writer,
            {
                "t": "challenge",
                "v": SIDE_VERSION,
                "nonce": nc,
                "auth": bool(secret),
                "proof": proof,
            },
        )
        m = await _recv_msg(reader, "auth")
        theirs = m.get("proof")
        if secret and (
            not isinstance(theirs, bytes) or not auth.check(secret, "agent", na, nc, theirs)
        ):
            await self._refuse(writer, "authentication failed")
        # Only an authenticated peer gets a queue pair.
        adapter, stream = self._open()
        try:
            await _send_msg(writer, {"t": "info", "info": self._info(adapter)})
            return await self._establish(adapter, stream, m.get("info"), reader, writer, peer)
        except BaseException:
            adapter.close()
            raise

    @staticmethod
    async def _refuse(writer: asyncio.StreamWriter, reason: str) -> NoReturn:
        with contextlib.suppress(Exception):
            await _send_msg(writer, {"t": "error", "reason": reason})
        raise RdmaHandshakeError(reason)


def make_transport(
    config: Mapping[str, Any], *, adapter_factory: AdapterFactory | None = None
) -> Transport:
    """The RDMA transport for ``transport = "rdma"`` in a daemon's config.

    Keys: device, port, gid_index (negative or absent: chosen as NCCL does), buffer_size, buffers, secret (bytes) or
    secret_file. Returns an ``RdmaTransport`` over pyverbs when ``probe()``
    finds pyverbs and a device, else raises ``RdmaUnavailable`` with the reason
    (``artemis.protocol.transport.build_transport`` falls back to TCP from
    there when the config says so). ``adapter_factory`` overrides the verbs
    adapter (tests use the loopback one) and skips the probe.
    """
    kind = config.get("transport", "rdma")
    if kind != "rdma":
        raise ValueError(f"make_transport builds the rdma transport, config asks for {kind!r}")
    secret = config.get("secret")
    if secret is None and config.get("secret_file"):
        secret = auth.load_secret(config["secret_file"])
    if adapter_factory is None:
        from artemis.protocol.rdma.verbs import VerbsAdapter, probe

        ok, why = probe()
        if not ok:
            raise RdmaUnavailable(
                f'transport = "rdma" but RDMA cannot run here: {why}. '
                "Set fallback_tcp = true to use TCP instead."
            )
        adapter_factory = VerbsAdapter
    return RdmaTransport(
        adapter_factory,
        device=config.get("device"),
        port=int(config.get("port", 1)),
        gid_index=int(config.get("gid_index", -1)),
        buffer_size=int(config.get("buffer_size", 64 * 1024)),
        buffers=int(config.get("buffers", 64)),
        secret=secret,
    )
