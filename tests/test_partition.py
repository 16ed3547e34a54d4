"""Network partitions mid-job, between real network namespaces (issue 14, item 1).

The simulated cluster of sim/scenarios/partition.toml (real coordinator, real
agents, real plugin, simulated GPUs; a thermal fault on rank 6 of node B) runs
in real time with its coordinator, node A's agent and the job in one network
namespace and node B's agent in another, joined only by a user-space link of
TUN devices (tests/netns_harness.py). During the job the link goes down
(blackout), then drops 20% of its packets and delays the rest by 200 ms, then
flaps. After the heal:

- every window is scored exactly once for every rank: on time, or late for
  the ranks its deadline found missing (the coordinator's log lists them);
- the findings equal those of an unpartitioned run of the same scenario
  (kinds, subjects, windows, states, causes), apart from the outage's `missing`;
- node B's agent reported the outage (its log at loss and recovery, its
  `straggler_agent_uplink_*` metrics);
- windows whose deadline passed are marked late and scored, not lost.

The short form runs in `make test`; `make reliability` runs the long forms (a
30 s blackout, 2 minutes of 20% loss with 200 ms delay, a flapping link) with
a daemon baseline run as well. Their figures are in docs/RELIABILITY.md.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from artemis.detect.monitor import JobMonitor
from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowColumns
from artemis.sim.cluster import SimCluster, SimContext, SimOptions
from artemis.sim.hostproc import metric_value
from artemis.sim.inproc import summaries
from artemis.sim.scenario import load_scenario
from daemon_harness import json_records
from netns_harness import C_ADDR, Link, inside, unavailable

REASON = unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=f"partition tests skipped: {REASON}"),
]

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "sim" / "scenarios" / "partition.toml"
NODE_B = {4, 5, 6, 7}
AGENT_METRICS_PORT = 9464  # node B's agent, inside its own namespace
Step = tuple[float, str, tuple[Any, ...]]  # (seconds after the start, action, args)
# The long forms run under `make reliability` only (minutes each).
LONG = pytest.mark.skipif(
    not os.environ.get("ARTEMIS_RELIABILITY"), reason="a long form: run by make reliability"
)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def _prom(text: str) -> dict[str, float]:
    """name (labels dropped, values summed) -> value of a Prometheus exposition."""
    out: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            out[m.group(1)] += float(m.group(3))
    return dict(out)


def _scrape(url: str, prefix: list[str] | None = None) -> dict[str, float]:
    code = f"import urllib.request;print(urllib.request.urlopen({url!r},timeout=5).read().decode())"
    r = subprocess.run(
        [*(prefix or []), sys.executable, "-c", code], capture_output=True, text=True, timeout=30
    )
    return _prom(r.stdout) if r.returncode == 0 else {}


@dataclass
class Outcome:
    ok: bool
    reason: str
    findings: list[dict[str, Any]]
    coord_log: list[dict[str, Any]]
    agent_b_log: list[dict[str, Any]]
    coord: dict[str, float]
    agent_b: dict[str, float]
    events: list[tuple[str, float]]
    windows: int
    elapsed_s: float
    link_log: str = ""
    done: list[str] = field(default_factory=list)


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return json_records(path.read_text(errors="replace")) if path.exists() else []


def run_partitioned(
    tmp: Path,
    schedule: list[Step],
    *,
    windows: int,
    window_s: float,
    start_window: int = 8,
    stall_s: float = 4.0,
    tag: str = "",
) -> Outcome:
    """The scenario, `windows` long at `window_s` wall seconds a window, with the link's
    faults of `schedule` from the moment the coordinator scored `start_window`."""
    scen = tmp / "partition.toml"
    text = SCENARIO.read_text()
    scen.write_text(re.sub(r"(?m)^windows = \d+$", f"windows = {windows}", text))
    with Link(tmp, tag) as link:

        def agent_argv(h: int, argv: list[str]) -> list[str]:
            if h != 1:
                return argv
            i = argv.index("--coordinator")
            port = argv[i + 1].rsplit(":", 1)[1]
            argv[i + 1] = f"{C_ADDR}:{port}"
            return link.exec_in(link.b) + argv

        started: list[float] = []
        todo = sorted(schedule)
        done: list[str] = []

        def tick(ctx: SimContext) -> None:
            if not started:
                lw = metric_value(ctx.metrics_url, "straggler_last_window")
                if lw is None or lw < start_window:
                    return
                started.append(time.monotonic())
            t = time.monotonic() - started[0]
            while todo and todo[0][0] <= t:
                _, action, args = todo.pop(0)
                getattr(link, action)(*args)
                done.append(f"{t:.1f}s {action}{args}")

        scraped: dict[str, dict[str, float]] = {}

        def end(ctx: SimContext) -> None:
            # the last window is scored: let the link finish its schedule's last
            # recovery, then read both sides' metrics before the processes stop
            scraped["coord"] = _scrape(ctx.metrics_url)
            scraped["agent_b"] = _scrape(
                f"http://127.0.0.1:{AGENT_METRICS_PORT}/metrics", link.exec_in(link.b)
            )

        opts = SimOptions(
            jsonl=tmp / "findings.jsonl",
            speed="realtime",
            window_s=window_s,
            workdir=tmp / "sim",
            keep_workdir=True,
            timeout_s=windows * window_s + 240,
            listen="0.0.0.0",
            agent_argv=agent_argv,
            agent_toml={
                1: {
                    "uplink_stall_s": stall_s,
                    "reconnect_max_s": 1.0,
                    "metrics_port": AGENT_METRICS_PORT,
                }
            },
            on_tick=tick,
            on_end=end,
        )

        def before_job(url: str) -> None:
            # both agents connected before the job starts: a rank unknown to the
            # coordinator is not missing from a window (nothing to be late for)
            end_by = time.monotonic() + 60
            while metric_value(url, "straggler_agents_connected") != 2:
                assert time.monotonic() < end_by, "node B's agent never connected"
                time.sleep(0.1)

        opts.before_job = before_job
        t0 = time.monotonic()
        with inside(link.c):
            res = SimCluster(scen, opts).run()
        logs = tmp / "sim" / "logs"
        return Outcome(
            ok=res.ok,
            reason=res.reason,
            findings=_json_lines(tmp / "findings.jsonl"),
            coord_log=_json_lines(logs / "coordinator.log"),
            agent_b_log=_json_lines(logs / "agent-1.log"),
            coord=scraped.get("coord", {}),
            agent_b=scraped.get("agent_b", {}),
            events=list(link.events),
            windows=windows,
            elapsed_s=time.monotonic() - t0,
            link_log=link.log.read_text(errors="replace"),
            done=done,
        )


def reference(windows: int) -> list[tuple[Any, ...]]:
    """The unpartitioned run of the same scenario: the same summaries (the simulator is
    deterministic: records carry virtual time) through the same core in process. The
    long form checks it against a daemon run too."""
    sc = load_scenario(SCENARIO)
    sc = type(sc)(**{**sc.__dict__, "windows": windows})
    m = JobMonitor("ref", Settings(hang_floor_s=2.0), nranks=sc.ranks)
    out: list[tuple[Any, ...]] = []
    for w, rows in enumerate(summaries(sc)):
        res = m.on_window(w, WindowColumns.from_records(rows))
        out += [
            (f.kind, f.subject, f.window, f.state, (f.cause or {}).get("kind"))
            for f in res.findings
        ]
    return sorted(x for x in out if x[0] != "missing")


def finding_keys(findings: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out = []
    for f in findings:
        if f["kind"] == "missing":
            continue
        subject = str(f["rank"]) if f["kind"] in ("rank", "degraded") else str(f["island"])
        out.append(
            (f["kind"], subject, f["window"], f["state"], (f.get("cause") or {}).get("kind"))
        )
    return sorted(out)


def delivery(o: Outcome) -> dict[str, Any]:
    """Per window: ranks missing at its deadline (the `missing` findings) and ranks
    scored late (the coordinator's log); every rank-window scored once."""
    missing: dict[int, set[int]] = {}
    for f in o.findings:
        if f["kind"] == "missing" and f["state"] in ("flagged", "ongoing"):
            missing[f["window"]] = set(f["ranks"])
    late: collections.Counter[tuple[int, int]] = collections.Counter()
    for rec in o.coord_log:
        if rec.get("event") == "late summaries scored" and rec.get("scored"):
            for r in rec["ranks"]:
                late[(rec["window"], r)] += 1
    late_of: dict[int, set[int]] = collections.defaultdict(set)
    for w, r in late:
        late_of[w].add(r)
    twice = sorted(k for k, n in late.items() if n > 1)
    lost = {w: sorted(m - late_of.get(w, set())) for w, m in missing.items()}
    lost = {w: r for w, r in lost.items() if r}
    stray = sorted(k for k in late if k[1] not in missing.get(k[0], set()))
    return {
        "windows_with_missing": len(missing),
        "rank_windows_missing": sum(len(m) for m in missing.values()),
        "rank_windows_late_scored": sum(late.values()),
        "twice": twice,
        "lost": lost,
        "stray": stray,
    }


def check(o: Outcome, want_blackout_s: float) -> dict[str, Any]:
    """The issue's checks after the heal; returns the figures for docs/RELIABILITY.md.
    `want_blackout_s`: the longest cut of the link (0: none); one longer than the
    assembly deadline makes windows late, one longer than the agent's stall limit
    is an outage it reports."""
    why = f"{o.reason}\nschedule done: {o.done}\nlink: {o.link_log[-2000:]}"
    assert o.ok, why
    d = delivery(o)
    # Every window scored once, every rank once in it: on time, or late for the ranks
    # its deadline found missing (never both, never twice, none left out).
    assert o.coord.get("straggler_windows_scored_total") == o.windows, (o.coord, why)
    assert d["twice"] == [] and d["stray"] == [], d
    assert d["lost"] == {}, (d, why)
    if want_blackout_s:
        assert d["windows_with_missing"] > 0, "the partition never made a window miss node B"
    # Late windows were marked late and scored, not lost.
    assert o.coord.get("straggler_windows_late_scored_total", 0) == d["rank_windows_late_scored"]
    assert d["rank_windows_late_scored"] == d["rank_windows_missing"]
    late_total = o.coord.get("straggler_windows_late_total", 0.0)
    dropped = o.coord.get("straggler_windows_dropped_total", 0.0)
    # what came after its window's release and was not scored is a resend of a rank
    # the window had (counted as dropped late), never data
    assert late_total - d["rank_windows_late_scored"] == dropped, o.coord
    # The findings: those of the unpartitioned run, apart from the outage's `missing`.
    assert finding_keys(o.findings) == reference(o.windows)
    slow = [f for f in o.findings if f.get("rank") == 6 and f["state"] == "flagged"]
    assert slow and slow[0]["cause"]["kind"] == "thermal"
    # Node B's agent reported the outage: a warning at the loss and at the recovery
    # with its length, and its metrics.
    lost = [r for r in o.agent_b_log if r.get("event") == "uplink to coordinator lost"]
    back = [r for r in o.agent_b_log if r.get("event") == "uplink to coordinator restored"]
    ab = o.agent_b
    assert ab.get("straggler_agent_uplink_up") == 1.0, ab  # healed
    assert len(back) == len(lost) == ab.get("straggler_agent_uplink_outages_total", 0), ab
    down = ab.get("straggler_agent_uplink_down_seconds_total", 0.0)
    if want_blackout_s:
        assert lost and back, (lost, back)
        assert max(r["outage_s"] for r in back) >= 0.5 * want_blackout_s, back
        assert down >= 0.5 * want_blackout_s, ab
    return {
        **d,
        "late_total": late_total,
        "dropped": dropped,
        "agent_outages": ab.get("straggler_agent_uplink_outages_total"),
        "agent_stalls": ab.get("straggler_agent_uplink_stalls_total"),
        "agent_down_s": round(down, 1),
        "outage_logs": [round(r["outage_s"], 1) for r in back][:12],
        "findings": len(o.findings),
        "elapsed_s": round(o.elapsed_s, 1),
    }


def _report(name: str, figures: dict[str, Any]) -> None:
    """The figures, printed (make reliability shows them) and kept for the docs."""
    line = json.dumps({"test": name, **figures}, default=str)
    print(line)
    out = os.environ.get("ARTEMIS_RELIABILITY_OUT")
    if out:
        with open(out, "a") as fh:
            fh.write(line + "\n")


def test_partition_short_form(tmp_path: Path) -> None:
    """In `make test`: a 4 s blackout, 5 s of 20% loss + 200 ms delay, two 1 s flaps."""
    schedule: list[Step] = [
        (0.0, "down", ()),
        (4.0, "up", ()),
        (5.0, "impair", (0.2, 200)),
        (10.0, "impair", (0.0, 0)),
        (11.0, "down", ()),
        (12.0, "up", ()),
        (13.0, "down", ()),
        (14.0, "up", ()),
    ]
    o = run_partitioned(tmp_path, schedule, windows=56, window_s=0.35, start_window=6, stall_s=3.0)
    assert len(o.done) == len(schedule), o.done
    _report("short", check(o, want_blackout_s=4.0))


@LONG
@pytest.mark.reliability
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "name, schedule, windows, blackout",
    [
        ("blackout_30s", [(0.0, "down", ()), (30.0, "up", ())], 100, 30.0),
        (
            "loss20_delay200_2min",
            [(0.0, "impair", (0.2, 200)), (120.0, "impair", (0.0, 0))],
            290,
            0.0,
        ),
        (
            "flapping",
            [
                step
                for k in range(10)
                for step in ((8.0 * k, "down", ()), (8.0 * k + 4.0, "up", ()))
            ],
            200,
            4.0,
        ),
    ],
)
def test_partition_long_forms(
    tmp_path: Path, name: str, schedule: list[Step], windows: int, blackout: float
) -> None:
    """`make reliability`: the issue's long forms, 0.5 s windows (the assembly deadline
    is 3 s); the agent's stall limit 2 s, so each cut of the flapping link is an outage."""
    o = run_partitioned(
        tmp_path, schedule, windows=windows, window_s=0.5, stall_s=2.0, tag=name[:3]
    )
    assert len(o.done) == len(schedule), o.done
    figures = check(o, want_blackout_s=blackout)
    _report(name, figures)


@LONG
@pytest.mark.reliability
@pytest.mark.timeout(900)
def test_reference_equals_a_daemon_run(tmp_path: Path) -> None:
    """The short form's reference (the scenario through the core in process) is what
    the daemons score unpartitioned."""
    scen = tmp_path / "partition.toml"
    scen.write_text(re.sub(r"(?m)^windows = \d+$", "windows = 60", SCENARIO.read_text()))
    res = SimCluster(scen, SimOptions(jsonl=tmp_path / "f.jsonl", timeout_s=600)).run()
    assert res.ok, res.reason
    assert finding_keys(_json_lines(tmp_path / "f.jsonl")) == reference(60)
