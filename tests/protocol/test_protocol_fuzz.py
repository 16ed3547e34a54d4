"""Property tests: the decoder never raises, and every bad frame is reported with a reason.

About 10k generated cases in total, split over several tests so each stays short.
"""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.messages import (
    MESSAGE_TYPES,
    REASONS,
    Dump,
    Message,
    ProtocolError,
    Windows,
    message_to_map,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_helpers import every_message

FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), database=None)
MAX = 4096
# Smaller instances than the round-trip tests use: the fuzzer mutates one
# field per case, so a 256-record dump only costs time.
MSGS = [
    msgspec.structs.replace(m, records=m.records[:3])
    if isinstance(m, Dump)
    else m.replace(windows=m.windows[:2])
    if isinstance(m, Windows)
    else m
    for m in every_message()
]
MAPS = [message_to_map(m) for m in MSGS]
PACKED = [msgpack.packb(m, use_bin_type=True) for m in MAPS]
FIELD_NAMES = sorted({k for m in MAPS for k in m} | {"gap_ms", "rank", "telemetry", "sm_mhz"})


def framed(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def expected_frames(stream: bytes, max_frame: int) -> tuple[int, bool]:
    """Walk the prefixes independently: (complete frames, poisoned)."""
    pos, n = 0, 0
    while len(stream) - pos >= 4:
        length = int.from_bytes(stream[pos : pos + 4], "big")
        if length > max_frame:
            return n + 1, True
        if pos + 4 + length > len(stream):
            break
        n += 1
        pos += 4 + length
    return n, False


def check_items(items: list[Message | ProtocolError]) -> None:
    for it in items:
        if isinstance(it, ProtocolError):
            assert it.reason in REASONS, it.reason
            assert it.text
        else:
            assert isinstance(it, Message)
            # Anything accepted re-encodes and decodes to itself.
            out = FrameDecoder().feed(encode(it, version=it.version))
            assert out == [it]


def feed_chunks(dec: FrameDecoder, data: bytes, cuts: list[int]) -> list[Any]:
    out: list[Any] = []
    pos = 0
    for c in sorted(cuts):
        out.extend(dec.feed(data[pos:c]))
        pos = c
    out.extend(dec.feed(data[pos:]))
    return out


@settings(FUZZ, max_examples=3000)
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=5))
def test_garbage_bytes(data: bytes, cuts: list[int]) -> None:
    dec = FrameDecoder(MAX)
    out = feed_chunks(dec, data, cuts)
    n, poisoned = expected_frames(data, MAX)
    assert len(out) == n
    assert dec.poisoned == poisoned
    check_items(out)
    if not poisoned and dec.pending:
        e = dec.eof()
        assert e is not None and e.reason == "truncated"


@settings(FUZZ, max_examples=2000)
@given(body=st.binary(max_size=300), prefix_extra=st.integers(1, 1 << 31))
def test_framed_garbage_and_oversize(body: bytes, prefix_extra: int) -> None:
    dec = FrameDecoder(MAX)
    out = dec.feed(framed(body))
    assert len(out) == 1
    check_items(out)
    # An absurd prefix poisons, whatever follows.
    dec2 = FrameDecoder(MAX)
    out2 = dec2.feed((MAX + prefix_extra).to_bytes(4, "big") + body)
    assert len(out2) == 1 and isinstance(out2[0], ProtocolError)
    assert out2[0].reason == "oversize" and out2[0].fatal and dec2.poisoned


plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=6,
)


@settings(FUZZ, max_examples=1500)
@given(
    t=st.sampled_from([*MESSAGE_TYPES, "nope"]),
    v=st.sampled_from([[1, 0], [1, 3], [2, 0], [0, 9], "1.0", None]),
    seq=st.integers(-5, (1 << 64) - 1) | st.none(),
    fields=st.dictionaries(st.sampled_from(FIELD_NAMES), plain, max_size=4),
)
def test_random_maps(t: str, v: Any, seq: Any, fields: dict[str, Any]) -> None:
    m = {**fields, "t": t, "v": v, "seq": seq}
    out = FrameDecoder(MAX).feed(framed(msgpack.packb(m, use_bin_type=True)))
    assert len(out) == 1
    check_items(out)
    if isinstance(out[0], ProtocolError) and v in ([2, 0], [0, 9]):
        assert out[0].reason == "version"


def _paths(x: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    if isinstance(x, dict):
        for k, v in x.items():
            out.append((*prefix, k))
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(x, list):
        for i, v in enumerate(x[:3]):
            out.append((*prefix, i))
            out.extend(_paths(v, (*prefix, i)))
    return out


PATHS = [(i, p) for i, m in enumerate(MAPS) for p in _paths(m) if p[0] not in ("v", "t")]


@settings(FUZZ, max_examples=2500)
@given(which=st.sampled_from(PATHS), value=plain, delete=st.booleans())
def test_mutated_valid_messages(
    which: tuple[int, tuple[Any, ...]], value: Any, delete: bool
) -> None:
    i, path = which
    m = msgpack.unpackb(PACKED[i], raw=False)  # a deep copy, fast
    cur: Any = m
    for p in path[:-1]:
        cur = cur[p]
    if delete and isinstance(cur, dict):
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    out = FrameDecoder(MAX * 64).feed(framed(msgpack.packb(m, use_bin_type=True)))
    assert len(out) == 1
    check_items(out)
    if isinstance(out[0], ProtocolError) and out[0].reason == "invalid":
        # The error names the message type it was found in.
        assert out[0].text.startswith(MSGS[i].TYPE)


@settings(FUZZ, max_examples=1000)
@given(which=st.integers(0, len(MSGS) - 1), cut=st.integers(1, 10_000))
def test_truncated_valid_frames(which: int, cut: int) -> None:
    frame = encode(MSGS[which])
    cut = cut % len(frame)
    dec = FrameDecoder()
    assert dec.feed(frame[:cut]) == []
    if cut:
        e = dec.eof()
        assert e is not None and e.reason == "truncated"
    # The rest completes it if the stream had not ended.
    dec2 = FrameDecoder()
    dec2.feed(frame[:cut])
    assert dec2.feed(frame[cut:]) == [MSGS[which]]
