"""`artemis-coordinator set` / `settings` against a running coordinator, and bad config."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from daemon_harness import BIN, Coordinator, write_secret

pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "artemis-coordinator"), *args], capture_output=True, text=True, timeout=60
    )


def test_settings_change_while_running(tmp_path: Path) -> None:
    c = Coordinator(tmp_path, write_secret(tmp_path / "secret")).start()
    sock = str(tmp_path / "coordinator.sock")
    try:
        before = _cli("settings", "--socket", sock)
        assert before.returncode == 0 and "suspect_ratio = 1.1" in before.stdout
        r = _cli("set", "suspect_ratio", "1.25", "--socket", sock)
        assert r.returncode == 0 and r.stdout.strip() == "suspect_ratio = 1.25", r.stderr
        r = _cli("set", "rebalance", "apply", "--socket", sock)
        assert r.returncode == 0 and r.stdout.strip() == "rebalance = apply", r.stderr
        after = _cli("settings", "--socket", sock).stdout
        assert "suspect_ratio = 1.25" in after and 'rebalance = "apply"' in after
        # A bad key or value is refused with a message naming it; nothing changes.
        bad = _cli("set", "suspect_ratios", "2", "--socket", sock)
        assert bad.returncode == 1 and "suspect_ratios" in bad.stderr
        bad = _cli("set", "flag_after", "nine", "--socket", sock)
        assert bad.returncode == 1 and "flag_after" in bad.stderr
        assert _cli("settings", "--socket", sock).stdout == after
        assert c.daemon is not None and c.daemon.alive()
    finally:
        assert c.daemon is not None
        assert c.daemon.stop() == 0  # SIGTERM: flushes and exits cleanly


def test_set_without_a_coordinator_says_so(tmp_path: Path) -> None:
    r = _cli("set", "suspect_ratio", "1.2", "--socket", str(tmp_path / "none.sock"))
    assert r.returncode == 2 and "cannot reach the coordinator" in r.stderr


def test_bad_config_names_the_file_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('listen = "127.0.0.1:0"\nmetrics_prot = 9\n')
    r = _cli("serve", "--config", str(cfg))
    assert r.returncode == 2 and "c.toml" in r.stderr and "metrics_prot" in r.stderr
    cfg.write_text("[detector]\nsuspect_ratio = 0.5\n")
    r = _cli("serve", "--config", str(cfg), "--secret-file", str(write_secret(tmp_path / "s")))
    assert r.returncode == 2 and "suspect_ratio" in r.stderr


def test_secret_file_too_open_is_refused(tmp_path: Path) -> None:
    s = write_secret(tmp_path / "secret")
    s.chmod(0o644)
    r = _cli(
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--metrics-port",
        "0",
        "--secret-file",
        str(s),
        "--jsonl",
        str(tmp_path / "f.jsonl"),
        "--plans-jsonl",
        str(tmp_path / "p.jsonl"),
        "--control-socket",
        str(tmp_path / "c.sock"),
    )
    assert r.returncode == 2 and "0644" in r.stderr and "0600" in r.stderr
