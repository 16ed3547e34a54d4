"""NvmlSource on a real NVIDIA GPU: skipped unless pynvml imports and a GPU is present.

tests/gpu/run.sh installs pynvml (nvidia-ml-py) from tests/gpu/wheels where
the lent machine lacks it, so there these checks run rather than skip.
"""

from __future__ import annotations

import os
import re

import pytest
from artemis.agent.telemetry import NvmlSource, RankTarget, collect
from artemis.protocol.records import THROTTLE_REASONS

pytestmark = pytest.mark.gpu

pynvml = pytest.importorskip("pynvml", reason="pynvml (nvidia-ml-py) is not installed")


@pytest.fixture(scope="module")
def source() -> NvmlSource:
    src = NvmlSource()
    ok, reason = src.available()
    if not ok:
        pytest.skip(f"no usable NVIDIA GPU: {reason}")
    return src


def test_real_values_are_in_range(source: NvmlSource) -> None:
    got = source.sample(RankTarget(rank=0, gpu_index=0))
    assert got["vendor"] == "nvidia" and got["gpu_index"] == 0
    assert isinstance(got["gpu_model"], str) and got["gpu_model"]
    sm, sm_max = float(got["sm_mhz"]), float(got["sm_mhz_max"])
    assert 0 < sm <= sm_max < 5000
    assert 0 < float(got["mem_mhz"]) < 20000
    assert 0 < float(got["temp_c"]) < 120
    if "power_w" in got:
        assert 0 < float(got["power_w"]) < 2000
        assert 0 < float(got["power_limit_w"]) < 2000
    throttle = got["throttle"]
    assert isinstance(throttle, dict) and set(throttle) <= set(THROTTLE_REASONS)
    if "pcie_gen" in got:
        assert 1 <= int(got["pcie_gen"]) <= int(got["pcie_gen_max"]) <= 6
        assert 1 <= int(got["pcie_width"]) <= int(got["pcie_width_max"]) <= 32


def test_collect_with_real_nvml(source: NvmlSource) -> None:
    t = collect([source], RankTarget(rank=0, gpu_index=0))
    assert t.sm_mhz is not None and "sm_mhz" not in t.missing
    assert "cpu_pct" in t.missing  # no host source given


def test_own_process_maps_to_a_gpu_when_it_holds_a_context(source: NvmlSource) -> None:
    # a process without a CUDA context is not in NVML's process list: the
    # mapping then falls back to the environment, which may say nothing
    idx = source.gpu_index(RankTarget(rank=0, pid=os.getpid()))
    assert idx is None or idx >= 0


def test_identity_and_error_counters_on_a_real_gpu(source: NvmlSource) -> None:
    got = source.sample(RankTarget(rank=0, gpu_index=0))
    assert re.fullmatch(r"GPU-[0-9a-f-]{36}", str(got["gpu_uuid"])), got["gpu_uuid"]
    assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.0", str(got["gpu_pci_bus"]))
    if "gpu_serial" in got:  # data-center boards have one
        assert str(got["gpu_serial"]).strip()
    # data-center GPUs (the H200 lent here) have ECC on and remap rows
    for k in ("ecc_corrected", "ecc_uncorrected", "remapped_rows", "remap_pending", "remap_failed"):
        if k in got:
            assert isinstance(got[k], int) and got[k] >= 0, (k, got[k])
    assert "ecc_corrected" in got and "remapped_rows" in got, sorted(got)
    # XID events: the set is drained without blocking; a healthy GPU has none
    assert isinstance(got.get("xid_count"), int), "XID events could not be registered"
    if "nvlink_errors" in got:
        assert isinstance(got["nvlink_errors"], int) and got["nvlink_errors"] >= 0


def test_a_second_sample_keeps_running_totals(source: NvmlSource) -> None:
    a = source.sample(RankTarget(rank=0, gpu_index=0))
    b = source.sample(RankTarget(rank=0, gpu_index=0))
    for k in ("xid_count", "ecc_corrected", "ecc_uncorrected", "nvlink_errors"):
        if k in a:
            assert int(b[k]) >= int(a[k])  # totals never go down
