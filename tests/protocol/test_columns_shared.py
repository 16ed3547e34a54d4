"""Columns of strings and maps off the wire (protocol/columns.py `WireBatch`): a column
that repeats one value is decoded once and shared by its rows; every other column is
decoded as before; either way the values and the refusals are those of the typed
decode, and the journal writes the batch's bytes back as they came."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import msgspec
import pytest
from artemis.coordinator.journal import _entry
from artemis.protocol.codec import decode_frame_body, encode
from artemis.protocol.columns import (
    COLUMNS,
    WindowBatch,
    WindowColumns,
    WireBatch,
    _repeated,
    from_wire,
)
from artemis.protocol.messages import ProtocolError, Windows
from protocol_helpers import window

_LISTS = [name for name, kind in COLUMNS.items() if kind in ("s", "os", "t", "m")]


def _recs(n: int) -> list[Any]:
    """A node's batch: every row's throttle map the same too."""
    out = []
    for r in range(n):
        w = window(r)
        tel = dataclasses.replace(w.telemetry, throttle={"hw_thermal": False})
        out.append(dataclasses.replace(w, telemetry=tel))
    return out


def _decoded(recs: list[Any]) -> WindowColumns:
    out = decode_frame_body(encode(Windows(host="node-a", windows=recs))[4:])
    assert isinstance(out, Windows)
    return out.columns


def _typed(wc: WindowColumns) -> WindowColumns:
    """The same batch through the struct that decodes every value (no sharing)."""
    data = msgspec.msgpack.encode(wc.wire)
    return from_wire(msgspec.msgpack.decode(data, type=WindowBatch))


def test_a_repeated_value_is_one_object_shared_by_the_rows() -> None:
    wc = _decoded(_recs(64))
    assert isinstance(wc.wire, WireBatch)
    for name in ("job", "comm", "host", "clock", "island", "hw_class", "tel_throttle"):
        col = wc[name]
        assert len(col) == 64 and all(v is col[0] for v in col), name
    assert wc == _typed(wc)
    assert wc.rows() == _recs(64)


def test_a_column_with_one_other_value_is_decoded_row_by_row() -> None:
    recs = _recs(64)
    recs[17] = dataclasses.replace(recs[17], host="node-b")
    tel = dataclasses.replace(recs[40].telemetry, throttle={"hw_thermal": True})
    recs[40] = dataclasses.replace(recs[40], telemetry=tel)
    wc = _decoded(recs)
    assert wc["host"][17] == "node-b" and wc["host"][16] == "node-a"
    assert wc["tel_throttle"][40] == {"hw_thermal": True}
    assert wc["tel_throttle"][41] == {"hw_thermal": False}
    assert wc == _typed(wc)
    assert wc.rows() == recs


@pytest.mark.parametrize("n", [1, 15, 16, 64, 300, 70_000])
def test_repeat_detection_agrees_with_decoding_each_value(n: int) -> None:
    # (array headers of every size: fixarray, array 16, array 32)
    same = msgpack.packb(["ab"] * n)
    one = _repeated(same, n)
    assert one == msgpack.packb("ab")
    # Items whose bytes could line up with a period of another length are told apart.
    for items in (["a"] * (n - 1) + ["b"], ["ab"] * (n - 1) + ["a"], [None] * (n - 1) + [""]):
        data = msgpack.packb(items)
        got = _repeated(data, n)
        if got is not None:
            assert msgpack.unpackb(got) is not None and [msgpack.unpackb(got)] * n == items


def test_a_bad_value_repeated_by_every_row_is_refused_naming_the_column() -> None:
    cols = msgspec.msgpack.decode(msgspec.msgpack.encode(_decoded_wire(64)))
    cols["job"] = [""] * 64
    body = msgpack.packb({"v": [1, 1], "t": "windows", "seq": 3, "host": "h", "cols": cols})
    with pytest.raises(ProtocolError) as ei:
        decode_frame_body(body)
    assert ei.value.field == "windows.cols.job[0]" and "length >= 1" in ei.value.text
    cols["job"] = ["j"] * 63 + [""]
    body = msgpack.packb({"v": [1, 1], "t": "windows", "seq": 3, "host": "h", "cols": cols})
    with pytest.raises(ProtocolError) as ei:
        decode_frame_body(body)
    assert ei.value.field == "windows.cols.job[63]", ei.value.text


def test_bytes_repeating_what_is_no_single_value_are_decoded_whole() -> None:
    """[True, "aäa"] repeated: its bytes are one 3-byte pattern over and over, which is
    no single value; the column is decoded item by item (here refused at its first row:
    a bool in a column of strings), not refused for the pattern."""
    data = msgpack.packb([True, "a\u00e4a"] * 16)
    one = _repeated(data, 32)
    assert one == b"\xc3\xa4a"  # (True, then the start of the string)
    from artemis.protocol.columns import _listed

    with pytest.raises(ValueError) as ei:
        _listed("job", msgspec.Raw(data), 32)  # strings only: True refused at row 0
    assert "job[0]" in str(ei.value)


def _decoded_wire(n: int) -> Any:
    return _decoded(_recs(n)).wire


def test_the_journal_writes_the_batch_as_it_came() -> None:
    wc = _decoded(_recs(64))
    tag, batch = msgspec.msgpack.decode(_entry(wc))
    assert tag == "c"
    # The journal's reader (a plain decode, then the typed struct) gets the same rows.
    back = from_wire(msgspec.convert(batch, WindowBatch))
    assert back == wc
    # Held by assembly without the frame's bytes.
    assert wc.detached().wire is None and wc.detached() == wc


def test_a_big_windows_absent_columns_share_one_nan_row() -> None:
    """A window past the cached sizes (here 20k rows) makes one NaN row for all of its
    absent columns, in its concatenation and in a `take` of it."""
    import numpy as np

    part = _decoded(_recs(250))
    absent = [k for k, kind in COLUMNS.items() if kind in ("of", "oi") and np.isnan(part[k]).all()]
    assert len(absent) >= 2
    window = WindowColumns.concat([part] * 80)
    rows = {id(window[k]) for k in absent}
    assert window.n == 20_000 and len(rows) == 1
    row = window[absent[0]]
    assert not row.flags.writeable and np.isnan(row).all() and row.size == 20_000
    some = window.take(np.arange(19_999, -1, -1))
    assert len({id(some[k]) for k in absent}) == 1 and some == window.take(range(20_000)[::-1])
