"""Findings: exact keys and types for every kind, the JSONL writer, the logger."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from artemis.coordinator.sinks import FindingsWriter
from artemis.detect.detector import Detector
from artemis.detect.findings import (
    FIELDS,
    Finding,
    flag_message,
    hang_finding,
)
from artemis.detect.hang import check_hang
from artemis.detect.settings import Settings
from artemis.protocol.records import RankProgress, Telemetry
from test_detector_support import make_window

NUM = (int, float)
TYPES: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "state": (str,),
    "window": (int,),
    "steps": (list,),
    "island": (str, type(None)),
    "rank": (int, type(None)),
    "ranks": (list,),
    "hosts": (list,),
    "since": (int, type(None)),
    "ratio": (*NUM, type(None)),
    "z": (*NUM, type(None)),
    "history": (*NUM, type(None)),
    "drift": (*NUM, type(None)),
    "excess_ms": (*NUM, type(None)),
    "loss_pct": (*NUM, type(None)),
    "confidence": (str,),
    "signal": (str,),
    "basis": (str,),
    "missing": (list,),
    "evidence": (dict, type(None)),
    "cause": (dict, type(None)),
    "job": (str,),
}


def every_kind() -> list[Finding]:
    """Findings of every kind, produced by the real detector and hang code."""
    isl = ["nvidia"] * 4 + ["amd"] * 4 + ["intel"] * 2
    tel = {r: Telemetry(sm_mhz=1500, temp_c=60, throttle={}) for r in range(10)}
    tel[1] = Telemetry(sm_mhz=1000, temp_c=60, throttle={})
    det = Detector(Settings(), "job1", 10, island_order=["nvidia", "amd", "intel"])
    out: list[Finding] = []
    for w in range(14):
        gap = np.array([100.0] * 8 + [70.0, 70.0])
        transfer = np.full(10, 10.0)
        bridge = {0: (5.0, 1), 4: (5.0, 0)}
        if w >= 7:
            gap[1] = 125.0  # rank
            gap[4:8] *= 1.25  # island amd
            gap[9] = 84.0  # degraded (intel has 2 ranks)
            transfer[:4] = 13.5  # collective nvidia
            bridge = {0: (7.0, 1), 4: (7.0, 0)}
        # Time in collectives = transfer + the wait for the last rank to arrive.
        coll = transfer + (gap.max() - gap)
        recs = make_window(w, gap, coll=coll, islands=isl, bridge=bridge, telemetry=tel)
        out += det.score_window(w, recs).findings
    v = check_hang(
        [
            RankProgress("job1", "c", 0, "h0", 9, 10, 30.0, 30.0),
            RankProgress("job1", "c", 1, "h1", 9, None, 0.0, 30.0),
        ],
        100.0,
        Settings(),
    )
    assert v is not None
    out.append(hang_finding(v, job="job1", window=14, dumps=["/d/1"], hosts={1: "h1"}))
    return out


def test_every_kind_has_exactly_the_design_keys_and_types() -> None:
    found = every_kind()
    kinds = {f.kind for f in found if f.state == "flagged"}
    assert kinds == {"rank", "degraded", "island", "collective", "link", "hang"}
    states = {f.state for f in found}
    assert states == {"suspect", "flagged", "ongoing"}
    for f in found:
        j = f.to_json()
        # The seed keys in their order, then the added `job`.
        assert list(j) == [*FIELDS, "job"] and j["job"] == "job1"
        for key, value in j.items():
            assert isinstance(value, TYPES[key]), (f.kind, key, value)
        assert len(j["steps"]) == 2 or f.kind == "hang"
        assert all(isinstance(r, int) for r in j["ranks"])
        assert all(isinstance(h, str) for h in j["hosts"])
        assert all(isinstance(m, str) for m in j["missing"])
        if j["cause"] is not None:
            assert set(j["cause"]) == {"kind", "text", "evidence", "explained", "alternatives"}
        json.dumps(j, allow_nan=False)  # strict JSON
        if f.kind in ("rank", "degraded"):
            assert j["rank"] is not None and j["cause"] is not None
        else:
            assert j["cause"] is None
        # basis says what judged; confidence what the verdict rests on.
        expect = {
            "rank": ("peers", "peers"),
            "degraded": ("history", "history"),
            "hang": ("progress", "progress"),
        }.get(f.kind, ("history", "baseline"))
        if f.kind == "rank" and j["basis"] in ("both", "history"):
            # the adaptive rule's change test judged it too (or alone)
            expect = (j["basis"], "history" if j["basis"] == "history" else "peers")
        assert (j["basis"], j["confidence"]) == expect, f.kind


def test_design_example_round_trips() -> None:
    f = Finding(
        kind="rank",
        state="flagged",
        window=37,
        steps=[1850, 1900],
        island="nvidia",
        rank=2,
        ranks=[2],
        hosts=["node-a"],
        since=35,
        ratio=1.19,
        z=14.2,
        history=1.18,
        drift=None,
        excess_ms=8.1,
        loss_pct=7.6,
        confidence="peers",
        signal="gap",
        basis="peers",
        missing=[],
        evidence=None,
        cause={"kind": "clocks", "text": "clocks low", "evidence": {"sm_mhz": 1110}},
    )
    line = json.dumps(f.to_json())
    assert json.loads(line)["ratio"] == 1.19 and json.loads(line)["cause"]["kind"] == "clocks"


def test_non_finite_numbers_become_null_and_bad_kinds_are_refused() -> None:
    f = dataclasses.replace(every_kind()[0], ratio=float("inf"), z=float("nan"))
    j = f.to_json()
    assert j["ratio"] is None and j["z"] is None
    with pytest.raises(ValueError, match="kind"):
        Finding(kind="bogus", state="flagged", window=0)


def test_writer_appends_lines_and_logs_new_flags(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    found = every_kind()
    path = tmp_path / "out" / "findings.jsonl"
    with caplog.at_level(logging.WARNING, logger="straggler"):
        with FindingsWriter(path) as w:
            assert w.write(found[:3]) == 3
            # Flushed per window: readable before close.
            assert len(path.read_text().splitlines()) == 3
            assert w.write([]) == 0
        with FindingsWriter(path) as w:  # appends, never truncates
            w.write(found[3:])
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["kind"] for x in lines] == [f.kind for f in found]
    flagged = [f for f in found if f.state == "flagged"]
    records = [r for r in caplog.records if r.name == "straggler"]
    assert len(records) == len(flagged)
    assert all(r.levelno == logging.WARNING for r in records)
    assert [r.getMessage() for r in records] == [flag_message(f) for f in flagged]
    rank_msg = next(flag_message(f) for f in flagged if f.kind == "rank")
    assert "rank 1" in rank_msg and "cause clocks" in rank_msg and "\n" not in rank_msg
