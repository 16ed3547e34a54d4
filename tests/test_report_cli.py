"""`artemis report` end to end: from a real SQLite store, from a findings file
(the store next to it, or incidents.jsonl with the findings' own lines), and its
errors; `write_job_report` for the coordinator's report_dir."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from artemis.report.load import (
    ReportError,
    bundles_from_findings,
    incident_link,
    report_path,
    rows_from_findings,
    write_job_report,
)
from artemis.store import open_store, store_url
from report_data import contract_bundle

ARTEMIS = Path(sys.executable).parent / "artemis"


def fill_store(path: Path, bundle: dict[str, Any]) -> str:
    url = store_url(path)
    st = open_store(url)
    try:
        job = bundle["job"]["job"]
        st.write_job(job, {k: v for k, v in bundle["job"].items() if k != "job"})
        st.write_incidents(bundle["incidents"])
        rows = [r for rs in bundle["subjects"].values() for r in rs]
        st.write_rows(bundle["windows"], rows)
    finally:
        st.close()
    return url


def run_report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ARTEMIS), "report", *args], capture_output=True, text=True, timeout=60
    )


def test_from_a_store(tmp_path: Path) -> None:
    b = contract_bundle()
    url = fill_store(tmp_path / "artemis.db", b)
    other = contract_bundle(job="other-job", windows=30)
    other["incidents"] = other["incidents"][:1]
    other["subjects"] = {
        k: v for k, v in other["subjects"].items() if k == other["incidents"][0]["id"]
    }
    other["incidents"][0]["closed"]["window"] = 29
    fill_store(tmp_path / "artemis.db", other)
    out = tmp_path / "reports"
    res = run_report("--store", url, "--out", str(out))
    assert res.returncode == 0, res.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == ["flagship-sim.html", "other-job.html"]
    html = (out / "flagship-sim.html").read_text()
    for inc in b["incidents"]:
        assert f'data-incident="{inc["id"]}"' in html
    assert html.count('data-series="peers"') == 3  # the bands came from the store's rows
    assert "8</td>" in html  # ranks, from the job's record
    assert "3 incidents" in res.stdout and "1 incident)" in res.stdout

    # One job, one incident.
    res = run_report("--store", url, "--out", str(out), "--incident", b["incidents"][1]["id"])
    assert res.returncode == 0, res.stderr
    one = out / f"flagship-sim--{b['incidents'][1]['id']}.html"
    text = one.read_text()
    assert text.count('class="incident"') == 1 and b["incidents"][1]["id"] in text


def test_findings_with_the_store_next_to_it(tmp_path: Path) -> None:
    b = contract_bundle()
    fill_store(tmp_path / "artemis.db", b)
    findings = tmp_path / "findings.jsonl"
    findings.write_text("")
    out = tmp_path / "r"
    res = run_report("--findings", str(findings), "--out", str(out), "--job", "flagship-sim")
    assert res.returncode == 0, res.stderr
    html = (out / "flagship-sim.html").read_text()
    assert html.count('data-series="peers"') == 3


def finding(window: int, state: str, rank: int = 2, ratio: float = 1.15) -> dict[str, Any]:
    return {
        "kind": "rank", "state": state, "window": window, "island": "nvidia", "rank": rank,
        "ranks": [rank], "hosts": ["node-a"], "since": 16, "ratio": ratio, "excess_ms": 9.0,
        "loss_pct": 8.26, "evidence": {"gap_ms": 62.0 * ratio, "peers_gap_ms": 62.0},
        "job": "flagship-sim",
    }  # fmt: skip


def test_findings_with_incidents_jsonl_only(tmp_path: Path) -> None:
    b = contract_bundle()
    inc = b["incidents"][0]
    (tmp_path / "incidents.jsonl").write_text(
        json.dumps({**inc, "change": "opened", "status": "open", "verdict": None})
        + "\n"
        + json.dumps(inc)
        + "\n"
    )
    lines = [finding(16, "suspect"), finding(17, "suspect"), finding(18, "flagged")]
    lines += [finding(w, "ongoing", ratio=1.15 + w / 1000) for w in range(19, 60)]
    lines += [finding(30, "suspect", rank=5)]  # another rank: not this incident's series
    findings = tmp_path / "findings.jsonl"
    findings.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"cut by a cr')
    (bundle,) = bundles_from_findings(findings)
    subj = bundle["subjects"][inc["id"]]
    assert [r["window"] for r in subj] == list(range(16, 60))
    assert subj[-1]["ratio"] == pytest.approx(1.15 + 59 / 1000)
    assert bundle["windows"][0]["step_ms"] == pytest.approx(100.0 * 9.0 / 8.26)
    assert bundle["notes"] and "kept only in the store" in bundle["notes"][0]
    out = tmp_path / "r"
    res = run_report("--findings", str(findings), "--out", str(out))
    assert res.returncode == 0, res.stderr
    html = (out / "flagship-sim.html").read_text()
    assert 'data-series="subject"' in html and "peer bands not recorded" in html


def test_actions_from_the_plans_file(tmp_path: Path) -> None:
    inc = contract_bundle()["incidents"][0]
    inc["actions"] = []
    (tmp_path / "incidents.jsonl").write_text(json.dumps(inc) + "\n")
    findings = tmp_path / "findings.jsonl"
    findings.write_text(json.dumps(finding(18, "flagged")) + "\n")
    plans = tmp_path / "plans.jsonl"
    plan = {"id": "p1", "window": 20, "rank": 2, "job": "flagship-sim",
            "throughput_before": 2000.0, "throughput_after": None}  # fmt: skip
    plans.write_text(
        json.dumps({**plan, "status": "recommended"})
        + "\n"
        + json.dumps({**plan, "status": "applied", "window": 23})
        + "\n"
        + json.dumps({**plan, "status": "verified", "window": 28, "throughput_after": 2200.0})
        + "\n"
    )
    (bundle,) = bundles_from_findings(findings, plans)
    (act,) = bundle["incidents"][0]["actions"]
    assert act["status"] == "verified" and act["gain_pct"] == pytest.approx(10.0)
    assert [h["window"] for h in act["history"]] == [20, 23, 28]


def test_rows_from_findings_ignore_cleared_and_other_subjects() -> None:
    inc = contract_bundle()["incidents"][1]  # rank 6, windows 34..42
    lines = [finding(w, "ongoing", rank=6) for w in range(30, 50)]
    lines.append({**finding(43, "cleared", rank=6)})
    lines.append(finding(38, "ongoing", rank=2))
    _, subj = rows_from_findings(lines, [inc])
    assert [r["window"] for r in subj[inc["id"]]] == list(range(34, 43))


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--findings", "{tmp}/nope.jsonl"], "no such findings file"),
        (["--findings", "{tmp}/empty/findings.jsonl"], "no incident store next to"),
        (["--store", "sqlite:///{tmp}/artemis.db", "--job", "nope"], "job 'nope' is not in"),
        (
            ["--store", "sqlite:///{tmp}/artemis.db", "--incident", "nope"],
            "incident 'nope' is not in",
        ),
        (["--store", "sqlite:///{tmp}/corrupt.db"], "corrupt.db"),
        (["--store", "sqlite:///{tmp}/none.db"], "none.db"),
        (
            ["--store", "postgresql://a:pw@127.0.0.1:1/y"],
            "postgresql://a@127.0.0.1:1/y: cannot connect",
        ),
        ([], "exactly one of --store"),
        (
            ["--plans", "{tmp}/p.jsonl", "--store", "sqlite:///{tmp}/artemis.db"],
            "--plans goes with",
        ),
    ],
)
def test_errors(tmp_path: Path, args: list[str], want: str) -> None:
    fill_store(tmp_path / "artemis.db", contract_bundle())
    (tmp_path / "corrupt.db").write_bytes(b"this is not a database at all" * 100)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "findings.jsonl").write_text("")
    res = run_report(*[a.format(tmp=tmp_path) for a in args], "--out", str(tmp_path / "o"))
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert want in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_write_job_report(tmp_path: Path) -> None:
    b = contract_bundle()
    url = fill_store(tmp_path / "artemis.db", b)
    st = open_store(url, readonly=True)
    try:
        p = write_job_report(st, "flagship-sim", tmp_path / "reports", generated=1.0)
        with pytest.raises(ReportError, match="job 'nope' is not in"):
            write_job_report(st, "nope", tmp_path / "reports")
    finally:
        st.close()
    assert p == report_path(tmp_path / "reports", "flagship-sim")
    assert p.stat().st_mode & 0o777 == 0o644  # readable by others, like any report
    assert p.read_text().count('class="incident"') == 3
    q = write_job_report(b, "flagship-sim", tmp_path / "b")
    assert q.read_text().count('class="incident"') == 3
    assert [x.name for x in (tmp_path / "reports").iterdir()] == [
        "flagship-sim.html"
    ]  # no temp left


def test_incident_link_points_at_its_section(tmp_path: Path) -> None:
    b = contract_bundle()
    iid = b["incidents"][1]["id"]
    link = incident_link(tmp_path, "flagship-sim", iid)
    path, frag = link.split("#")
    assert Path(path) == write_job_report(b, "flagship-sim", tmp_path)
    assert f'id="{frag}"' in Path(path).read_text()


def test_a_reused_job_id_reports_its_latest_run(tmp_path: Path) -> None:
    old, new = contract_bundle(), contract_bundle()
    for b, run, step in ((old, "run-1", 200.0), (new, "run-2", 100.0)):
        b["job"]["run"] = run
        for inc in b["incidents"]:
            inc["run"] = run
            old_id = inc["id"]
            inc["id"] = f"{old_id}-{run}"
            b["subjects"][inc["id"]] = [
                {**r, "incident": inc["id"]} for r in b["subjects"].pop(old_id)
            ]
        for r in b["windows"]:
            r["run"], r["step_ms"] = run, step
    url = fill_store(tmp_path / "artemis.db", old)
    fill_store(tmp_path / "artemis.db", new)
    from artemis.report.load import bundles_from_store

    (b,) = bundles_from_store(url)
    assert {i["run"] for i in b["incidents"]} == {"run-2"}
    assert {r["step_ms"] for r in b["windows"]} == {100.0}
    assert "3 incident(s) of earlier runs" in b["notes"][0]
    first_old = old["incidents"][0]["id"]
    (one,) = bundles_from_store(url, incident=first_old)
    assert [i["id"] for i in one["incidents"]] == [first_old]
    assert {r["step_ms"] for r in one["windows"]} == {200.0}  # its own run's windows
