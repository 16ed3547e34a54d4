"""TCP transport (asyncio streams, optional TLS): the default, runs everywhere.

Implements ``artemis.protocol.transport``: a channel moves whole frames (length
prefix included). The channel only splits the stream on the length prefix; the
meaning of the bytes is the codec's business. Two edge cases are handed up as
bytes rather than hidden, so the decoder above reports them with its usual
reason codes and the server counts them:

* a length prefix above ``max_frame``: the channel returns just the 4 prefix
  bytes (the decoder reports "oversize" and poisons) and closes itself, since
  reading the body would mean trusting an absurd length;
* the stream ending inside a frame: the channel returns the partial bytes
  once (the decoder keeps them as pending and reports "truncated" at EOF),
  then raises ChannelClosed.

The listener's TLS handshake must finish within ``tls_timeout`` (a peer that
stalls in it is dropped by asyncio). With client certificates verified,
``identity`` is the agent id the certificate names: its ``artemis://agent/ID``
SAN URI, else its subject CN (docs/DESIGN.md "Agent identities").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from pathlib import Path
from typing import Any

import structlog
from artemis.protocol.codec import DEFAULT_MAX_FRAME, HEADER
from artemis.protocol.transport import ChannelClosed, Handler

log = structlog.get_logger("artemis.protocol.tcp")


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); raises ValueError with the bad input."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise ValueError(f"address must be HOST:PORT, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def server_ssl_context(
    cert: str | Path,
    key: str | Path,
    ca: str | Path | None = None,
    *,
    require_client_cert: bool = True,
) -> ssl.SSLContext:
    """TLS for the coordinator; with ``ca`` agents' certificates are verified against it
    (required, or only when presented with ``require_client_cert=False``)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    if ca is not None:
        ctx.load_verify_locations(str(ca))
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


IDENTITY_URI = "artemis://agent/"


def cert_identity(cert: dict[str, Any] | None) -> str:
    """The agent id a verified client certificate names: the ``artemis://agent/ID``
    subjectAltName URI, else the subject CN; "" when it names none."""
    if not cert:
        return ""
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "URI" and str(value).startswith(IDENTITY_URI):
            return str(value)[len(IDENTITY_URI) :]
    for rdn in cert.get("subject", ()):
        for k, v in rdn:
            if k == "commonName":
                return str(v)
    return ""


def client_ssl_context(
    ca: str | Path | None = None,
    cert: str | Path | None = None,
    key: str | Path | None = None,
    *,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """TLS for the agent: verifies the coordinator against ``ca`` (system CAs if None)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = check_hostname
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key) if key else None)
    return ctx


def _tune(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        # Frames are small and latency matters more than packet count.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


class TcpChannel:
    """One TCP connection carrying whole frames."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_frame: int = DEFAULT_MAX_FRAME,
        *,
        server_side: bool = False,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._max_frame = max_frame
        self._closed = False
        self._eof = False
        self._send_lock = asyncio.Lock()
        # None: no client certificate verified (plain TCP, or TLS without a ``ca``).
        self.identity: str | None = None
        self._server_side = server_side
        self._note_identity()
        peer = writer.get_extra_info("peername")
        self._peer = (
            format_address(str(peer[0]), int(peer[1]))
            if isinstance(peer, tuple) and len(peer) >= 2
            else str(peer)
        )

    @property
    def peer(self) -> str:
        return self._peer

    def set_max_frame(self, n: int) -> None:
        """Longer frames are refused at their length prefix from now on (the server
        lowers this until the peer authenticated)."""
        self._max_frame = n

    def _note_identity(self) -> None:
        obj = self._writer.get_extra_info("ssl_object")
        if not self._server_side or obj is None or obj.context.verify_mode == ssl.CERT_NONE:
            return
        cert = obj.getpeercert()
        self.identity = cert_identity(cert) if cert else None
        if self.identity is None and obj.context.verify_mode == ssl.CERT_REQUIRED:
            self.identity = ""

    async def send(self, frame: bytes) -> None:
        if self._closed or self._writer.is_closing():
            raise ChannelClosed(f"channel to {self._peer} is closed")
        try:
            # The lock keeps concurrent senders from interleaving drain() waits;
            # write() itself is atomic per frame.
            async with self._send_lock:
                self._writer.write(frame)
                await self._writer.drain()
        except (ConnectionError, OSError, RuntimeError) as e:
            raise ChannelClosed(f"send to {self._peer} failed: {e}") from e

    async def recv(self) -> bytes:
        if self._closed or self._eof:
            raise ChannelClosed(f"channel to {self._peer} is closed")
        head = await self._read(HEADER, b"")
        n = int.from_bytes(head, "big")
        if n > self._max_frame:
            # Hand the prefix up so the decoder reports "oversize"; the caller
            # may still send an Error before it closes, but we read no further.
            self._eof = True
            return head
        if n == 0:
            return head
        return head + await self._read(n, head)

    async def _read(self, n: int, head: bytes) -> bytes:
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError as e:
            self._eof = True
            if head or e.partial:
                # Return what there is once (the decoder will call it
                # "truncated"); the next recv() raises ChannelClosed.
                return e.partial
            raise ChannelClosed(f"{self._peer} closed the connection") from None
        except (ConnectionError, OSError) as e:
            self._eof = True
            raise ChannelClosed(f"connection to {self._peer} lost: {e}") from e

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 2.0)


class TcpListener:
    def __init__(
        self,
        server: asyncio.base_events.Server,
        tasks: set[asyncio.Task[None]],
        channels: set[TcpChannel],
    ) -> None:
        self._server = server
        self._tasks = tasks
        self._channels = channels
        sock = server.sockets[0].getsockname()
        self._address = format_address(str(sock[0]), int(sock[1]))

    @property
    def address(self) -> str:
        return self._address

    async def close(self) -> None:
        self._server.close()
        for ch in list(self._channels):
            await ch.close()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)


class TcpTransport:
    """Factory for TCP channels; TLS when contexts are given."""

    name = "tcp"

    def __init__(
        self,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        connect_timeout: float = 10.0,
        tls_timeout: float = 10.0,
    ) -> None:
        self.max_frame = max_frame
        self.tls_timeout = tls_timeout
        self.server_ssl = server_ssl
        self.client_ssl = client_ssl
        self.server_hostname = server_hostname
        self.connect_timeout = connect_timeout

    async def connect(self, address: str) -> TcpChannel:
        host, port = parse_address(address)
        if self.client_ssl is not None:
            opening = asyncio.open_connection(
                host,
                port,
                limit=1 << 20,
                ssl=self.client_ssl,
                server_hostname=self.server_hostname or host,
            )
        else:
            opening = asyncio.open_connection(host, port, limit=1 << 20)
        reader, writer = await asyncio.wait_for(opening, self.connect_timeout)
        _tune(writer)
        return TcpChannel(reader, writer, self.max_frame)

    async def listen(self, address: str, handler: Handler) -> TcpListener:
        host, port = parse_address(address)
        tasks: set[asyncio.Task[None]] = set()
        channels: set[TcpChannel] = set()

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            _tune(writer)
            ch = TcpChannel(
                reader,
                writer,
                self.max_frame,
                server_side=True,
            )
            task = asyncio.current_task()
            channels.add(ch)
            if task is not None:
                tasks.add(task)
            try:
                await handler(ch)
            except asyncio.CancelledError:
                pass
            except Exception:
                # The handler owns its errors; this is the last line of defence
                # so one connection can never take the listener down.
                log.exception("connection handler failed", peer=ch.peer)
            finally:
                await ch.close()
                channels.discard(ch)
                if task is not None:
                    tasks.discard(task)

        server = await asyncio.start_server(
            on_client,
            host,
            port,
            ssl=self.server_ssl,
            ssl_handshake_timeout=self.tls_timeout if self.server_ssl is not None else None,
            limit=1 << 20,
            reuse_address=True,
            # After a coordinator restart every agent reconnects at once; a short
            # accept queue would drop their SYNs into retransmit back-off.
            backlog=4096,
        )
        return TcpListener(server, tasks, channels)
