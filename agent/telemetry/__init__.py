"""GPU and host telemetry sources.

Every source implements ``TelemetrySource`` (``name``, ``sample(target)``);
``collect`` merges their partial samples into a ``Telemetry`` with the fields
nobody supplied listed in ``missing``; ``TelemetryAccumulator`` averages the
samples of one window. Hardware libraries (pynvml, amdsmi) are imported only
when a source is first used.

Modules: ``nvml`` (NVIDIA: clocks, power, throttle reasons, PCIe, identity,
XID / ECC / row-remap / NVLink errors), ``amd`` (the same from amdsmi, RAS
counts), ``host`` (/proc: CPU, pressure, load, the rank's process; and the
NICs' port error counters through ``nic``), ``simulated`` (the simulator's
files). Error counts are running totals in the sources and window increases
after ``TelemetryAccumulator`` (``base`` says why).
"""

from artemis.agent.telemetry.amd import AmdSmiSource
from artemis.agent.telemetry.base import (
    ALL_FIELDS,
    RankTarget,
    TelemetryAccumulator,
    TelemetrySource,
    collect,
    merge,
)
from artemis.agent.telemetry.host import HostSource
from artemis.agent.telemetry.nvml import NvmlSource
from artemis.agent.telemetry.simulated import SimulatedSource, sim_telemetry_path

__all__ = [
    "ALL_FIELDS",
    "AmdSmiSource",
    "HostSource",
    "NvmlSource",
    "RankTarget",
    "SimulatedSource",
    "TelemetryAccumulator",
    "TelemetrySource",
    "collect",
    "merge",
    "sim_telemetry_path",
]
