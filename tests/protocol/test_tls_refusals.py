"""Failed TLS handshakes against the real coordinator, counted by reason, while a real
agent on mutual TLS is scored (docs/RELIABILITY.md "5. Hostile peers").

`artemis-coordinator serve` with `[tls]` (its certificate, and a CA its agents'
certificates must be signed by) and `artemis-agent run` with its own certificate
run as subprocesses; a lockstep job (tests/daemon_harness.py) writes the agent's
rings, a window every ~0.25 s. A separate process (tests/hostile_peer.py tls) then
fails handshakes of every kind at once: without a client certificate, with one of
another CA, an agent's hello in plain TCP, an HTTP request, garbage, and peers
that connect and send nothing. Checked: each counted under its own reason, exactly;
none got past the handshake; the refusals logged at a bounded rate; the agent's
windows scored through it, none late, its connection never lost.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import hostile_peer
import pytest
from artemis.protocol.peers import REFUSAL_REASONS
from artemis.protocol.server import LOG_REFUSALS_PER_S
from artemis.protocol.transport import TLS_REASONS
from daemon_harness import metric, metric_by_label, scored_paced_job, wait_for, windows_scored
from test_protocol_peers import Pki

pytestmark = pytest.mark.slow

HOSTILE = Path(__file__).resolve().parents[1] / "hostile_peer.py"
W_STEPS = 10
# TLS + hello + auth: the silent peers are cut off here. 6 s, not 3: in a fresh-clone
# `make test` (2 workers beside the daemons) one of 120 non-TLS peers was counted as
# `tls_timeout`, not `tls_not_tls`: its bytes were not read within a 3-s limit on the
# busy machine, which is the load's doing, not what the test asks about
HANDSHAKE_S = 6.0
N = 40  # failed handshakes of each kind
SILENT = 8


def _stamp(rec: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(str(rec["timestamp"]).rstrip("Z")).timestamp()


def test_failed_tls_handshakes_are_counted_by_reason_while_the_agent_is_scored(
    tmp_path: Path, plugin_lib: Path
) -> None:
    (tmp_path / "pki").mkdir()
    (tmp_path / "other").mkdir()
    pki = Pki(tmp_path / "pki")
    cert, key = pki.issue("h0", "/CN=h0", "subjectAltName=URI:artemis://agent/h0")
    other = Pki(tmp_path / "other")
    rogue = pki.issue("rogue", "/CN=h0", ca=(other.ca, other.ca_key))
    tables = {
        "tls": {"cert": str(pki.server[0]), "key": str(pki.server[1]), "ca": str(pki.ca)},
        "limits": {"handshake_timeout_s": HANDSHAKE_S},
    }
    tls = [f"{k} = {json.dumps(str(v))}" for k, v in [("ca", pki.ca), ("cert", cert), ("key", key)]]
    with scored_paced_job(
        tmp_path, plugin_lib, tables, window_steps=W_STEPS, agent_extra=["[tls]", *tls]
    ) as coord:
        s0 = windows_scored(coord)
        ca = ["--ca", str(pki.ca), "--cert", str(rogue[0]), "--key", str(rogue[1])]
        flood = hostile_peer.spawn(
            coord.address,
            "tls",
            "--kinds",
            "nocert,badca,plain,http,garbage",
            "--count",
            str(N),
            "--sources",
            "8",
            "--base",
            "60",
            *ca,
        )
        silent = hostile_peer.spawn(
            coord.address, "tls", "--kinds", "silent", "--count", str(SILENT), "--base", "61", *ca
        )
        r_flood, r_silent = hostile_peer.result(flood), hostile_peer.result(silent)
        wait_for(lambda: windows_scored(coord) >= s0 + 4, 30, "windows scored after the attack")
        samples = coord.samples()

    refused = metric_by_label(samples, "straggler_protocol_refused_peers_total", "reason")
    print(json.dumps({"refused": refused, "flood": r_flood, "silent": r_silent}))
    assert set(TLS_REASONS) <= set(REFUSAL_REASONS) <= set(refused)  # exported, at 0 too
    # Every connection was closed by the coordinator, none got past the handshake...
    assert r_flood["closed"] == dict.fromkeys(["nocert", "badca", "plain", "http", "garbage"], N)
    assert r_silent["closed"] == {"silent": SILENT}
    assert not any(r_flood["through"].values()), r_flood
    # ... and each was counted under its own reason, exactly; nothing else was refused.
    assert {k: v for k, v in refused.items() if v} == {
        "tls_no_cert": N,
        "tls_bad_cert": N,
        "tls_not_tls": 3 * N,
        "tls_timeout": SILENT,
    }, refused
    # Logged at a bounded rate: LOG_REFUSALS_PER_S lines per reason per second (two of
    # its one-second windows may meet inside any one second of the log).
    lines = [
        r
        for r in coord.daemon.log_records()
        if r.get("event") == "peer refused" and str(r.get("reason", "")).startswith("tls_")
    ]
    for reason in TLS_REASONS:
        ts = sorted(_stamp(r) for r in lines if r["reason"] == reason)
        assert len(ts) <= refused[reason]
        for i, t in enumerate(ts):
            assert sum(1 for u in ts[i:] if u < t + 1.0) <= 2 * LOG_REFUSALS_PER_S, reason
    # The agent kept its windows' deadlines through the attack and never lost its link.
    assert metric(samples, "straggler_windows_late_total") == 0
    assert metric(samples, "straggler_agents_connected") == 1
    assert refused.get("superseded", 0) == 0
