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

A TLS listener accepts plain TCP and runs the handshake in the channel
(``secure``), not in asyncio's accept: so the server counts each failed
handshake by reason (``TlsRefused``: no client certificate, one it does not
trust, a peer that does not speak TLS, one that stalls, any other failure) and
holds its per-peer limits over the handshake too (protocol/server.py). A
handler that never calls ``secure`` gets it at its first ``recv``/``send``,
under ``tls_timeout``. With client certificates verified, ``identity`` is the
agent id the certificate names: its ``artemis://agent/ID`` SAN URI, else its
subject CN (docs/DESIGN.md "Agent identities").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import structlog
from artemis.common.aio import cancel_all
from artemis.protocol.codec import DEFAULT_MAX_FRAME, HEADER
from artemis.protocol.transport import (
    ChannelClosed,
    Handler,
    TlsRefused,
    format_address,
    parse_address,
)

log = structlog.get_logger("artemis.protocol.tcp")

BACKLOG = 4096


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


# OpenSSL's reasons for a first record that is not a TLS handshake at all.
_NOT_TLS = frozenset(
    {
        "WRONG_VERSION_NUMBER",
        "HTTP_REQUEST",
        "HTTPS_PROXY_REQUEST",
        "UNKNOWN_PROTOCOL",
        "PACKET_LENGTH_TOO_LONG",
        "RECORD_LAYER_FAILURE",
        "WRONG_SSL_VERSION",
    }
)


def tls_refusal(e: BaseException, timeout: float) -> TlsRefused:
    """The TlsRefused of a server-side handshake that raised ``e``."""
    if isinstance(e, asyncio.TimeoutError | TimeoutError):
        return TlsRefused("tls_timeout", f"TLS handshake not finished in {timeout:g} s")
    if isinstance(e, ssl.SSLCertVerificationError):
        return TlsRefused("tls_bad_cert", f"client certificate refused: {e.verify_message}")
    if isinstance(e, ssl.SSLError):
        why = str(getattr(e, "reason", "") or "")
        if why == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return TlsRefused("tls_no_cert", "no client certificate")
        if why in _NOT_TLS:
            return TlsRefused("tls_not_tls", f"not a TLS handshake ({why.lower()})")
        return TlsRefused("tls_failed", f"TLS handshake failed: {why or e}")
    return TlsRefused("tls_failed", f"TLS handshake failed: {type(e).__name__} {e}".strip())


def _tune(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        _tune_sock(sock)


def _tune_sock(sock: Any) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        # Frames are small and latency matters more than packet count.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


def _peername(writer: asyncio.StreamWriter | None) -> Any:
    return None if writer is None else writer.get_extra_info("peername")


class TcpChannel:
    """One TCP connection carrying whole frames."""

    def __init__(
        self,
        reader: asyncio.StreamReader | None,
        writer: asyncio.StreamWriter | None,
        max_frame: int = DEFAULT_MAX_FRAME,
        *,
        server_side: bool = False,
        tls: tuple[socket.socket, ssl.SSLContext] | None = None,
        tls_timeout: float = 10.0,
    ) -> None:
        # No streams yet with ``tls``: an accepted socket whose handshake is to run.
        self._reader = reader
        self._writer = writer
        self._max_frame = max_frame
        self._closed = False
        self._eof = False
        self._send_lock = asyncio.Lock()
        # None: no client certificate verified (plain TCP, or TLS without a ``ca``).
        self.identity: str | None = None
        self._server_side = server_side
        # A server-side handshake still to run (``secure``), and its outcome once run.
        self._tls = tls
        self._tls_timeout = tls_timeout
        self._tls_lock = asyncio.Lock()
        self._tls_error: TlsRefused | None = None
        self._note_identity()
        peer = tls[0].getpeername() if writer is None and tls else _peername(writer)
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

    async def secure(self, timeout: float | None = None) -> None:
        """Run the server side of the TLS handshake (once; a no-op without TLS), within
        ``timeout`` s (default: the transport's ``tls_timeout``). Raises TlsRefused
        with its reason when it fails; the channel is closed then."""
        async with self._tls_lock:
            if self._tls_error is not None:
                raise self._tls_error
            pending, self._tls = self._tls, None
            if pending is None:
                return
            sock, ctx = pending
            limit = self._tls_timeout if timeout is None else timeout
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader(limit=1 << 20)
            # Kept here: uvloop returns its TLS protocol in place of the one it was given.
            protocol = asyncio.StreamReaderProtocol(reader)
            try:
                # The socket was read by nobody: the handshake sees the peer's first
                # byte. On any error (the time-out's cancel too) the loop closes the
                # socket; ssl_handshake_timeout is only a backstop.
                transport, _ = await asyncio.wait_for(
                    loop.connect_accepted_socket(
                        lambda: protocol,
                        sock,
                        ssl=ctx,
                        ssl_handshake_timeout=limit + 5.0,
                    ),
                    limit,
                )
            except asyncio.CancelledError:
                self._closed = True
                raise
            except Exception as e:
                self._tls_error = tls_refusal(e, limit)
                self._eof = self._closed = True
                raise self._tls_error from None
            self._reader = reader
            self._writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            self._note_identity()

    def _streams(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            raise ChannelClosed(f"channel to {self._peer} is closed")
        return self._reader, self._writer

    def _note_identity(self) -> None:
        if self._writer is None:
            return
        obj = self._writer.get_extra_info("ssl_object")
        if not self._server_side or obj is None or obj.context.verify_mode == ssl.CERT_NONE:
            return
        cert = obj.getpeercert()
        self.identity = cert_identity(cert) if cert else None
        if self.identity is None and obj.context.verify_mode == ssl.CERT_REQUIRED:
            self.identity = ""

    async def send(self, frame: bytes) -> None:
        if self._tls is not None or self._tls_error is not None:
            await self.secure()
        _, writer = self._streams()
        if self._closed or writer.is_closing():
            raise ChannelClosed(f"channel to {self._peer} is closed")
        try:
            # The lock keeps concurrent senders from interleaving drain() waits;
            # write() itself is atomic per frame.
            async with self._send_lock:
                writer.write(frame)
                await writer.drain()
        except (ConnectionError, OSError, RuntimeError) as e:
            raise ChannelClosed(f"send to {self._peer} failed: {e}") from e

    async def recv(self) -> bytes:
        if self._tls is not None or self._tls_error is not None:
            await self.secure()
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
        reader, _ = self._streams()
        try:
            return await reader.readexactly(n)
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
        if self._writer is None:
            # Never handed to the loop (no handshake run): the socket is ours to close.
            if self._tls is not None:
                self._tls[0].close()
                self._tls = None
            return
        with contextlib.suppress(Exception):
            self._writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 2.0)


class TcpListener:
    def __init__(
        self,
        server: asyncio.base_events.Server | None,
        tasks: set[asyncio.Task[None]],
        channels: set[TcpChannel],
        *,
        sock: socket.socket | None = None,
        acceptor: asyncio.Task[None] | None = None,
    ) -> None:
        # A plain listener is an asyncio server; a TLS one its own accept loop (`sock`).
        self._server = server
        self._sock = sock
        self._acceptor = acceptor
        self._tasks = tasks
        self._channels = channels
        if server is not None:
            bound = server.sockets[0].getsockname()
        else:
            assert sock is not None
            bound = sock.getsockname()
        self._address = format_address(str(bound[0]), int(bound[1]))

    @property
    def address(self) -> str:
        return self._address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._acceptor is not None:
            self._acceptor.cancel()
            await asyncio.gather(self._acceptor, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
        for ch in list(self._channels):
            await ch.close()
        await cancel_all(self._tasks)
        if self._server is not None:
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

        async def serve(ch: TcpChannel) -> None:
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

        if self.server_ssl is not None:
            return await self._listen_tls(host, port, self.server_ssl, serve, tasks, channels)

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            _tune(writer)
            await serve(TcpChannel(reader, writer, self.max_frame, server_side=True))

        server = await asyncio.start_server(
            on_client,
            host,
            port,
            limit=1 << 20,
            reuse_address=True,
            # After a coordinator restart every agent reconnects at once; a short
            # accept queue would drop their SYNs into retransmit back-off.
            backlog=BACKLOG,
        )
        return TcpListener(server, tasks, channels)

    async def _listen_tls(
        self,
        host: str,
        port: int,
        ctx: ssl.SSLContext,
        serve: Callable[[TcpChannel], Coroutine[Any, Any, None]],
        tasks: set[asyncio.Task[None]],
        channels: set[TcpChannel],
    ) -> TcpListener:
        """A TLS listener accepts sockets itself and leaves them unread: the handshake
        runs in the channel (``secure``), where its failure is seen and counted. An
        asyncio server would run it at the accept and only log a failure, and its
        stream reader may take the peer's first bytes (uvloop reads at once)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, addr = infos[0]
        lsock = socket.socket(family, kind, proto)
        try:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind(addr)
            lsock.listen(BACKLOG)
            lsock.setblocking(False)
        except OSError:
            lsock.close()
            raise

        async def accept() -> None:
            while True:
                try:
                    sock, _ = await loop.sock_accept(lsock)
                except (ConnectionAbortedError, InterruptedError):
                    continue
                except OSError as e:
                    # Out of file descriptors (EMFILE, ENFILE): wait rather than spin.
                    log.warning("accept failed", error=str(e))
                    await asyncio.sleep(0.1)
                    continue
                sock.setblocking(False)
                _tune_sock(sock)
                ch = TcpChannel(
                    None,
                    None,
                    self.max_frame,
                    server_side=True,
                    tls=(sock, ctx),
                    tls_timeout=self.tls_timeout,
                )
                tasks.add(loop.create_task(serve(ch)))  # serve() drops it when done

        acceptor = loop.create_task(accept())
        return TcpListener(None, tasks, channels, sock=lsock, acceptor=acceptor)
