"""`artemis run`'s end-of-run text and JSON (cli/run_summary.py), on made-up findings."""

from __future__ import annotations

import json
from pathlib import Path

from artemis.cli.run_summary import (
    RingCensus,
    full_window_possible,
    incident_lines,
    latest_findings,
    metric_value,
    no_collective_lines,
    one_line,
    short_job_line,
    summary_json,
    summary_lines,
    watched_line,
)


def _f(state: str, window: int, cause: str | None, rank: int = 2) -> dict[str, object]:
    return {
        "job": "j",
        "kind": "rank",
        "rank": rank,
        "state": state,
        "window": window,
        "loss_pct": 5.0,
        "cause": {"kind": cause, "text": f"{cause} text"} if cause else None,
    }


def test_summary_gives_the_cause_of_the_live_flag_line() -> None:
    found = [_f("suspect", 3, None), _f("flagged", 4, "host"), _f("ongoing", 5, "unknown")]
    (head, line) = summary_lines(found)
    assert head == "[artemis] summary: 1 flagged"
    assert "cause host: host text" in line and "(later lines: unknown)" in line, line
    assert summary_lines([_f("suspect", 3, "host")]) == ["[artemis] summary: nothing flagged"]


def test_watched_line_and_census_rules() -> None:
    c = RingCensus(ranks={0, 1, 2, 3}, hosts={"a"}, records=21, rings=4)
    assert watched_line(c, 21) == "[artemis] watched 4 ranks on 1 host, 21 windows scored"
    assert watched_line(RingCensus(), 1) == "[artemis] watched 0 ranks on 0 hosts, 1 window scored"
    assert not full_window_possible(c, 50, 0) and full_window_possible(c, 20, 1)
    assert not full_window_possible(c, 20, 2)  # 21 collectives at 2 a step: 10 steps
    assert short_job_line(c, 50, 0).endswith("21 of 50 steps (--window-steps sets the window)")
    assert c.collectives_seen and not RingCensus().collectives_seen


def test_no_collective_names_the_likely_reasons() -> None:
    text = "\n".join(no_collective_lines(RingCensus(), plugin=True))
    assert "no collective seen" in text
    assert "gloo" in text and "init_process_group('artemis')" in text
    assert "plugin was not loaded" in text and "older than the profiler API" in text
    assert "no profiler plugin is built" in "\n".join(no_collective_lines(RingCensus(), False))


def test_metric_value_reads_one_jobs_sample() -> None:
    text = (
        "# HELP straggler_windows_scored_total x\n"
        'straggler_windows_scored_total{job="other"} 7.0\n'
        'straggler_windows_scored_total{job="j"} 21.0\n'
        'straggler_windows_scored_total_created{job="j"} 1.7e9\n'
    )
    assert metric_value(text, "straggler_windows_scored_total", "j") == 21.0
    assert metric_value(text, "straggler_windows_scored_total", "none") is None
    assert metric_value("", "straggler_windows_scored_total", "j") is None


def test_summary_json_keeps_the_latest_per_subject_and_incident(tmp_path: Path) -> None:
    found = [_f("flagged", 4, "host"), _f("suspect", 4, None, rank=1), _f("cleared", 9, "host")]
    assert [f["window"] for f in latest_findings(found)] == [9, 4]
    c = RingCensus(ranks={0, 1}, hosts={"b", "a"}, records=3)
    obj = summary_json("j", c, 2, 7, found, {"i1": {"id": "i1", "verdict": "confirmed"}})
    assert obj == {
        "job": "j",
        "ranks": 2,
        "hosts": ["a", "b"],
        "windows_scored": 2,
        "collectives_seen": True,
        "exit_code": 7,
        "findings": latest_findings(found),
        "incidents": [{"id": "i1", "verdict": "confirmed"}],
    }


def test_a_cpu_jobs_missing_telemetry_is_named_once_and_its_hours_are_cpu(tmp_path: Path) -> None:
    # (issue 31, item 9) every line keeps its `missing`; the summary names them once
    gaps = ["cg_throttled_pct", "run_delay_pct"]
    found = [
        {**_f(s, w, "unknown"), "missing": gaps}
        for s, w in (("suspect", 3), ("flagged", 4), ("ongoing", 5))
    ]
    found.append({**_f("flagged", 6, None, rank=1), "kind": "missing", "missing": ["rank 1"]})
    lines = summary_lines(found)
    said = [s for s in lines if "not reported" in s]
    assert said == ["[artemis] telemetry not reported by this job's ranks: " + ", ".join(gaps)]
    assert not any("not reported" in s for s in summary_lines([_f("flagged", 4, "host")]))
    rec = {"id": "j-r2-w4", "job": "j", "verdict": "unresolved", "cost": {"gpu_hours": 0.012}}
    path = tmp_path / "incidents.jsonl"
    path.write_text(json.dumps({**rec, "cost": {**rec["cost"], "unit": "cpu"}}) + "\n")
    assert incident_lines(path, "j") == ["  incident j-r2-w4: unresolved; cost 0.012 CPU-hours"]
    path.write_text(json.dumps(rec) + "\n")  # a record from before cost.unit: a GPU job's
    assert incident_lines(path, "j") == ["  incident j-r2-w4: unresolved; cost 0.012 GPU-hours"]


def test_a_field_missing_from_some_lines_only_is_not_said_to_be_unreported() -> None:
    # A rank moved into a quota cgroup misses the throttled figure in one window only;
    # the later lines' cause is that figure, so "not reported" would contradict them.
    nic = ["nic_link_downed", "nic_symbol_errors"]
    found = [{**_f("suspect", 3, "host"), "missing": [*nic, "cg_throttled_pct"]}]
    found += [{**_f("flagged", 4, "host"), "missing": nic}]
    found += [{**_f("ongoing", 5, "host"), "missing": nic}]
    # a cleared line names no cause and so no `missing`: it does not count
    found += [{**_f("cleared", 6, None), "missing": []}]
    said = [s for s in summary_lines(found) if "not reported" in s or "missing from" in s]
    assert said == [
        "[artemis] telemetry not reported by this job's ranks: "
        + ", ".join(nic)
        + "; and missing from some lines only: cg_throttled_pct (1 of 3)"
    ]
    only_some = [found[0], {**_f("flagged", 4, "host"), "missing": []}]
    said = [s for s in summary_lines(only_some) if "missing from" in s]
    assert said == [
        "[artemis] telemetry missing from some lines only: "
        + ", ".join(f"{m} (1 of 2)" for m in sorted([*nic, "cg_throttled_pct"]))
    ]


def test_a_collective_line_says_what_slowed_not_cause_none() -> None:
    # A job on a bandwidth-limited network (600 Mbit/s on its loopback from step 300):
    # the `collective` kind carries no `cause` (its kind says it); the live line and
    # the summary said "cause none" and nothing of what slowed.
    f = {
        "job": "j",
        "kind": "collective",
        "rank": None,
        "island": "default",
        "state": "flagged",
        "window": 14,
        "loss_pct": 53.8,
        "cause": None,
        "evidence": {"transfer_ms": 77.94, "baseline_transfer_ms": 18.93},
    }
    said = "transfer 77.9 ms vs 18.9 ms at warm-up"
    assert one_line(f).endswith(said) and "collectives slowed" in one_line(f)
    lines = summary_lines([f, {**f, "state": "ongoing", "window": 15}])
    assert "cause none" not in lines[1] and lines[1].endswith(said), lines
    # a cleared line says only that it cleared
    assert one_line({**f, "state": "cleared"}).endswith("window 14 loss 53.8%")
