"""Cause and effect of the simulated compute faults: one model for timing and telemetry.

The lockstep model (`model.py`) asks how much slower a rank's compute is; the
telemetry (`telemetry.py`) asks what the rank's GPU and host read. Both come
from the same physical state of the fault here, so a reading is a consequence
of the cause (a hot GPU throttles its clocks, and the slowdown follows from
the clocks), never a copy of a diagnosis rule's threshold.

Compute time depends on the SM clock through its clock-bound share: a step is
`CLOCK_BOUND` clock-bound kernels and the rest memory- or launch-bound work
that the SM clock does not speed up, so

    time(f) / time(f0) = (1 - CLOCK_BOUND) + CLOCK_BOUND x f0 / f

and a slowdown s needs the clock ratio c = CLOCK_BOUND / (CLOCK_BOUND + s):
clocks 10% low make a rank about 11% slower.
"""

from __future__ import annotations

from dataclasses import dataclass

CLOCK_BOUND = 0.9  # share of a step's compute that scales with the SM clock
HOST_BOUND = 0.3  # share of a step that waits on the rank's CPU threads (launch, input)
THROTTLE_C = 87.0  # a thermal regulator holds the GPU here by lowering its clocks
CLOCK_KINDS = ("clocks", "thermal", "power")


def clock_ratio(slowdown: float) -> float:
    """The SM clock, as a fraction of the healthy clock, that makes compute `slowdown` slower."""
    return CLOCK_BOUND / (CLOCK_BOUND + max(0.0, slowdown))


def slowdown_of_clock(ratio: float) -> float:
    """Extra compute time (fraction) when the SM clock runs at `ratio` of its healthy value."""
    return (1.0 - CLOCK_BOUND) + CLOCK_BOUND / ratio - 1.0


def cpu_share(slowdown: float) -> float:
    """The share of the CPU it needs that a rank's process gets, for a host slowdown:
    its CPU-bound part (`HOST_BOUND` of a step) runs at that share."""
    return HOST_BOUND / (HOST_BOUND + max(0.0, slowdown))


@dataclass(frozen=True)
class FaultState:
    """The physical state of one rank in one window (relative to its healthy self)."""

    clock: float = 1.0  # SM clock ratio
    temp_rise_c: float = 0.0  # above the rank's healthy temperature
    at_thermal_limit: bool = False
    power_capped: bool = False
    pcie_lanes: int = 16
    pcie_gen: int = 5
    cpu_share: float = 1.0  # share of its CPU demand the process gets
    slowdown: float = 0.0  # the compute slowdown that results


def fault_state(kind: str, slowdown: float, level: float, temp_c: float) -> FaultState:
    """What a fault of `kind` and full size `slowdown`, at `level` (0..1, ramp and duty),
    does to a rank whose healthy temperature is `temp_c`."""
    s = slowdown * level
    if s <= 0.0:
        return FaultState()
    if kind == "thermal":
        # Degraded cooling: the die heats to the regulator's limit, which then
        # trades clock for heat. The clock falls until power (and so heat) fits
        # what the cooling removes; the slowdown is that clock's consequence.
        c = clock_ratio(s)
        return FaultState(
            clock=c,
            temp_rise_c=max(0.0, THROTTLE_C - temp_c),
            at_thermal_limit=True,
            slowdown=slowdown_of_clock(c),
        )
    if kind == "power":
        # A lowered power limit: the GPU runs at the limit, and the governor
        # lowers clocks until the draw fits it.
        c = clock_ratio(s)
        return FaultState(clock=c, power_capped=True, slowdown=slowdown_of_clock(c))
    if kind == "clocks":
        # Clocks locked or stuck low, nothing throttling: power and heat fall with them.
        c = clock_ratio(s)
        return FaultState(clock=c, slowdown=slowdown_of_clock(c))
    if kind == "pcie":
        # A link trained below its width or generation: host-device copies slow.
        lanes, gen = (8, 4) if s < 0.1 else (4, 3)
        return FaultState(pcie_lanes=lanes, pcie_gen=gen, slowdown=s)
    if kind == "software":
        # A slower driver, library or setting: the same kernels take longer at the
        # same clocks, nothing in the GPU's or host's readings moves.
        return FaultState(slowdown=s)
    if kind == "host":
        # Other work on the host: the process gets a share of the CPU it needs.
        return FaultState(cpu_share=cpu_share(s), slowdown=s)
    return FaultState(slowdown=s)
