"""The incident store (artemis.store): round trip, migration from v1, readers during
writes (a real second process), damaged files, the JSONL fallback, the sink.

The tests taking ``url`` run twice: on a SQLite file and on a fresh database of a
real PostgreSQL server (tests/pg.py), the same assertions for both."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import structlog
from artemis.common.tomlfile import ConfigError
from artemis.coordinator.config import CoordinatorConfig
from artemis.store import StoreError, open_for_findings, open_store, store_url
from artemis.store.schema import CURRENT, MIGRATIONS, Db, migrate, wrap
from artemis.store.sink import StoreSink, resolve_url
from artemis.store.sql import SqlStore
from artemis.store.sqlite import SqliteStore
from store_records import dismissed, flagship, incident_rows, job_rows, t

ENGINES = ("sqlite", "postgresql")


@pytest.fixture(params=ENGINES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty store: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return store_url(tmp_path / "a.db")
    return str(request.getfixturevalue("pg_url"))


def _password(url: str) -> str:
    """The URL's password, or a string no message holds."""
    return (urlsplit(url).password or "") or "\x00no password"


def _connect(url: str) -> Db:
    """A raw connection to the store at ``url`` (autocommit), outside any Store."""
    if url.startswith("sqlite:"):
        return wrap(sqlite3.connect(url[len("sqlite:///") :], isolation_level=None))
    import psycopg

    return wrap(psycopg.connect(url, autocommit=True))


def _fill(url: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    changes, dis = flagship(), dismissed()
    with open_store(url) as s:
        s.write_job("flagship-sim", {"ranks": 8, "hosts": ["node-a", "node-b"]})
        for c in changes:
            s.write_incident(c)
        s.write_incidents([dis])
        s.write_rows(job_rows("flagship-sim", 0, 61), incident_rows(changes[0]["id"], 18, 61))
        s.write_job("flagship-sim", {"ended": t(61)})  # a merge, not a replace
    return changes, dis


def test_round_trip(url: str) -> None:
    changes, dis = _fill(url)
    with open_store(url, readonly=True) as s:
        assert s.incidents() == [changes[-1], dis]  # the latest record per id, by job
        assert s.incidents("stalls-sim") == [dis]
        assert s.incident(changes[0]["id"]) == changes[-1]
        assert s.incident("nope") is None
        jobs = {j["job"]: j for j in s.jobs()}
        assert jobs["flagship-sim"]["ranks"] == 8 and jobs["flagship-sim"]["ended"] == t(61)
        assert jobs["flagship-sim"]["incidents"] == 1 and jobs["stalls-sim"]["incidents"] == 1
        assert s.job_windows("flagship-sim") == job_rows("flagship-sim", 0, 61)
        assert s.job_windows("flagship-sim", 10, 12) == job_rows("flagship-sim", 10, 13)
        assert s.incident_windows(changes[0]["id"]) == incident_rows(changes[0]["id"], 18, 61)
        assert isinstance(s, SqlStore)
        acts = s.db.execute("SELECT plan, status, gain_pct, history FROM actions").fetchall()
        assert [(p, st, g) for p, st, g, _ in acts] == [("p-2-20", "verified", 9.9)]
        assert [h["status"] for h in json.loads(acts[0][3])] == [
            "recommended",
            "applied",
            "verified",
        ]
        cols = s.db.execute(
            "SELECT kind, subject, status, verdict, cause, opened_window, closed_window,"
            " gpu_hours FROM incidents ORDER BY id"
        ).fetchall()
        assert [tuple(c) for c in cols] == [
            ("rank", "2", "closed", "mitigated", "clocks", 18, 60, 0.011),
            ("rank", "5", "closed", "dismissed", "unknown", 9, 13, 0.0001),
        ]


def test_rows_replace_and_extra_keys(url: str) -> None:
    with open_store(url) as s:
        s.write_rows(job_rows("j", 0, 3), [])
        again = [{**r, "step_ms": 1.0, "islands": {"nvidia": 1.0}} for r in job_rows("j", 1, 2)]
        s.write_rows(again, [])
        got = s.job_windows("j")
        assert [r["step_ms"] for r in got] == [100.0, 1.0, 102.0]
        assert got[1]["islands"] == {"nvidia": 1.0}  # a key without a column survives


def test_a_new_run_of_a_job_keeps_the_old_runs_windows(url: str) -> None:
    """A job id reused by a new run: windows from 0 again, the old run's rows kept."""
    with open_store(url) as s:
        old = [{**r, "run": "r1"} for r in job_rows("j", 0, 5)]
        new = [{**r, "run": "r2", "time": r["time"] + 1e4} for r in job_rows("j", 0, 3)]
        s.write_rows(old, [])
        s.write_rows(new, [])
        assert s.job_windows("j") == new  # the latest run by default
        assert s.job_windows("j", run="r1") == old  # an incident's run
        assert s.job_windows("j", 1, 2, run="r1") == old[1:3]
        assert s.job_windows("nope") == []


def _write_v1(url: str) -> None:
    """A store as version 1 wrote it: its migration, then v1's own rows."""
    db = _connect(url)
    assert migrate(db, target=1) == [1]
    rec = flagship()[-1]
    db.execute("INSERT INTO jobs VALUES (?, ?, ?, ?)", ("flagship-sim", '{"ranks": 8}', 1.0, 2.0))
    db.execute(
        "INSERT INTO incidents VALUES (?, ?, ?, ?, ?)",
        (rec["id"], rec["job"], 18, json.dumps(rec), 2.0),
    )
    db.executemany(
        "INSERT INTO job_windows VALUES (?, ?, ?, ?, ?, ?)",
        [("flagship-sim", w, t(w), 100.0, 320.0, 1.0) for w in range(5)],
    )
    db.conn.close()


def test_migration_from_v1(url: str) -> None:
    _write_v1(url)
    # Named by its file, or by its URL without the password.
    where = r"a\.db" if url.startswith("sqlite") else r"postgresql://artemis@127\.0\.0\.1:\d+/t"
    with pytest.raises(StoreError, match=rf"{where}\S*: store schema v1.*read-write once") as e:
        open_store(url, readonly=True)  # a reader never writes
    assert _password(url) not in str(e.value)
    with open_store(url) as s:
        assert isinstance(s, SqlStore) and s.upgraded == list(range(2, CURRENT + 1))
        rec = flagship()[-1]
        assert s.incident(rec["id"]) == rec
        # Backfilled from the v1 record: the listing columns and the action rows.
        got = s.db.execute("SELECT verdict, cause, closed_window FROM incidents").fetchall()
        assert [tuple(r) for r in got] == [("mitigated", "clocks", 60)]
        got = s.db.execute("SELECT plan, status FROM actions").fetchall()
        assert [tuple(r) for r in got] == [("p-2-20", "verified")]
        old = s.job_windows("flagship-sim")
        assert [(r["window"], r["ratio_p50"], r["ratio_p10"]) for r in old] == [
            (w, 1.0, None) for w in range(5)
        ]
        s.write_rows(job_rows("flagship-sim", 5, 7), incident_rows(rec["id"], 5, 7))
        assert len(s.job_windows("flagship-sim")) == 7
        versions = [
            v for (v,) in s.db.execute("SELECT version FROM schema_version ORDER BY version")
        ]
        assert versions == [m.version for m in MIGRATIONS]
    with open_store(url) as s:  # a current store: nothing to apply
        assert isinstance(s, SqlStore) and s.upgraded == []
    with open_store(url, readonly=True) as s:
        assert s.jobs()[0]["ranks"] == 8


def test_newer_schema_refused(url: str) -> None:
    open_store(url).close()
    db = _connect(url)
    db.execute("INSERT INTO schema_version VALUES (?, 0, 'from the future')", (CURRENT + 1,))
    db.conn.close()
    with pytest.raises(StoreError, match=rf": store schema v{CURRENT + 1} .*newer"):
        open_store(url)


def test_damaged_files_name_the_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"certainly not a database\n" * 400)
    for ro in (False, True):
        with pytest.raises(StoreError, match=r"junk\.db: not an Artemis store"):
            open_store(store_url(junk), readonly=ro)
    assert junk.read_bytes() == b"certainly not a database\n" * 400  # left as it was

    other = tmp_path / "other.db"
    db = sqlite3.connect(str(other))
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match=r"other\.db: not an Artemis store: .*no schema_version"):
        open_store(store_url(other))

    # A real store with its pages after the first overwritten: the damage shows at
    # the first read past the header, still as a StoreError naming the file.
    hurt = tmp_path / "hurt.db"
    _fill(store_url(hurt))
    data = bytearray(hurt.read_bytes())
    data[4096:] = b"\xa5" * (len(data) - 4096)
    hurt.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"hurt\.db: "), open_store(store_url(hurt)) as s:
        s.incidents()
    with pytest.raises(StoreError, match=r"missing\.db: no store there"):
        open_store(store_url(tmp_path / "missing.db"), readonly=True)


def test_urls() -> None:
    with pytest.raises(StoreError, match="expected sqlite:///PATH or postgresql://") as e:
        open_store("mysql://root:hunter2@x/db")
    assert "hunter2" not in str(e.value)
    with pytest.raises(StoreError, match="expected sqlite:///PATH"):
        open_store("sqlite://relative.db")
    assert resolve_url("auto", "/var/lib/artemis/findings.jsonl") == (
        "sqlite:////var/lib/artemis/artemis.db"
    )
    assert resolve_url("off", "f.jsonl") is None and resolve_url("", "f.jsonl") is None
    assert resolve_url("sqlite:///x.db", "f.jsonl") == "sqlite:///x.db"
    assert CoordinatorConfig(store="sqlite:////tmp/x.db").validated().store
    assert CoordinatorConfig(store="postgresql://artemis:pw@db:5432/artemis").validated().store
    for bad, msg in (
        ("postgresql://artemis:pw@db/artemis?nope=1", "not a PostgreSQL URL.*nope"),
        ("sqlite://x.db", "sqlite:///PATH"),
        ("artemis.db", "expected auto, off"),
    ):
        with pytest.raises(ConfigError, match=msg) as e:
            CoordinatorConfig(store=bad).validated()
        assert ":pw@" not in str(e.value)


def test_postgresql_errors_name_the_url_without_its_password(pg_server: Any) -> None:
    from pg import free_port

    wrong = pg_server.url().replace(pg_server.password, "not-the-password")
    with pytest.raises(StoreError, match=r"^postgresql://artemis@127\.0\.0\.1:\d+/postgres: ") as e:
        open_store(wrong)
    assert "not-the-password" not in str(e.value) and "password" in str(e.value)
    nobody = f"postgresql://artemis:s3cret@127.0.0.1:{free_port()}/artemis?connect_timeout=2"
    with pytest.raises(StoreError, match="cannot connect") as e:
        open_store(nobody)
    assert e.value.transient and "s3cret" not in str(e.value)
    assert str(e.value).startswith("postgresql://artemis@127.0.0.1:")
    # A database of another program is not taken over.
    name = "someone-else"
    other = pg_server.create_db(name)
    try:
        db = _connect(other)
        db.execute("CREATE TABLE t (x INTEGER)")
        db.conn.close()
        with pytest.raises(StoreError, match=r"not an Artemis store: .*no schema_version"):
            open_store(other)
    finally:
        pg_server.drop_db(name)


def test_findings_fallbacks(tmp_path: Path) -> None:
    findings = tmp_path / "findings.jsonl"
    findings.touch()
    with pytest.raises(StoreError, match="no incident store next to"):
        open_for_findings(findings)
    changes, dis = flagship(), dismissed()
    lines = [json.dumps(c) for c in changes[:2]] + [json.dumps(dis)]
    lines += [json.dumps(c) for c in changes[2:]]
    # The last line cut short (a crash mid-write) is skipped.
    (tmp_path / "incidents.jsonl").write_text("\n".join(lines) + '\n{"id": "cut')
    with open_for_findings(findings) as s:
        assert s.incidents() == [changes[-1], dis]
        assert s.incident(dis["id"]) == dis
        assert [j["job"] for j in s.jobs()] == ["flagship-sim", "stalls-sim"]
        assert s.job_windows("flagship-sim") == []
        with pytest.raises(StoreError, match="read-only"):
            s.write_incident(dis)
    _fill(store_url(tmp_path / "artemis.db"))  # a store next to it wins
    with open_for_findings(findings) as s:
        assert isinstance(s, SqliteStore) and s.readonly
        assert len(s.job_windows("flagship-sim")) == 61


READER = textwrap.dedent(
    """
    import json, sys
    from artemis.store import open_store
    s = open_store(sys.argv[1], readonly=True)
    if sys.argv[2] == "snapshot":
        # Hold one read transaction open across the writer's commits (PostgreSQL:
        # a snapshot for the whole transaction, not per statement).
        pg = sys.argv[1].startswith("postgresql")
        s.db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ" if pg else "BEGIN")
        before = len(s.job_windows("j"))
        print(json.dumps({"held": before}), flush=True)
        sys.stdin.readline()  # the writer is done
        inside = len(s.job_windows("j"))
        s.db.execute("COMMIT")
        print(json.dumps({"inside": inside, "after": len(s.job_windows("j"))}), flush=True)
    else:
        import time
        seen = []  # the row counts read, each change once
        print(json.dumps({"ready": True}), flush=True)
        deadline = time.monotonic() + 120  # never outlive a writer that failed
        while time.monotonic() < deadline:
            rows = s.job_windows("j")
            if not seen or seen[-1] != len(rows):
                seen.append(len(rows))
            if rows and rows[-1]["window"] == int(sys.argv[3]) - 1:
                break
        print(json.dumps({"seen": seen}), flush=True)
    """
)


@pytest.fixture
def reader() -> Any:
    """Start the reader process; it is killed at the end whatever the test did."""
    procs: list[subprocess.Popen[str]] = []

    def start(url: str, *args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [sys.executable, "-c", READER, url, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(30)


def test_reader_holding_a_snapshot_never_blocks_the_writer(url: str, reader: Any) -> None:
    """Without WAL the writer's commit would wait for the reader's shared lock (and
    fail after the busy timeout): the reader here holds it until the writer is done.
    PostgreSQL's readers never block its writers either (MVCC)."""
    with open_store(url) as w:
        w.write_rows(job_rows("j", 0, 10), [])
        rd = reader(url, "snapshot")
        assert rd.stdout is not None and rd.stdin is not None
        assert json.loads(rd.stdout.readline()) == {"held": 10}
        for win in range(10, 210):  # one transaction per window, as the coordinator
            w.write_rows(job_rows("j", win, win + 1), [])
        assert len(w.job_windows("j")) == 210
        rd.stdin.write("done\n")
        rd.stdin.flush()
        got = json.loads(rd.stdout.readline())
        assert rd.wait(30) == 0
    assert got == {"inside": 10, "after": 210}  # its snapshot, then every commit whole


def test_reader_polling_during_writes(url: str, reader: Any) -> None:
    n = 300
    with open_store(url) as w:
        w.write_job("j", {})
        rd = reader(url, "poll", str(n))
        assert rd.stdout is not None
        assert json.loads(rd.stdout.readline()) == {"ready": True}
        for win in range(n):
            w.write_rows(job_rows("j", win, win + 1), incident_rows("i", win, win + 1))
        got = json.loads(rd.stdout.readline())
        assert rd.wait(30) == 0
    seen = got["seen"]
    # Never an error, never a partial commit, and a read between the commits (one
    # that saw fewer than all of them: how many depends on the scheduler).
    assert seen[-1] == n and seen == sorted(seen) and len(seen) >= 2, seen


def test_sink_logs_and_stays_off(tmp_path: Path) -> None:
    junk = tmp_path / "artemis.db"
    junk.write_bytes(b"\x00garbage" * 1000)
    with structlog.testing.capture_logs() as logs:
        sink = StoreSink.open("auto", tmp_path / "findings.jsonl")
    assert not sink.on and sink.failed and str(junk) in sink.failed
    errs = [e for e in logs if e["log_level"] == "error"]
    assert len(errs) == 1 and str(junk) in errs[0]["store"] and str(junk) in errs[0]["error"]
    sink.write_incidents(flagship())  # off: nothing, no error
    sink.write_rows(job_rows("j", 0, 2), [])

    sink = StoreSink.open(store_url(tmp_path / "ok.db"), tmp_path / "findings.jsonl")
    assert sink.on
    sink.write_incidents(flagship()[:1])
    with structlog.testing.capture_logs() as logs:
        sink.write_incidents([{"job": "j"}])  # no id: refused, the sink turns off
        sink.write_incidents(flagship())
        assert sink.flush()
    assert not sink.on and [e["log_level"] for e in logs] == ["error"]
    assert "ok.db" in logs[0]["error"]
    with open_store(store_url(tmp_path / "ok.db"), readonly=True) as s:
        assert [r["change"] for r in s.incidents()] == ["opened"]
    assert StoreSink.open("off", tmp_path / "f.jsonl").on is False


def test_sink_retries_a_sqlite_file_locked_past_its_busy_timeout(tmp_path: Path) -> None:
    """Another writer holding the file's lock past the busy timeout is a transient
    failure: the sink reopens the file with back-off and writes the queue once the
    lock is gone (a refusal would turn it off)."""
    path = tmp_path / "a.db"
    store = SqliteStore(path, busy_timeout_s=0.05)
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held
    sink = StoreSink(
        store,
        opener=lambda: SqliteStore(path, busy_timeout_s=0.05),  # reopened while locked too
        retry_min_s=0.05,
        retry_max_s=0.1,
    )
    with structlog.testing.capture_logs() as logs:
        for w in range(3):
            sink.write_rows(job_rows("j", w, w + 1), [])
        assert not sink.flush(0.5) and sink.depth == 3 and sink.on  # waiting, not off
        holder.execute("COMMIT")
        assert sink.flush(30)
    assert sink.on and sink.dropped == 0 and sink.reconnects >= 1
    assert any("connection lost" in e["event"] and "locked" in e["error"] for e in logs)
    assert sink.store is not None and sink.store.job_windows("j") == job_rows("j", 0, 3)
    sink.close()
    holder.close()


def test_sink_writes_records_as_they_were_when_queued(tmp_path: Path) -> None:
    """The incident tracker goes on appending to a plan's history list after it
    hands a record out; the queued write keeps the record as it was then (written
    here only after the change: the file's lock is held until then)."""
    path = tmp_path / "a.db"
    store = SqliteStore(path, busy_timeout_s=0.05)
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    sink = StoreSink(
        store,
        opener=lambda: SqliteStore(path, busy_timeout_s=0.05),
        retry_min_s=0.05,
        retry_max_s=0.1,
    )
    rec = flagship()[3]  # with a plan and its history
    want = json.loads(json.dumps(rec))
    sink.write_incidents([rec])
    rec["actions"][0]["history"].append({"status": "rolled_back", "window": 99, "time": 1.0})
    rec["status"] = "changed later"
    holder.execute("COMMIT")
    assert sink.flush(30) and sink.store is not None
    assert sink.store.incident(rec["id"]) == want
    sink.close()
    holder.close()


def test_config_keys_and_flags(tmp_path: Path) -> None:
    from artemis.common.tomlfile import load_config

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(CoordinatorConfig, root / "deploy" / "coordinator.toml", {}).validated()
    assert (cfg.store, cfg.report_dir) == ("auto", "")  # documented there, as the defaults
    cfg = load_config(
        CoordinatorConfig,
        root / "deploy" / "coordinator.toml",
        {"store": "off", "report_dir": str(tmp_path)},
    ).validated()
    assert (cfg.store, cfg.report_dir) == ("off", str(tmp_path))
    bin_ = Path(sys.executable).parent / "artemis-coordinator"
    r = subprocess.run(
        [str(bin_), "serve", "--store", "artemis.db", "--secret-file", "/nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "expected auto, off, sqlite:///PATH or postgresql" in r.stderr
    r = subprocess.run([str(bin_), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert "--store" in r.stdout and "--report-dir" in r.stdout


def test_sink_takes_the_monitors_rows(url: str, tmp_path: Path) -> None:
    """The monitor returns one list of rows, `row` telling job and subject rows apart."""
    rows: list[dict[str, Any]] = [
        {"row": "job", "run": "c0ffee", **r} for r in job_rows("j", 0, 3)
    ] + [{"row": "subject", "job": "j", "gpu_hours": 0.5, **r} for r in incident_rows("i", 1, 3)]
    sink = StoreSink.open(url, tmp_path / "f.jsonl")
    sink.write_monitor_rows(rows)
    assert sink.flush() and sink.store is not None
    got = sink.store.job_windows("j")
    assert got == [{**r, "run": "c0ffee"} for r in job_rows("j", 0, 3)]
    assert sink.store.incident_windows("i") == [
        {**r, "job": "j", "gpu_hours": 0.5} for r in incident_rows("i", 1, 3)
    ]
    with structlog.testing.capture_logs() as logs:
        sink.write_monitor_rows([{"row": "what", "job": "j", "window": 1}])
        assert sink.flush()
    assert not sink.on and "unknown kind" in logs[0]["error"]
    sink.close()


def test_written_from_another_thread(url: str) -> None:
    """artemis.job.Detector opens its store on the caller's thread and writes it from
    its scorer thread (one at a time)."""
    import threading

    errors: list[BaseException] = []
    with open_store(url) as s:

        def write() -> None:
            try:
                s.write_rows(job_rows("j", 0, 3), [])
                s.write_incidents(flagship())
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=write)
        t.start()
        t.join(30)
        assert not errors and len(s.job_windows("j")) == 3
        s.write_job("j", {"ended": 1.0})  # and back on this thread


@pytest.mark.parametrize("start", ["empty", "v1"])
def test_coordinators_migrating_one_database_at_once(pg_url: str, start: str) -> None:
    """A fleet's coordinators starting together on an empty (or old) database: each
    migration is applied once (the advisory lock), every open succeeds, and they
    all write to the same schema."""
    import threading

    if start == "v1":
        _write_v1(pg_url)
    n = 8
    go = threading.Barrier(n)
    got: list[Any] = [None] * n

    def coordinator(i: int) -> None:
        try:
            go.wait(30)
            with open_store(pg_url) as s:
                got[i] = list(getattr(s, "upgraded", []))
                s.write_rows([{**job_rows("j", i, i + 1)[0], "run": "r"}], [])
        except BaseException as e:
            got[i] = e

    threads = [threading.Thread(target=coordinator, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert all(isinstance(g, list) for g in got), got
    # Each migration applied by exactly one of them.
    first = 2 if start == "v1" else 1
    assert sorted(v for g in got for v in g) == list(range(first, CURRENT + 1))
    with open_store(pg_url, readonly=True) as s:
        versions = s.db.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert [v for (v,) in versions] == [m.version for m in MIGRATIONS]
        assert [r["window"] for r in s.job_windows("j", run="r")] == list(range(n))
