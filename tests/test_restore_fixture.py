"""Saved state from before the redesign (issue 28) restores after it.

tests/data/pre_redesign/state/ is what a coordinator of the commit before the redesign
persisted when it was killed mid-job: the job's monitor snapshot (`f.assembly.jobs/`),
the assembly journal, the SQLite store and the JSONL outputs. expected.json is what that
code wrote when it continued from there. The current code, given the same state and the
same messages, must write the same findings (subjects, states, windows) and incidents.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

FIXTURE = Path(__file__).parent / "data" / "pre_redesign"


def _generator() -> ModuleType:
    # The generator holds the job's inputs (the messages of both lives): one copy of them.
    spec = importlib.util.spec_from_file_location(
        "pre_redesign_fixture", FIXTURE / "make_fixture.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _continued(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    gen = _generator()
    work = tmp_path / "state"
    shutil.copytree(FIXTURE / "state", work)  # never the committed files themselves
    before = gen.line_counts(work)
    gen.second_life(work)
    return before, gen.outcome(work, before)


def test_saved_state_of_the_pre_redesign_coordinator_continues_the_same(tmp_path: Path) -> None:
    expected = json.loads((FIXTURE / "expected.json").read_text())
    before, got = _continued(tmp_path)
    assert before == expected["lines_before"]
    assert got["findings"] == expected["findings"]
    assert got["incidents"] == expected["incidents"]
    assert got["store_incidents"] == expected["store_incidents"]


def test_the_restored_detector_is_the_saved_one(tmp_path: Path) -> None:
    """Window 6 (journaled half, resent half) is scored once, by the restored detector:
    rank 1 ongoing since window 1, as the first life flagged it (a fresh detector would
    call it suspect), and the incident the first life opened is the one closed."""
    _before, got = _continued(tmp_path)
    first = got["findings"][0]
    assert (first["window"], first["rank"], first["state"], first["since"]) == (6, 1, "ongoing", 1)
    assert [f["window"] for f in got["findings"]] == sorted({f["window"] for f in got["findings"]})
    opened = [
        json.loads(x) for x in (FIXTURE / "state" / "incidents.jsonl").read_text().splitlines()
    ]
    assert {r["id"] for r in got["incidents"]} == {r["id"] for r in opened}
