"""A coordinator fleet on one real PostgreSQL, for tests/test_fleet_e2e.py and
bench/fleet_failover.py (issue 30; docs/DESIGN.md "The coordinator fleet").

Everything is real: N `artemis-coordinator serve --fleet` processes share one
PostgreSQL (tests/pg.py), `artemis-agent run` processes are given the fleet's
addresses as a comma list, and the jobs' rings are written by the real plugin
through the NCCL stand-in (tests/daemon_harness.LockstepFeeder), whose compute
times the test chooses. A job follows rebalance plans as `artemis.job` does: it
reads the plan the agent publishes and acknowledges the split it switched to
(artemis.rebalance.files).

What the fleet did is read from its outputs, never from its internals: each
member's findings, plans and incidents JSONL (what it scored), the store
(incidents, per-window rows) and each member's /metrics (who owns a job:
`straggler_job_owner{job}`, exported by the owner only). `Outputs` gathers
them; the `check_*` functions judge them and return problems as sentences (an
empty list: nothing wrong), so a failure says which window, which member.

A member can run in a network namespace of its own (`Cutoff`): joined to the
test's namespace by a veth pair, PostgreSQL also listening on an address of
that pair, so that one route (`cut()`) takes the database away from that
member alone while its agents still reach it.
"""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from artemis.common.ports import START_TRIES, error_line, port_taken
from artemis.common.tomlfile import toml_value
from artemis.rebalance.files import (
    ack_path,
    make_ack,
    read_plan,
    write_json_atomic,
)
from daemon_harness import (
    BIN,
    Daemon,
    LockstepFeeder,
    free_port,
    json_records,
    metric,
    metric_by_label,
    scrape,
    start_agent,
    wait_for,
    write_secret,
)
from pg import PgServer

W_STEPS = 10  # steps per window
COLLS = 4  # collectives per step
BASE_MS = (6.0, 3.0, 3.0, 3.0)  # compute before each collective at the uniform split
UNIFORM = 40  # samples per rank per step
LEASE_S = 3.0  # short leases: a failover within a test's budget
RENEW_S = 0.5
DETECTOR = {"hang_floor_s": 600.0}  # pauses of a failover are not hangs


def compute(
    nranks: int, slow: int, factor: float = 1.3, samples: Sequence[int] | None = None
) -> list[list[float]]:
    """Compute per collective: proportional to a rank's samples, `factor` slower on `slow`."""
    s = list(samples or [UNIFORM] * nranks)
    return [
        [b * s[r] / UNIFORM * (factor if r == slow else 1.0) for b in BASE_MS]
        for r in range(nranks)
    ]


# ---------------------------------------------------------------- members


@dataclass
class Member:
    """One coordinator of the fleet: its own folder (findings, plans, incidents JSONL,
    journal, control socket, log), the fleet's store and secret."""

    name: str  # its fleet id
    work: Path
    secret: Path
    store: str
    lease_s: float = LEASE_S
    renew_s: float = RENEW_S
    host: str = "127.0.0.1"  # where it listens (agents, metrics): its namespace's address
    detector: dict[str, Any] = field(default_factory=dict)
    netns: str | None = None  # born in this network namespace (Cutoff)
    fleet: bool = True  # False: a lone coordinator on the same store (a baseline)
    snapshot_every: int = 10  # [fleet] snapshot_every (1: the whole state every window)
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    daemon: Daemon | None = None
    lives: int = 0
    logs: list[Path] = field(default_factory=list)  # one per life

    def __post_init__(self) -> None:
        # Its outputs, in its own folder: what it scored (docs/DESIGN.md "Outputs").
        self.jsonl, self.plans, self.incidents = (
            self.work / f"{n}.jsonl" for n in ("findings", "plans", "incidents")
        )

    @property
    def address(self) -> str:
        """Where its agents reach it (and what it advertises to the fleet)."""
        return f"{self.host}:{self.port}"

    def config_text(self) -> str:
        top = {
            "assembly_deadline_s": 2.0,
            "tick_s": 0.05,
            "metrics_addr": self.host,
            "control_socket": str(self.work / "coordinator.sock"),
            "store": self.store,
            "store_retry_max_s": 0.5,
        }
        fleet = {
            "enabled": True,
            "id": self.name,
            "lease_s": self.lease_s,
            "renew_s": self.renew_s,
            "advertise": self.address,
            "snapshot_every": self.snapshot_every,
        }
        tables = {"fleet": fleet} if self.fleet else {}
        tables["detector"] = {**DETECTOR, **self.detector}
        lines = [f"{k} = {toml_value(v)}" for k, v in top.items()]
        for name, table in tables.items():
            lines += [f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in table.items())]
        return "\n".join(lines) + "\n"

    def start(self, wait: bool = True) -> Member:
        first = self.lives == 0
        for left in range(START_TRIES - 1, -1, -1):
            self._spawn()
            if not wait:
                return self
            d = self.daemon
            assert d is not None
            wait_for(
                lambda: (
                    not d.alive()  # noqa: B023 - waited on within this iteration
                    or self.value("straggler_detector_active") == 1
                ),
                30,
                f"{self.name}: metrics endpoint",
            )
            # A first life's ports, picked free, can be taken before it binds them
            # (common/ports.py): it starts on others, before anyone learnt its address.
            if d.alive() or not first or not left or not port_taken(error_line(d.log)):
                break
            self.port, self.metrics_port = free_port(), free_port()
        self.wait_up()
        return self

    def _spawn(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        cfg = self.work / "coordinator.toml"
        cfg.write_text(self.config_text())
        self.lives += 1
        log = self.work / f"coordinator.{self.lives}.log"
        self.logs.append(log)
        argv = [
            str(BIN / "artemis-coordinator"),
            "serve",
            *("--listen", self.address, "--metrics-port", str(self.metrics_port)),
            *("--jsonl", str(self.jsonl), "--plans-jsonl", str(self.plans)),
            *("--secret-file", str(self.secret), "--config", str(cfg), "--log-json"),
            *(["--fleet"] if self.fleet else []),
        ]
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        self.daemon = Daemon(self.name, argv, log).start()

    def wait_up(self) -> None:
        d = self.daemon
        assert d is not None
        wait_for(
            lambda: not d.alive() or self.value("straggler_detector_active") == 1,
            30,
            f"{self.name}: metrics endpoint",
        )
        assert d.alive(), f"{self.name} exited:\n{d.log_text()[-3000:]}"

    def alive(self) -> bool:
        return self.daemon is not None and self.daemon.alive()

    def kill(self) -> None:
        if self.daemon is not None:
            self.daemon.kill()

    def stop(self) -> int | None:
        return None if self.daemon is None else self.daemon.stop()

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        url = f"http://{self.host}:{self.metrics_port}/metrics"
        return scrape(url, timeout=1.0) if self.alive() else {}

    def value(self, name: str, **labels: str) -> float | None:
        return metric(self.samples(), name, **labels)

    def epoch(self, job: str) -> float | None:
        """The lease epoch it exports for `job` (only an owner does), or None."""
        return self.value("straggler_job_owner", job=job)

    def disowns(self, job: str) -> bool:
        """It answers /metrics, and without an owner gauge for `job` (a member that does
        not answer says nothing either way)."""
        got = self.samples()
        return bool(got) and metric(got, "straggler_job_owner", job=job) is None

    def last_window(self, job: str) -> int:
        got = self.samples()
        if not metric_by_label(got, "straggler_windows_scored_total", "job").get(job):
            return -1
        v = metric(got, "straggler_last_window", job=job)
        return -1 if v is None else int(v)

    def log_records(self) -> list[dict[str, Any]]:
        """Every life's JSON log lines, each tagged with its life (1, 2, ...)."""
        out = []
        for life, path in enumerate(self.logs, 1):
            if path.exists():
                for rec in json_records(path.read_text(errors="replace")):
                    out.append({**rec, "_life": life})
        return out


# ---------------------------------------------------------------- the fleet


class Fleet:
    """N members on one store, one secret; agents on host folders, given the fleet's
    addresses in an order of the test's choosing (the first reachable one is tried first)."""

    def __init__(
        self,
        tmp: Path,
        store: str,
        n: int = 3,
        *,
        lease_s: float = LEASE_S,
        renew_s: float = RENEW_S,
        detector: dict[str, Any] | None = None,
        fleet: bool = True,
        snapshot_every: int = 10,
    ) -> None:
        self.tmp = tmp
        self.secret = write_secret(tmp / "secret")
        self.members = [
            Member(f"c{i}", tmp / f"c{i}", self.secret, store, lease_s, renew_s) for i in range(n)
        ]
        for m in self.members:
            m.detector, m.fleet = dict(detector or {}), fleet
            m.snapshot_every = snapshot_every
        self.store = store
        self.agents: dict[str, Daemon] = {}

    def start(self) -> Fleet:
        for m in self.members:
            m.start(wait=False)
        for m in self.members:
            m.wait_up()
        return self

    def addresses(self, first: int = 0, count: int | None = None) -> str:
        """The fleet's addresses as an agent's comma list, member `first` first (`count`
        of them: all by default)."""
        ms = self.members[first:] + self.members[:first]
        return ",".join(m.address for m in ms[:count])

    def start_agent(self, shm: Path, host: str, first: int = 0, count: int | None = None) -> Daemon:
        self.agents[host] = start_agent(
            self.tmp,
            self.addresses(first, count),
            shm,
            self.secret,
            host,
            window_steps=W_STEPS,
            colls_per_step=COLLS,
        )
        return self.agents[host]

    def owners(self, job: str) -> list[Member]:
        """The live members that export an owner gauge for `job` (one, in a healthy fleet)."""
        return [m for m in self.members if m.epoch(job) is not None]

    def wait_owner(self, job: str, timeout: float = 40, other_than: Member | None = None) -> Member:
        def one() -> Member | None:
            got = self.owners(job)
            return got[0] if len(got) == 1 and got[0] is not other_than else None

        owner: Member = wait_for(one, timeout, f"{job}: one owner (not {other_than})")
        return owner

    def last_window(self, job: str) -> int:
        """The highest window of `job` any live member says it scored."""
        return max([m.last_window(job) for m in self.members] + [-1])

    def wait_window(self, job: str, w: int, timeout: float = 60) -> None:
        wait_for(lambda: self.last_window(job) >= w, timeout, f"{job}: window {w} scored")

    def stop(self) -> None:
        for a in self.agents.values():
            a.stop()
        for m in self.members:
            m.stop()

    def outputs(self) -> Outputs:
        return Outputs.read(self.members, self.store)


# ---------------------------------------------------------------- a job


class FleetJob:
    """A lockstep job of `nranks` ranks (rank r on host folder `shm_of_rank[r]`), rank
    `slow` `factor` times slower, following the plans its agents publish."""

    def __init__(
        self,
        fleet: Fleet,
        plugin: Path,
        name: str,
        shm_of_rank: Sequence[Path],
        slow: int,
        comm: int,
        factor: float = 1.3,
    ) -> None:
        self.fleet, self.name, self.slow, self.factor = fleet, name, slow, factor
        self.shm_of_rank = list(shm_of_rank)
        self.nranks = len(shm_of_rank)
        self.samples = [UNIFORM] * self.nranks
        self.feeder = LockstepFeeder(
            plugin, self.shm_of_rank, compute(self.nranks, slow, factor), job=name, comm_hash=comm
        )
        self.pending: dict[str, Any] | None = None
        self.seen: set[str] = set()
        self.switched: list[str] = []  # plan ids this job switched to, in order
        self.next_window = 0
        self._ack("uniform")

    def _ack(self, plan_id: str) -> None:
        gb = sum(self.samples)
        for r, shm in enumerate(self.shm_of_rank):
            rec = make_ack(plan_id, r, self.feeder.steps, self.samples[r], gb)
            write_json_atomic(ack_path(shm, self.name, r), rec)

    def write_window(self) -> bool:
        """One window's steps, switching to a published plan at its step first (True)."""
        for shm in sorted(set(self.shm_of_rank)):
            plan = read_plan(shm, self.name)
            if plan is not None and plan["id"] not in self.seen:
                self.seen.add(plan["id"])
                self.pending = plan
        switched = False
        if self.pending is not None and self.feeder.steps >= self.pending["apply_at_step"]:
            self.samples = list(self.pending["samples"])
            self.feeder.set_compute(compute(self.nranks, self.slow, self.factor, self.samples))
            self._ack(self.pending["id"])
            self.switched.append(self.pending["id"])
            self.pending, switched = None, True
        self.feeder.write_steps(W_STEPS)
        self.next_window += 1
        return switched

    def step(self, timeout: float = 60) -> int:
        """Write the next window w, then wait until w - 1 is scored somewhere in the fleet
        (a window closes when the next one starts); returns w."""
        w = self.next_window
        self.write_window()
        if w:
            self.fleet.wait_window(self.name, w - 1, timeout)
        return w

    def drive(self, until: Callable[[], Any], limit: int, what: str, timeout: float = 60) -> None:
        """`step` until `until()`; fails naming `what` past window `limit`."""
        while not until():
            assert self.next_window < limit, f"{self.name}: {what} did not happen by {limit}"
            self.step(timeout)

    def finish(self, timeout: float = 60) -> int:
        """The job ends: its last window written and scored; returns that window."""
        last = self.next_window - 1
        self.feeder.finish()
        self.fleet.wait_window(self.name, last, timeout)
        return last


# ---------------------------------------------------------------- what the fleet wrote


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return json_records(path.read_text(errors="replace")) if path.exists() else []


@dataclass
class Outputs:
    """What every member wrote (each record tagged `_by`: the member) and the store's view."""

    findings: list[dict[str, Any]]
    plans: list[dict[str, Any]]
    incident_lines: list[dict[str, Any]]
    store_incidents: list[dict[str, Any]]
    store_windows: dict[str, list[int]]  # job -> its per-window rows' windows
    incident_windows: dict[str, list[int]]  # incident id -> its per-window rows' windows
    logs: list[dict[str, Any]]

    @classmethod
    def read(cls, members: Sequence[Member], store: str) -> Outputs:
        from artemis.store import open_store

        def tagged(get: Callable[[Member], list[dict[str, Any]]]) -> list[dict[str, Any]]:
            return [{**rec, "_by": m.name} for m in members for rec in get(m)]

        findings = tagged(lambda m: _jsonl(m.jsonl))
        with open_store(store, readonly=True) as s:
            incidents = s.incidents()
            jobs = {f["job"] for f in findings} | {i["job"] for i in incidents}
            windows = {j: [int(r["window"]) for r in s.job_windows(j)] for j in jobs}
            rows = {
                i["id"]: [int(r["window"]) for r in s.incident_windows(i["id"])] for i in incidents
            }
        return cls(
            findings=findings,
            plans=tagged(lambda m: _jsonl(m.plans)),
            incident_lines=tagged(lambda m: _jsonl(m.incidents)),
            store_incidents=incidents,
            store_windows=windows,
            incident_windows=rows,
            logs=tagged(Member.log_records),
        )

    def rank_lines(self, job: str, rank: int) -> list[dict[str, Any]]:
        """The `rank` findings of one rank, in window order (ties: as written)."""
        got = [
            f
            for f in self.findings
            if f["job"] == job and f["kind"] == "rank" and f.get("rank") == rank
        ]
        return sorted(got, key=lambda f: int(f["window"]))

    def scored_by(self, job: str) -> dict[int, list[str]]:
        """window -> the members whose findings JSONL has a line of that window (of any
        kind): each member's files hold what it scored."""
        out: dict[int, set[str]] = collections.defaultdict(set)
        for f in self.findings:
            if f["job"] == job:
                out[int(f["window"])].add(f["_by"])
        return {w: sorted(by) for w, by in sorted(out.items())}


# ---------------------------------------------------------------- the checks


def check_scored_once(out: Outputs, job: str, rank: int, windows: range) -> list[str]:
    """Every window of `windows` scored exactly once across the fleet: the straggler has
    exactly one finding line per window (it is slow in every one), all of them in the
    JSONL of one member, and the store has a per-window row for each."""
    problems = []
    lines = out.rank_lines(job, rank)
    count = collections.Counter(int(f["window"]) for f in lines)
    twice = {w: n for w, n in count.items() if n > 1}
    if twice:
        by = {w: [f["_by"] for f in lines if f["window"] == w] for w in twice}
        problems.append(f"{job}: windows scored more than once (window: members): {by}")
    # A window whose outputs a kill cut between its commit and its JSONL lines is still
    # scored: its rows are in the store (the straggler's incident has a row of it).
    rows = {
        w
        for i in out.store_incidents
        if i["job"] == job and i.get("rank") == rank
        for w in out.incident_windows.get(i["id"], [])
    }
    lost = [w for w in windows if w not in count and w not in rows]
    if lost:
        problems.append(f"{job}: windows never scored (no line, no row for rank {rank}): {lost}")
    problems += check_owners_apart(out, job)
    stored = set(out.store_windows.get(job, []))
    unstored = [w for w in windows if w not in stored]
    if unstored:
        problems.append(f"{job}: windows without a row in the store: {unstored}")
    return problems


def check_finding_continues(out: Outputs, job: str, rank: int) -> list[str]:
    """The straggler's finding is one episode across every owner: suspect..., flagged
    once, then ongoing, every line with the same `since`."""
    lines = out.rank_lines(job, rank)
    states = [f["state"] for f in lines]
    if not lines:
        return [f"{job}: no finding for rank {rank}"]
    problems = []
    if states.count("flagged") != 1:
        problems.append(f"{job}: rank {rank} flagged {states.count('flagged')} times: {states}")
    else:
        i = states.index("flagged")
        if set(states[:i]) - {"suspect"} or set(states[i + 1 :]) - {"ongoing"}:
            problems.append(f"{job}: rank {rank}'s finding broke: {states}")
    sinces = {f["since"] for f in lines}
    if len(sinces) != 1:
        problems.append(f"{job}: rank {rank}'s finding restarted (since {sorted(sinces)})")
    return problems


def check_one_incident(out: Outputs, job: str, rank: int) -> list[str]:
    """One incident for the straggler, with one ID, still open, in the store and in every
    member's incidents JSONL (each owner continued it rather than opening its own)."""
    problems = []
    stored = [i for i in out.store_incidents if i["job"] == job and i.get("rank") == rank]
    ids = {i["id"] for i in stored}
    lined = {i["id"] for i in out.incident_lines if i["job"] == job and i.get("rank") == rank}
    if len(ids) != 1:
        problems.append(f"{job}: rank {rank} has {len(ids)} incidents in the store: {ids}")
    if lined != ids:
        by = sorted({(i["_by"], i["id"]) for i in out.incident_lines if i["job"] == job})
        problems.append(f"{job}: the members' incidents JSONL name other ids: {by} vs {ids}")
    closed = [i["id"] for i in stored if i.get("closed")]
    if closed:
        problems.append(f"{job}: the straggler's incident was closed by a failover: {closed}")
    return problems


def check_plan_verified(out: Outputs, job: str) -> list[str]:
    """Every plan recommended for `job` ends verified (or rolled back), each of its
    statuses written once across the fleet: the plan in force survived its owner."""
    problems = []
    mine = [p for p in out.plans if p["job"] == job]
    if not mine:
        return [f"{job}: no plan was recommended"]
    keys = collections.Counter((p["id"], p["status"]) for p in mine)
    twice = {k: n for k, n in keys.items() if n > 1}
    if twice:
        problems.append(f"{job}: plan statuses written more than once: {twice}")
    end: dict[str, str] = {}
    for p in mine:
        end[p["id"]] = p["status"]
    left = {i: s for i, s in end.items() if s not in ("verified", "rolled_back")}
    if left:
        problems.append(f"{job}: plans neither verified nor rolled back: {left}")
    return problems


def check_owners_apart(out: Outputs, job: str) -> list[str]:
    """Two owners never scored the same window: no window of `job` has outputs (finding
    lines of any kind) in two members' files."""
    shared = {w: by for w, by in out.scored_by(job).items() if len(by) > 1}
    return [f"{job}: two owners scored the same windows: {shared}"] if shared else []


# ---------------------------------------------------------------- a member cut off from PostgreSQL


class Cutoff:
    """A network namespace for one member, joined to the test's by a veth pair.

    The test's side of the pair has two addresses: `GATE` (the agents' source, and the
    member's route back to them) and `PG` (PostgreSQL listens there too). `cut()` adds a
    blackhole route to `PG` inside the namespace: the member's database traffic vanishes
    (a paused network, not a refused one) while its agents still reach it."""

    def __init__(self, tag: str) -> None:
        pid = os.getpid() % 100_000
        self.ns = f"afl{tag}{pid}"
        self.dev, self.peer = f"afl{tag}{pid}h", f"afl{tag}{pid}n"
        sub = 200 + (pid % 50)
        self.gate, self.pg, self.inner = f"10.{sub}.7.1", f"10.{sub}.7.3", f"10.{sub}.7.2"
        self.is_cut = False

    def __enter__(self) -> Cutoff:
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.dev], capture_output=True)
        for cmd in (
            ["netns", "add", self.ns],
            ["-n", self.ns, "link", "set", "lo", "up"],
            ["link", "add", self.dev, "type", "veth", "peer", "name", self.peer],
            ["link", "set", self.peer, "netns", self.ns],
            ["addr", "add", f"{self.gate}/24", "dev", self.dev],
            ["addr", "add", f"{self.pg}/24", "dev", self.dev],
            ["link", "set", self.dev, "up"],
            ["-n", self.ns, "addr", "add", f"{self.inner}/24", "dev", self.peer],
            ["-n", self.ns, "link", "set", self.peer, "up"],
        ):
            _ip(*cmd)
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal()
        subprocess.run(["ip", "link", "del", self.dev], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)

    def cut(self) -> None:
        _ip("-n", self.ns, "route", "add", "blackhole", f"{self.pg}/32")
        self.is_cut = True

    def heal(self) -> None:
        if self.is_cut:
            _ip("-n", self.ns, "route", "del", "blackhole", f"{self.pg}/32")
            self.is_cut = False

    def store_url(self, srv: PgServer, db: str) -> str:
        """The database's URL through the pair's `PG` address (for the member inside)."""
        return srv.url(db).replace(f"@127.0.0.1:{srv.port}/", f"@{self.pg}:{srv.port}/")


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")


@contextlib.contextmanager
def pg_also_on(addresses: Sequence[str]) -> Iterator[PgServer]:
    """A PostgreSQL server listening on 127.0.0.1 and on `addresses` too, its host-based
    authentication opened to their /24s (password auth, as on loopback)."""
    srv = PgServer()
    try:
        hba = srv.data / "pg_hba.conf"
        with open(hba, "a") as fh:
            for a in addresses:
                net = a.rsplit(".", 1)[0] + ".0/24"
                fh.write(f"host all all {net} scram-sha-256\n")
        listen = ",".join(["127.0.0.1", *addresses])
        opts = (
            f"-h {listen} -p {srv.port} -k '' -c fsync=off -c synchronous_commit=off"
            " -c full_page_writes=off -c max_connections=200"
        )
        srv._run("pg_ctl", "-D", str(srv.data), "-l", str(srv.log), "-o", opts, "-w", "start")
        yield srv
    finally:
        srv.destroy()
