"""The columnar `windows` batch (minor 1.1): round trips, plain-msgpack interop both ways,
the 1.0 per-rank form still read, and strict column checks that name the column."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import pytest
from artemis.protocol.codec import decode_frame_body, encode
from artemis.protocol.columns import COLUMNS, WindowColumns
from artemis.protocol.messages import PROTOCOL_VERSION, ProtocolError, Windows
from artemis.protocol.records import RankWindow, Telemetry
from protocol_helpers import window, windows_msg


def body_of(frame: bytes) -> bytes:
    return frame[4:]


def mixed() -> Windows:
    """Ranks with telemetry, without, and with some optional fields absent."""
    recs: list[RankWindow] = []
    for r in range(5):
        w = window(r)
        if r == 1:
            w = RankWindow(**{**_fields(w), "telemetry": Telemetry(), "samples": None})
        if r == 3:
            tel = Telemetry(sm_mhz=1400.0, gpu_index=None, pcie_gen=4, missing=("gpu_index",))
            w = RankWindow(**{**_fields(w), "telemetry": tel, "bridge_ms": 2.5, "bridge_peer": 1})
        recs.append(w)
    return Windows(seq=4, host="node-a", windows=recs)


def _fields(w: RankWindow) -> dict[str, Any]:
    return {k: getattr(w, k) for k in RankWindow.__dataclass_fields__}


def test_round_trip_is_exact_absent_values_included() -> None:
    msg = mixed()
    out = decode_frame_body(body_of(encode(msg)))
    assert isinstance(out, Windows) and out == msg
    assert out.windows == msg.windows
    assert out.version == PROTOCOL_VERSION
    c = out.columns
    assert c.n == 5 and math.isnan(c.floats("samples")[1]) and c.floats("samples")[0] == 32.0
    assert c["tel_missing"][3] == ("gpu_index",) and c["tel_throttle"][1] is None


def test_old_minor_form_is_written_for_a_1_0_peer_and_read_back() -> None:
    msg = mixed()
    wire = msgpack.unpackb(body_of(encode(msg, version=(1, 0))), raw=False)
    assert "cols" not in wire and len(wire["windows"]) == 5
    assert wire["windows"][0]["rank"] == 0 and wire["v"] == [1, 0]
    out = decode_frame_body(body_of(encode(msg, version=(1, 0))))
    assert isinstance(out, Windows) and out.version == (1, 0)
    assert out.columns == msg.columns


def test_plain_msgpack_reads_our_columnar_frame() -> None:
    msg = windows_msg(4)
    wire = msgpack.unpackb(body_of(encode(msg)), raw=False)
    assert wire["t"] == "windows" and wire["v"] == list(PROTOCOL_VERSION)
    cols = wire["cols"]
    assert cols["n"] == 4
    dtype, data = cols["rank"]
    assert dtype == "<i8" and isinstance(data, bytes)
    assert np.frombuffer(data, "<i8").tolist() == [0, 1, 2, 3]
    dtype, data = cols["gap_ms"]
    assert dtype == "<f8" and np.frombuffer(data, "<f8").tolist() == [81.5, 82.5, 83.5, 84.5]
    assert cols["job"] == ["job-1"] * 4
    assert cols["tel_throttle"][0] == {"hw_thermal": False, "sw_power_cap": True}


def _plain_batch(n: int) -> dict[str, Any]:
    """A columnar batch written by hand with numpy + plain msgpack, no artemis code."""

    def i8(vals: list[int]) -> list[Any]:
        return ["<i8", np.asarray(vals, "<i8").tobytes()]

    def f8(vals: list[float]) -> list[Any]:
        return ["<f8", np.asarray(vals, "<f8").tobytes()]

    ranks = list(range(n))
    return {
        "n": n,
        "job": ["j"] * n,
        "comm": ["00000000000000aa"] * n,
        "host": ["h"] * n,
        "clock": ["device"] * n,
        "rank": i8(ranks),
        "nranks": i8([n] * n),
        "window": i8([7] * n),
        "step_lo": i8([350] * n),
        "step_hi": i8([400] * n),
        "coll_lo": i8([700] * n),
        "coll_hi": ["<i4", np.asarray([800] * n, "<i4").tobytes()],  # a narrower dtype
        "gap_ms": f8([10.0 + r for r in ranks]),
        "coll_ms": f8([2.0] * n),
        "step_ms": f8([12.0] * n),
        "collectives": i8([100] * n),
        "bytes": i8([1 << 20] * n),
        "lost": i8([0] * n),
        # rows 0 and 2 present, 1 absent: a validity bitmap, LSB first.
        "samples": ["<i8", np.asarray([32, 0, 30], "<i8").tobytes(), bytes([0b101])],
        "tel_sm_mhz": f8([1400.0, math.nan, 1390.0]),
        "tel_throttle": [None, {"hw_thermal": True}, None],
        "tel_missing": [["sm_mhz"], [], []],
    }


def test_we_read_a_batch_written_by_plain_msgpack() -> None:
    body = msgpack.packb(
        {"v": [1, 1], "t": "windows", "seq": 3, "host": "h", "cols": _plain_batch(3)},
        use_bin_type=True,
    )
    out = decode_frame_body(body)
    assert isinstance(out, Windows) and out.seq == 3
    recs = out.windows
    assert [w.rank for w in recs] == [0, 1, 2]
    assert [w.samples for w in recs] == [32, None, 30]
    assert recs[2].coll_hi == 800 and recs[1].gap_ms == 11.0
    assert [w.telemetry.sm_mhz for w in recs] == [1400.0, None, 1390.0]
    assert recs[1].telemetry.throttle == {"hw_thermal": True}
    assert recs[0].telemetry.missing == ("sm_mhz",) and recs[0].island is None
    assert out.columns.ints("coll_hi").dtype == np.int64


def test_we_read_a_1_0_frame_written_by_plain_msgpack() -> None:
    rec = window(2).to_dict()
    body = msgpack.packb(
        {"v": [1, 0], "t": "windows", "seq": 1, "host": "node-a", "windows": [rec]},
        use_bin_type=True,
    )
    out = decode_frame_body(body)
    assert isinstance(out, Windows) and out.windows == (window(2),)
    assert out.columns == WindowColumns.from_records([window(2)])


BAD: list[tuple[str, Any, str]] = [
    # (column, new value, text expected in the error)
    ("rank", ["<i8", np.asarray([0, -1, 2], "<i8").tobytes()], "row 1"),
    ("rank", ["<i8", b"\x00" * 16], "expected 3 rows"),
    ("rank", ["<f8", np.asarray([0, 1, 2], "<f8").tobytes()], "integer dtype"),
    ("rank", ["<u2", b"\x00" * 6], ""),
    ("nranks", ["<i8", np.asarray([3, 0, 3], "<i8").tobytes()], ">= 1, got 0 at row 1"),
    ("gap_ms", ["<f8", np.asarray([1.0, math.nan, 1.0], "<f8").tobytes()], "nan"),
    ("coll_ms", ["<f8", np.asarray([1.0, 1.0, math.inf], "<f8").tobytes()], "inf"),
    ("tel_sm_mhz", ["<f8", np.asarray([1.0, -math.inf, 1.0], "<f8").tobytes()], "row 1"),
    ("tel_temp_c", ["<f8", np.asarray([-300.0, 1.0, 1.0], "<f8").tobytes()], "row 0"),
    ("samples", ["<i8", np.asarray([1, 2, 3], "<i8").tobytes(), b"\x01\x00"], "bitmap"),
    ("samples", ["<f8", np.asarray([1.5, 2, 3], "<f8").tobytes()], "whole numbers"),
    ("step_hi", ["<i8", np.asarray([400, 349, 400], "<i8").tobytes()], "step_lo"),
    ("job", ["j", "j"], "expected 3 rows"),
    ("job", ["j", "", "j"], ""),
    ("clock", ["device", "wall", "device"], ""),
    ("host", None, ""),
    ("tel_throttle", [None, {"hw_thermal": 1}, None], ""),
    ("tel_missing", [[], "sm_mhz", []], ""),
    ("gap_ms", "DELETE", "missing"),
]


@pytest.mark.parametrize(("column", "value", "text"), BAD)
def test_bad_columns_are_refused_naming_the_column(column: str, value: Any, text: str) -> None:
    cols = _plain_batch(3)
    if value == "DELETE":
        del cols[column]
    else:
        cols[column] = value
    body = msgpack.packb(
        {"v": [1, 1], "t": "windows", "seq": 3, "host": "h", "cols": cols}, use_bin_type=True
    )
    with pytest.raises(ProtocolError) as ei:
        decode_frame_body(body)
    e = ei.value
    assert e.reason == "invalid" and e.msg_type == "windows" and not e.fatal
    assert e.field is not None and e.field.startswith(f"windows.cols.{column}"), e.text
    assert e.text.startswith(f"windows.cols.{column}") and text in e.text, e.text


def test_every_schema_column_travels() -> None:
    msg = windows_msg(3)
    wire = msgpack.unpackb(body_of(encode(msg)), raw=False)
    # Columns absent in every row are left out; these rows have every field.
    assert set(wire["cols"]) - {"n"} <= set(COLUMNS)
    assert decode_frame_body(body_of(encode(msg))) == msg


def test_a_big_batch_costs_per_column() -> None:
    recs = [window(r % 64) for r in range(4096)]
    msg = Windows(host="node-a", windows=recs)
    out = decode_frame_body(body_of(encode(msg)))
    assert isinstance(out, Windows) and out.columns.n == 4096
    assert out.columns == msg.columns


def test_every_list_derives_from_the_schema() -> None:
    """A Telemetry field added in records.py reaches the columns, the wire struct, the
    field groups, the agent's integer rounding and the diagnosis without another edit."""
    import dataclasses

    from artemis.agent.telemetry import base
    from artemis.detect import diagnosis
    from artemis.protocol import records
    from artemis.protocol.columns import TELEMETRY_COLUMNS, WindowBatch

    tel = [f.name for f in dataclasses.fields(Telemetry)]
    assert list(TELEMETRY_COLUMNS) == tel
    assert set(records.GPU_FIELDS) | set(records.HOST_FIELDS) == set(tel) - {"missing"}
    assert not set(records.GPU_FIELDS) & set(records.HOST_FIELDS)
    assert base.ALL_FIELDS == records.GPU_FIELDS + records.HOST_FIELDS
    assert {k for k, v in TELEMETRY_COLUMNS.items() if v == "oi"} == base._INT_FIELDS
    assert diagnosis.DIAG_FIELDS is records.DIAG_FIELDS
    assert set(diagnosis.DIAG_FIELDS) <= set(tel)
    wire = set(WindowBatch.__struct_fields__)
    assert wire == set(COLUMNS) | {"n"}
    rw = [f.name for f in dataclasses.fields(RankWindow) if f.name != "telemetry"]
    assert [c for c in COLUMNS if not c.startswith("tel_")] == rw


def test_plain_msgpack_reads_every_message_we_write() -> None:
    from protocol_helpers import every_message

    for msg in every_message():
        wire = msgpack.unpackb(body_of(encode(msg)), raw=False, strict_map_key=True)
        assert wire["t"] == msg.TYPE and wire["v"] == list(PROTOCOL_VERSION)
        assert wire["seq"] == msg.seq
        # ...and the map plain msgpack wrote back decodes to the same message.
        assert decode_frame_body(msgpack.packb(wire, use_bin_type=True)) == msg


def _wire_batch(cols: dict[str, Any]) -> Any:
    import msgspec
    from artemis.protocol.columns import WindowBatch

    return msgspec.msgpack.decode(msgpack.packb(cols, use_bin_type=True), type=WindowBatch)


def test_the_fast_check_agrees_with_the_column_walk() -> None:
    """The batch check runs every numeric column at once and falls back to the column by
    column walk for anything unusual: on valid batches both give the same columns, and
    the fast one never accepts what the walk refuses."""
    import msgspec
    from artemis.protocol.columns import (
        WindowBatch,
        _from_wire_columns,
        _from_wire_fast,
        from_wire,
        to_wire,
    )

    # (columns, whether the fast check takes them: a validity bitmap goes to the walk)
    valid = [(mixed().columns, False), (windows_msg(3).columns, True)]
    valid += [(WindowColumns.empty(), True), (_wire_cols(_plain_batch(3)), False)]
    for wc, fast_ok in valid:
        b = msgspec.msgpack.decode(msgspec.msgpack.encode(to_wire(wc)), type=WindowBatch)
        fast, walk = _from_wire_fast(b), _from_wire_columns(b)
        assert (fast is not None) == fast_ok
        assert WindowColumns(wc.n, walk) == wc
        if fast is not None:
            assert WindowColumns(wc.n, fast) == wc
    for column, value, _ in BAD:
        cols = _plain_batch(3)
        if value == "DELETE":
            del cols[column]
        else:
            cols[column] = value
        try:
            b = _wire_batch(cols)
        except Exception:
            continue  # refused by msgspec already
        if _from_wire_fast(b) is not None:
            # Only the cross-column rules are left to from_wire itself.
            assert column in ("step_hi", "coll_hi")
        with pytest.raises(ValueError):
            from_wire(b)


def _wire_cols(cols: dict[str, Any]) -> WindowColumns:
    from artemis.protocol.columns import from_wire

    return from_wire(_wire_batch(cols))
