"""bench/finding_path.py measures the path of a finding: it keeps working as the code
moves (the count itself is reported in docs/DESIGN.md, not asserted here)."""

from __future__ import annotations

import re
from pathlib import Path

from bench.finding_path import measure


def test_the_path_is_measured_from_the_ring_reader_to_the_findings_line(tmp_path: Path) -> None:
    files, line = measure(tmp_path)
    assert (line["rank"], line["state"], line["since"]) == (1, "ongoing", 1)
    # Each stage of the flow shows up: ring, agent, wire, coordinator, core.
    for f in ("ring/reader.py", "agent/summary.py", "protocol/codec.py", "detect/detector.py"):
        assert f in files, files
    assert all(f.split("/", 1)[0] not in ("tests", "bench") for f in files)


def test_design_lists_every_file_on_the_path(tmp_path: Path) -> None:
    # docs/DESIGN.md "The path of a finding" names each Python file the flow runs, no
    # more and no fewer (issue 28: the path in DESIGN is kept true by a test).
    design = (Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md").read_text()
    section = design.split("### The path of a finding", 1)[1].split("\n### ", 1)[0]
    listed = set(re.findall(r"`([a-z_/]+\.py)`", section))
    files, _ = measure(tmp_path)
    assert listed == set(files), (
        f"on the path but not in DESIGN: {sorted(set(files) - listed)}; "
        f"in DESIGN but not on the path: {sorted(listed - set(files))}"
    )
