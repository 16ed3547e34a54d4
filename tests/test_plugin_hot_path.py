"""The plugin's hot-path rules (issue 16, "the hot path at its floor"), through the real ABI.

A start never overwrites a record in flight (plugin README "Slot writers"),
and host times read from the TSC stay CLOCK_MONOTONIC ns (README "Host
clock"), as the agent's reader sees them.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
import pytest
from artemis.ring.format import HEADER_SIZE, REC_DEVICE, SLOT_DTYPE, SLOT_SIZE, STATE_DONE
from artemis.ring.reader import RingReader, records_to_dicts
from standin_comms import one_comm, ring_path


def _tsc_usable() -> bool:
    """What the plugin checks at init (ring.c art_tsc_usable), for the message only."""
    try:
        src = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        flags = next(
            ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")
        )
    except (OSError, StopIteration):
        return False
    return src.read_text().strip() == "tsc" and {"constant_tsc", "nonstop_tsc"} <= set(
        flags.split()
    )


def _slot(path: Path, i: int) -> np.ndarray:
    """Slot i of a ring file as it lies (64-byte base slots), past any reader cursor."""
    raw = path.read_bytes()[HEADER_SIZE + i * SLOT_SIZE : HEADER_SIZE + (i + 1) * SLOT_SIZE]
    return np.frombuffer(raw, dtype=SLOT_DTYPE)[0]


@pytest.mark.parametrize("version", (4, 7))
def test_a_start_never_overwrites_an_op_in_flight(
    plugin_lib: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    # A 4-slot ring: op 0's kernel is still running while three more ops go by,
    # and the fifth start would take op 0's slot. op 0 is younger than the
    # reclaim age, so its KernelCh may still come: the fifth start is dropped
    # and counted, and op 0 completes whole, with its device times, in its slot.
    # Before, the fifth record overwrote op 0's and op 0's completion was the
    # one dropped.
    monkeypatch.setenv("ARTEMIS_RING_SLOTS", "4")
    _, c = one_comm(plugin_lib, version, 0x1A9)
    first = c.begin_collective("AllReduce", 64, "ncclFloat32")
    for _ in range(4):
        c.collective("AllReduce", 64, "ncclFloat32", kernel_times=[(10, 20), (11, 21)])
    first.complete([(1, 5), (2, 6)])
    path = ring_path(shm_dir, 0x1A9, 0)
    with RingReader(path) as r:
        h = r.header()
        recs = records_to_dicts(r.poll().done, h)
    assert h.dropped == 1 and h.host_fallback == 0
    assert sorted(x["seq"] for x in recs) == [1, 2, 3]
    s0 = _slot(path, 0)
    assert (s0["seq"], s0["state"], s0["clock"]) == (0, STATE_DONE, REC_DEVICE)
    assert (s0["start"], s0["end"], s0["lock"] % 2) == (1, 6, 0)
    # the next lap finds op 0's slot free again
    for _ in range(4):
        c.collective("AllReduce", 64, "ncclFloat32", kernel_times=[(50, 60), (51, 61)])
    with RingReader(path) as r:
        h = r.header()
        recs = records_to_dicts(r.poll().done, h)
    assert h.dropped == 1 and sorted(x["seq"] for x in recs) == [5, 6, 7, 8]
    c.finalize()


def test_a_lapped_op_past_the_reclaim_age_is_reclaimed(
    plugin_lib: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same lap with op 0 older than the reclaim age (0 here): the lapping
    # start reclaims it (a host record, counted) and takes the slot; op 0's
    # late KernelCh change nothing.
    monkeypatch.setenv("ARTEMIS_RING_SLOTS", "4")
    monkeypatch.setenv("ARTEMIS_RECLAIM_AGE_MS", "0")
    _, c = one_comm(plugin_lib, 7, 0x1AA)
    first = c.begin_collective("AllReduce", 64, "ncclFloat32")
    for _ in range(4):
        c.collective("AllReduce", 64, "ncclFloat32", kernel_times=[(10, 20), (11, 21)])
    first.complete([(1, 5), (2, 6)])
    with RingReader(ring_path(shm_dir, 0x1AA, 0)) as r:
        h = r.header()
        recs = records_to_dicts(r.poll().done, h)
    assert h.dropped == 0 and h.host_fallback == 1
    assert sorted(x["seq"] for x in recs) == [1, 2, 3, 4]
    assert all((x["clock"], x["start_ns"], x["end_ns"]) == ("device", 10, 21) for x in recs)
    c.finalize()


def test_host_times_from_the_tsc_stay_clock_monotonic(
    plugin_lib: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough (>= 40 ms) for the plugin to measure the TSC's slope and
    # re-anchor a few times: every enqueue time must lie within 20 us of the
    # CLOCK_MONOTONIC reads taken around its collective, and never go back.
    monkeypatch.setenv("ARTEMIS_DEVICE_TIMING", "0")
    n, c = one_comm(plugin_lib, 7, 0x75C)
    brackets: list[tuple[int, int]] = []
    t_end = time.monotonic_ns() + 40_000_000
    while time.monotonic_ns() < t_end and len(brackets) < 8000:
        t0 = time.monotonic_ns()
        c.collective("AllReduce", 64, "ncclFloat32")
        brackets.append((t0, time.monotonic_ns()))
    with RingReader(ring_path(shm_dir, 0x75C, 0)) as r:
        h = r.header()
        recs = records_to_dicts(r.poll().done, h)
    c.finalize()
    assert h.dropped == 0 and len(recs) == len(brackets) > 100
    recs.sort(key=lambda x: x["seq"])
    tol = 20_000
    off = [
        (x["seq"], x["enqueue_ns"], t0, t1)
        for x, (t0, t1) in zip(recs, brackets, strict=True)
        if not (t0 - tol <= x["enqueue_ns"] <= t1 + tol)
    ]
    assert not off, f"enqueue times off CLOCK_MONOTONIC (TSC usable: {_tsc_usable()}): {off[:5]}"
    q = [x["enqueue_ns"] for x in recs]
    assert all(a <= b for a, b in itertools.pairwise(q))
    assert all(x["start_ns"] == x["enqueue_ns"] <= x["end_ns"] for x in recs)
    assert any("host clock TSC" in ln for ln in n.log_lines) == _tsc_usable()
