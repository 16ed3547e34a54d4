"""The largest coordinator fleet this machine holds (issue 30 "Benchmark"): 3 fleet
coordinators on one PostgreSQL over loopback, jobs adding up to a size of ranks at one
window a second, each window's findings within 1 s of its last summary at a load
average of at most 4; or the largest size that fits, reported.

Three `artemis-coordinator serve --fleet` processes (tests/fleet_harness.py's members:
their own folders, findings JSONL, /metrics) on one PostgreSQL (a tests/pg.py server, or
``ARTEMIS_BENCH_PG_URL`` as in bench/fleet_failover.py). For each size of the ladder
(``--sizes``, ranks in all), three `artemis loadtest` processes run at once, one job of a
third of the ranks each, each given the fleet's addresses starting at another member, so
each member owns one job (the first asked takes its lease). Each loadtest's agents are real
`Uplinks` (HMAC handshake, columnar windows, the fleet's redirects followed).

Latency: a loadtest paces its windows one a second and waits for the acks of the last
one; the coordinator scores a window inside the call that completes it and acks after,
so `send+ack` less the pacing of the earlier windows is, for the last window, the time
from its last summary queued to its ack: an upper bound of "last summary -> findings"
(the client's writing and the loopback trip included). A member that fell behind on any
window carries the backlog into the last one (windows leave in order), so the figure
also shows a fleet that does not keep pace. The load average (1 min) is sampled every
second of the run. A size fits when every summary was acknowledged, no window started
late and the latency is at most 1 s (it keeps pace), and the load stayed at most 4; the
ladder stops at the first size that does not keep pace. The machine's other users count
in the load: it is printed as seen, and the largest size that keeps pace at that load is
reported apart from the one that fits the goal.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bench.fleet_failover import _database, _mode, _tests_on_path

if TYPE_CHECKING:  # tests/ is put on the path when the run starts
    from fleet_harness import Fleet

JOBS = 3
RANKS_PER_AGENT = 256
GOAL_LATENCY_S = 1.0
GOAL_LOAD = 4.0
SIZES = (3_000, 30_000, 90_000, 300_000)
_SEND = re.compile(r"(\d+)/(\d+) summaries acknowledged.* send\+ack ([0-9.]+) s")


@dataclass
class Step:
    """One size of the ladder: what the three loadtests said."""

    ranks: int
    latency_s: list[float] = field(default_factory=list)  # per job: last summary -> ack
    loads: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)  # per member, after the run

    @property
    def keeps_pace(self) -> bool:
        """Every summary acked, every window on time, findings within the goal."""
        return not self.failures and max(self.latency_s, default=0.0) <= GOAL_LATENCY_S

    @property
    def fits(self) -> bool:
        """Keeps pace at the goal's load (the machine's other users count in it)."""
        return self.keeps_pace and max(self.loads, default=0.0) <= GOAL_LOAD


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _loads(stop: threading.Event, into: list[float]) -> None:
    while not stop.wait(1.0):
        into.append(os.getloadavg()[0])


def _step(fl: Fleet, secret: Path, bin_dir: Path, ranks: int, windows: int) -> Step:
    st = Step(ranks)
    each = max(1, ranks // JOBS)
    procs = []
    for k in range(JOBS):
        argv = [
            str(bin_dir / "artemis"),
            "loadtest",
            *("--coordinator", fl.addresses(first=k % len(fl.members))),
            *("--secret-file", str(secret), "--job", f"cap-{ranks}-{k}"),
            *("--ranks", str(each), "--ranks-per-agent", str(min(RANKS_PER_AGENT, each))),
            *("--windows", str(windows), "--window-s", "1.0", "--straggler", "5:1.3"),
            *("--connect-timeout-s", "300", "--ack-timeout-s", "120"),
        ]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    stop = threading.Event()
    sampler = threading.Thread(target=_loads, args=(stop, st.loads), daemon=True)
    sampler.start()
    try:
        for k, p in enumerate(procs):
            out, err = p.communicate(timeout=600 + 2 * windows)
            m = _SEND.search(out.decode(errors="replace"))
            if p.returncode != 0 or m is None:
                tail = (out + err).decode(errors="replace").strip().splitlines()[-3:]
                st.failures.append(f"job {k}: exit {p.returncode}: {' | '.join(tail)}")
                continue
            acked, sent, send_s = int(m[1]), int(m[2]), float(m[3])
            st.latency_s.append(send_s - (windows - 1) * 1.0)
            if acked != sent:
                st.failures.append(f"job {k}: {acked}/{sent} acknowledged")
            if "started late" in out.decode(errors="replace"):
                st.failures.append(f"job {k}: windows started late (the generator's side)")
    except subprocess.TimeoutExpired:
        st.failures.append("a loadtest did not finish in time")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        stop.set()
        sampler.join()
    st.rss_mb = [
        _rss_mb(m.daemon.pid) if m.daemon is not None and m.alive() else 0.0 for m in fl.members
    ]
    return st


def run(sizes: list[int], windows: int, keep: Path | None, snapshot_every: int = 10) -> int:
    _tests_on_path()
    from daemon_harness import BIN
    from fleet_harness import Fleet

    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="fleet-capacity-") as d, _database() as url:
        if url is None:
            return 0
        tmp = Path(d) if keep is None else keep
        tmp.mkdir(parents=True, exist_ok=True)
        fl = Fleet(tmp, url, 3, lease_s=10.0, renew_s=1.0, snapshot_every=snapshot_every)
        try:
            fl.start()
            for ranks in sizes:
                st = _step(fl, fl.secret, BIN, ranks, windows)
                steps.append(st)
                lat = max(st.latency_s, default=float("nan"))
                print(
                    f"{ranks:>8} ranks: last summary -> ack {lat:.2f} s (worst of {JOBS} jobs),"
                    f" load {min(st.loads, default=0):.1f}-{max(st.loads, default=0):.1f},"
                    f" member RSS {', '.join(f'{r:.0f}' for r in st.rss_mb)} MB"
                    + (f"; {'; '.join(st.failures)}" if st.failures else "")
                    + ("" if st.keeps_pace else "  [does not keep pace]")
                    + ("" if st.fits or not st.keeps_pace else f"  [load above {GOAL_LOAD:g}]"),
                    flush=True,
                )
                if not st.keeps_pace:
                    break
        finally:
            fl.stop()
    fit = [s.ranks for s in steps if s.fits]
    pace = [s.ranks for s in steps if s.keeps_pace]
    print(
        f"fleet capacity: 3 coordinators on one PostgreSQL, {JOBS} jobs, 1 s windows,"
        f" {windows} windows a size; goal: findings within {GOAL_LATENCY_S:g} s of the last"
        f" summary at load <= {GOAL_LOAD:g}; {_mode(snapshot_every)}; largest size that fits: "
        + (f"{max(fit)} ranks" if fit else "none of the ladder")
        + "; largest that keeps pace at the load seen: "
        + (f"{max(pace)} ranks" if pace else "none of the ladder")
    )
    return 0 if fit and max(fit) >= 300_000 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet_capacity", description=__doc__)
    ap.add_argument(
        "--sizes",
        default=",".join(str(s) for s in SIZES),
        help="ranks in all, a comma list, smallest first (default %(default)s)",
    )
    ap.add_argument("--windows", type=int, default=8, help="windows a size (default 8)")
    ap.add_argument(
        "--snapshot-every",
        type=int,
        default=10,
        help="[fleet] snapshot_every (default 10; 1 = the whole state every window)",
    )
    ap.add_argument("--keep", type=Path, help="run in this folder and keep it (logs, outputs)")
    a = ap.parse_args(argv if argv is not None else [])
    try:
        sizes = [int(s) for s in a.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--sizes: expected ranks as a comma list of integers, got {a.sizes!r}")
    if not sizes or min(sizes) < JOBS or a.windows < 2 or a.snapshot_every < 1:
        ap.error(f"--sizes must be integers >= {JOBS}, --windows >= 2, --snapshot-every >= 1")
    return run(sizes, a.windows, a.keep, a.snapshot_every)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
