"""Framing and (de)serialisation, sans-IO.

A frame is a 4-byte big-endian body length followed by the body, one msgpack
map (see messages.py for its contents), written and read by msgspec. ``encode`` builds a whole frame;
``FrameDecoder`` turns an arbitrary byte stream back into messages.

The decoder never raises on peer input. Each bad frame becomes a
``ProtocolError`` in the output list, with a reason code for metrics. A bad
body inside a sane length only loses that frame (the length still tells us
where the next one starts). A length prefix above the limit poisons the
stream: we cannot know where the next frame starts, and buffering it would let
a peer make us allocate gigabytes, so the decoder stops and the connection
must close.
"""

from __future__ import annotations

from artemis.protocol.messages import (
    PROTOCOL_VERSION,
    Message,
    ProtocolError,
    decode_body,
    encode_body,
)

DEFAULT_MAX_FRAME = 8 * 1024 * 1024
HEADER = 4
_MAX_PREFIX = 0xFFFFFFFF


def encode(
    msg: Message,
    *,
    seq: int | None = None,
    version: tuple[int, int] = PROTOCOL_VERSION,
    max_frame: int = DEFAULT_MAX_FRAME,
) -> bytes:
    """The whole frame (length prefix + body) for ``msg``; ``seq`` overrides ``msg.seq``.

    Raises ProtocolError("oversize") when the body would exceed ``max_frame``:
    the peer would refuse it, so the sender must split it instead.
    """
    body = encode_body(msg, seq=seq, version=version)
    n = len(body)
    if n > max_frame:
        raise ProtocolError(
            "oversize",
            f"{msg.TYPE} message of {n} bytes exceeds the frame limit of {max_frame} bytes",
            msg_type=msg.TYPE,
        )
    return n.to_bytes(HEADER, "big") + body


def decode_frame_body(
    body: bytes | bytearray | memoryview, *, version: tuple[int, int] = PROTOCOL_VERSION
) -> Message:
    """Decode and validate one frame body (no length prefix); raises ProtocolError."""
    try:
        return decode_body(body, version)
    except ProtocolError:
        raise
    except Exception as e:
        # A validator bug must not take the connection down with a traceback;
        # treat it as a bad frame and say what happened.
        raise ProtocolError("invalid", f"frame body rejected: {type(e).__name__}: {e}") from None


class FrameDecoder:
    """Incremental decoder for one byte stream (one connection)."""

    __slots__ = ("_buf", "max_frame", "poisoned", "version")

    def __init__(
        self, max_frame: int = DEFAULT_MAX_FRAME, *, version: tuple[int, int] = PROTOCOL_VERSION
    ) -> None:
        if not (0 < max_frame <= _MAX_PREFIX):
            raise ValueError(f"max_frame must be in 1..{_MAX_PREFIX}, got {max_frame}")
        self.max_frame = max_frame
        self.version = version
        self.poisoned = False
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes buffered that do not make a whole frame yet."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message | ProtocolError]:
        """Add bytes; return every message (or error) completed by them, in order."""
        if self.poisoned:
            return []
        if self._buf:
            self._buf += data
            view = memoryview(self._buf)
        else:
            view = memoryview(data)
        out: list[Message | ProtocolError] = []
        pos = 0
        n = len(view)
        max_frame = self.max_frame
        version = self.version
        try:
            while n - pos >= HEADER:
                length = int.from_bytes(view[pos : pos + HEADER], "big")
                if length > max_frame:
                    self.poisoned = True
                    out.append(
                        ProtocolError(
                            "oversize",
                            f"frame length prefix {length} exceeds the limit of {max_frame}"
                            " bytes; the stream cannot be trusted past it",
                            fatal=True,
                        )
                    )
                    pos = n
                    break
                end = pos + HEADER + length
                if end > n:
                    break
                try:
                    out.append(decode_frame_body(view[pos + HEADER : end], version=version))
                except ProtocolError as e:
                    out.append(e)
                pos = end
            rest = bytes(view[pos:])
        finally:
            view.release()
        # Replace rather than trim in place: the memoryview above pinned the old buffer.
        self._buf = bytearray(rest)
        return out

    def eof(self) -> ProtocolError | None:
        """The stream ended: a ProtocolError("truncated") if it stopped inside a frame."""
        if self.poisoned or not self._buf:
            return None
        have = len(self._buf)
        if have < HEADER:
            text = f"stream ended inside a length prefix ({have} of {HEADER} bytes)"
        else:
            want = int.from_bytes(self._buf[:HEADER], "big")
            text = f"stream ended inside a frame ({have - HEADER} of {want} body bytes)"
        self._buf = bytearray()
        return ProtocolError("truncated", text)
