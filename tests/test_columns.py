"""WindowColumns round-trips RankWindow records exactly, absent values included."""

from __future__ import annotations

import math

import msgspec
from artemis.protocol.columns import COLUMNS, WindowBatch, WindowColumns, from_wire, to_wire
from artemis.protocol.records import RankWindow, Telemetry
from window_records import window_record


def _rw(rank: int, **tel: object) -> RankWindow:
    # every field away from window_record's defaults, so the round trip checks each one
    place = {"comm": "00000000000000aa", "nranks": 4, "host": f"h{rank}"}
    span = {"coll_lo": 300, "coll_hi": 400, "bytes": 1 << 20}
    timing = {"gap_ms": 10.0 + rank, "coll_ms": 2.0, "step_ms": 12.5}
    return window_record(
        rank,
        3,
        island="nvidia" if rank % 2 else None,
        samples=32 if rank else None,
        telemetry=Telemetry(**tel),  # type: ignore[arg-type]
        **place,
        **span,
        **timing,
    )


def test_round_trip_keeps_every_value() -> None:
    recs = [
        _rw(0),
        _rw(1, sm_mhz=1410.0, throttle={"hw_thermal": True}, gpu_index=1, missing=("temp_c",)),
        _rw(2, cpu_pct=55.5, ncpu=64),
    ]
    cols = WindowColumns.from_records(recs)
    assert cols.n == 3 and set(cols.cols) == set(COLUMNS)
    assert cols.rows() == recs
    assert math.isnan(cols.floats("tel_sm_mhz")[0])
    assert cols.take([2, 0]).rows() == [recs[2], recs[0]]
    both = WindowColumns.concat([cols, WindowColumns.empty(), cols.take([1])])
    assert both.rows() == [*recs, recs[1]]


def test_nan_gap_stays_nan_so_the_detector_can_refuse_it() -> None:
    bad = _rw(0)
    object.__setattr__(bad, "gap_ms", math.nan)
    (back,) = WindowColumns.from_records([bad]).rows()
    assert math.isnan(back.gap_ms)


def test_a_short_column_is_named() -> None:
    cols = WindowColumns.from_records([_rw(0)])
    broken = dict(cols.cols)
    broken["rank"] = broken["rank"][:0]
    try:
        WindowColumns(1, broken)
    except ValueError as e:
        assert "rank" in str(e)
    else:
        raise AssertionError("a short column was accepted")


def _wire(recs: list[RankWindow]) -> WindowColumns:
    data = msgspec.msgpack.encode(to_wire(WindowColumns.from_records(recs)))
    return from_wire(msgspec.msgpack.decode(data, type=WindowBatch))


def test_wire_batches_concat_and_take_keep_every_value_absent_columns_included() -> None:
    # Batches off the wire share one NaN row for the optional columns they lack, and
    # concat/take keep it for a column no part has: each value must still come back,
    # whether the column is absent from every part, some, or none.
    a = [_rw(0), _rw(1)]  # no sm_mhz, no cpu_pct
    b = [_rw(2, sm_mhz=1410.0), _rw(3, sm_mhz=1400.0, cpu_pct=55.5)]
    c = [_rw(4)]
    both = WindowColumns.concat([_wire(a), _wire(b), _wire(c)])
    assert both.rows() == [*a, *b, *c]
    assert both.take([3, 0]).rows() == [b[1], a[0]]
    lacking = WindowColumns.concat([_wire(a), _wire(c)])
    assert lacking.rows() == [*a, *c]
    sm = lacking.floats("tel_sm_mhz")
    assert sm.size == 3 and all(math.isnan(x) for x in sm.tolist())
    assert lacking.take([2, 1]).rows() == [c[0], a[1]]
