"""`artemis incidents list|show`, run as a real subprocess, in a real pseudo-terminal
(pty) where an operator reads it, and piped."""

from __future__ import annotations

import errno
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from artemis.store import open_store, store_url
from store_records import dismissed, flagship, incident_rows, job_rows

ARTEMIS = str(Path(sys.executable).parent / "artemis")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PIPED_ENV = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # as from a script


def _in_pty(args: list[str], cols: int = 140) -> tuple[int, str]:
    """Run `artemis ARGS` with a pty as its terminal; return (exit code, raw output)."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": str(cols), "LINES": "60", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    p = subprocess.Popen([ARTEMIS, *args], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 65536)
        except OSError as e:  # EIO: the child closed its end of the terminal
            if e.errno != errno.EIO:
                raise
            break
        if not b:
            break
        chunks.append(b)
    os.close(master)
    return p.wait(60), b"".join(chunks).decode("utf-8", "replace")


def _plain(raw: str) -> str:
    return ANSI.sub("", raw).replace("\r\n", "\n")


def _store(tmp: Path) -> str:
    url = store_url(tmp / "artemis.db")
    with open_store(url) as s:
        for c in flagship():
            s.write_incident(c)
        s.write_incident(dismissed())
        s.write_rows(job_rows("flagship-sim", 0, 61), incident_rows(flagship()[0]["id"], 18, 61))
    return url


def test_show_in_a_terminal(tmp_path: Path) -> None:
    url = _store(tmp_path)
    rec = flagship()[-1]
    code, raw = _in_pty(["incidents", "show", rec["id"], "--store", url])
    out = _plain(raw)
    assert code == 0, out
    assert ANSI.search(raw), "a terminal gets styled output"
    assert "┃" in out or "│" in out  # rich's tables
    lines = out.splitlines()

    def line_with(*words: str) -> str:
        hits = [ln for ln in lines if all(w in ln for w in words)]
        assert hits, (words, out)
        return hits[0]

    assert f"incident {rec['id']}" in out
    line_with("verdict", "mitigated")
    line_with("why", rec["reason"])
    conf = rec["confirmed"]
    line_with("confirmed", f"window {conf['window']}", conf["rule"], "113.2", "100.1")
    line_with("closed", "window 60", "job_end")
    # The story in one sentence, from the record's numbers.
    pct = f"{100 * (rec['evidence']['ratio'] - 1):.1f}%"
    assert f"rank 2 on node-a ran {pct} slow against its peers from window 18" in " ".join(
        out.split()
    )
    line_with("cause", "clocks", "explains 93%")
    line_with("or power", "20%")
    # The evidence table: rank vs peers and their ratio, per measurement.
    for name, v in rec["evidence"]["telemetry"].items():
        row = line_with(name, f"{v['rank']:.4g}", f"{v['peers']:.4g}")
        assert f"{v['rank'] / v['peers']:.3f}" in row
    line_with("gap ms", "115.1", "100", f"{115.1 / 100.0:.3f}")
    line_with("cost", "4.1 ms per step", "3.0% of throughput", "0.011 GPU-hours", "2.6 a day")
    # The action with its status history and measured throughput before and after.
    act = line_with("p-2-20", "verified")
    assert "recommended@w20 > applied@w23 > verified@w28" in act
    assert "310.2" in act and "341.0" in act and "+9.9%" in act
    assert "nvidia-smi -q -d CLOCK" in " ".join(out.split())
    marks = " > ".join(f"{m['marker']}@w{m['window']}" for m in rec["markers"])
    line_with("markers", marks)


def test_list_in_a_terminal_and_piped(tmp_path: Path) -> None:
    url = _store(tmp_path)
    code, raw = _in_pty(["incidents", "list", "--store", url])
    out = _plain(raw)
    assert code == 0, out
    row = next(ln for ln in out.splitlines() if "flagship-sim-r2-w18" in ln)
    cells = row.split()
    assert cells == [
        "flagship-sim-r2-w18",
        "flagship-sim",
        "rank",
        "2",
        "clocks",
        "mitigated",
        "18-60",
        "0.011",
    ]
    row = next(ln for ln in out.splitlines() if "stalls-sim-r5-w9" in ln)
    assert "dismissed" in row and "unknown" in row
    assert "2 incidents" in out

    piped = subprocess.run(
        [ARTEMIS, "incidents", "list", "--store", url, "--job", "stalls-sim"],
        capture_output=True,
        text=True,
        timeout=60,
        env=PIPED_ENV,
    )
    assert piped.returncode == 0, piped.stderr
    assert not ANSI.search(piped.stdout)  # a pipe gets plain text
    assert "stalls-sim-r5-w9" in piped.stdout and "flagship-sim-r2-w18" not in piped.stdout
    js = subprocess.run(
        [ARTEMIS, "incidents", "show", "stalls-sim-r5-w9", "--store", url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(js.stdout) == dismissed()


def test_a_cpu_jobs_hours_are_cpu_hours(tmp_path: Path) -> None:
    """(issue 31, item 9) `cost.unit` words the hours; a listing of GPU and CPU jobs
    totals each unit apart, never one sum."""
    url = _store(tmp_path)
    cpu = json.loads(json.dumps(flagship()[-1]).replace("flagship-sim", "cpu-job"))
    cpu["cost"]["unit"] = "cpu"
    with open_store(url) as s:
        s.write_incident(cpu)
    code, raw = _in_pty(["incidents", "show", cpu["id"], "--store", url])
    out = " ".join(_plain(raw).split())
    assert code == 0 and "0.011 CPU-hours lost" in out and "GPU-hours" not in out, out
    code, raw = _in_pty(["incidents", "list", "--store", url])
    out = _plain(raw)
    assert code == 0, out
    total = next(ln for ln in out.splitlines() if "3 incidents" in ln)
    gpu = flagship()[-1]["cost"]["gpu_hours"] + (dismissed()["cost"]["gpu_hours"] or 0.0)
    assert f"{gpu:.3g} GPU-hours" in total and "0.011 CPU-hours" in total, total
    row = next(ln for ln in out.splitlines() if cpu["id"] in ln)
    assert row.split()[-2:] == ["0.011", "CPU"], row


def test_findings_reads_what_is_next_to_it(tmp_path: Path) -> None:
    findings = tmp_path / "findings.jsonl"
    findings.touch()
    (tmp_path / "incidents.jsonl").write_text(
        "".join(json.dumps(c) + "\n" for c in [*flagship(), dismissed()])
    )
    code, raw = _in_pty(["incidents", "list", "--findings", str(findings)])
    out = _plain(raw)
    assert code == 0 and "flagship-sim-r2-w18" in out and "mitigated" in out, out
    assert "incidents.jsonl" in out  # it says what it read
    _store(tmp_path)  # now a store next to it: that is read instead
    code, raw = _in_pty(["incidents", "show", "stalls-sim-r5-w9", "--findings", str(findings)])
    out = _plain(raw)
    assert code == 0 and "dismissed" in out and "check none needed" in out, out


def test_errors_are_clear(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([ARTEMIS, *args], capture_output=True, text=True, timeout=60)

    r = run("incidents", "list")
    assert r.returncode == 2 and "give one of --store URL or --findings FILE" in r.stderr
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a store at all\n" * 300)
    r = run("incidents", "list", "--store", store_url(junk))
    assert r.returncode == 2 and f"{junk}: not an Artemis store" in r.stderr
    r = run("incidents", "list", "--findings", str(tmp_path / "findings.jsonl"))
    assert r.returncode == 2 and "no incident store next to" in r.stderr
    url = _store(tmp_path)
    r = run("incidents", "show", "no-such-id", "--store", url)
    assert r.returncode == 1 and "no incident 'no-such-id'" in r.stderr
    # A PostgreSQL server that is not there (port 1: refused at once): named by its
    # URL without the password.
    r = run("incidents", "list", "--store", "postgresql://artemis:pw@127.0.0.1:1/artemis")
    assert (
        r.returncode == 2 and "postgresql://artemis@127.0.0.1:1/artemis: cannot connect" in r.stderr
    )
    assert ":pw@" not in r.stderr
