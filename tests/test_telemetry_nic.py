"""NIC port error counters read from a fixture sysfs tree (the kernel's layout)."""

from __future__ import annotations

from pathlib import Path

from artemis.agent.telemetry import HostSource, RankTarget, TelemetryAccumulator, collect
from artemis.agent.telemetry.nic import NIC_COUNTERS, NicCounters, read_port_counters

T = RankTarget(rank=0)


def port(root: Path, dev: str, num: int, **counters: int | str) -> Path:
    d = root / f"sys/class/infiniband/{dev}/ports/{num}/counters"
    d.mkdir(parents=True, exist_ok=True)
    # the files a real port has beside ours, which must be ignored
    (d / "port_rcv_data").write_text("123456789\n")
    for name, v in counters.items():
        (d / name).write_text(f"{v}\n")
    return d


def healthy(root: Path) -> None:
    port(root, "mlx5_0", 1, symbol_error=0, link_downed=1, port_rcv_errors=0, port_xmit_wait=900)
    port(root, "mlx5_1", 1, symbol_error=7, link_downed=0, port_rcv_errors=2, port_xmit_wait=0)


def test_reads_every_port_of_every_device(tmp_path: Path) -> None:
    healthy(tmp_path)
    got = read_port_counters(tmp_path)
    assert set(got) == {("mlx5_0", "1"), ("mlx5_1", "1")}
    assert got[("mlx5_1", "1")] == {
        "nic_symbol_errors": 7,
        "nic_link_downed": 0,
        "nic_rcv_errors": 2,
        "nic_xmit_wait": 0,
    }
    assert set(NIC_COUNTERS.values()) == {
        "symbol_error",
        "link_downed",
        "port_rcv_errors",
        "port_xmit_wait",
    }
    assert read_port_counters(tmp_path, devices=["mlx5_0"]).keys() == {("mlx5_0", "1")}


def test_unreadable_files_are_skipped(tmp_path: Path) -> None:
    d = port(tmp_path, "rxe0", 1, symbol_error="garbage", port_xmit_wait=5)
    (d / "link_downed").mkdir()  # read fails like a driver answering EINVAL
    assert read_port_counters(tmp_path) == {("rxe0", "1"): {"nic_xmit_wait": 5}}


def test_running_totals_over_ports_with_a_cleared_counter(tmp_path: Path) -> None:
    healthy(tmp_path)
    nic = NicCounters(tmp_path)
    assert nic.sample() == {
        "nic_symbol_errors": 0,
        "nic_link_downed": 0,
        "nic_rcv_errors": 0,
        "nic_xmit_wait": 0,
    }
    port(tmp_path, "mlx5_0", 1, symbol_error=40, port_xmit_wait=1900)
    port(tmp_path, "mlx5_1", 1, symbol_error=9, link_downed=1)
    got = nic.sample()
    assert (got["nic_symbol_errors"], got["nic_link_downed"], got["nic_xmit_wait"]) == (42, 1, 1000)
    port(tmp_path, "mlx5_0", 1, symbol_error=3)  # perfquery -R cleared it: 3 new since
    assert nic.sample()["nic_symbol_errors"] == 45
    port(tmp_path, "mlx5_2", 1, symbol_error=500)  # a port seen late starts at its first read
    assert nic.sample()["nic_symbol_errors"] == 45


def test_no_rdma_ports_means_missing_not_zero(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    t = collect([HostSource(tmp_path)], T)
    assert set(NIC_COUNTERS) <= set(t.missing)
    assert t.nic_symbol_errors is None


def test_host_source_windows_get_the_increase(tmp_path: Path) -> None:
    healthy(tmp_path)
    src = HostSource(tmp_path)
    acc = TelemetryAccumulator()
    acc.add(collect([src], T))  # primes
    port(tmp_path, "mlx5_1", 1, symbol_error=19, port_rcv_errors=5)
    acc.add(collect([src], T))
    port(tmp_path, "mlx5_1", 1, symbol_error=20)
    acc.add(collect([src], T))
    t = acc.result()
    assert (t.nic_symbol_errors, t.nic_rcv_errors, t.nic_link_downed, t.nic_xmit_wait) == (
        13,
        3,
        0,
        0,
    )
