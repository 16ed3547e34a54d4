"""This tree against an earlier commit, side by side: ``python -m bench.ab --base REV``.

The redesign's rule (issue 28): the ingest, scoring and agent benches no slower than
the commit before it, measured in the same run, interleaved, at least 5 runs of each,
the median within 5%. Each run is one fresh process per tree that times the same
probes through that tree's own code and its own bench helpers (``bench.ingest.measure``,
``bench.agent_summary.measure``, ``bench.scoring._records`` exist on both sides of the
redesign; the core's import path moved, so the probe tries both). Runs go in ABBA
order, so a drift in the machine's load falls on both trees alike. Not in the default
``python -m bench`` list (it checks out a second tree and takes minutes).

The base tree is a temporary ``git worktree`` of REV; its packages are found through a
folder of links (``artemis.<room>`` -> ``<room>/``, read from REV's pyproject.toml),
put first on PYTHONPATH, so neither tree needs installing. The compiled plugin and
backend extension are this tree's (the ingest probe runs neither).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# One process, one tree: prints {probe: seconds} as JSON on its last line. Both trees
# hold these helpers; only the core's package moved (coordinator -> detect).
PROBE = r"""
import copy, json, sys, time
import numpy as np
try:  # the old path first: the installed tree would answer the new one for any tree
    from artemis.coordinator.detector import Detector
    from artemis.coordinator.monitor import JobMonitor
    from artemis.coordinator.settings import Settings
except ImportError:
    from artemis.detect.detector import Detector
    from artemis.detect.monitor import JobMonitor
    from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowColumns
import os, subprocess
# The benches pin their children's PYTHONPATH to their tree's root (bench.ingest's
# clients and server), which would import the installed tree's rooms: put this tree's
# links first for them too.
_init = subprocess.Popen.__init__
def _popen(self, *a, **k):
    env = k.get("env")
    if env is not None and "PYTHONPATH" in env:
        k["env"] = {**env, "PYTHONPATH": sys.argv[3] + os.pathsep + env["PYTHONPATH"]}
    _init(self, *a, **k)
subprocess.Popen.__init__ = _popen
import bench.agent_summary as agent
import bench.ingest as ingest
import bench.scoring as scoring

out = {}
which = sys.argv[1].split(",")
if "agent" in which:
    out["agent_summary us/window (10 polls)"] = agent.measure(10)
if "scoring" in which:
    rng = np.random.default_rng(0)
    for n in (16_000, 100_000):
        cols = [WindowColumns.from_records(scoring._records(n, w, rng)) for w in range(8)]
        det = Detector(Settings(), "bench", n)
        mon = JobMonitor("bench", Settings(), nranks=n)
        for w in range(7):
            det.score_window(w, cols[w])
            mon.on_window(w, cols[w])
        # Wall and CPU time of the same calls: on a shared machine the CPU time moves
        # less with the load (not at all with the waits for a core). score_window as
        # bench.scoring._fresh_s times it: the median of 5, after a first copy.
        for probe, obj, first in (("score_window", det, 1), ("JobMonitor.on_window", mon, 0)):
            ts, cs = [], []
            for m in [copy.deepcopy(obj) for _ in range(5 + first)]:
                if probe == "JobMonitor.on_window":
                    m.last_window -= 1
                t0, c0 = time.perf_counter(), time.process_time()
                if probe == "score_window":
                    m.score_window(7, cols[7])
                else:
                    m.on_window(m.last_window + 1, cols[7])
                ts.append(time.perf_counter() - t0)
                cs.append(time.process_time() - c0)
            out[f"{probe} ms ({n} ranks)"] = sorted(ts[first:])[len(ts[first:]) // 2]
            out[f"{probe} CPU ms ({n} ranks)"] = sorted(cs[first:])[len(cs[first:]) // 2]
if "ingest" in which:
    wall, per_cpu_s = ingest.measure("coordinator", 10_000, 64)
    out["ingest rank-windows/CPU-s (10k ranks, 64/agent)"] = per_cpu_s
import artemis.protocol.records as r
for f in (r.__file__, sys.modules[Detector.__module__].__file__):  # this tree's code only
    assert os.path.realpath(f).startswith(os.path.realpath(sys.argv[2]) + "/"), f
print(json.dumps(out))
"""

SCALE = {"us/window": 1e6, "ms (": 1e3}


def _links(where: Path, tree: Path) -> Path:
    """A folder ``where`` in which ``artemis.<room>`` links to ``tree``'s folder for it
    (read from the tree's own pyproject.toml): put first on PYTHONPATH."""
    pkg = where / "artemis"
    pkg.mkdir(parents=True)
    text = (tree / "pyproject.toml").read_text()
    for name, folder in re.findall(r'^"artemis\.([a-z_]+)" = "([a-z_/]+)"$', text, re.M):
        (pkg / name).symlink_to(tree / folder)
    return where


def _base_tree(rev: str, where: Path) -> Path:
    tree = where / "base"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(tree), rev], cwd=REPO, check=True
    )
    # the compiled parts (git ignores them) come from this tree
    for built in ("agent/_plugin", "job/_ext"):
        src = REPO / built
        if src.exists() and not (tree / built).exists():
            (tree / built).symlink_to(src)
    return tree


def _run(tree: Path, pkg: Path, probes: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=f"{pkg}{os.pathsep}{tree}")
    env.pop("ARTEMIS_CONFIG", None)
    p = subprocess.run(
        [sys.executable, "-c", PROBE, probes, str(tree), str(pkg)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if p.returncode != 0:
        raise SystemExit(f"probe failed in {tree}:\n{p.stderr[-3000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def _scaled(name: str, v: float) -> float:
    for unit, k in SCALE.items():
        if unit in name:
            return v * k
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare against (e.g. HEAD~5)")
    ap.add_argument("--runs", type=int, default=6, help="runs per tree (ABBA order; even)")
    ap.add_argument("--probes", default="agent,scoring,ingest", help="agent,scoring,ingest")
    a = ap.parse_args(argv)
    rev = subprocess.run(
        ["git", "rev-parse", "--short", a.base], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="artemis-ab-") as tmp:
        base = _base_tree(a.base, Path(tmp))
        try:
            trees = {
                "base": (base, _links(Path(tmp) / "pkg-base", base)),
                "this": (REPO, _links(Path(tmp) / "pkg-this", REPO)),
            }
            got: dict[str, dict[str, list[float]]] = {"base": {}, "this": {}}
            order = ["base", "this", "this", "base"] * ((a.runs + 1) // 2)
            for i, side in enumerate(order):
                tree, pkg = trees[side]
                for k, v in _run(tree, pkg, a.probes).items():
                    got[side].setdefault(k, []).append(v)
                print(f"run {i + 1}/{len(order)} ({side}) done", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO)
    print(f"this tree ({head}) against {a.base} ({rev}): median of {len(order) // 2} runs each,")
    print("interleaved ABBA; ratio = this / base (times: lower is faster; /CPU-s: higher is)")
    print(f"{'probe':<48} {'base':>10} {'this':>10} {'ratio':>6}  within 5%")
    for name in got["base"]:
        b = statistics.median(_scaled(name, v) for v in got["base"][name])
        t = statistics.median(_scaled(name, v) for v in got["this"][name])
        higher_better = "/CPU-s" in name  # a throughput; the rest are times
        ok = "yes" if (t >= b / 1.05 if higher_better else t <= b * 1.05) else "no"
        print(f"{name:<48} {b:>10.2f} {t:>10.2f} {t / b:>6.3f}  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
