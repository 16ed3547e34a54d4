"""The pure judgement of `artemis regress` runs (regress/core.py): baselines from
earlier runs, the noise rule, persistence over a benchmark's items, the kinds of the
findings and what they carry. Plain run records; no torch, no store."""

from __future__ import annotations

from typing import Any

import pytest
from artemis.cli.regress import parse_cpus
from artemis.detect.baselines import software_hash
from artemis.regress import core

SOFT = {"kernel": "6.1.0", "torch": "2.13.0", "env": {"NCCL_ALGO": "Ring"}}
TREE = {**SOFT, "env": {"NCCL_ALGO": "Tree"}}
GEMM = "gemm/bf16x8192"
SWEEP = ("all_reduce/1MiB", "all_reduce/16MiB", "all_reduce/256MiB")
BASE = {GEMM: 1.0e-3, SWEEP[0]: 50e-6, SWEEP[1]: 200e-6, SWEEP[2]: 2e-3}


def samples(median: float, rel: float = 0.004, n: int = 11) -> list[float]:
    """n samples spread evenly by ``rel`` around ``median``."""
    return [median * (1 + rel * (i - n // 2) / (n // 2)) for i in range(n)]


def run(
    t: float,
    node: str = "a",
    scale: dict[str, float] | None = None,
    software: dict[str, Any] | None = None,
    rel: float = 0.004,
    healthy: bool = True,
    **kw: Any,
) -> dict[str, Any]:
    scale = scale or {}
    soft = software or SOFT
    r = core.build_run(
        node=node,
        time=t,
        device=kw.pop("device", "cuda"),
        ranks=kw.pop("ranks", 8),
        backend="nccl",
        hardware=kw.pop("hardware", "NVIDIA H100 80GB HBM3"),
        software=soft,
        samples={k: samples(v * scale.get(k, 1.0), rel) for k, v in BASE.items()},
        benchmarks={k: k.split("/")[0] for k in BASE},
        absent={},
        duration_s=1.0,
        meta={},
    )
    r["healthy"] = healthy
    return r


def test_summarise() -> None:
    s = core.summarise([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median"], s["p25"], s["p75"], s["n"]) == (3.0, 2.0, 4.0, 5)
    with pytest.raises(ValueError):
        core.summarise([])
    with pytest.raises(ValueError):
        core.summarise([1.0, float("nan")])


def test_the_fingerprint_is_the_baseline_helpers_hash() -> None:
    assert run(1.0)["fingerprint"] == software_hash(SOFT)
    assert run(1.0, software=TREE)["fingerprint"] != run(1.0)["fingerprint"]


def test_no_baseline_before_two_healthy_runs() -> None:
    j = core.judge(run(3.0, scale={GEMM: 2.0}), [run(1.0)])
    assert j.verdict == "no-baseline" and not j.flagged and j.healthy
    # An unhealthy run never counts towards a baseline.
    j = core.judge(run(3.0, scale={GEMM: 2.0}), [run(1.0), run(2.0, healthy=False)])
    assert j.verdict == "no-baseline"


def test_two_runs_are_a_stable_baseline_and_a_quiet_run_is_ok() -> None:
    earlier = [run(1.0), run(2.0, scale={GEMM: 1.003})]
    j = core.judge(run(3.0, scale={GEMM: 1.01}), earlier)
    assert j.verdict == "ok" and j.history_runs == 2 and not j.flagged
    (c,) = j.comparisons
    assert c.baseline.basis == "history" and not c.slower


def test_a_slower_gemm_is_a_regression_with_unknown_cause() -> None:
    earlier = [run(1.0), run(2.0)]
    new = run(3.0, scale={GEMM: 1.08})  # 8% slower: above the GPU's 5% floor
    j = core.judge(new, earlier)
    assert j.verdict == "regression" and not j.healthy
    (f,) = core.findings_of(new, j, window=2)
    assert f.kind == "regression" and f.state == "flagged"
    assert f.cause is not None and f.cause["kind"] == "unknown"
    ev = f.evidence or {}
    assert ev["slower_benchmarks"] == ["gemm"] and ev["basis"] == "history"
    assert ev["slower_pct"] == pytest.approx(8.0, abs=0.01)
    assert ev["items"][GEMM]["slower"] and not ev["items"][SWEEP[0]]["slower"]
    assert ev["hw_class"] == "NVIDIA H100 80GB HBM3" and f.subject == ev["hw_class"]
    assert ev["checked"] == ["env.NCCL_ALGO", "kernel", "torch"]
    assert f.ratio == pytest.approx(1.08, rel=1e-6)
    assert f.job == "regress/a" and f.hosts == ["a"] and f.window == 2


def test_below_the_floor_or_inside_the_noise_is_nothing() -> None:
    earlier = [run(1.0), run(2.0)]
    assert core.judge(run(3.0, scale={GEMM: 1.04}), earlier).verdict == "ok"
    # Noisy baseline runs (10% apart): the threshold is 3 x their scatter.
    noisy = [run(1.0), run(2.0, scale={GEMM: 1.10})]
    j = core.judge(run(3.0, scale={GEMM: 1.12}), noisy)
    assert j.verdict == "ok"
    (c,) = j.comparisons
    v = next(x for x in c.items if x.item == GEMM)
    assert v.threshold == pytest.approx(1 + 3 * (1.10 / 1.05 - 1), rel=1e-6)
    assert core.judge(run(3.0, scale={GEMM: 1.30}), noisy).verdict == "regression"


def test_a_burst_inside_the_run_is_not_a_slowdown() -> None:
    """The median above the threshold but the lower quartile inside the baseline's
    samples: a part of the run was slow, not the run."""
    earlier = [run(1.0, rel=0.2), run(2.0, rel=0.2)]
    new = run(3.0, scale={GEMM: 1.10}, rel=0.2)  # wide samples: p25 below the baseline's p75
    j = core.judge(new, earlier)
    v = next(x for x in j.comparisons[0].items if x.item == GEMM)
    assert v.ratio > v.threshold and not v.slower
    assert j.verdict == "ok"


def test_persistence_over_a_benchmarks_items() -> None:
    earlier = [run(1.0), run(2.0)]
    one = core.judge(run(3.0, scale={SWEEP[2]: 1.5}), earlier)  # one size of three
    assert one.verdict == "ok"
    two = core.judge(run(3.0, scale={SWEEP[1]: 1.5, SWEEP[2]: 1.5}), earlier)
    assert two.verdict == "regression"
    assert two.flagged[0][1].slower_benchmarks == ("all_reduce",)


def test_a_changed_fingerprint_is_a_change_naming_it() -> None:
    earlier = [run(1.0), run(2.0)]
    new = run(3.0, scale={GEMM: 1.2}, software=TREE)
    j = core.judge(new, earlier)
    assert j.verdict == "change" and j.history_runs == 0
    (f,) = core.findings_of(new, j, window=2)
    assert f.kind == "change"
    assert (f.evidence or {})["changed"] == {"env.NCCL_ALGO": ["Ring", "Tree"]}
    assert (f.evidence or {})["baseline_fingerprint"] == software_hash(SOFT)
    assert f.cause is not None and f.cause["kind"] == "software"


def test_a_change_without_slowdown_is_nothing_and_starts_its_own_baseline() -> None:
    earlier = [run(1.0), run(2.0)]
    first = run(3.0, software=TREE)
    j = core.judge(first, earlier)
    assert j.verdict == "ok" and j.healthy  # judged against the old fingerprint's baseline
    assert j.comparisons[0].baseline.fingerprint == software_hash(SOFT)
    second = run(4.0, software=TREE)
    later = run(5.0, software=TREE, scale={GEMM: 1.2})
    j = core.judge(later, [*earlier, first, second])
    assert j.verdict == "regression"  # the new fingerprint's own baseline now
    assert j.comparisons[0].baseline.fingerprint == software_hash(TREE)


def test_history_takes_the_latest_healthy_runs_of_the_same_setup() -> None:
    earlier = [run(float(t)) for t in range(1, 9)]
    earlier += [run(9.0, scale={GEMM: 3.0}, healthy=False)]
    earlier += [run(10.0, ranks=4), run(11.0, device="cpu"), run(12.0, node="b")]
    base = core.history_baseline(run(20.0), earlier)
    assert base is not None
    assert [r["time"] for r in base.runs] == [8.0, 7.0, 6.0, 5.0, 4.0]


def test_peers_need_two_other_nodes_of_the_class() -> None:
    mine = run(10.0, node="c", scale={GEMM: 1.3})
    one = [run(5.0, node="a")]
    assert core.judge(mine, one).verdict == "no-baseline"
    peers = [
        run(5.0, node="a"),
        run(4.0, node="a", scale={GEMM: 9.0}),  # older: only a node's latest run counts
        run(6.0, node="b"),
        run(7.0, node="x", hardware="AMD MI300X"),  # another class
        run(8.0, node="y", healthy=False, scale={GEMM: 2.0}),
        run(9.0, node="c"),  # the node itself
    ]
    j = core.judge(mine, [], peers)
    assert j.verdict == "regression"
    (c,) = j.comparisons
    assert c.baseline.basis == "peers" and c.baseline.nodes == ["a", "b"]
    (f,) = core.findings_of(mine, j, window=0)
    assert (f.evidence or {})["basis"] == "peers"
    # Peers that run another fingerprint: the node's slowdown is a change against them.
    tree = [run(5.0, node="a", software=TREE), run(6.0, node="b", software=TREE)]
    j = core.judge(mine, [], tree)
    assert j.verdict == "change"
    (f,) = core.findings_of(mine, j, window=0)
    assert (f.evidence or {})["changed"] == {"env.NCCL_ALGO": ["Tree", "Ring"]}
    # Stale peers (older than a week) are not compared with.
    old = [run(10.0 - 8 * 86400, node="a"), run(9.0 - 8 * 86400, node="b")]
    assert core.judge(mine, [], old).verdict == "no-baseline"


def test_the_cpu_floor_and_an_explicit_margin() -> None:
    cpu = {"device": "cpu", "hardware": "cpu X", "ranks": 2}
    earlier = [run(1.0, **dict(cpu)), run(2.0, **dict(cpu))]
    assert core.judge(run(3.0, scale={GEMM: 1.5}, **dict(cpu)), earlier).verdict == "ok"
    assert core.judge(run(3.0, scale={GEMM: 1.7}, **dict(cpu)), earlier).verdict == "regression"
    j = core.judge(run(3.0, scale={GEMM: 1.5}, **dict(cpu)), earlier, margin=0.2)
    assert j.verdict == "regression" and j.comparisons[0].margin == 0.2


def test_parse_cpus() -> None:
    assert parse_cpus(None) == ()
    assert parse_cpus("3") == (3,)
    assert parse_cpus("0,2-4,2") == (0, 2, 3, 4)
