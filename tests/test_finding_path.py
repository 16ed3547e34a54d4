"""bench/finding_path.py measures the path of a finding: it keeps working as the code
moves (the count itself is reported in docs/DESIGN.md, not asserted here)."""

from __future__ import annotations

from pathlib import Path

from bench.finding_path import measure


def test_the_path_is_measured_from_the_ring_reader_to_the_findings_line(tmp_path: Path) -> None:
    files, line = measure(tmp_path)
    assert (line["rank"], line["state"], line["since"]) == (1, "ongoing", 1)
    # Each stage of the flow shows up: ring, agent, wire, coordinator, core.
    for f in ("ring/reader.py", "agent/summary.py", "protocol/codec.py", "detect/detector.py"):
        assert f in files, files
    assert all(f.split("/", 1)[0] not in ("tests", "bench") for f in files)
