"""The one seam between the sans-IO protocol and the transports that move its bytes.

A transport moves whole frames (the bytes that ``artemis.protocol`` encodes,
length prefix included) between one agent and the coordinator, in order and
reliably while the connection lives. TCP (``artemis.protocol.tcp``) and RDMA
(``artemis.protocol.rdma``) both implement this; everything above them (the
agent uplink, the coordinator server) only sees ``FrameChannel``.

``build_transport(config, role)`` is the one place both daemons get their
transport from: TCP with the configured TLS, or RDMA, which falls back to TCP
(keeping that TLS) when ``[rdma] fallback_tcp`` is set and RDMA cannot run.
``TlsConfig`` and ``RdmaConfig`` are the ``[tls]``/``[rdma]`` tables of both
daemons' configs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import structlog

log = structlog.get_logger("artemis.protocol.transport")


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); raises ValueError with the bad input."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise ValueError(f"address must be HOST:PORT, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


def format_address(host: str, port: int) -> str:
    """(host, port) -> ``host:port``, an IPv6 host in brackets (what ``parse_address`` reads)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ChannelClosed(ConnectionError):
    """The peer went away or the channel was closed; no more frames will come."""


# Why a TLS handshake failed: the reasons of TlsRefused (and of the refused-peer
# counter, protocol/server.py REFUSAL_REASONS).
TLS_REASONS = (
    "tls_no_cert",  # the peer sent no client certificate (one is required)
    "tls_bad_cert",  # its certificate did not verify (another CA, expired, ...)
    "tls_not_tls",  # what it sent is no TLS handshake (plain TCP, HTTP, garbage)
    "tls_timeout",  # the handshake did not finish in time
    "tls_failed",  # any other failure (its alert, a reset or EOF mid-handshake)
)


class TlsRefused(ChannelClosed):
    """A server channel's TLS handshake failed (raised by its ``secure``, the TCP
    transport's); ``reason`` is one of TLS_REASONS."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason
        self.text = text


class FrameChannel(Protocol):
    """One connection, carrying whole frames in order."""

    @property
    def peer(self) -> str:
        """Human-readable peer address, for logs."""
        ...

    async def send(self, frame: bytes) -> None:
        """Queue one whole frame; waits (back-pressure) while the transport is full."""
        ...

    async def recv(self) -> bytes:
        """The next whole frame; raises ChannelClosed when the peer is gone."""
        ...

    async def close(self) -> None:
        """Close the channel; idempotent."""
        ...


Handler = Callable[[FrameChannel], Awaitable[None]]


class Listener(Protocol):
    """A bound server: hands every accepted channel to the handler in its own task."""

    @property
    def address(self) -> str:
        """Where it listens (host:port), with the real port when 0 was asked for."""
        ...

    async def close(self) -> None: ...


class Transport(Protocol):
    """Factory for both ends of one kind of transport."""

    name: str

    async def connect(self, address: str) -> FrameChannel: ...

    async def listen(self, address: str, handler: Handler) -> Listener: ...


Role = Literal["agent", "coordinator"]


@dataclass(frozen=True)
class TlsConfig:
    """``[tls]``: TLS on TCP (and on RDMA's TCP fallback); all empty = plaintext.

    coordinator: ``cert`` + ``key`` are its certificate; with ``ca``, agents must
    present a client certificate signed by it (mutual TLS; with
    ``require_client_cert = false`` only agents that present one are checked).
    A verified certificate is the agent's identity: its ``artemis://agent/ID``
    URI subjectAltName, else its subject CN, must equal the hello's agent id and
    host (docs/DESIGN.md "Agent identities").
    agent: ``ca`` verifies the coordinator (system CAs when only ``cert`` is
    set); ``cert`` + ``key`` are its client certificate for mutual TLS.
    """

    cert: str = ""
    key: str = ""
    ca: str = ""
    require_client_cert: bool = True  # coordinator with ``ca``: refuse agents without one

    def enabled(self, role: Role) -> bool:
        return bool(self.cert) if role == "coordinator" else bool(self.ca or self.cert)


@dataclass(frozen=True)
class RdmaConfig:
    """``[rdma]``: read only when ``transport = "rdma"``."""

    device: str = ""  # e.g. "mlx5_0"; "" = first device
    port: int = 1
    gid_index: int = -1  # < 0: the RoCE v2 IPv4 GID, as NCCL picks it (protocol/rdma/verbs.py)
    fallback_tcp: bool = True  # no pyverbs or no device: use TCP (with [tls]) and say so once


class TransportSettings(Protocol):
    """What ``build_transport`` reads from a daemon's config."""

    @property
    def transport(self) -> str: ...  # "tcp" | "rdma"

    @property
    def secret_file(self) -> str: ...

    @property
    def tls(self) -> TlsConfig: ...

    @property
    def rdma(self) -> RdmaConfig: ...


def build_transport(config: TransportSettings, role: Role) -> Transport:
    """The transport a daemon of ``role`` runs on, from its config (see module doc).

    Raises ``RdmaUnavailable`` when RDMA was asked for, cannot run here and
    ``fallback_tcp`` is off; ``ValueError`` for an unknown transport name.
    """
    from artemis.protocol.tcp import TcpTransport, client_ssl_context, server_ssl_context

    tls = config.tls

    def tcp() -> TcpTransport:
        if not tls.enabled(role):
            return TcpTransport()
        try:
            if role == "coordinator":
                ctx = server_ssl_context(
                    tls.cert, tls.key, tls.ca or None, require_client_cert=tls.require_client_cert
                )
                return TcpTransport(server_ssl=ctx)
            ctx = client_ssl_context(tls.ca or None, tls.cert or None, tls.key or None)
            return TcpTransport(client_ssl=ctx)
        except OSError as e:  # ssl.SSLError is one; neither names the file
            files = ", ".join(
                f"{k} = {v!r}" for k, v in vars(tls).items() if v and isinstance(v, str)
            )
            raise ValueError(f"[tls] {files}: cannot load: {e}") from None

    if config.transport == "tcp":
        return tcp()
    if config.transport != "rdma":
        raise ValueError(f"transport: expected 'tcp' or 'rdma', got {config.transport!r}")
    from artemis.protocol.rdma.transport import RdmaUnavailable, make_transport

    r = config.rdma
    try:
        rdma = make_transport(
            {
                "transport": "rdma",
                "device": r.device or None,
                "port": r.port,
                "gid_index": r.gid_index,
                "secret_file": config.secret_file,
            }
        )
    except RdmaUnavailable as e:
        if not r.fallback_tcp:
            raise
        log.warning("rdma unavailable, using tcp", reason=str(e), tls=tls.enabled(role))
        return tcp()
    if tls.enabled(role):
        # RDMA frames never pass through TLS; the shared secret still authenticates both ends.
        log.warning("[tls] applies to TCP only: frames go over RDMA without TLS")
    return rdma
