"""A simulated cluster (real plugin, agents, coordinator over loopback TCP) plays its
scenario's [software]: the ranks of host 1 get [software.hosts.1]'s driver, NCCL and
env; the fingerprints travel as the agents' `fingerprint` messages and the job's
fingerprint lands in the store's job info at its end, the secret-named variable
nowhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from artemis.store import open_for_findings
from sim_cli import artemis_sim

pytestmark = pytest.mark.slow

SCENARIO = """
[job]
ranks = 4
ranks_per_host = 2
step_ms = 20.0
collectives_per_step = 3
window_steps = 10
windows = 6
seed = 3

[software]
driver = "550.54.15"
nccl = "2.21.5"
torch = "2.5.1"
env = { NCCL_ALGO = "Ring", NCCL_FP_API_KEY = "s3cret" }

[software.hosts.1]
driver = "560.28.03"
nccl = "2.23.4"
env = { NCCL_ALGO = "Tree" }
"""


def test_host_overrides_reach_the_coordinator(tmp_path: Path) -> None:
    scen = tmp_path / "fp.toml"
    scen.write_text(SCENARIO)
    findings = tmp_path / "findings.jsonl"
    artemis_sim(scen, findings)
    with open_for_findings(findings) as store:
        (job,) = store.jobs()
    fp = job["fingerprint"]
    sw = fp["software"]
    assert sw["driver"] == ["550.54.15", "560.28.03"]  # host 0's ranks, host 1's ranks
    assert sw["nccl"] == ["2.21.5", "2.23.4"]  # through ncclGetVersion of the stand-in
    assert sw["env"]["NCCL_ALGO"] == ["Ring", "Tree"]  # through the plugin's env sidecar
    assert "NCCL_FP_API_KEY" not in sw["env"]
    assert sw["torch"] == "2.5.1" and sw["cuda"] == "12.4"  # the default where not named
    assert sw["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert fp["nranks"] == 4 and fp["hardware"] == ["NVIDIA H100 80GB HBM3"]
    assert isinstance(fp["workload"], str) and len(fp["workload"]) == 32
    assert "s3cret" not in findings.with_suffix(".jsonl").read_text()
