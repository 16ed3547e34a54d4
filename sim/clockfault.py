"""The simulator's `clock_anomaly` faults: what a rank's device timer reads.

The model (sim/model.py) computes true device times; a rank with a
`[[fault]] kind = "clock_anomaly"` has them passed through `DeviceClock` before
they reach the real plugin as KernelCh timers, so the rings hold exactly what
a faulty GPU timer would give (docs/RELIABILITY.md "4. Device-clock anomalies"):

* ``reversed``: in the fault's windows, two records a window end before they start
  (the timer values of one collective swapped);
* ``jump``: mid-way through the start window the timer jumps `JUMP_NS` (3 h)
  ahead and stays there;
* ``wrap``: the timer is a `WRAP_BITS`-bit counter that wraps around near the
  middle of the start window;
* ``reset``: mid-way through the start window the timer restarts from near zero
  (a GPU reset);
* ``rate``: from the start window (to `end_window`), the timer runs `rate` times
  as fast as true time.

One-off events (jump, wrap, reset) happen once; `end_window` bounds only
``reversed`` and ``rate``. Deterministic: the same scenario gives the same rings.
"""

from __future__ import annotations

from collections.abc import Sequence

from artemis.sim.scenario import Fault, Scenario

JUMP_NS = 3 * 3600 * 10**9
WRAP_BITS = 48
RESET_TO_NS = 5_000


class DeviceClock:
    def __init__(self, fault: Fault, window_steps: int, step_ns: float) -> None:
        self.f = fault
        self.S = window_steps
        self.step_ns = step_ns
        mid = window_steps // 2 if fault.anomaly != "rate" else 0
        self.switch = (fault.start_window, mid)  # (window, step in window) of the event
        self._last = 0  # the latest true time passed through (the last stop)
        self._base: int | None = None  # the true time at the switch (reset, rate)
        self._offset: int | None = None  # wrap: counter = (t + offset) mod 2**WRAP_BITS
        self._rate_done: tuple[int, int] | None = None  # (true, shown) where rate ended

    @classmethod
    def for_rank(cls, sc: Scenario, rank: int) -> DeviceClock | None:
        for f in sc.faults:
            if f.kind == "clock_anomaly" and rank in f.ranks:
                return cls(f, sc.window_steps, sc.step_ms * 1e6)
        return None

    def kernel_times(
        self, window: int, step: int, k: int, kt: Sequence[tuple[int, int]]
    ) -> list[tuple[int, int]]:
        """The channels' (start, stop) timer values for collective `k` of `step` (in the
        window) of `window`, from their true times."""
        f, a = self.f, self.f.anomaly
        after = (window, step) >= self.switch
        if a == "wrap" and self._offset is None:
            first = min(s for s, _ in kt)
            until = (f.start_window * self.S + self.S // 2) * self.step_ns
            self._offset = (1 << WRAP_BITS) - first - int(until)
        if after and self._base is None and a in ("reset", "rate"):
            self._base = self._last
        out = [(self._read(window, s, after), self._read(window, e, after)) for s, e in kt]
        self._last = max(self._last, max(e for _, e in kt))
        if a == "reversed" and f.active(window) and k == 1 and step in self._reversed_steps():
            out = [(e, s) for s, e in out]
        return out

    def _reversed_steps(self) -> tuple[int, ...]:
        return (self.S // 3, (2 * self.S) // 3) if self.S >= 3 else (0,)

    def _read(self, window: int, t: int, after: bool) -> int:
        a = self.f.anomaly
        if a == "jump":
            return t + JUMP_NS if after else t
        if a == "wrap":
            assert self._offset is not None
            return (t + self._offset) % (1 << WRAP_BITS)
        if a == "reset":
            assert not after or self._base is not None
            return t - self._base + RESET_TO_NS if after and self._base is not None else t
        if a == "rate" and after and self._base is not None:
            if self.f.end_window is not None and window >= self.f.end_window:
                if self._rate_done is None:
                    base = self._base
                    self._rate_done = (self._last, base + round((self._last - base) * self.f.rate))
                t0, v0 = self._rate_done
                return v0 + (t - t0)  # back to the true rate, continuous
            return self._base + round((t - self._base) * self.f.rate)
        return t
