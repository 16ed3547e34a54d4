"""Diagnosis rules, one table row per rule and per ambiguous case."""

from __future__ import annotations

from dataclasses import replace

import pytest
from artemis.detect.diagnosis import DIAG_FIELDS, diagnose, nic_evidence, pcie_degraded
from artemis.protocol.records import Telemetry

# A healthy GPU on a quiet host: every field present.
HEALTHY = Telemetry(
    vendor="nvidia",
    sm_mhz=1530,
    sm_mhz_max=1980,
    temp_c=62,
    power_w=350,
    power_limit_w=700,
    throttle={},
    pcie_gen=5,
    pcie_gen_max=5,
    pcie_width=16,
    pcie_width_max=16,
    cpu_pct=40,
    steal_pct=0,
    iowait_pct=0,
    psi_cpu_some=1,
    load1=20,
    ncpu=64,
    proc_cpu_pct=60,
)
PEERS = [replace(HEALTHY, temp_c=t) for t in (60, 62, 64)]


def sick(**kw: object) -> Telemetry:
    return replace(HEALTHY, **kw)


CASES = [
    ("clocks: low, no reason", sick(sm_mhz=1110), "clocks", "no throttle reason"),
    (
        "clocks: locked via apps clocks",
        sick(sm_mhz=1110, throttle={"apps_clocks": True}),
        "clocks",
        "locked",
    ),
    (
        "thermal: reason active",
        sick(sm_mhz=1200, temp_c=88, throttle={"hw_thermal": True}),
        "thermal",
        "hw_thermal",
    ),
    ("thermal: hot vs peers, clocks low", sick(sm_mhz=1200, temp_c=80), "thermal", "hot"),
    (
        "power: cap reason",
        sick(sm_mhz=1250, throttle={"sw_power_cap": True}),
        "power",
        "sw_power_cap",
    ),
    ("power: at the limit, clocks low", sick(sm_mhz=1250, power_w=690), "power", "power limit"),
    ("pcie: narrow link", sick(pcie_width=8), "pcie", "50%"),
    ("pcie: lower generation", sick(pcie_gen=4), "pcie", "PCIe"),
    ("host: steal", sick(steal_pct=12), "host", "steal"),
    ("host: pressure", sick(psi_cpu_some=45), "host", "pressure"),
    ("host: load per cpu", sick(load1=150), "host", "load"),
    ("host: busy vs peers", sick(cpu_pct=80), "host", "vs 40%"),
    ("host: process starved vs its peers", sick(proc_cpu_pct=30), "host", "vs 60% on its peers"),
    ("a process at a full core is normal", sick(proc_cpu_pct=100), "unknown", "nothing"),
    ("nothing fits", HEALTHY, "unknown", "nothing in the telemetry"),
    # Two causes at once: both named, the first as kind, the other as an alternative
    # (test_two_causes_are_both_named).
    (
        "throttle reason without low clocks",
        sick(throttle={"hw_thermal": True}),
        "unknown",
        "contradictory",
    ),
    (
        "clocks low and an unmapped reason",
        sick(sm_mhz=1100, throttle={"hw_slowdown": True}),
        "unknown",
        "hw_slowdown",
    ),
    ("all telemetry missing", Telemetry(), "unknown", "no telemetry"),
    (
        "clocks low, nothing to say why",
        Telemetry(sm_mhz=1100),
        "unknown",
        "no throttle, temperature or power",
    ),
]


@pytest.mark.parametrize(("name", "tel", "kind", "words"), CASES, ids=[c[0] for c in CASES])
def test_rules(name: str, tel: Telemetry, kind: str, words: str) -> None:
    c = diagnose(tel, PEERS)
    assert c.kind == kind, c.text
    assert words in c.text


def test_evidence_has_the_design_shape() -> None:
    c = diagnose(sick(sm_mhz=1110, temp_c=61, power_w=336), PEERS)
    assert c.kind == "clocks"
    assert c.evidence == {
        "sm_mhz": 1110,
        "peers_sm_mhz": 1530,
        "temp_c": 61,
        "peers_temp_c": 62,
        "power_frac": pytest.approx(336 / 700, abs=1e-3),
        "throttle": {},
        "pcie_degraded": 0.0,
    }
    assert c.to_json() == {
        "kind": "clocks",
        "text": c.text,
        "evidence": c.evidence,
        "explained": None,  # no measured slowdown given: the seed's cut-off, no fit
        "alternatives": [],
    }
    assert "SM 1110 MHz vs 1530 MHz" in c.text


def test_host_evidence_added_when_host_is_the_cause() -> None:
    c = diagnose(sick(steal_pct=12), PEERS)
    assert c.evidence["steal_pct"] == 12 and c.evidence["peers_cpu_pct"] == 40
    assert c.evidence["load_per_cpu"] == pytest.approx(20 / 64, abs=0.01)


def test_missing_is_listed_never_guessed() -> None:
    tel = Telemetry(sm_mhz=1530, temp_c=60, missing=("power_w",))
    c = diagnose(tel, PEERS)
    expected = sorted(set(DIAG_FIELDS) - {"sm_mhz", "temp_c"})
    assert c.missing == expected
    assert c.evidence["power_frac"] is None and c.evidence["pcie_degraded"] is None
    assert all(f not in c.missing for f in ("sm_mhz", "temp_c"))


def test_throttle_reason_counts_when_clocks_are_not_reported() -> None:
    c = diagnose(Telemetry(throttle={"sw_thermal": True}), [])
    assert c.kind == "thermal"
    assert "could not be compared" in c.text
    assert "sm_mhz" in c.missing


def test_without_peers_the_gpu_max_clock_is_the_reference() -> None:
    c = diagnose(sick(sm_mhz=1500, sm_mhz_max=1980, temp_c=90, throttle={}), [])
    # 1500 < 0.9 x 1980 and 90 C >= the absolute hot mark: thermal.
    assert c.kind == "thermal" and "its max" in c.text


def test_pcie_fraction_lost() -> None:
    assert pcie_degraded(sick(pcie_width=8)) == 0.5
    # Gen 3 -> gen 4 is not a plain halving: 128b/130b on both, ~half.
    lost = pcie_degraded(sick(pcie_gen=3, pcie_gen_max=4))
    assert lost == pytest.approx(1 - 0.985 / 1.969, abs=1e-4)
    assert pcie_degraded(Telemetry()) is None


# ---------------------------------------------------------------- hardware errors

HW_PEERS = [replace(p, xid_count=0, ecc_uncorrected=0, nvlink_errors=0) for p in PEERS]
GPU_ID = {"gpu_uuid": "GPU-6f1d", "gpu_serial": "1654123456789", "gpu_pci_bus": "00000000:18:00.0"}


def test_hardware_errors_on_the_rank_only() -> None:
    tel = sick(xid_count=3, xid_last=79, ecc_corrected=12, **GPU_ID)
    c = diagnose(tel, HW_PEERS)
    assert c.kind == "hardware", c.text
    assert "3 XID event(s), last XID 79" in c.text and "1654123456789" in c.text
    assert "00000000:18:00.0" in c.text
    hw = c.evidence["hardware"]
    assert (hw["xid_count"], hw["xid_last"], hw["ecc_corrected"]) == (3, 79, 12)
    assert hw["gpu_uuid"] == "GPU-6f1d" and hw["peers"]["xid_count"] == 0
    assert c.to_json()["evidence"]["hardware"] == hw


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"ecc_uncorrected": 1}, "1 uncorrected ECC error(s)"),
        ({"nvlink_errors": 40}, "40 NVLink error(s)"),
        ({"remap_failed": 1, "remapped_rows": 512}, "needs service"),
        ({"remap_pending": 1}, "waits for a GPU reset"),
    ],
)
def test_each_hardware_signal(fields: dict[str, int], words: str) -> None:
    c = diagnose(sick(**fields), HW_PEERS)
    assert c.kind == "hardware" and words in c.text


def test_peers_without_hardware_fields_do_not_hide_a_rise() -> None:
    assert diagnose(sick(xid_count=1), PEERS).kind == "hardware"  # peers report nothing


def test_a_rise_on_the_peers_too_is_not_this_gpus_fault() -> None:
    peers = [replace(p, xid_count=1) for p in HW_PEERS]
    c = diagnose(sick(xid_count=1, xid_last=13), peers)
    assert c.kind == "unknown" and "nothing in the telemetry" in c.text
    assert c.evidence["hardware"]["peers"]["xid_count"] == 1  # still shown


def test_corrected_ecc_alone_is_evidence_not_a_cause() -> None:
    c = diagnose(sick(ecc_corrected=5, xid_count=0), HW_PEERS)
    assert c.kind == "unknown" and "hardware" not in c.evidence


def test_hardware_explains_low_clocks_without_a_reason() -> None:
    c = diagnose(sick(sm_mhz=1110, xid_count=2, xid_last=48), HW_PEERS)
    assert c.kind == "hardware", c.text  # not `clocks`: the error is the reason


def test_hardware_and_thermal_at_once_are_both_named() -> None:
    c = diagnose(sick(sm_mhz=1200, throttle={"hw_thermal": True}, nvlink_errors=9), HW_PEERS)
    assert {c.kind, *(a["kind"] for a in c.alternatives)} == {"thermal", "hardware"}
    # with the slowdown measured, the clock's full fit ranks above the qualitative one
    c = diagnose(
        sick(sm_mhz=1200, throttle={"hw_thermal": True}, nvlink_errors=9), HW_PEERS, slowdown=0.2
    )
    assert c.kind == "thermal" and c.alternatives[0]["kind"] == "hardware"


def test_nic_evidence_counts_each_host_once() -> None:
    a = Telemetry(nic_symbol_errors=40, nic_link_downed=1, nic_rcv_errors=0, nic_xmit_wait=10)
    a2 = replace(a, nic_symbol_errors=41)  # a second rank of host a, sampled a moment later
    b = Telemetry(nic_symbol_errors=0, nic_link_downed=0, nic_rcv_errors=0, nic_xmit_wait=0)
    ev = nic_evidence([("a", a), ("a", a2), ("b", b), ("c", Telemetry())])
    assert ev == {
        "nic_symbol_errors": 41,
        "nic_link_downed": 1,
        "nic_rcv_errors": 0,
        "nic_xmit_wait": 10,
        "nic_hosts": {"a": {"nic_symbol_errors": 41, "nic_link_downed": 1, "nic_xmit_wait": 10}},
    }
    assert nic_evidence([("c", Telemetry())]) == {}


# ------------------------------------------------------------ diagnosis by consistency


def test_two_causes_are_both_named() -> None:
    c = diagnose(sick(sm_mhz=1100, throttle={"hw_thermal": True, "sw_power_cap": True}), PEERS)
    assert c.kind == "thermal" and [a["kind"] for a in c.alternatives] == ["power"]
    c = diagnose(sick(pcie_width=8, steal_pct=20), PEERS)
    assert {c.kind, *(a["kind"] for a in c.alternatives)} == {"pcie", "host"}
    assert c.explained is None  # qualitative fits have no quantitative share
    assert "absent on its peers" in c.text


def test_clocks_10_percent_low_explain_an_11_percent_slower_rank() -> None:
    """Whatever the fixed cut-off: 10% low clocks explain 11% slower (0.9 x (1/0.9 - 1) = 10%)."""
    ref = 1530.0
    c = diagnose(sick(sm_mhz=0.9 * ref, temp_c=60, power_w=300), PEERS, slowdown=0.11)
    assert c.kind == "clocks" and c.explained == pytest.approx(0.909, abs=0.01)
    assert "explains 91%" in c.text
    # 5% slower, clocks 5% low: explained fully, though far above CLOCK_LOW_FRAC
    c = diagnose(sick(sm_mhz=0.95 * ref, temp_c=60, power_w=300), PEERS, slowdown=0.05)
    assert c.kind == "clocks" and c.explained == pytest.approx(0.95, abs=0.02)
    # the same seed cut-off without a measured slowdown: 5% low clocks are normal
    assert diagnose(sick(sm_mhz=0.95 * ref, temp_c=60, power_w=300), PEERS).kind == "unknown"


def test_a_clock_deficit_that_explains_too_little_is_not_the_cause() -> None:
    ref = 1530.0
    # clocks 3% low cannot explain a 20% slowdown (they explain 14%)
    c = diagnose(sick(sm_mhz=0.97 * ref, temp_c=60, power_w=300), PEERS, slowdown=0.2)
    assert c.kind == "unknown"
    assert "the clock explains 14%" in c.text and "checked:" in c.text
    # boost wander (1.5% low) explains nothing, even for a small slowdown
    c = diagnose(sick(sm_mhz=0.985 * ref, temp_c=60, power_w=300), PEERS, slowdown=0.012)
    assert c.kind == "unknown"


def test_thermal_ranks_above_host_when_it_explains_the_slowdown() -> None:
    ref = 1530.0
    c = diagnose(
        sick(sm_mhz=0.9 * ref, throttle={"sw_thermal": True}, steal_pct=20), PEERS, slowdown=0.1
    )
    assert c.kind == "thermal" and c.explained == pytest.approx(1.0)
    assert [a["kind"] for a in c.alternatives] == ["host"]


def test_host_signal_on_every_peer_is_not_this_ranks() -> None:
    busy = [replace(p, steal_pct=20.0) for p in PEERS]
    assert diagnose(sick(steal_pct=20), busy, slowdown=0.1).kind == "unknown"
    assert diagnose(sick(steal_pct=20), PEERS, slowdown=0.1).kind == "host"


@pytest.mark.parametrize("field", sorted(DIAG_FIELDS))
def test_each_missing_field_is_listed_never_guessed(field: str) -> None:
    """Partial telemetry: with any one field absent, it is in `missing` and the
    cause is one the remaining evidence supports (or unknown), never invented."""
    ref = 1530.0
    full = sick(sm_mhz=0.9 * ref, throttle={"sw_thermal": True}, temp_c=88)
    partial = replace(full, **{field: None})
    c = diagnose(partial, PEERS, slowdown=0.1)
    assert field in c.missing
    if field == "sm_mhz":
        # the clock cannot be compared: the throttle reason alone is accepted, and says so
        assert c.kind == "thermal" and "could not be compared" in c.text
    elif field in ("throttle", "temp_c"):
        assert c.kind in ("thermal", "unknown", "clocks")
    else:
        assert c.kind == "thermal"
    healthy = replace(HEALTHY, **{field: None})
    assert diagnose(healthy, PEERS, slowdown=0.1).kind == "unknown"
