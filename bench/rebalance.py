"""Closing the loop: what the straggler costs and what a rebalance plan wins back.

Runs the real simulated cluster (``SimCluster``: coordinator, agents, one job
process per host, real plugin and rings) on ``sim/scenarios/flagship.toml`` with
``rebalance = "apply"``, three times, and reads the plans JSONL and the findings.

* throughput before / after: the plan's ``throughput_before`` (median over the
  windows that triggered it) and ``throughput_after`` (median over the first 3
  whole windows on the new split), samples/s = global batch / step time.
* healthy throughput: the same lockstep model and seed with the fault removed
  (the model's noise draws do not depend on faults, so the run is the faulty
  one minus the fault), step time = median over each window's steps of the end
  of a step's last collective minus the previous step's, throughput = global
  batch / that, median over windows 1.. (window 0 is not judged either). The
  policy's own healthy baseline (median throughput of its last 8 unflagged
  windows, from the plan's reason) is shown next to it as a check.
* lost = (healthy - before) / healthy; recovered = (after - before) /
  (healthy - before), the share of the lost throughput the plan won back.
* model columns: the same model run with the fault and the uniform split, and
  with the fault and the plan's split from its ``apply_at_step`` on: what the
  measured numbers should be if the pipeline measured the model exactly.
* best whole-sample split: the model with the split that minimises the compute
  step in whole samples (no policy bounds): how much of the loss any plan could
  win back at this global batch (one sample is 1/32 of a rank's share here).
* time to verified recovery: from the start of the onset window to the end of
  the window whose scoring verified the plan, in windows and in simulated
  seconds (windows x window_steps x step_ms); with the stages (flagged, plan
  sent, applied at, verified) as windows after the onset window.

Every number is the median over the runs; the data are deterministic, only the
wall-clock arrival of a plan may differ between runs.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from artemis.detect.findings import RANK_KINDS
from artemis.sim.cluster import SimCluster, SimOptions
from artemis.sim.model import LockstepModel
from artemis.sim.scenario import Scenario, load_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "flagship.toml"
RUNS = 3
_LOST_RE = re.compile(r"of the ([0-9.]+) samples/s lost")


@dataclass
class Run:
    wall_s: float
    flag_window: int | None
    sent_window: int | None
    apply_at_step: int | None
    verified_window: int | None
    before: float | None
    after: float | None
    policy_lost: float | None  # samples/s lost per the policy's own healthy baseline
    after_split: list[int] | None
    statuses: list[str]
    reason: str


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def one_run(sc_path: Path, slow_rank: int) -> Run:
    with tempfile.TemporaryDirectory(prefix="artemis-bench-rebalance-") as tmp:
        t = Path(tmp)
        opts = SimOptions(
            jsonl=t / "findings.jsonl",
            plans_jsonl=t / "plans.jsonl",
            rebalance="apply",
            workdir=t / "work",
        )
        t0 = time.perf_counter()
        res = SimCluster(sc_path, opts).run()
        wall = time.perf_counter() - t0
        findings = _read_jsonl(opts.jsonl)
        plans = _read_jsonl(t / "plans.jsonl")
    flag = next(
        (
            int(f["window"])
            for f in findings
            if f.get("kind") in RANK_KINDS
            and f.get("rank") == slow_rank
            and f.get("state") == "flagged"
        ),
        None,
    )
    first = plans[0]["id"] if plans else None
    events = [p for p in plans if p["id"] == first]
    sent = next((p for p in events if p["status"] == "recommended"), None)
    ver = next((p for p in events if p["status"] == "verified"), None)
    lost = None
    if ver is not None:
        m = _LOST_RE.search(str(ver.get("reason", "")))
        lost = float(m.group(1)) if m else None
    return Run(
        wall_s=wall,
        flag_window=flag,
        sent_window=None if sent is None else int(sent["window"]),
        apply_at_step=None if sent is None else int(sent["apply_at_step"]),
        verified_window=None if ver is None else int(ver["window"]),
        before=None if ver is None else float(ver["throughput_before"]),
        after=None if ver is None else float(ver["throughput_after"]),
        policy_lost=lost,
        after_split=None if ver is None else [int(x) for x in ver["after"]],
        statuses=[f"{p['id']}:{p['status']}@w{p['window']}" for p in plans],
        reason=res.reason if not res.ok else "",
    )


def model_throughput(
    sc: Scenario, split: list[int] | None = None, at_step: int | None = None
) -> list[float]:
    """Per-window throughput (samples/s) of the lockstep model; the split from at_step on."""
    model = LockstepModel(sc)
    k = model.colls_per_step
    uniform = np.full(sc.ranks, sc.global_batch / sc.ranks)
    prev_end: int | None = None
    out: list[float] = []
    for w in range(sc.windows):
        s = sc.window_steps
        samples = np.tile(uniform, (s, 1))
        if split is not None and at_step is not None:
            steps = np.arange(w * s, (w + 1) * s)
            samples[steps >= at_step] = np.asarray(split, float)
        wt = model.window(w, samples)
        ends = wt.end[:, 0, k - 1].astype(np.int64)
        seq = ends if prev_end is None else np.concatenate([[prev_end], ends])
        prev_end = int(ends[-1])
        step_ms = float(np.median(np.diff(seq))) / 1e6
        out.append(sc.global_batch / step_ms * 1000.0)
    return out


def best_split(sc: Scenario, window: int) -> list[int]:
    """The whole-sample split with the shortest compute step (no bounds): each sample in
    turn goes to the rank that would finish it first (greedy is optimal for a min-max)."""
    model = LockstepModel(sc)
    comp, _, _ = model.slowdowns(window)
    per_sample = (1.0 + comp) / model.speed  # compute per sample, relative
    split = [0] * sc.ranks
    for _ in range(sc.global_batch):
        r = min(range(sc.ranks), key=lambda i: ((split[i] + 1) * per_sample[i], i))
        split[r] += 1
    return split


def _med(xs: list[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.median(got) if got else None


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def main() -> int:
    sc = load_scenario(SCENARIO)
    faults = [f for f in sc.faults if f.kind in ("clocks", "thermal", "power", "pcie", "host")]
    fault = faults[0]
    onset, slow_rank = fault.start_window, fault.ranks[0]
    step_s = sc.window_steps * sc.step_ms / 1000.0
    print(
        f"{SCENARIO.name}: {sc.ranks} ranks, islands {', '.join(sc.island_names)}, "
        f"{sc.window_steps}-step windows of {sc.step_ms:.0f} ms ({step_s:.0f} s simulated per "
        f"window), global batch {sc.global_batch}; {fault.kind} fault on rank {slow_rank}, "
        f"+{fault.slowdown:.0%} compute from window {onset}; rebalance apply; {RUNS} runs"
    )
    runs = [one_run(SCENARIO, slow_rank) for _ in range(RUNS)]
    print()
    print(f"{'run':>3} {'wall s':>6} {'flag':>4} {'sent':>4} {'apply step':>10} "
          f"{'verified':>8} {'before':>9} {'after':>9}  plan events")  # fmt: skip
    for i, r in enumerate(runs):
        print(
            f"{i + 1:>3} {r.wall_s:>6.1f} {_f(r.flag_window, 'd'):>4} "
            f"{_f(r.sent_window, 'd'):>4} {_f(r.apply_at_step, 'd'):>10} "
            f"{_f(r.verified_window, 'd'):>8} {_f(r.before, '.1f'):>9} {_f(r.after, '.1f'):>9}  "
            f"{' '.join(r.statuses) or 'none'}{'  (' + r.reason + ')' if r.reason else ''}"
        )
    if any(r.verified_window is None for r in runs):
        print()
        print("FAIL: a run produced no verified plan; plan events are listed above")
        return 1

    healthy_sc = replace(sc, faults=())
    healthy = statistics.median(model_throughput(healthy_sc)[1:])
    uniform_fault = statistics.median(model_throughput(sc)[onset + 1 :])
    at_step = int(_med([r.apply_at_step for r in runs]) or 0)
    split = runs[0].after_split
    plan_thr = model_throughput(sc, split, at_step)
    at_w = -(-at_step // sc.window_steps)
    planned = statistics.median(plan_thr[at_w:])

    best = best_split(sc, onset)
    best_thr = statistics.median(model_throughput(sc, best, at_step)[at_w:])

    before = _med([r.before for r in runs])
    after = _med([r.after for r in runs])
    pol_lost = _med([r.policy_lost for r in runs])
    assert before is not None and after is not None
    lost_pct = 100.0 * (healthy - before) / healthy
    rec_pct = 100.0 * (after - before) / (healthy - before)
    m_lost = 100.0 * (healthy - uniform_fault) / healthy
    m_rec = 100.0 * (planned - uniform_fault) / (healthy - uniform_fault)
    b_rec = 100.0 * (best_thr - uniform_fault) / (healthy - uniform_fault)
    print()
    print(f"{'throughput, samples/s':<44} {'measured':>10} {'model':>10}")
    print("-" * 66)
    print(f"{'healthy (no fault)':<44} {'-':>10} {healthy:>10.1f}")
    pol_healthy = None if pol_lost is None else before + pol_lost
    print(f"{'  policy healthy baseline (before + lost)':<44} {_f(pol_healthy, '.1f'):>10} {'':>10}")  # fmt: skip
    print(f"{'with the fault, uniform split (before)':<44} {before:>10.1f} {uniform_fault:>10.1f}")
    print(f"{'with the fault, the plan split (after)':<44} {after:>10.1f} {planned:>10.1f}")
    print(f"{'with the fault, best whole-sample split':<44} {'-':>10} {best_thr:>10.1f}")
    print(f"{'lost to the straggler, % of healthy':<44} {lost_pct:>10.1f} {m_lost:>10.1f}")
    print(f"{'recovered by the plan, % of lost':<44} {rec_pct:>10.1f} {m_rec:>10.1f}")
    print(f"{'  best whole-sample split, % of lost':<44} {'-':>10} {b_rec:>10.1f}")
    if pol_healthy is not None and pol_lost:
        p_lost = 100.0 * pol_lost / pol_healthy
        p_rec = 100.0 * (after - before) / pol_lost
        print(f"{'lost, % of the policy baseline':<44} {p_lost:>10.1f} {'':>10}")
        print(f"{'recovered, % of lost per the policy baseline':<44} {p_rec:>10.1f} {'':>10}")

    def after_onset(x: int | None) -> int | None:
        return None if x is None else x - onset + 1

    ver = _med([after_onset(r.verified_window) for r in runs])
    assert ver is not None
    apply_w = _med([None if r.apply_at_step is None else r.apply_at_step // sc.window_steps
                    for r in runs])  # fmt: skip
    print(f"plan split {split}; best whole-sample split {best}")
    print()
    print("time from onset (window counts: onset window = 1, up to the end of the window)")
    print(f"{'stage':<34} {'windows':>8} {'simulated s':>12}")
    print("-" * 56)
    for name, w in (
        ("flagged", _med([after_onset(r.flag_window) for r in runs])),
        ("plan sent (recommended)", _med([after_onset(r.sent_window) for r in runs])),
        ("split in force (apply_at_step)", None if apply_w is None else apply_w - onset),
        ("verified recovery", ver),
    ):
        print(f"{name:<34} {_f(w, '.0f'):>8} {_f(None if w is None else w * step_s, '.0f'):>12}")
    print("(split in force: whole windows of the fault before the first step on the new split)")
    print(f"wall per run: median {statistics.median(r.wall_s for r in runs):.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
