"""bench/ingest.py: a paced run's memory per rank from its RSS reads (peak and held)."""

from __future__ import annotations

from bench.ingest import _memory

# (perf_counter, RSS bytes): windows sent at 0.4 and 1.95 s, each a burst after it.
READS = [(0.0, 100), (0.5, 150), (1.0, 300), (1.1, 140), (1.9, 145), (2.0, 320), (2.5, 142)]
READS += [(3.5, 130)]  # after the run


def test_the_peak_is_the_kernels_mark_when_a_burst_fell_between_two_reads() -> None:
    m = _memory(READS, 350, [0.4, 1.95], base=100, ranks=10)
    assert (m.peak, m.read_peak) == (25.0, 22.0)
    assert _memory(READS, None, [0.4, 1.95], base=100, ranks=10).peak == 22.0


def test_held_is_the_highest_level_just_before_a_later_window_or_after_the_run() -> None:
    # The read just before the second window (145), not a burst's, nor the first
    # window's base (100: before any window, nothing is held yet).
    assert _memory(READS, 350, [0.4, 1.95], base=100, ranks=10).held == 4.5
    # A run whose last read is its highest level between windows.
    tail = [*READS[:-1], (3.5, 160)]
    assert _memory(tail, 350, [0.4, 1.95], base=100, ranks=10).held == 6.0
