"""GPU and host telemetry sources.

Every source implements ``TelemetrySource`` (``name``, ``sample(target)``);
``collect`` merges their partial samples into a ``Telemetry`` with the fields
nobody supplied listed in ``missing``; ``TelemetryAccumulator`` averages the
samples of one window. Hardware libraries (pynvml, amdsmi) are imported only
when a source is first used.
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
