"""Codec and message validation: round trips, field-naming errors, version rules, framing."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import pytest
from artemis.protocol.codec import FrameDecoder, decode_frame_body, encode
from artemis.protocol.messages import (
    PROTOCOL_VERSION,
    Ack,
    Heartbeat,
    Message,
    ProtocolError,
    Windows,
    message_to_map,
    rank_window_from_dict,
    telemetry_from_dict,
)
from artemis.protocol.records import RankWindow, Telemetry
from protocol_helpers import every_message, heartbeat, window, windows_msg


def body_of(frame: bytes) -> bytes:
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    return frame[4:]


def pack(m: dict[str, Any]) -> bytes:
    return msgpack.packb(m, use_bin_type=True)


def frame_of(m: dict[str, Any]) -> bytes:
    b = pack(m)
    return len(b).to_bytes(4, "big") + b


@pytest.mark.parametrize("msg", every_message(), ids=lambda m: type(m).__name__)
def test_round_trip_every_message(msg: Message) -> None:
    frame = encode(msg)
    out = decode_frame_body(body_of(frame))
    assert out == msg
    assert type(out) is type(msg)
    assert out.version == PROTOCOL_VERSION


def test_round_trip_keeps_nested_records_exact() -> None:
    msg = windows_msg(8)
    out = decode_frame_body(body_of(encode(msg)))
    assert isinstance(out, Windows)
    assert all(isinstance(w, RankWindow) for w in out.windows)
    assert out.windows[3].telemetry == window(3).telemetry
    assert out.windows[3].telemetry.missing == ("steal_pct", "iowait_pct")
    # Absent telemetry stays absent (None), never invented.
    assert out.windows[0].telemetry.steal_pct is None


def test_seq_override_and_ints_as_floats() -> None:
    m = message_to_map(heartbeat(), seq=41)
    m["progress"][0]["idle_s"] = 2  # an int where a float is expected is fine
    out = decode_frame_body(pack(m))
    assert isinstance(out, Heartbeat)
    assert out.seq == 41 and out.progress[0].idle_s == 2.0
    assert isinstance(out.progress[0].idle_s, float)


def _windows_map() -> dict[str, Any]:
    # The 1.0 form (one map per rank): its errors name the rank's field.
    return message_to_map(windows_msg(3), version=(1, 0))


CASES: list[tuple[str, Any, str]] = [
    # (path into the map, new value or DELETE, field named in the error)
    ("windows.0.gap_ms", float("nan"), "windows.windows[0].gap_ms"),
    ("windows.1.step_ms", float("inf"), "windows.windows[1].step_ms"),
    ("windows.2.coll_ms", -1.0, "windows.windows[2].coll_ms"),
    ("windows.0.rank", "zero", "windows.windows[0].rank"),
    ("windows.0.rank", True, "windows.windows[0].rank"),
    ("windows.0.rank", -1, "windows.windows[0].rank"),
    ("windows.0.nranks", 0, "windows.windows[0].nranks"),
    ("windows.0.clock", "wall", "windows.windows[0].clock"),
    ("windows.1.step_hi", 0, "windows.windows[1].step_hi"),
    ("windows.1.job", "DELETE", "windows.windows[1].job"),
    ("windows.2.telemetry.sm_mhz", float("nan"), "windows.windows[2].telemetry.sm_mhz"),
    ("windows.2.telemetry.throttle", {"hw_thermal": 1}, "windows.windows[2].telemetry.throttle"),
    ("windows.2.telemetry.missing", "sm_mhz", "windows.windows[2].telemetry.missing"),
    ("windows.0.telemetry", [1, 2], "windows.windows[0].telemetry"),
    ("windows", {"a": 1}, "windows.windows"),
    ("host", "", "windows.host"),
    ("host", "DELETE", "windows.host"),
    ("seq", -1, "seq"),
]


def _set(m: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    cur: Any = m
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    if value == "DELETE":
        del cur[parts[-1]]
    else:
        cur[parts[-1]] = value


@pytest.mark.parametrize(("path", "value", "field"), CASES)
def test_invalid_field_is_named(path: str, value: Any, field: str) -> None:
    m = _windows_map()
    _set(m, path, value)
    with pytest.raises(ProtocolError) as ei:
        decode_frame_body(pack(m))
    e = ei.value
    assert e.reason == "invalid"
    assert e.field == field
    assert field in e.text
    assert e.msg_type == "windows"
    assert not e.fatal


@pytest.mark.parametrize(
    ("t", "fields", "field"),
    [
        ("heartbeat", {"progress": [{"job": "j"}]}, "heartbeat.progress[0].comm"),
        ("heartbeat", {"buffered": -3}, "heartbeat.buffered"),
        ("heartbeat", {"plan_acks": [{"k": 1.5}, 3]}, "heartbeat.plan_acks[1]"),
        (
            "hello",
            {"agent_id": "a", "host": "h", "agent_version": "1", "nonce": b"x"},
            "hello.nonce",
        ),
        (
            "welcome",
            {"coordinator_id": "c", "nonce": b"n" * 32, "proof": b"short"},
            "welcome.proof",
        ),
        ("control", {"control_id": "c", "action": "reboot"}, "control.action"),
        # A non-string key: msgspec names the map it is in.
        ("control", {"control_id": "c", "action": "dump", "body": {1: 2}}, "control.body"),
        ("ack", {}, "ack.upto"),
        ("ack", {"upto": 3, "ok": "yes"}, "ack.ok"),
        ("dump", {"job": "j", "comm": "c", "rank": 0, "records": [[1]]}, "dump.records[0]"),
        ("error", {"code": "x"}, "error.text"),
    ],
)
def test_invalid_fields_of_other_types(t: str, fields: dict[str, Any], field: str | None) -> None:
    m = {"v": [1, 0], "t": t, "seq": 1, **fields}
    with pytest.raises(ProtocolError) as ei:
        decode_frame_body(msgpack.packb(m, strict_types=False))
    assert ei.value.reason == "invalid"
    assert ei.value.field == field and field in ei.value.text


def test_unknown_fields_ignored_and_optional_defaulted_same_major() -> None:
    m = message_to_map(heartbeat(seq=3), version=(1, 7))
    m["a_field_from_1_7"] = {"nested": [1, 2, 3]}
    m["progress"][0]["new_progress_field"] = 5
    for k in ("buffered", "dropped", "plan_acks"):
        del m[k]
    out = decode_frame_body(pack(m))
    assert isinstance(out, Heartbeat)
    assert out.version == (1, 7)
    assert (out.buffered, out.dropped, out.plan_acks) == (0, 0, ())
    assert out.progress == heartbeat().progress


def test_other_major_refused_naming_both_versions() -> None:
    m = message_to_map(heartbeat(), version=(2, 1))
    with pytest.raises(ProtocolError) as ei:
        decode_frame_body(pack(m))
    e = ei.value
    assert e.reason == "version" and e.peer_version == (2, 1)
    ours = "{}.{}".format(*PROTOCOL_VERSION)
    assert "2.1" in e.text and ours in e.text
    # And the same from the other side: a 2.x decoder refusing our 1.0 frame.
    with pytest.raises(ProtocolError) as ei2:
        decode_frame_body(body_of(encode(heartbeat())), version=(2, 0))
    assert ei2.value.reason == "version" and ours in ei2.value.text and "2.0" in ei2.value.text


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "msgpack"),
        (b"\xc1", "msgpack"),  # never-used msgpack byte
        (msgpack.packb([1, 2, 3]), "not_a_map"),
        (msgpack.packb("hello"), "not_a_map"),
        (msgpack.packb({"v": [1, 0], "t": "gossip", "seq": 1}), "unknown_type"),
        (msgpack.packb({"v": [1, 0], "seq": 1}), "unknown_type"),
        (msgpack.packb({"t": "ack", "seq": 1, "upto": 1}), "invalid"),
        (msgpack.packb({"v": "1.0", "t": "ack", "seq": 1, "upto": 1}), "invalid"),
        (msgpack.packb({"v": [1, 0], "t": "ack", "upto": 1}), "invalid"),
        (msgpack.packb(msgpack.ExtType(5, b"xx")), "not_a_map"),
        (msgpack.packb({"v": [1, 0], "t": "ack", "seq": 1, "upto": 1}) + b"\x00", "msgpack"),
    ],
)
def test_bad_bodies_have_reasons(body: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as ei:
        decode_frame_body(body)
    assert ei.value.reason == reason


def test_decoder_byte_by_byte_and_bad_frame_only_drops_itself() -> None:
    good1 = encode(windows_msg(2, seq=1))
    bad = frame_of({"v": [1, 0], "t": "windows", "seq": 2, "host": "h", "windows": [{"job": 1}]})
    good2 = encode(heartbeat(seq=3))
    stream = good1 + bad + b"\x00\x00\x00\x02\xc1\xc1" + good2
    dec = FrameDecoder()
    out: list[Any] = []
    for i in range(len(stream)):
        out.extend(dec.feed(stream[i : i + 1]))
    assert [type(x).__name__ for x in out] == [
        "Windows",
        "ProtocolError",
        "ProtocolError",
        "Heartbeat",
    ]
    assert out[1].reason == "invalid" and out[2].reason == "msgpack"
    assert out[0].seq == 1 and out[3].seq == 3
    assert dec.pending == 0 and not dec.poisoned and dec.eof() is None


def test_oversize_prefix_poisons_and_nothing_after_is_decoded() -> None:
    dec = FrameDecoder(max_frame=1024)
    ok = encode(Ack(seq=1, upto=1))
    out = dec.feed(ok + (2048).to_bytes(4, "big") + b"x" * 10 + ok)
    assert isinstance(out[0], Ack)
    assert isinstance(out[1], ProtocolError) and out[1].reason == "oversize" and out[1].fatal
    assert "2048" in out[1].text and "1024" in out[1].text
    assert len(out) == 2 and dec.poisoned
    assert dec.feed(ok) == []


def test_truncated_stream_reported_at_eof() -> None:
    dec = FrameDecoder()
    frame = encode(heartbeat())
    assert dec.feed(frame[:-5]) == []
    assert dec.pending == len(frame) - 5
    e = dec.eof()
    assert e is not None and e.reason == "truncated" and str(len(frame) - 4) in e.text
    dec2 = FrameDecoder()
    dec2.feed(b"\x00\x00")
    e2 = dec2.eof()
    assert e2 is not None and e2.reason == "truncated" and "prefix" in e2.text


def test_encode_refuses_oversize_messages() -> None:
    with pytest.raises(ProtocolError) as ei:
        encode(windows_msg(8), max_frame=1000)
    assert ei.value.reason == "oversize" and "windows" in ei.value.text


def test_record_builders_validate() -> None:
    d = window(2).to_dict()
    assert rank_window_from_dict(d) == window(2)
    d["gap_ms"] = math.nan
    with pytest.raises(ProtocolError, match=r"rank_window\.gap_ms"):
        rank_window_from_dict(d)
    assert telemetry_from_dict({}) == Telemetry()
    with pytest.raises(ProtocolError, match=r"telemetry\.temp_c"):
        telemetry_from_dict({"temp_c": "hot"})
