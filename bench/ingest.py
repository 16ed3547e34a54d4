"""Whole-coordinator ingest on one core: rank-windows per second, memory per rank, and the time
from a window's last summary to its findings.

``python -m bench ingest``. The server is the real ``artemis-coordinator serve``
process (assembly, detector, findings and plans JSONL, Prometheus, control
socket: everything) pinned to one core with ``taskset``. The baseline, measured
in the same run, is the same protocol server (``ProtocolServer``, TCP, auth,
codec, dedup, acks) with an app that does nothing, pinned the same way. The
agents are ``sim/loadtest.py``'s: real ``AgentLink`` clients (HMAC handshake,
columnar ``windows`` messages of protocol 1.1) in one process pinned to the
other cores, one job, one straggler.

Throughput: every agent connects first; then every window of every agent is
queued (encoded) without yielding to the loop, and the clock runs from the
first byte sent to the last ack. The server's CPU time over the same span is
read from /proc: rank-windows per server CPU second is what one core sustains
even where the agents' single process is the slower side (it is, for the null
app with small agents). An ack means the app has the message, and
the coordinator scores a window inside the call that completes it, so the last
ack comes after the last window's findings were written. Rank-windows/s =
ranks x windows / that time; median of RUNS runs.

Memory per rank, from the paced runs (a backlog of queued frames would count
as memory otherwise), over the server's RSS before any agent connected, per rank:
the PEAK during the run (the kernel's high-water mark, reset once that base is
read, and a thread's reads of /proc every 10 ms, whichever is higher) and the level
HELD between windows (the highest of the reads just before each window after the
first is sent and the read after the run; by then the tick has handed a window's
freed heap back, protocol/heap.py). A window's burst (every agent's batch decoded,
journaled, assembled and scored within a few hundred ms) is live memory that a
single read after the run sees only by chance. The same for the null app in the
same paced job (connections, frame buffers, decoded batches: the protocol's share).

Latency: 10k- and 100k-rank jobs paced at one window per second; per window, from the
moment its last message was queued to the ack of the last of them (which
follows the findings line), the worst window reported. This is an upper bound
of "last summary -> findings line": it includes the client writing every
message of the window, the loopback trip and the ack coalescing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUNS = 3
JOB = "bench-ingest"
# (ranks per window, ranks per agent): a node of 8 GPUs is the usual agent; the big jobs
# also with bigger agents, to show where the per-message cost ends.
ROWS = ((64, 8), (512, 8), (10_000, 8), (10_000, 64), (10_000, 256), (100_000, 256))
SUMMARIES = 100_000  # per run (windows = SUMMARIES / ranks, at least MIN_WINDOWS)
# A job's first window carries its one-time work (its ranks' arrays grown, its first
# baselines): a 100k-rank run of 2 windows was half that (idle, 5 interleaved runs:
# 175k rank-windows per CPU second at 2 windows, 208k at 6). Ingest is the steady state.
MIN_WINDOWS = 6
# Paced runs: (ranks, ranks per agent, windows, window_s); memory and latency.
PACED = ((10_000, 64, 4, 1.0), (100_000, 256, 5, 1.0))
STRAGGLER = 5
GOAL_RATE = 200_000
GOAL_BYTES = 2048
GOAL_LATENCY_S = 1.0


def _cpus() -> tuple[int, list[int]]:
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[0], cpus[1:] or cpus[:1]


def _env() -> dict[str, str]:
    """The children's environment: this tree's root first (`bench`), then the caller's
    PYTHONPATH, so a worktree's package links (.envrc) still come before the installed
    tree (with the root alone, the server and agents ran the installed code)."""
    path = [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def _rss(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


SAMPLE_S = 0.01  # between the sampler's reads of the server's RSS
SETTLE_S = 0.6  # read on after the run: more than two of the coordinator's 0.25 s ticks


class _RssSampler:
    """A thread reading a process's RSS every SAMPLE_S: (perf_counter, bytes) pairs. The
    kernel's own high-water mark (VmHWM) is reset at the start where /proc allows it
    (clear_refs 5, Linux 4.0+), so `hwm()` also sees a peak shorter than a read's gap."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
            self._hwm_reset = True
        except OSError:
            self._hwm_reset = False
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.samples.append((time.perf_counter(), _rss(self.pid)))
            if self._stop.wait(SAMPLE_S):
                return

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def hwm(self) -> int | None:
        """The kernel's peak RSS since the start (None where it could not be reset)."""
        return _rss(self.pid, "VmHWM") if self._hwm_reset else None


@dataclass(frozen=True)
class Memory:
    """A server's RSS through a paced run, in bytes a rank over its RSS before any agent
    connected: `peak` the highest at any moment (`read_peak`: the highest of the 10 ms
    reads alone), `held` the highest level it came back to between windows (and after
    the run), `base` that RSS before (bytes)."""

    peak: float
    read_peak: float
    held: float
    base: int
    samples: int


def _memory(
    samples: list[tuple[float, int]], hwm: int | None, sent: list[float], base: int, ranks: int
) -> Memory:
    """`sent`: when each window's batches were queued (the client's perf_counter: the same
    monotonic clock). Held: the last read before each window after the first, and the
    last read of all (after the run and SETTLE_S)."""
    if not samples:
        raise RuntimeError("the RSS sampler read nothing")
    read = max(r for _, r in samples)
    between = [[r for t, r in samples if t < s][-1] for s in sent[1:] if samples[0][0] < s]
    held = max([*between, samples[-1][1]])
    peak = max(read, hwm or 0)
    return Memory(
        peak=(peak - base) / ranks,
        read_peak=(read - base) / ranks,
        held=(held - base) / ranks,
        base=base,
        samples=len(samples),
    )


# --------------------------------------------------------------------------- servers


def _null_server_main(address_file: str, secret_file: str) -> None:
    """`python -m bench.ingest null ADDR_FILE SECRET_FILE`: the protocol server, null app."""
    from artemis.common.aio import run
    from artemis.protocol.auth import load_secret
    from artemis.protocol.heap import keep_heap_compact, release_free
    from artemis.protocol.server import ProtocolServer
    from artemis.protocol.tcp import TcpTransport

    keep_heap_compact()  # as the coordinator does (coordinator/server_main.py)

    class Null:
        async def on_message(self, peer: Any, msg: Any) -> None:
            return None

        def on_disconnect(self, peer: Any) -> None:
            return None

    async def serve() -> None:
        server = ProtocolServer(TcpTransport(), "127.0.0.1:0", load_secret(secret_file), Null())
        Path(address_file).write_text(await server.start())
        while True:  # the coordinator's tick hands freed memory back as often
            await asyncio.sleep(0.25)
            release_free()

    _quiet()
    run(serve())


def _quiet() -> None:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


class _Server:
    """A pinned server process: the real coordinator, or the null-app protocol server."""

    def __init__(self, mode: str, work: Path, secret: Path, cpu: int) -> None:
        self.mode = mode
        self.work = work
        from socket import socket

        with socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket() as s:
            s.bind(("127.0.0.1", 0))
            mport = s.getsockname()[1]
        pin = ["taskset", "-c", str(cpu)] if shutil.which("taskset") else []
        log = open(work / f"{mode}.log", "wb")  # noqa: SIM115 - closed in stop()
        self._log = log
        if mode == "coordinator":
            cfg = work / "coordinator.toml"
            cfg.write_text(
                "assembly_deadline_s = 60.0\nassembly_grace_s = 0.0\ntick_s = 0.25\n"
                f'metrics_addr = "127.0.0.1"\ncontrol_socket = "{work / "c.sock"}"\n'
                "[detector]\nhang_floor_s = 600.0\n"
            )
            cmd = [
                str(Path(sys.executable).parent / "artemis-coordinator"),
                "serve", "--listen", f"127.0.0.1:{port}", "--metrics-port", str(mport),
                "--jsonl", str(work / "findings.jsonl"), "--plans-jsonl",
                str(work / "plans.jsonl"), "--secret-file", str(secret), "--config", str(cfg),
            ]  # fmt: skip
            self.address = f"127.0.0.1:{port}"
        else:
            addr = work / "null.addr"
            cmd = [sys.executable, "-m", "bench.ingest", "null", str(addr), str(secret)]
        env = _env()
        self.proc = subprocess.Popen([*pin, *cmd], stdout=log, stderr=subprocess.STDOUT, env=env)
        end = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{mode} server exited: {(work / f'{mode}.log').read_text()}")
            if mode != "coordinator" and addr.exists() and addr.read_text():
                self.address = addr.read_text()
                break
            if mode == "coordinator" and _listening(port):
                break
            if time.monotonic() > end:
                raise RuntimeError(f"{mode} server did not start")
            time.sleep(0.05)
        time.sleep(0.3)  # the coordinator's metrics and tick are up too
        self.rss0 = _rss(self.proc.pid)

    def rss(self) -> int:
        return _rss(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def _listening(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- clients


def _client_main(spec_json: str) -> None:
    """`python -m bench.ingest client SPEC`: play the agents, print one JSON result line."""
    _quiet()
    from artemis.common.aio import run

    out = run(_drive(json.loads(spec_json)))
    print(json.dumps(out), flush=True)


async def _drive(p: dict[str, Any]) -> dict[str, Any]:
    from artemis.protocol.auth import load_secret
    from artemis.protocol.client import AgentIdentity, AgentLink
    from artemis.protocol.messages import RankInfo, Windows
    from artemis.protocol.tcp import TcpTransport
    from artemis.sim.loadtest import LoadSpec, _Template

    spec = LoadSpec(
        coordinator=p["address"], secret=load_secret(p["secret"]), ranks=p["ranks"],
        ranks_per_agent=p["k"], windows=p["windows"], window_s=p["window_s"],
        stragglers={STRAGGLER: 1.3}, job=JOB,
    )  # fmt: skip
    templates = [_Template(spec, a) for a in range(spec.agents)]
    links = [
        AgentLink(
            TcpTransport(),
            spec.coordinator,
            spec.secret,
            AgentIdentity(
                agent_id=t.host,
                host=t.host,
                agent_version="bench",
                ranks=tuple(RankInfo(JOB, spec.comm, int(r), spec.ranks) for r in t.ranks),
            ),
            outbox_capacity=spec.windows + 16,
            outbox_max_bytes=1 << 31,
        )
        for t in templates
    ]
    for link in links:
        link.start()
    await asyncio.gather(*(link.wait_connected(120) for link in links))
    batches = [[t.batch(w) for w in range(spec.windows)] for t in templates]
    out: dict[str, Any] = {}
    if spec.window_s == 0:
        # Tell the bench we are about to send, and wait for its go (it reads the
        # server's CPU time in between).
        print("ready", flush=True)
        sys.stdin.readline()
        seqs = [
            [link.enqueue(Windows(host=t.host, columns=b)) for b in bs]
            for t, link, bs in zip(templates, links, batches, strict=True)
        ]
        t0 = time.perf_counter()  # nothing was sent yet: the loop did not run
        await asyncio.gather(
            *(link.wait_acked(s[-1], 600) for link, s in zip(links, seqs, strict=True))
        )
        out["elapsed"] = time.perf_counter() - t0
    else:
        lat = []
        sent: list[float] = []
        start = time.perf_counter()
        for w in range(spec.windows):
            await asyncio.sleep(max(0.0, start + w * spec.window_s - time.perf_counter()))
            sent.append(time.perf_counter())
            last = [
                link.enqueue(Windows(host=t.host, columns=bs[w]))
                for t, link, bs in zip(templates, links, batches, strict=True)
            ]
            # Queued and encoded; the links write them as soon as this task yields.
            t_sent = time.perf_counter()
            await asyncio.gather(
                *(link.wait_acked(s, 600) for link, s in zip(links, last, strict=True))
            )
            lat.append(time.perf_counter() - t_sent)
        out["latency"] = lat
        out["sent"] = sent
    await asyncio.gather(*(link.close(timeout=1.0) for link in links))
    return out


def _play(
    address: str,
    secret: Path,
    ranks: int,
    k: int,
    windows: int,
    window_s: float,
    on_ready: Any = None,
) -> Any:
    """Run the agents' process; `on_ready()` is called just before an unpaced run sends."""
    _, cpus = _cpus()
    spec = json.dumps(
        {"address": address, "secret": str(secret), "ranks": ranks, "k": k,
         "windows": windows, "window_s": window_s}
    )  # fmt: skip
    pin = ["taskset", "-c", ",".join(map(str, cpus))] if shutil.which("taskset") else []
    env = _env()
    proc = subprocess.Popen(
        [*pin, sys.executable, "-m", "bench.ingest", "client", spec],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    lines = []
    for line in proc.stdout:
        if line.strip() == "ready":
            if on_ready is not None:
                on_ready()
            proc.stdin.write("go\n")
            proc.stdin.flush()
        elif line.strip():
            lines.append(line)
    if proc.wait(1800) != 0 or not lines:
        err = proc.stderr.read() if proc.stderr else ""
        raise RuntimeError(f"bench client failed: {err[-3000:]}")
    return json.loads(lines[-1])


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- runs


def _secret(work: Path) -> Path:
    p = work / "secret"
    p.write_text("bench ingest secret, 32 bytes..\n")
    p.chmod(0o600)
    return p


def measure(mode: str, ranks: int, k: int) -> tuple[float, float]:
    """(rank-windows/s of wall time, rank-windows per CPU second of the server) of one run,
    every window queued at once."""
    windows = max(MIN_WINDOWS, SUMMARIES // ranks)
    with _server(mode, windows) as (srv, secret):
        cpu0: list[float] = []
        out = _play(
            srv.address, secret, ranks, k, windows, 0.0,
            on_ready=lambda: cpu0.append(_cpu_s(srv.proc.pid)),
        )  # fmt: skip
        used = _cpu_s(srv.proc.pid) - cpu0[0]
    n = ranks * windows
    return n / out["elapsed"], n / max(used, 1e-9)


@contextlib.contextmanager
def _server(mode: str, windows: int) -> Iterator[tuple[_Server, Path]]:
    """A server of `mode` on its pinned CPU, in a temporary directory, and its secret;
    stopped at the end, after a coordinator's run is checked (`_check_scored`)."""
    cpu, _ = _cpus()
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        work = Path(tmp)
        secret = _secret(work)
        srv = _Server(mode, work, secret, cpu)
        try:
            yield srv, secret
            if mode == "coordinator":
                _check_scored(work / "findings.jsonl", windows)
        finally:
            srv.stop()


def _check_scored(path: Path, windows: int) -> None:
    """The run counts only if the coordinator wrote the straggler's finding for the last window."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    last = [f for f in lines if f.get("window") == windows - 1 and f.get("rank") == STRAGGLER]
    if not last:
        raise RuntimeError(f"coordinator did not score window {windows - 1}: {lines[-3:]}")


def paced_run(
    ranks: int, k: int, windows: int, window_s: float, mode: str = "coordinator"
) -> tuple[list[float], Memory]:
    """(per-window latency bounds in s, the server's memory) of a paced job."""
    with _server(mode, windows) as (srv, secret):
        sampler = _RssSampler(srv.proc.pid)
        try:
            out = _play(srv.address, secret, ranks, k, windows, window_s)
            time.sleep(SETTLE_S)
            hwm = sampler.hwm()
        finally:
            samples = sampler.stop()
    lat: list[float] = out["latency"]
    return lat, _memory(samples, hwm, out["sent"], srv.rss0, ranks)


def paced(
    ranks: int, k: int, windows: int, window_s: float, mode: str = "coordinator"
) -> tuple[list[float], float]:
    """(per-window latency bounds in s, the server's PEAK bytes per rank) of a paced job."""
    lat, mem = paced_run(ranks, k, windows, window_s, mode)
    return lat, mem.peak


def main() -> int:
    cpu, clients = _cpus()
    print(
        f"coordinator ingest over loopback TCP: server pinned to cpu {cpu} (taskset), "
        f"agents on {clients}; ~{SUMMARIES} rank-windows per run, median of {RUNS} runs"
    )
    print(
        "rank-windows per second of wall time, and per CPU second the server used"
        " (what one core sustains when the agents' process is the slower side)"
    )
    hdr = (
        f"{'ranks':>7} {'per agent':>9} {'windows':>7} {'null /s':>9} {'null /cpu-s':>11} "
        f"{'coord /s':>9} {'coord /cpu-s':>12} {'ratio':>6} {'>=200k':>6} {'load':>5}"
    )
    print(hdr)
    print("-" * len(hdr))
    for ranks, k in ROWS:
        null = [measure("null", ranks, k) for _ in range(RUNS)]
        full = [measure("coordinator", ranks, k) for _ in range(RUNS)]
        nw, nc = (statistics.median(x[i] for x in null) for i in (0, 1))
        fw, fc = (statistics.median(x[i] for x in full) for i in (0, 1))
        best = max(fw, fc)
        print(
            f"{ranks:>7} {k:>9} {max(MIN_WINDOWS, SUMMARIES // ranks):>7} {nw:>9,.0f} {nc:>11,.0f}"
            f" {fw:>9,.0f} {fc:>12,.0f} {fc / nc:>6.2f} {'yes' if best >= GOAL_RATE else 'no':>6}"
            f" {os.getloadavg()[0]:>5.1f}",
            flush=True,
        )
    print(
        "paced jobs (one run each): coordinator RSS per rank at its peak and held between"
        " windows (null app: the protocol server alone), last summary -> findings"
    )
    for ranks, k, windows, window_s in PACED:
        lat, mem = paced_run(ranks, k, windows, window_s)
        # The same paced job against the null app: what connections, frames and the
        # decoded batches alone leave in the RSS.
        _, nmem = paced_run(ranks, k, windows, window_s, mode="null")
        worst = max(lat)
        print(
            f"{ranks:>7} ranks ({k} per agent), {windows} windows of {window_s:g} s:"
            f" peak {mem.peak:,.0f} B/rank (<= {GOAL_BYTES}:"
            f" {'yes' if mem.peak <= GOAL_BYTES else 'no'}), held {mem.held:,.0f};"
            f" null app peak {nmem.peak:,.0f}, held {nmem.held:,.0f};"
            f" latency median {statistics.median(lat):.3f} s, worst {worst:.3f} s"
            f" (<= {GOAL_LATENCY_S:g} s: {'yes' if worst <= GOAL_LATENCY_S else 'no'});"
            f" load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "null":
        _null_server_main(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "client":
        _client_main(sys.argv[2])
    else:
        sys.exit(main())
