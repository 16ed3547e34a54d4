"""How much of a rank's excess its host explains: the `host` cause's quantitative fit.

Pure (no I/O). The diagnosis passes the measured slowdown s: the rank's compute
gap G against its peers' P, s = G/P - 1, so its excess is G - P = s x P. Each
mechanism's extra time on this rank over the peers' median, in the gap, is
divided by that excess and clipped to [0, 1]: its `explained` share. (Where
the detector's change test judged the rank, s is the change from its own
confirmed pace; the peers' figures then stand for its healthy self.)

- `runnable_wait`: the main thread was runnable but not running (schedstat run
  delay, `run_delay_pct` of the wall time). The slow rank's gap fills nearly
  all of its step (its peers wait for it, it waits for nobody), so a share x
  of the wall time is about x x G of its gap: (x - x_peers) x (1 + s) / s.
- `cgroup_throttled`: its cgroup's quota ran out (`cg_throttled_pct`), the same
  way. The kernel counts a throttled task's wait as run delay too, so the
  runnable wait is what run delay adds beyond the throttling. A cgroup that
  every rank shares (a pod, a Slurm job) shows the same figure on the peers,
  and its extra is nil: it counts only where it differs from the peers'.
- `stopped`: the process was stopped (state T: SIGSTOP, a scheduler's suspend,
  a debugger), `stopped_pct` of the wall time (the agent samples the state),
  the same way. A stopped task is neither runnable nor throttled.
- `idle`: not running although it could have run: an input stall or a stopped
  process. Not-busy time in the gap (`gap_busy_pct`, per record CPU times)
  over the peers', (1 - b)(1 + s) - (1 - b_peers), in units of P, less the
  waits and the stop above.

The shares split one quantity (the rank's extra time not running in its gap)
by its reason, so the host's `explained` is their sum (clipped to 1), its
`mechanism` the largest; the text names the others of at least MINOR_SHARE.
A mechanism whose figures are absent (on this rank or every peer) is not
scored; without any, the diagnosis keeps its qualitative host signals.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from artemis.protocol.records import Telemetry

MECHANISMS = ("stopped", "idle", "runnable_wait", "cgroup_throttled")
# A mechanism's share that the text names beside the best one's.
MINOR_SHARE = 0.1
_NAMES = {
    "stopped": "stopped",
    "idle": "idle",
    "runnable_wait": "runnable wait",
    "cgroup_throttled": "throttled",
}


@dataclass(frozen=True)
class HostFit:
    """The measured mechanisms' shares of the excess, and the best one's words."""

    shares: dict[str, float] = field(default_factory=dict)  # measured mechanisms only
    mechanism: str | None = None  # the best-explaining mechanism (None: none measured)
    explained: float | None = None
    text: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


def _median(values: Sequence[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _clip(x: float) -> float:
    return round(min(1.0, max(0.0, x)), 3)


def _pct(v: float | None) -> float | None:
    return None if v is None else round(float(v), 1)


def host_fit(t: Telemetry, peer_tels: Sequence[Telemetry], slowdown: float) -> HostFit:
    """Each host mechanism's share of the rank's excess (`slowdown` > 0, a fraction)."""
    s = slowdown
    scale = (1.0 + s) / s  # a share of the wall time, as a share of the excess
    peers_delay = _median([p.run_delay_pct for p in peer_tels])
    peers_thr = _median([p.cg_throttled_pct for p in peer_tels])
    peers_busy = _median([p.gap_busy_pct for p in peer_tels])
    peers_stop = _median([p.stopped_pct for p in peer_tels])
    evidence: dict[str, Any] = {
        "run_delay_pct": _pct(t.run_delay_pct),
        "peers_run_delay_pct": _pct(peers_delay),
        "cg_throttled_pct": _pct(t.cg_throttled_pct),
        "peers_cg_throttled_pct": _pct(peers_thr),
        "cg_nr_throttled": t.cg_nr_throttled,
        "stopped_pct": _pct(t.stopped_pct),
        "peers_stopped_pct": _pct(peers_stop),
    }
    shares: dict[str, float] = {}
    throttled = 0.0  # extra time throttled, in units of the excess
    if t.cg_throttled_pct is not None and peers_thr is not None:
        # a quota's throttled time sums over CPUs; one thread waits at most the wall time
        own, peers = min(t.cg_throttled_pct, 100.0), min(peers_thr, 100.0)
        throttled = max(0.0, (own - peers) / 100.0 * scale)
        shares["cgroup_throttled"] = _clip(throttled)
    waits = throttled
    if t.run_delay_pct is not None and peers_delay is not None:
        delayed = max(0.0, (t.run_delay_pct - peers_delay) / 100.0 * scale)
        shares["runnable_wait"] = _clip(delayed - throttled)
        waits = max(waits, delayed)
    stopped = 0.0
    if t.stopped_pct is not None and peers_stop is not None:
        stopped = max(0.0, (t.stopped_pct - peers_stop) / 100.0 * scale)
        shares["stopped"] = _clip(stopped)
    if t.gap_busy_pct is not None and peers_busy is not None:
        not_busy = ((1 - t.gap_busy_pct / 100.0) * (1 + s) - (1 - peers_busy / 100.0)) / s
        shares["idle"] = _clip(not_busy - waits - stopped)
    evidence["host_fit"] = dict(shares)
    if not shares:
        return HostFit(evidence=evidence)
    best = max(MECHANISMS, key=lambda m: (shares.get(m, -1.0), -MECHANISMS.index(m)))
    text = _words(best, t, peers_delay, peers_thr, peers_busy, peers_stop)
    # The shares split one quantity, the rank's extra time not running in its gap, by
    # its reason (each less the ones before it), so the host explains their sum. A hog
    # on the rank's core showed 45% as run delay and 48% as idle (the waits a sampled
    # run delay misses): the host explained 92%, neither mechanism half.
    others = [m for m in MECHANISMS if m != best and shares.get(m, 0.0) >= MINOR_SHARE]
    if others:
        text += " (and " + ", ".join(f"{_NAMES[m]} {shares[m]:.0%}" for m in others)
        text += " of the excess)"
    total = _clip(sum(shares.values()))
    return HostFit(shares, best, total, text, {**evidence, "mechanism": best})


def _words(
    mechanism: str,
    t: Telemetry,
    peers_delay: float | None,
    peers_thr: float | None,
    peers_busy: float | None,
    peers_stop: float | None,
) -> str:
    if mechanism == "stopped":
        return (
            f"stopped: the process was stopped (SIGSTOP, a scheduler's suspend or a "
            f"debugger) {t.stopped_pct or 0.0:.0f}% of the time vs {peers_stop or 0.0:.0f}% on "
            f"its peers, and every rank waited for it"
        )
    if mechanism == "cgroup_throttled":
        n = f", {t.cg_nr_throttled} periods" if t.cg_nr_throttled is not None else ""
        return (
            f"CPU quota: the rank's cgroup was throttled {min(t.cg_throttled_pct or 0.0, 100.0):.0f}"
            f"% of the time{n} vs {min(peers_thr or 0.0, 100.0):.0f}% on its peers"
        )
    if mechanism == "runnable_wait":
        share = (
            f"; the process got {t.proc_cpu_pct:.0f}% of a core"
            if t.proc_cpu_pct is not None
            else ""
        )
        busy = f", host CPU {t.cpu_pct:.0f}% busy" if t.cpu_pct is not None else ""
        return (
            f"waiting for a CPU: the process was runnable but not running "
            f"{t.run_delay_pct:.0f}% of the time vs {peers_delay:.0f}% on its peers{share}{busy}"
        )
    b = t.gap_busy_pct or 0.0
    unsure = (
        " (run delay not reported: part of it may be a wait for a CPU)"
        if t.run_delay_pct is None
        else ""
    )
    return (
        f"input stall: the process was idle for {100 - b:.0f}% of its "
        f"compute gap (busy {b:.0f}% vs {peers_busy:.0f}% on its peers) while it could have "
        f"run: waiting on its data loader or storage, or a stopped process, not on a CPU{unsure}"
    )
