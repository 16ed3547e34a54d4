"""What a simulated run must report, computed from the parsed scenario alone.

The end-to-end tests (tests/test_e2e_scenarios.py, tests/test_e2e_rebalance.py)
run whole simulated clusters and compare what the coordinator wrote against
the expectations here. Nothing in this module reads a run's output to decide
what is expected: every number comes from the scenario (its faults, its job
shape) and from the simulated hardware's own definition (sim/model.py,
sim/telemetry.py: what the simulated GPUs do, not what Artemis concludes).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artemis.sim.model import TRANSFER_FRAC
from artemis.sim.scenario import Fault, Scenario
from artemis.sim.telemetry import fault_fields, telemetry_plan

REPO = Path(__file__).resolve().parents[1]
SIM_SCENARIOS = REPO / "sim" / "scenarios"
SHARED_SCENARIOS = Path(__file__).resolve().parents[2] / "shared" / "scenarios"

# DESIGN.md "Findings": the fixed keys, in order, written out here rather than
# imported from the coordinator so that a change there cannot move the goalposts.
FINDING_KEYS = (
    "kind",
    "state",
    "window",
    "steps",
    "island",
    "rank",
    "ranks",
    "hosts",
    "since",
    "ratio",
    "z",
    "history",
    "drift",
    "excess_ms",
    "loss_pct",
    "confidence",
    "signal",
    "basis",
    "missing",
    "evidence",
    "cause",
    "job",  # the one key added since the seed (docs/DESIGN.md)
)

# DESIGN.md "Rebalance plans": the fields of every plans line, written out for the
# same reason.
PLAN_KEYS = {
    "id",
    "window",
    "rank",
    "finding",
    "speeds",
    "before",
    "after",
    "apply_at_step",
    "status",
    "throughput_before",
    "throughput_after",
    "reason",
}

# DESIGN.md kinds, plus `missing` (ranks that stopped reporting), which DESIGN.md
# documents as the finding of an `agent_down` fault.
FINDING_KINDS = {"rank", "degraded", "island", "link", "collective", "hang", "missing"}
FINDING_STATES = {"suspect", "flagged", "ongoing", "cleared"}
CAUSE_KINDS = {"thermal", "power", "clocks", "pcie", "host", "unknown"}

# DESIGN.md "Scenario files": the faults that slow one rank's compute.
COMPUTE_FAULTS = ("clocks", "thermal", "power", "pcie", "host")
# DESIGN.md / DETECTOR.md: an island (or class) with fewer ranks than this judges
# its ranks by their own history (kind "degraded").
MIN_PEERS = 3
# "within 3 windows of the fault's start"
FLAG_WITHIN = 3
# The ring fields a hang dump must carry (DESIGN.md "Ring").
DUMP_FIELDS = ("comm", "rank", "seq", "func", "bytes", "start_ns", "end_ns", "clock", "state")
DUMP_RECORDS = 256  # "the last 256 collectives per rank"
# A process "near 100% of a core": the simulated base reading of every rank.
# rebalance/README.md default bound on a rank's share: +-25% of the uniform split.
DEFAULT_MAX_SHIFT_FRAC = 0.25


def scenario_files(*, rebalance: bool = False) -> list[Path]:
    """Every scenario of /work/shared/scenarios and sim/scenarios, deduplicated by name.

    rebalance=False leaves out rebalance*.toml (tests/test_e2e_rebalance.py runs those);
    clock_*.toml are left out either way (tests/test_clock_scenarios.py runs those)."""
    found: dict[str, Path] = {}
    for folder in (SHARED_SCENARIOS, SIM_SCENARIOS):
        if folder.is_dir():
            for p in sorted(folder.glob("*.toml")):
                found.setdefault(p.name, p)
    return [
        p
        for name, p in sorted(found.items())
        if name.startswith("rebalance") == rebalance and not name.startswith("clock_")
    ]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------- rank faults
def hardware_classes_on(sc: Scenario) -> bool:
    v = sc.detector.get("hardware_classes", "auto")
    return v not in (False, "off")


def comparison_group(sc: Scenario, rank: int) -> list[int]:
    """The ranks `rank` is compared with: its island, narrowed to its hardware class
    when classes differ within the island and the scenario does not turn classes off."""
    island = [r for r in range(sc.ranks) if sc.islands[r] == sc.islands[rank]]
    if sc.classes is None or not hardware_classes_on(sc):
        return island
    classes = sc.classes
    if len({classes[r] for r in island}) < 2:
        return island
    return [r for r in island if classes[r] == classes[rank]]


def rank_finding_kind(sc: Scenario, rank: int) -> str:
    return "rank" if len(comparison_group(sc, rank)) >= MIN_PEERS else "degraded"


def rank_reading(sc: Scenario, fault: Fault, rank: int) -> dict[str, Any]:
    """The simulated telemetry of `rank` while `fault` is active (sim/telemetry.py)."""
    base = telemetry_plan(sc)[rank]["base"]
    return {**base, **fault_fields(fault.kind, fault.slowdown, base)}


def accepted_causes(sc: Scenario, fault: Fault, rank: int) -> tuple[set[str], list[str]]:
    """(cause kinds accepted, words an `unknown` cause's text must contain).

    Every simulated fault shows exactly the telemetry of its own cause
    (sim/telemetry.py), so the diagnosis must name the fault's kind.
    """
    return {fault.kind}, []


# ---------------------------------------------------------------- what counts as injected
def host_ranks(sc: Scenario, rank: int) -> list[int]:
    h = rank // sc.ranks_per_host
    return [r for r in range(sc.ranks) if r // sc.ranks_per_host == h]


def host_name(sc: Scenario, rank: int) -> str:
    return sc.host_name(rank // sc.ranks_per_host)


def about_injected(f: dict[str, Any], sc: Scenario) -> bool:
    """Whether a finding is about something the scenario broke."""
    for fault in sc.faults:
        if fault.kind in COMPUTE_FAULTS:
            if f["kind"] in ("rank", "degraded") and f["rank"] in fault.ranks:
                return True
        elif fault.kind in ("island", "collective"):
            if f["kind"] == fault.kind and f["island"] == fault.island:
                return True
        elif fault.kind == "link":
            if f["kind"] == "link":
                return True
        elif fault.kind == "hang":
            if f["kind"] == "hang" and set(f["ranks"]) <= set(fault.ranks):
                return True
        elif fault.kind == "agent_down":
            gone = {r for x in fault.ranks for r in host_ranks(sc, x)}
            if f["kind"] == "missing" and set(f["ranks"]) <= gone:
                return True
    return False


# ---------------------------------------------------------------- hangs
def collectives_per_step(sc: Scenario) -> int:
    """Collectives per step on an island's communicator: the step's collectives,
    plus the broadcast after the bridge exchange when the job has 2+ islands."""
    return sc.collectives_per_step + (1 if len(set(sc.islands)) > 1 else 0)


def completed_before_hang(sc: Scenario, fault: Fault) -> int:
    """Collectives the hanging rank completed: every step of the windows before the hang."""
    return fault.start_window * sc.window_steps * collectives_per_step(sc)


DUMP_NAME = re.compile(r"-r(\d+)-[^/]*\.jsonl$")


def dump_rank(path: str) -> int | None:
    """The job-wide rank a dump file belongs to (`<job>-r<rank>-<comm>.jsonl`)."""
    m = DUMP_NAME.search(path)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------- throughput
@dataclass(frozen=True)
class Throughput:
    healthy: float  # samples/s with every rank healthy
    faulted: float  # samples/s while the fault slows its rank, uniform split
    lost: float


def lockstep_throughput(sc: Scenario, slowdown: float) -> Throughput:
    """Samples/s of a single-island lockstep job, from the simulated hardware's definition.

    A step is the compute of the slowest rank (every collective waits for the last
    arrival) plus the transfer inside the collectives, TRANSFER_FRAC of a healthy
    step (sim/model.py). Healthy: step_ms x (1 + TRANSFER_FRAC). One rank slowed by
    s: step_ms x (1 + s) + step_ms x TRANSFER_FRAC. Per-step noise is ignored: it
    makes the real healthy step a little longer (the max of noisy ranks), so this
    estimate of the loss is slightly high, which only makes the tests stricter.
    """
    healthy_ms = sc.step_ms * (1.0 + TRANSFER_FRAC)
    faulted_ms = sc.step_ms * (1.0 + slowdown) + sc.step_ms * TRANSFER_FRAC
    healthy = sc.global_batch / healthy_ms * 1000.0
    faulted = sc.global_batch / faulted_ms * 1000.0
    return Throughput(healthy, faulted, healthy - faulted)
