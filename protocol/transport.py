"""The one seam between the sans-IO protocol and the transports that move its bytes.

A transport moves whole frames (the bytes that ``artemis.protocol`` encodes,
length prefix included) between one agent and the coordinator, in order and
reliably while the connection lives. TCP (``artemis.protocol.tcp``) and RDMA
(``artemis.protocol.rdma``) both implement this; everything above them (the
agent uplink, the coordinator server) only sees ``FrameChannel``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol


class ChannelClosed(ConnectionError):
    """The peer went away or the channel was closed; no more frames will come."""


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
