"""Metrics: the DESIGN names, values from a window, a real HTTP scrape."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest
from artemis.coordinator.metrics import Metrics
from artemis.detect.detector import Detector, WindowResult
from artemis.detect.settings import Settings
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_detector_support import WINDOW_STEPS, make_window

ISL = ["nvidia"] * 4 + ["amd"] * 4


def windows(n: int, slow_from: int, stop_at: int | None = None) -> list[WindowResult]:
    det = Detector(Settings(), "job1", 8)
    out = []
    for w in range(n):
        gap = np.full(8, 100.0)
        if w >= slow_from and (stop_at is None or w < stop_at):
            gap[2] = 120.0
        out.append(det.score_window(w, make_window(w, gap, islands=ISL), missing=[]))
    return out


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


def test_observe_and_scrape_over_http() -> None:
    m = Metrics()
    extra = Gauge("straggler_extra_test", "registered by another part", registry=m.registry)
    extra.set(7)
    results = windows(12, slow_from=3, stop_at=6)
    for res in results:
        m.observe_window(res, scoring_seconds=0.002)
    m.set_active(True)
    stop = m.serve(0, addr="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{stop.port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        stop()
    last = results[-1]
    assert (
        value(text, "straggler_rank_pace_ratio", rank="2", island="nvidia", job="job1")
        == last.pace[2]
    )
    assert value(text, "straggler_step_ms", job="job1") == last.step_ms
    assert value(text, "straggler_missing_ranks", job="job1") == 0
    assert value(text, "straggler_detector_active") == 1
    assert value(text, "straggler_last_window", job="job1") == 11
    assert value(text, "straggler_windows_scored_total", job="job1") == 12
    assert value(text, "straggler_scoring_seconds_count", job="job1") == 12
    assert value(text, "straggler_extra_test") == 7
    # Windows 3, 4 suspect; 5 flagged; 6, 7 ongoing (recovering); 8 cleared.
    counts: dict[tuple[str, str], int] = {}
    for res in results:
        for f in res.findings:
            counts[(f.kind, f.state)] = counts.get((f.kind, f.state), 0) + 1
    assert counts == {
        ("rank", "suspect"): 2,
        ("rank", "flagged"): 1,
        ("rank", "ongoing"): 2,
        ("rank", "cleared"): 1,
    }
    for (kind, state), n in counts.items():
        assert value(text, "straggler_findings_total", kind=kind, state=state, job="job1") == n
    assert value(text, "straggler_flagged", kind="rank", subject="2", job="job1") == 0  # cleared
    hours = 3 * 20.0 / 1000 * WINDOW_STEPS * 8 / 3600  # windows 3..5, confirmed at 5
    assert value(text, "straggler_gpu_hours_lost_total", job="job1") == last.gpu_hours_lost
    # The ongoing windows 6 and 7 are healthy again: no excess, no cost.
    assert last.gpu_hours_lost == pytest.approx(hours)


def test_flagged_gauge_while_it_lasts_and_missing_count() -> None:
    m = Metrics()
    for res in windows(7, slow_from=1):
        m.observe_window(res, 0.001)
    text = generate_latest(m.registry).decode()
    assert value(text, "straggler_flagged", kind="rank", subject="2", job="job1") == 1
    det = Detector(Settings(), "job1", 8)
    res = det.score_window(1, make_window(1, [100.0] * 5, nranks=8), missing=[5, 6, 7])
    m.observe_window(res, 0.001)
    text = generate_latest(m.registry).decode()
    assert value(text, "straggler_missing_ranks", job="job1") == 3
    # Ranks that stopped reporting lose their pace series.
    names = {k for k in samples(text) if k[0] == "straggler_rank_pace_ratio"}
    assert {dict(k[1])["rank"] for k in names} == {"0", "1", "2", "3", "4"}


def test_two_jobs_keep_their_own_series_and_one_ending_leaves_the_other() -> None:
    m = Metrics()
    for job, slow in (("a", 2), ("b", 6)):
        det = Detector(Settings(), job, 8)
        for w in range(6):
            gap = [100.0] * 8
            gap[slow] = 130.0
            m.observe_window(det.score_window(w, make_window(w, gap, islands=ISL, job=job)), 0.001)
    text = generate_latest(m.registry).decode()
    for job, slow in (("a", 2), ("b", 6)):
        # Each job's rank 2 is its own: the straggler in a, a healthy rank in b.
        pace2 = value(text, "straggler_rank_pace_ratio", job=job, rank="2", island="nvidia")
        assert pace2 == pytest.approx(1.3 if slow == 2 else 1.0)
        assert value(text, "straggler_flagged", job=job, kind="rank", subject=str(slow)) == 1
        assert value(text, "straggler_windows_scored_total", job=job) == 6
    m.forget_job("a")
    left = samples(generate_latest(m.registry).decode())
    assert not [k for k in left if ("job", "a") in k[1]]
    assert (
        value(
            generate_latest(m.registry).decode(),
            "straggler_flagged",
            job="b",
            kind="rank",
            subject="6",
        )
        == 1
    )
    assert len([k for k in left if ("job", "b") in k[1]]) > 8


def test_a_job_over_the_pace_series_limit_exports_its_ranks_farthest_from_pace() -> None:
    full, capped = Metrics(), Metrics(pace_series_max=4)
    for res in windows(6, slow_from=3):
        full.observe_window(res, scoring_seconds=0.001)
        capped.observe_window(res, scoring_seconds=0.001)

    def pace(m: Metrics) -> dict[str, float]:
        text = generate_latest(m.registry).decode()
        return {
            dict(lab)["rank"]: v
            for (name, lab), v in samples(text).items()
            if name == "straggler_rank_pace_ratio"
        }

    every, some = pace(full), pace(capped)
    assert len(every) == 8 and len(some) == 4
    # The four farthest from pace (ties among the healthy ranks go either way).
    cut = sorted((abs(np.log(v)) for v in every.values()), reverse=True)[3]
    assert all(abs(np.log(v)) >= cut for v in some.values()) and "2" in some
    assert all(some[r] == every[r] for r in some)


def test_every_straggler_family_is_said_once_in_the_metrics_module() -> None:
    # The coordinator's registry with every part registered, and the agent's collector:
    # each family they export is one of FAMILIES (name, type, help, labels), and every
    # one of FAMILIES is exported by one of them.
    from types import SimpleNamespace

    from artemis.common.diskio import FileHealth
    from artemis.coordinator.metrics import (
        FAMILIES,
        LinkCollector,
        register_plan_metrics,
        register_protocol_metrics,
        register_store_metrics,
    )
    from artemis.protocol.client import LinkStats
    from artemis.protocol.peers import ProtocolStats

    m = Metrics()
    health = FileHealth("findings")
    health.errors["ENOSPC"] += 1
    health.lost["ENOSPC"] += 1
    coord = SimpleNamespace(
        assembler=SimpleNamespace(late=0, duplicates=0),
        write_health=lambda: [health],
        refused_batches=0,
    )
    register_protocol_metrics(m.registry, SimpleNamespace(stats=ProtocolStats()), coord)  # type: ignore[arg-type]
    sink = SimpleNamespace(dropped=0, depth=0, url="sqlite:///x", connected=True)
    register_store_metrics(m.registry, sink)  # type: ignore[arg-type]
    register_plan_metrics(m.registry)
    agent = CollectorRegistry()
    agent.register(LinkCollector("h0", LinkStats, lambda: 0))
    seen = {}
    for reg in (m.registry, agent):
        for fam in reg.collect():
            seen[fam.name] = (fam.type, fam.documentation, fam)
    assert set(seen) == set(FAMILIES)
    for name, (kind, text, labels) in FAMILIES.items():
        got_kind, got_text, fam = seen[name]
        assert (got_kind, got_text) == (kind, text), name
        for s in fam.samples:
            assert set(s.labels) - {"le"} <= set(labels), (name, s.labels)
