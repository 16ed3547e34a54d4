"""Kills at random moments (docs/RELIABILITY.md section 2): the harness.

One run of sim/scenarios/reliability/kills.toml through the real simulated cluster (real
coordinator, agents, plugin, job processes; sim/cluster.py) while a watcher
thread SIGKILLs the coordinator, an agent, or both, five times at points a
seeded RNG picks, and starts them again at once:

1. at a random window early on, a random delay after it was scored;
2. during the plan's apply: the plan sent and not yet acknowledged by every
   rank, or acknowledged and not yet verified (which one: the RNG);
3. and 4. a random window or two after the previous kill;
5. during the hang's dumps: the coordinator asked for them and has not
   reported the hang yet.

The watcher follows the coordinator's own log (one "window scored" line per
scored window, "hang suspected"), the plans file and the findings file, every
10 ms. What the run kept is judged from its outputs alone (`judge`): windows
never scored (the store's per-window rows and the per-window log line, across
every life of the coordinator), findings or plans lines written twice (a
window or an ack taken in twice), rank-windows scored without their rank (and
whether their summaries came late, counted), whether the restored detector kept the straggler's finding open,
whether every plan ended verified or rolled back, the hang reported once.
"""

from __future__ import annotations

import collections
import json
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from artemis.sim.cluster import SimCluster, SimContext
from sim_runs import sim_options

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "sim" / "scenarios" / "reliability" / "kills.toml"
KINDS = ("coordinator", "agent", "both")
SLOW = 1  # the scenario's clocks fault
HANG_WINDOW = 17  # the scenario's hang: windows from here on never complete
FLAG_WINDOW = 5  # the straggler is flagged (its third slow window)
WINDOW_STEPS = 20  # the scenario's
VERIFY_WINDOWS = 3  # the policy's default (rebalance/policy.py PolicySettings)


@dataclass
class Kill:
    at: str  # "window" | "plan-sent" | "plan-applied" | "dump"
    window: int  # for "window": fire once this window is scored
    delay_s: float
    host: int  # the agent killed (agent, both)
    fired: str = ""  # what the watcher saw when it fired


@dataclass
class _Tail:
    """New lines of a file that grows (and is appended to by several processes)."""

    path: Path
    pos: int = 0
    buf: bytes = b""

    def lines(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.pos += len(data)
        self.buf += data
        *done, self.buf = self.buf.split(b"\n")
        out = []
        for raw in done:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


def schedule(seed: int, hosts: int = 2) -> list[Kill]:
    rng = random.Random(seed)

    def host() -> int:
        return rng.randrange(hosts)

    return [
        Kill("window", rng.randint(1, 4), rng.uniform(0.0, 0.25), host()),
        Kill(rng.choice(["plan-sent", "plan-applied"]), -1, rng.uniform(0.0, 0.05), host()),
        Kill("window", rng.randint(1, 2), rng.uniform(0.0, 0.25), host()),  # after the last
        Kill("window", rng.randint(1, 2), rng.uniform(0.0, 0.25), host()),
        Kill("dump", -1, 0.0, host()),
    ]


@dataclass
class Watcher:
    kind: str
    kills: list[Kill]
    log: Path
    plans: Path
    findings: Path
    ctx: SimContext | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: str = ""

    def on_tick(self, ctx: SimContext) -> None:
        if self.ctx is None:
            self.ctx = ctx
            threading.Thread(target=self._run, name="kills", daemon=True).start()

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # reported by the test, not lost in a thread
            self.error = repr(e)

    def _loop(self) -> None:
        assert self.ctx is not None and self.ctx.kill_restart is not None
        log, plans, findings = _Tail(self.log), _Tail(self.plans), _Tail(self.findings)
        scored = -1  # highest window scored, any life
        life_scored = 0  # windows scored by the current life
        suspected = False  # this life asked for dumps
        hang_reported = False
        status: dict[str, str] = {}  # plan id -> its last status
        last: str | None = None  # the id of the latest plan event
        armed_at = -1  # the highest window scored when the current kill was armed
        i = 0
        while i < len(self.kills) and not self.done.is_set():
            for rec in log.lines():
                if rec.get("event") == "window scored":
                    scored = max(scored, int(rec["window"]))
                    life_scored += 1
                elif rec.get("event") == "hang suspected: requesting dumps":
                    suspected = True
            for rec in plans.lines():
                status[rec["id"]] = rec["status"]
                last = rec["id"]
            hang_reported = hang_reported or any(r.get("kind") == "hang" for r in findings.lines())
            k = self.kills[i]
            if armed_at < 0:
                armed_at = max(scored, 0)
            fire = ""
            now = status.get(last, "") if last is not None else ""
            if life_scored == 0 and k.at != "dump":
                pass  # the last kill's restart has not scored anything yet
            elif k.at == "window":
                # Before the hang's partial window (the last one a kill can follow).
                target = min(k.window if i == 0 else armed_at + k.window, HANG_WINDOW - 2)
                if scored >= target:
                    fire = f"window {scored} scored"
            elif k.at == "plan-sent" and now == "recommended":
                fire = f"plan {last} sent, not acknowledged"
            elif k.at == "plan-applied" and now == "applied":
                fire = f"plan {last} applied, not verified"
            elif k.at.startswith("plan") and now in ("verified", "rolled_back") and scored > 12:
                fire = f"plan {last} already {now}: missed its apply"
            elif k.at == "dump" and suspected and not hang_reported:
                fire = "dumps requested, hang not reported"
            elif k.at == "dump" and hang_reported:
                fire = "hang already reported: missed its dumps"
            if fire:
                time.sleep(k.delay_s)
                names = {
                    "coordinator": ["coordinator"],
                    "agent": [f"agent-{k.host}"],
                    "both": ["coordinator", f"agent-{k.host}"],
                }[self.kind]
                self.ctx.kill_restart(names)
                k.fired = fire
                if self.kind != "agent":
                    life_scored, suspected = 0, False
                i += 1
                armed_at = -1
            time.sleep(0.01)


@dataclass
class Outcome:
    seed: int
    kind: str
    ok: bool
    reason: str
    kills: list[Kill]
    scored: collections.Counter[int]  # window -> "window scored" log lines, every life
    lost_windows: list[int]  # never scored (no row of it in the store, no log line)
    twice_lines: list[tuple[Any, ...]]  # findings or plans lines written twice
    # Rank-windows scored without their rank (its agent away past the deadline: the
    # agents' back-off grows over sessions shorter than 5 s), and of those how many
    # never came at all, not even late (still in an agent's outbox when the run ended:
    # `unacked_at_end` messages). Reported, not failures: nothing acknowledged is lost.
    missing_rank_windows: int
    late_unaccounted: int
    unacked_at_end: int
    # Plans applied too late for the verification windows before the hang stopped the
    # job (their last line stays `applied`: there is nothing left to verify).
    plans_cut_by_hang: list[str]
    rank_states: list[tuple[int, str, int]]  # the slow rank's (window, state, since)
    # What a failure needs to explain itself (printed with the straggler's problem):
    slow_lines: list[tuple[int, str, str]]  # the slow rank's every line: (window, kind, state)
    scored_lines: list[tuple[int, int, int, int]]  # (window, ranks, missing, unusable)
    run_events: list[str]  # the coordinator's events about runs, job ends and drops
    restored_open: list[tuple[int, int]]  # (last window, open findings) of each restore
    plans_end: dict[str, str]  # plan id -> its last status
    plan_reasons: dict[str, str]
    hang_lines: int
    hang_dumps: int
    cut_back: int  # windows whose interrupted outputs a restart removed and scored again
    run_s: float

    def replay(self) -> str:
        return (
            f"replay: ARTEMIS_KILL_SEED={self.seed} .venv/bin/python -m pytest -q "
            f"tests/test_kills.py -k {self.kind}; kills: "
            + "; ".join(
                f"{k.at}({k.window}, {k.delay_s:.3f} s, h{k.host}): {k.fired}" for k in self.kills
            )
        )

    def problems(self) -> list[str]:
        out = []
        if not self.ok:
            out.append(f"the run failed: {self.reason}")
        if self.lost_windows:
            out.append(f"windows never scored: {self.lost_windows}")
        if self.twice_lines:
            out.append(f"output lines written twice (taken in twice): {self.twice_lines}")
        unfired = [k.at for k in self.kills if not k.fired]
        if unfired:
            out.append(f"kills that never fired: {unfired}")
        left = {
            p: s
            for p, s in self.plans_end.items()
            if s == "applied" and p not in self.plans_cut_by_hang
        }
        if left:
            out.append(f"plans left applied, neither verified nor rolled back: {left}")
        if self.hang_lines != 1:
            out.append(f"{self.hang_lines} hang findings (one expected)")
        states = self.rank_states
        sinces = {s for _w, _st, s in states}
        # With ranks missing (an agent away past the deadline) the detector judges the
        # straggler against fewer peers, or as a host's: its run of findings may change.
        steady = self.missing_rank_windows == 0
        if steady and (len(sinces) != 1 or [st for _w, st, _s in states].count("flagged") != 1):
            out.append(
                f"the straggler's finding did not stay open across restarts: {states}; "
                f"its lines (window, kind, state): {self.slow_lines}; windows scored "
                f"(window, ranks, missing, unusable): {self.scored_lines}; "
                f"events: {self.run_events}"
            )
        if any(w >= FLAG_WINDOW and n < 1 for w, n in self.restored_open):
            out.append(f"a restored detector lost the open finding: {self.restored_open}")
        return out


def run_trial(kind: str, seed: int, tmp: Path) -> Outcome:
    tmp.mkdir(parents=True, exist_ok=True)
    kills = schedule(seed)
    work = tmp / "work"
    w = Watcher(
        kind,
        kills,
        work / "logs" / "coordinator.log",
        tmp / "plans.jsonl",
        tmp / "findings.jsonl",
    )
    cluster = SimCluster(
        SCENARIO,
        sim_options(tmp, timeout_s=400, on_tick=w.on_tick),
    )
    t0 = time.monotonic()
    try:
        res = cluster.run()
        ok, reason = res.ok, res.reason or w.error
    except RuntimeError as e:  # e.g. a coordinator that did not come up (a loaded machine)
        ok, reason = False, f"the cluster did not run: {e}"
    finally:
        w.done.set()
    return judge(kind, seed, kills, ok, reason, tmp, time.monotonic() - t0)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def judge(
    kind: str, seed: int, kills: list[Kill], ok: bool, reason: str, tmp: Path, run_s: float
) -> Outcome:
    from artemis.store.base import open_for_findings

    log = _Tail(tmp / "work" / "logs" / "coordinator.log").lines()
    scored = collections.Counter(int(r["window"]) for r in log if r.get("event") == "window scored")
    # The store's per-window rows: written inside each window's outputs, idempotent
    # (one row per window however often it is written): the record that a window was
    # scored, which the log line cannot be (a kill can fall between the two).
    with open_for_findings(tmp / "findings.jsonl") as store:
        stored = {int(r["window"]) for r in store.job_windows(f"{SCENARIO.stem}-sim")}
    # Rank-windows scored without their rank, against the summaries of those windows
    # that arrived after their window was released (dropped as late, and counted).
    missing: collections.Counter[int] = collections.Counter()
    late: collections.Counter[int] = collections.Counter()
    for r in log:
        if r.get("event") == "window scored" and int(r["window"]) < HANG_WINDOW - 1:
            # absent at the deadline, or present with no usable time: either way the
            # straggler was judged without that rank
            missing[int(r["window"])] = int(r["missing"]) + int(r.get("unusable", 0))
        elif r.get("event") == "window summaries dropped" and r.get("reason") == "late":
            late[int(r["window"])] += int(r["summaries"])
    findings = _jsonl(tmp / "findings.jsonl")
    plans = _jsonl(tmp / "plans.jsonl")
    keys = collections.Counter(
        (f["kind"], f.get("rank"), f["window"], f.get("state")) for f in findings
    )
    keys.update(("plan", p["id"], p["status"], p["reason"]) for p in plans)
    end: dict[str, str] = {}
    why: dict[str, str] = {}
    for p in plans:
        end[p["id"]] = p["status"]
        why[p["id"]] = p["reason"]
    hangs = [f for f in findings if f["kind"] == "hang"]
    return Outcome(
        seed=seed,
        kind=kind,
        ok=ok,
        reason=reason,
        kills=kills,
        scored=scored,
        lost_windows=[x for x in range(HANG_WINDOW - 1) if x not in stored and not scored[x]],
        twice_lines=sorted((k for k, n in keys.items() if n > 1), key=str),
        missing_rank_windows=sum(missing.values()),
        late_unaccounted=sum(max(0, n - late[w]) for w, n in missing.items()),
        unacked_at_end=sum(
            int(r.get("buffered", 0))
            for h in (0, 1)
            for r in _Tail(tmp / "work" / "logs" / f"agent-{h}.log").lines()
            if r.get("event") == "closing with unacknowledged data"
        ),
        plans_cut_by_hang=sorted(
            {
                p["id"]
                for p in plans
                if p["status"] == "applied"
                and (p["apply_at_step"] or 0) > (HANG_WINDOW - 1 - VERIFY_WINDOWS) * WINDOW_STEPS
            }
        ),
        rank_states=[
            (f["window"], f["state"], f["since"])
            for f in findings
            if f["kind"] == "rank" and f["rank"] == SLOW
        ],
        slow_lines=[
            (f["window"], f["kind"], f["state"]) for f in findings if f.get("rank") == SLOW
        ],
        scored_lines=[
            (int(r["window"]), int(r["ranks"]), int(r["missing"]), int(r.get("unusable", 0)))
            for r in log
            if r.get("event") == "window scored"
        ],
        run_events=sorted(
            {
                str(r["event"])
                for r in log
                if str(r.get("event", "")).startswith(("new run", "job ", "baseline"))
            }
        ),
        restored_open=[
            (int(r["last_window"]), int(r["open_findings"]))
            for r in log
            if r.get("event") == "job state restored"
        ],
        plans_end=end,
        plan_reasons=why,
        hang_lines=len(hangs),
        hang_dumps=len(hangs[0]["evidence"].get("dumps", [])) if hangs else 0,
        cut_back=sum(1 for r in log if str(r.get("event", "")).startswith("outputs interrupted")),
        run_s=run_s,
    )
