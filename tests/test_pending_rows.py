"""A pending window's rows copied in as its batches come (detect/pending_rows.py): the
same window as the batches' concatenation, without holding the batches."""

from __future__ import annotations

import math

import numpy as np
from artemis.detect.assembly import WindowAssembler
from artemis.detect.pending_rows import PendingRows
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import Telemetry
from window_records import window_record

N = 12


def _batch(ranks: range, **fields: object) -> WindowColumns:
    return WindowColumns.from_records(
        [window_record(r, 0, nranks=N, gap_ms=1.0 + r, job="j", **fields) for r in ranks]
    )


def test_rows_are_the_batches_concatenated_an_optional_column_nan_where_a_batch_lacked_it() -> None:
    # The middle batch has a telemetry column the others lack (their shared NaN row).
    batches = [
        _batch(range(0, 4)),
        _batch(range(4, 8), telemetry=Telemetry(sm_mhz=1500.0)),
        _batch(range(8, 12)),
    ]
    rows = PendingRows(2)  # smaller than the window: the columns grow
    for b in batches:
        rows.append(b)
    got = rows.columns()
    assert got == WindowColumns.concat(batches)
    sm = got.floats("tel_sm_mhz")
    assert sm[4:8].tolist() == [1500.0] * 4 and all(math.isnan(x) for x in [*sm[:4], *sm[8:]])
    assert rows.starts == [0, 4, 8] and rows.sizes == [4, 4, 4] and rows.firsts == [0, 4, 8]


def test_rows_taken_before_the_window_left_do_not_change_with_later_batches() -> None:
    rows = PendingRows(N)
    rows.append(_batch(range(0, 6)))
    early = rows.columns()  # (the journal's pending_windows)
    rows.append(_batch(range(6, 12)))
    assert early == _batch(range(0, 6)) and len(early["job"]) == 6
    assert rows.columns(final=True) == _batch(range(0, 12))


def _released(order: list[range]) -> WindowColumns:
    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", range(N))
    out = []
    for ranks in order:
        out += a.add(_batch(ranks), 0.0)
    (done,) = out
    assert done.complete
    return done.columns


def test_a_window_is_the_same_whichever_order_its_batches_came_in() -> None:
    in_order = _released([range(0, 4), range(4, 8), range(8, 12)])
    shuffled = _released([range(8, 12), range(0, 4), range(4, 8)])
    assert in_order == shuffled == _batch(range(N))
    assert np.array_equal(in_order.ints("rank"), np.arange(N))


def test_a_batch_claiming_a_huge_communicator_costs_its_rows_not_its_claim() -> None:
    import tracemalloc

    a = WindowAssembler(deadline_s=5, grace_s=0)
    a.expect("j", range(4))
    big = WindowColumns.from_records(
        [window_record(r, 0, nranks=1 << 40, job="j") for r in range(4)]
    )
    tracemalloc.start()
    try:
        (done,) = a.add(big, 0.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert done.complete and len(done.columns) == 4
    assert peak < 1 << 20, peak  # room for the 4 ranks announced, not for 2**40
