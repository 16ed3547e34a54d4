"""The incident store's cost per window, at job sizes of 64, 1k and 10k ranks, on
SQLite and on PostgreSQL.

What the coordinator writes to its store for each scored window (coordinator/
service.py, through ``StoreSink``): the job's changed info (its last window and
time), the window's rows (one job row with the peers' p10/p50/p90 bands, one
row per open incident's subject) and the records of the incidents that changed.
Here two incidents are open and both change every window (the worst case): a
rank incident (one host) and an island incident naming every host of the job
(N/8 hosts), so the part of the cost that grows with the job shows.

* scoring: the median time the scoring path spends in the sink's calls for one
  window (they queue the writes: store/sink.py), what a window's scoring pays;
* write: the median time of one window's writes into the store itself (what the
  sink's writer thread spends): SQLite with the store's settings (WAL,
  ``synchronous = NORMAL``), PostgreSQL over loopback TCP (a server of
  tests/pg.py: ``fsync = off``, so no disk flush on either side);
* JSONL: the same records and rows appended as JSON lines to a file and
  flushed (what the incidents JSONL writer does), the baseline measured in the
  same run; the ratio is write / JSONL;
* read: ``job_windows`` of the whole job (WINDOWS rows) and ``incidents``, the
  reads a report makes, once the windows are written.

Every figure is the median of RUNS runs of WINDOWS windows each. PostgreSQL:
``ARTEMIS_BENCH_PG_URL`` (a database this may fill with tables: a fresh one per
run is created next to it, so the role needs CREATEDB), else a server started
here (tests/pg.py) when PostgreSQL is installed, else its rows are left out.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from artemis.store import open_store, store_url
from artemis.store.sink import StoreSink, split_rows

SIZES = (64, 1_000, 10_000)
RUNS = 5
WINDOWS = 200


def _record(id_: str, kind: str, hosts: list[str], w: int) -> dict[str, Any]:
    return {
        "id": id_,
        "job": "bench",
        "run": "r",
        "kind": kind,
        "subject": "2" if kind == "rank" else "nvidia",
        "hosts": hosts,
        "change": "updated",
        "status": "open",
        "opened": {"window": 3, "time": 1.0},
        "confirmed": {"window": 3, "time": 1.0, "rule": "q1>peers_median"},
        "closed": None,
        "cause": {"kind": "clocks", "text": "clocks low " * 8, "evidence": {"sm_mhz": 1694}},
        "evidence": {
            "windows": w,
            "gap_ms": 115.0,
            "peers_gap_ms": 100.0,
            "ratio": 1.15,
            "telemetry": {"sm_mhz": {"rank": 1694.0, "peers": 1978.0}},
        },
        "cost": {
            "excess_ms": 15.0,
            "loss_pct": 11.7,
            "gpu_hours": 0.004 * w,
            "gpu_hours_per_day": 9.6,
        },
        "actions": [],
        "escalation": None,
        "verdict": None,
        "markers": [{"marker": "flagged", "window": 3}],
    }


def _window(n: int, w: int) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    hosts = [f"node-{h:05d}" for h in range(max(1, n // 8))]
    recs = [_record("bench-r2-w3", "rank", hosts[:1], w), _record("bench-i-w3", "island", hosts, w)]
    rows: list[dict[str, Any]] = [
        {
            "row": "job",
            "job": "bench",
            "window": w,
            "time": float(w),
            "step_ms": 100.0,
            "samples_per_s": 320.0,
            "ratio_p10": 0.98,
            "ratio_p50": 1.0,
            "ratio_p90": 1.02,
        }
    ] + [
        {
            "row": "subject",
            "incident": r["id"],
            "job": "bench",
            "window": w,
            "time": float(w),
            "ratio": 1.15,
            "gap_ms": 115.0,
            "peers_gap_ms": 100.0,
            "gpu_hours": 0.004 * w,
        }
        for r in recs
    ]
    return {"last_window": w, "last_time": float(w)}, recs, rows


def _one(n: int, tmp: Path, url: str) -> tuple[float, float, float, float, float]:
    wins = [_window(n, w) for w in range(WINDOWS)]
    sink = StoreSink.open(url, tmp / "f.jsonl")
    scoring_s = []
    for info, recs, rows in wins:
        t0 = time.perf_counter()
        sink.write_job("bench", info)
        sink.write_monitor_rows(rows)
        sink.write_incidents(recs)
        scoring_s.append(time.perf_counter() - t0)
    assert sink.flush(600) and sink.on, sink.failed
    sink.close()
    # The writer's side: the same writes straight into the store, on a new job.
    write_s = []
    with open_store(url) as st:
        for info, recs, rows in wins:
            recs = [{**r, "job": "bench2", "id": r["id"] + "-2"} for r in recs]
            jr, ir = split_rows([{**r, "job": "bench2"} for r in rows])
            t0 = time.perf_counter()
            st.write_job("bench2", info)
            st.write_rows(jr, ir)
            st.write_incidents(recs)
            write_s.append(time.perf_counter() - t0)
    jsonl_s = []
    with open(tmp / f"i{n}.jsonl", "w", encoding="utf-8") as fh:
        for _, recs, rows in wins:
            t0 = time.perf_counter()
            fh.write("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in recs + rows))
            fh.flush()
            jsonl_s.append(time.perf_counter() - t0)
    with open_store(url, readonly=True) as s:
        t0 = time.perf_counter()
        got = s.job_windows("bench")
        read_rows = time.perf_counter() - t0
        t0 = time.perf_counter()
        s.incidents("bench")
        read_inc = time.perf_counter() - t0
    assert len(got) == WINDOWS
    return (
        statistics.median(scoring_s),
        statistics.median(write_s),
        statistics.median(jsonl_s),
        read_rows,
        read_inc,
    )


@contextlib.contextmanager
def _postgres() -> Iterator[Callable[[str], str] | None]:
    """A function naming a fresh database per run, or None without PostgreSQL."""
    import psycopg

    given = os.environ.get("ARTEMIS_BENCH_PG_URL")
    if given:
        base = given.rsplit("/", 1)[0]

        def fresh(name: str) -> str:
            with psycopg.connect(given, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}"')
                c.execute(f'CREATE DATABASE "{name}"')
            return f"{base}/{name}"

        yield fresh
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    try:
        import pg
    except ImportError:
        yield None
        return
    if pg.missing() is not None:
        yield None
        return
    srv = pg.PgServer()
    try:
        srv.start()
        yield srv.create_db
    finally:
        srv.destroy()


def main() -> int:
    import logging

    import structlog

    # The sink's "store open" lines would interleave the table.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print(
        f"store cost per window: 2 open incidents changing every window, medians of "
        f"{RUNS} runs x {WINDOWS} windows"
    )
    print(
        f"{'engine':>10} {'ranks':>7} {'hosts':>6} {'scoring us':>10} {'write us':>9}"
        f" {'JSONL us':>9} {'ratio':>6} {'read rows ms':>13} {'read incidents ms':>18}"
    )
    with tempfile.TemporaryDirectory() as d, _postgres() as fresh_pg:
        engines: list[tuple[str, Callable[[Path, str], str]]] = [
            ("sqlite", lambda sub, name: store_url(sub / "s.db"))
        ]
        if fresh_pg is not None:
            engines.append(("postgresql", lambda sub, name: fresh_pg(name)))
        else:
            print("(no PostgreSQL here: its rows are left out)")
        for engine, url_of in engines:
            for n in SIZES:
                runs = []
                for i in range(RUNS):
                    sub = Path(d) / f"{engine}-{n}-{i}"
                    sub.mkdir()
                    runs.append(_one(n, sub, url_of(sub, f"bench_{n}_{i}")))
                sc, wr, jl, rr, ri = (statistics.median(x) for x in zip(*runs, strict=True))
                print(
                    f"{engine:>10} {n:>7} {max(1, n // 8):>6} {sc * 1e6:>10.0f} {wr * 1e6:>9.0f}"
                    f" {jl * 1e6:>9.0f} {wr / jl:>6.1f} {rr * 1e3:>13.2f} {ri * 1e3:>18.2f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
