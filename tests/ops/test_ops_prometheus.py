"""A real Prometheus scrapes a real coordinator during a simulated run.

`artemis sim` runs a small cluster on loopback (ranks driving the real plugin,
agents, coordinator) with a rank slowed by low clocks and, later, a host whose
agent dies. A Prometheus server started here (127.0.0.1, free port, temporary
storage, 1 s scrapes) scrapes the coordinator with the scrape job of
deploy/prometheus/prometheus.yml and loads deploy/prometheus/artemis-rules.yml.
While the run goes on, every PromQL expression of the Grafana dashboard (with
its variables substituted) and of the alerting rules goes through Prometheus's
HTTP API until each has returned data; the alerts for the flagged rank and the
missing ranks must match, with the rank's cause; the hang and coordinator-down
alerts must stay quiet. The coordinator's /metrics text goes through
`promtool check metrics`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from artemis_ops_helpers import (
    RULES,
    SCRAPE_CONFIG,
    console_script,
    dashboard_exprs,
    free_port,
    load_dashboard,
    load_yaml,
    referenced_metrics,
    rule_list,
    stop_process,
    substitute,
    tail,
    tool,
    variable_queries,
)

pytestmark = pytest.mark.slow

JOB = "artemis-coordinator"  # the scrape job
TRAINING_JOB = "scenario-sim"  # the job id `artemis sim` gives scenario.toml's job
DEADLINE_S = 75.0

SCENARIO = """\
# tests/ops: a short run for the Prometheus test. Windows of 10 steps of 20 ms
# (0.2 s each at realtime speed); rank 1's clocks drop at window 6; host 1's
# agent dies at window 30, so its two ranks go missing.
[job]
ranks = 4
ranks_per_host = 2
step_ms = 20.0
collectives_per_step = 2
window_steps = 10
windows = 150
noise = 0.01
seed = 3

[[fault]]
kind = "clocks"
rank = 1
start_window = 6
slowdown = 0.3

[[fault]]
kind = "agent_down"
rank = 3
start_window = 30

[detector]
rebalance = "apply"
"""

# Series that exist only after an event this run does not produce (a bad frame,
# a refused peer, a measured rebalance plan). For them the metric family must be
# declared in /metrics (# TYPE) instead of returning data.
EVENT_DRIVEN = {
    "straggler_protocol_bad_frames_total",
    "straggler_protocol_refused_peers_total",
    "straggler_throughput_samples_per_second",
}
# Exported only by a fleet's coordinators (docs/DESIGN.md "The coordinator fleet"):
# this run's single coordinator has none, so their panels and rules are not asked
# for data here; tests/test_fleet_e2e*.py read them from the fleet members' /metrics.
FLEET_ONLY = {"straggler_job_owner"}
# Alerts whose expression must match during this run, and ones that must not.
MUST_MATCH = {"ArtemisStragglerFlagged", "ArtemisRanksMissing"}
MUST_STAY_QUIET = {"ArtemisHang", "ArtemisCoordinatorDown"}
# promtool check metrics complaints about names that docs/DESIGN.md fixes
# ("these names stay"): tolerated, anything else fails.
FIXED_NAME_LINTS = (
    re.compile(r"^straggler_step_ms metric names should not contain abbreviated units$"),
    re.compile(
        r'^straggler_gpu_hours_lost_(total|created) use base unit "seconds" instead of "hours"$'
    ),
    re.compile(r'^straggler_incident_gpu_hours_lost use base unit "seconds" instead of "hours"$'),
)


def _sim_or_skip() -> Path:
    artemis = console_script("artemis")
    r = subprocess.run(
        [str(artemis), "sim", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    if r.returncode != 0:
        text = r.stdout + r.stderr
        if "No such command" in text or "ModuleNotFoundError" in text or "ImportError" in text:
            pytest.skip(f"`artemis sim` does not exist yet: {text.strip().splitlines()[-1]}")
        pytest.fail(f"artemis sim --help failed:\n{text[-2000:]}")
    missing = [
        f for f in ("--scenario", "--jsonl", "--metrics-port", "--speed") if f not in r.stdout
    ]
    assert not missing, f"artemis sim lacks {missing}"
    return artemis


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


@dataclass
class Prom:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(_get(f"{self.url}/api/v1/query?{q}"))
        except urllib.error.HTTPError as e:
            raise AssertionError(
                f"Prometheus rejected {expr!r}: {e.read().decode()[:500]}"
            ) from None
        assert body["status"] == "success", body
        return body["data"]["result"]


@pytest.fixture
def sim_port() -> int:
    return free_port()


@pytest.fixture
def prometheus(tmp_path: Path, sim_port: int) -> Iterator[Prom]:
    """Prometheus on 127.0.0.1 with the deploy scrape job aimed at the sim's coordinator."""
    binary = tool("prometheus")
    deploy = load_yaml(SCRAPE_CONFIG)
    job = next(s for s in deploy["scrape_configs"] if s["job_name"] == JOB)
    job = {
        **job,
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "static_configs": [{"targets": [f"127.0.0.1:{sim_port}"]}],
    }
    cfg = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [job],
    }
    cfg_path = tmp_path / "prometheus.yml"
    cfg_path.write_text(json.dumps(cfg))  # JSON is YAML
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={cfg_path}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"prometheus exited:\n{tail(log)}"
            try:
                if _get(f"{url}/-/ready", timeout=1).strip():
                    break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, f"prometheus not ready in 30 s:\n{tail(log)}"
            time.sleep(0.1)
        yield Prom(url, proc, log)
    finally:
        stop_process(proc)


@pytest.fixture
def sim(tmp_path: Path, sim_port: int) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    artemis = _sim_or_skip()
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    log = tmp_path / "sim.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(artemis),
                "sim",
                "--scenario",
                str(scenario),
                "--jsonl",
                str(tmp_path / "findings.jsonl"),
                "--plans-jsonl",
                str(tmp_path / "plans.jsonl"),
                "--metrics-port",
                str(sim_port),
                "--speed",
                "realtime",
                "--timeout-s",
                str(int(DEADLINE_S) + 30),
                "--workdir",
                str(tmp_path / "work"),
                # the dashboard's "Incident report" annotation needs report_dir
                "--report-dir",
                str(tmp_path / "reports"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc, log
    finally:
        # The whole process group: the sim's coordinator, agents and hosts too.
        stop_process(proc)


@dataclass
class Check:
    what: str
    expr: str
    seen: bool = False
    results: list[dict[str, Any]] = field(default_factory=list)


def test_prometheus_scrapes_coordinator_and_every_query_has_data(
    prometheus: Prom, sim: tuple[subprocess.Popen[bytes], Path], sim_port: int, tmp_path: Path
) -> None:
    proc, sim_log = sim
    dash = load_dashboard()
    rules = {r["alert"]: r["expr"] for r in rule_list()}

    checks: list[Check] = []
    event_exprs: list[tuple[str, str]] = []
    for where, raw in dashboard_exprs(dash):
        expr = substitute(raw, TRAINING_JOB)
        if referenced_metrics([expr]) & FLEET_ONLY:
            continue
        if referenced_metrics([expr]) & EVENT_DRIVEN:
            event_exprs.append((where, expr))
        else:
            checks.append(Check(where, expr))
    for name, sel, label in variable_queries(dash):
        checks.append(
            Check(f"variable ${name}", f"count by ({label}) ({substitute(sel, TRAINING_JOB)})")
        )
    for name in MUST_MATCH:
        checks.append(Check(f"alert {name}", rules[name]))
    # Every metric any rule reads must be scraped (the rule itself may be quiet).
    for metric in sorted(referenced_metrics(list(rules.values())) - FLEET_ONLY):
        checks.append(Check(f"rules read {metric}", f'count({metric}{{instance=~".+"}})'))
    quiet = {name: rules[name] for name in MUST_STAY_QUIET}
    # The slowed rank's incident while it is open (docs/DESIGN.md "Metrics").
    checks.append(
        Check(
            "incident open",
            f'straggler_incident_open{{job="{TRAINING_JOB}",kind="rank",subject="1",'
            'cause="clocks"} == 1',
        )
    )
    checks.append(
        Check(
            "incident GPU-hours", f'straggler_incident_gpu_hours_lost{{job="{TRAINING_JOB}"}} > 0'
        )
    )

    exposition = ""
    coordinator_up = False  # quiet alerts are judged once the first scrape succeeded
    deadline = time.monotonic() + DEADLINE_S
    while True:
        coordinator_up = coordinator_up or bool(prometheus.query(f'up{{job="{JOB}"}} == 1'))
        if not exposition:
            try:
                text = _get(f"http://127.0.0.1:{sim_port}/metrics", timeout=2).decode()
                if "straggler_rank_pace_ratio{" in text:
                    exposition = text
            except (urllib.error.URLError, OSError):
                pass
        for c in checks:
            if not c.seen:
                c.results = prometheus.query(c.expr)
                c.seen = bool(c.results)
        for name, expr in quiet.items() if coordinator_up else ():
            got = prometheus.query(expr)
            # (a match after the sim has ended, e.g. up == 0, does not count)
            assert not got or proc.poll() is not None, (
                f"alert {name} matched during a healthy coordinator run: {got}"
            )
        if coordinator_up and exposition and all(c.seen for c in checks):
            break
        pending = [f"{c.what}: {c.expr}" for c in checks if not c.seen]
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(
                "no data from Prometheus for:\n  "
                + "\n  ".join(pending)
                + f"\n(sim {'exited ' + str(proc.returncode) if proc.poll() is not None else 'still running'};"
                f" sim log tail:\n{tail(sim_log, 1500)})"
            )
        time.sleep(0.5)  # poll period; the loop ends on the conditions above

    # The straggler alert names the rank, the island's cause and the finding's window.
    flagged = next(c for c in checks if c.what == "alert ArtemisStragglerFlagged").results
    assert any(
        r["metric"].get("kind") == "rank" and r["metric"].get("subject") == "1" for r in flagged
    ), flagged
    with_cause = [r for r in flagged if "cause" in r["metric"]]
    assert with_cause, f"straggler_finding_info did not join: {flagged}"
    assert {r["metric"]["cause"] for r in with_cause} == {"clocks"}, with_cause
    missing = next(c for c in checks if c.what == "alert ArtemisRanksMissing").results
    assert float(missing[0]["value"][1]) == 2, missing

    # Queries over event-driven series must parse and the families must be declared.
    declared = set(re.findall(r"^# TYPE (\S+)", exposition, re.M))
    for where, expr in event_exprs:
        prometheus.query(expr)  # valid PromQL (raises otherwise)
        for metric in referenced_metrics([expr]) & EVENT_DRIVEN:
            family = metric
            assert family in declared or family.removesuffix("_total") in declared, (
                f"{where}: {metric} not declared in the coordinator's /metrics"
            )

    # Closed incidents are counted by verdict: declared before the first one closes.
    assert "straggler_incidents_total" in declared or "straggler_incidents" in declared
    hours = next(c for c in checks if c.what == "incident GPU-hours").results
    assert any(h["metric"]["incident"].startswith(f"{TRAINING_JOB}-r1-") for h in hours), hours

    # All alert rules load and evaluate.
    rules_api = json.loads(_get(f"{prometheus.url}/api/v1/rules"))["data"]["groups"]
    states = {r["name"]: r for g in rules_api for r in g["rules"]}
    assert set(states) == set(rules)
    for name, r in states.items():
        assert r["health"] in ("ok", "unknown") and not r.get("lastError"), (
            name,
            r.get("lastError"),
        )

    # The exposition passes promtool's linter, except for the names DESIGN fixes.
    r = subprocess.run(
        [tool("promtool"), "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        timeout=30,
    )
    problems = [
        line
        for line in (r.stdout + r.stderr).splitlines()
        if line.strip() and not any(p.match(line.strip()) for p in FIXED_NAME_LINTS)
    ]
    assert not problems, "promtool check metrics:\n" + "\n".join(problems)
    assert r.returncode in (0, 3), r.stderr  # 3: lint problems only (the tolerated ones)
