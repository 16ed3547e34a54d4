"""Why a rank is slow, from its telemetry against its peers': a pure function.

Diagnosis by consistency (DETECTOR.md "Diagnosis"): given the measured
slowdown, a cause is named when its evidence explains it. The SM clock has a
quantitative model: compute is CLOCK_BOUND clock-bound, so a clock at c of
its peers' makes the rank CLOCK_BOUND x (1/c - 1) slower, and
`explained` = that / the measured slowdown (capped at 1). The host has one
too (`hostfit.py`): the extra time its mechanism (`stopped`, `idle`, `runnable_wait`,
`cgroup_throttled`) took in the rank's gap over the peers', / the excess.
PCIe and hardware evidence, and host signals without those figures (steal,
pressure, load), fit qualitatively, when present on this rank and absent on
its peers. Every fitting cause is named, best first
(`kind`, then `alternatives`). Without a measured slowdown the fixed
cut-off CLOCK_LOW_FRAC is the clock test, as in the seed.

The causes split by what the SM clock does:

- clocks low  -> thermal (thermal throttle reason, or hot vs peers),
                 power (power-cap reason, or drawing >= 97% of the limit),
                 clocks (low with no throttle reason: locked / misconfigured);
- clocks normal -> pcie (link below its max width or generation),
                   host (CPU contention on the host);
- either way    -> hardware (the GPU's error counters rose in the window
                   while its peers' did not: XID events, uncorrected ECC
                   errors, NVLink errors, a row remap pending or failed).

A throttle reason contradicted by normal clocks is not a cause. When no cause
fits, the answer is `unknown` and the text says what was checked.
Absent telemetry is listed in `missing`; it is never assumed healthy or sick.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from artemis.detect.hostfit import HostFit, host_fit
from artemis.detect.node_kind import is_cpu, reportable
from artemis.protocol import records
from artemis.protocol.records import Telemetry

# SM clock below this fraction of the reference (peers' median, else the GPU's
# own max clock) counts as low. Boost noise between healthy GPUs stays within ~5%.
CLOCK_LOW_FRAC = 0.90
# Hotter than the peers' median by this much (deg C), or this hot when no peer reports.
TEMP_ABOVE_PEERS_C = 10.0
TEMP_HOT_C = 85.0
POWER_CAP_FRAC = 0.97
# Host contention thresholds.
STEAL_PCT = 5.0
PSI_CPU_SOME = 20.0
LOAD_PER_CPU = 1.0
CPU_BUSY_PCT = 95.0
PROC_STARVED_FRAC = 0.75  # the rank's process gets <= 75% of its peers' CPU
# Without a measured slowdown (or the figures hostfit needs), input stall: the process is busy for at most GAP_IDLE_PCT % of its compute gap
# (per-record CPU times, Telemetry.gap_busy_pct) and at most GAP_IDLE_FRAC of
# its peers' share: it sleeps on its input (a data loader, storage). Relative to
# the peers because on a crowded host every gap is partly spent waiting for a core.
GAP_IDLE_PCT = 40.0
GAP_IDLE_FRAC = 0.5
CPU_ABOVE_PEERS_PCT = 25.0
# The consistency model. A clock deficit smaller than CLOCK_NOISE_FRAC is within
# healthy GPUs' boost wander and explains nothing; a cause is named when it
# explains at least EXPLAIN_MIN of the measured slowdown.
CLOCK_BOUND = 0.9
CLOCK_NOISE_FRAC = 0.025
EXPLAIN_MIN = 0.5
# Qualitative fits rank between a full and a partial quantitative one.
QUALITATIVE_FIT = 0.75

THERMAL_REASONS = ("hw_thermal", "sw_thermal")
POWER_REASONS = ("sw_power_cap", "hw_power_brake")
# Reasons that do not explain a slowdown (idle, boost sync) are ignored.
SLOWING_REASONS = (*THERMAL_REASONS, *POWER_REASONS, "hw_slowdown", "apps_clocks")

# Hardware error signals (records.Telemetry): counts are increases in the
# window, flags the state at its end. Each one counts for `hardware` when the
# rank has it and its peers' median does not (a fleet-wide rise, e.g. after a
# driver update, is not this GPU's fault). Corrected ECC errors are evidence
# only: a healthy GPU corrects a few.
HW_SIGNALS = ("xid_count", "ecc_uncorrected", "nvlink_errors", "remap_failed", "remap_pending")
HW_EVIDENCE = (
    "xid_count",
    "xid_last",
    "ecc_corrected",
    "ecc_uncorrected",
    "nvlink_errors",
    "retired_pages",
    "remapped_rows",
    "remap_pending",
    "remap_failed",
    "gpu_uuid",
    "gpu_serial",
    "gpu_pci_bus",
)
NIC_FIELDS = records.NIC_FIELDS

# Per-lane throughput by PCIe generation (GB/s after encoding): gen 3 switched
# to 128b/130b, so lost bandwidth is not a plain ratio of generations.
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563, 7: 15.125}

# Telemetry the rules read (tagged DIAG in the schema); absent ones are reported as missing.
DIAG_FIELDS = records.DIAG_FIELDS


@dataclass(frozen=True)
class Cause:
    kind: str  # thermal | power | clocks | pcie | host | hardware | unknown
    text: str
    evidence: dict[str, Any]
    missing: list[str] = field(default_factory=list)
    explained: float | None = None  # share of the slowdown explained (None: qualitative)
    alternatives: list[dict[str, Any]] = field(default_factory=list)  # other fits, by fit

    def to_json(self) -> dict[str, Any]:
        """The finding's `cause` object (missing goes on the finding)."""
        return {
            "kind": self.kind,
            "text": self.text,
            "evidence": dict(self.evidence),
            "explained": self.explained,
            "alternatives": [dict(a) for a in self.alternatives],
        }


def _median(values: Sequence[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None


def pcie_degraded(t: Telemetry) -> float | None:
    """Fraction of the link's maximum bandwidth lost (0.0 = full link), None if unknown."""
    width_frac: float | None = None
    if t.pcie_width is not None and t.pcie_width_max:
        width_frac = min(1.0, t.pcie_width / t.pcie_width_max)
    gen_frac: float | None = None
    if t.pcie_gen is not None and t.pcie_gen_max:
        now = PCIE_LANE_GBS.get(int(t.pcie_gen))
        top = PCIE_LANE_GBS.get(int(t.pcie_gen_max))
        if now is not None and top:
            gen_frac = min(1.0, now / top)
    if width_frac is None and gen_frac is None:
        return None
    return round(
        1.0
        - (width_frac if width_frac is not None else 1.0)
        * (gen_frac if gen_frac is not None else 1.0),
        4,
    )


def _active(throttle: dict[str, bool] | None, reasons: Sequence[str]) -> list[str]:
    if not throttle:
        return []
    return [r for r in reasons if throttle.get(r)]


def _host_signals(
    t: Telemetry, peers_cpu: float | None, peers_proc: float | None = None
) -> list[str]:
    """Which host contention signals fire, in words."""
    out = []
    if t.steal_pct is not None and t.steal_pct >= STEAL_PCT:
        out.append(f"CPU steal {t.steal_pct:.0f}%")
    if t.psi_cpu_some is not None and t.psi_cpu_some >= PSI_CPU_SOME:
        out.append(f"CPU pressure {t.psi_cpu_some:.0f}%")
    if t.load1 is not None and t.ncpu and t.load1 / t.ncpu >= LOAD_PER_CPU:
        out.append(f"load {t.load1 / t.ncpu:.2f} per CPU")
    if t.cpu_pct is not None:
        if t.cpu_pct >= CPU_BUSY_PCT:
            out.append(f"host CPU {t.cpu_pct:.0f}% busy")
        elif peers_cpu is not None and t.cpu_pct - peers_cpu >= CPU_ABOVE_PEERS_PCT:
            out.append(f"host CPU {t.cpu_pct:.0f}% busy vs {peers_cpu:.0f}% on its peers")
    # A training process keeps about one core busy on every rank (launches,
    # data loading), so a full core is normal; a process that gets clearly less
    # CPU than its peers' processes is starved by something else on its host.
    if (
        t.proc_cpu_pct is not None
        and peers_proc is not None
        and peers_proc > 0
        and t.proc_cpu_pct <= PROC_STARVED_FRAC * peers_proc
    ):
        out.append(
            f"the rank's process got {t.proc_cpu_pct:.0f}% of a core vs {peers_proc:.0f}% "
            "on its peers"
        )
    return out


def _signal_key(words: str) -> str:
    """Which host signal a `_host_signals` phrase is ("CPU steal", "load", "host CPU", ...)."""
    parts = words.split()
    return parts[0] if parts[0] == "load" else " ".join(parts[:2])


def _measured_by(words: str, shares: dict[str, float]) -> bool:
    """Whether a qualitative host signal is one a measured host mechanism already
    weighed (then its fit, not the signal, decides). Pressure, load and a busy
    host mean waits for a CPU: run delay measures them; a starved process is
    either that, idle or stopped. Steal is neither (the guest sees its task running)."""
    key = _signal_key(words)
    if key == "CPU steal":
        return False
    if key == "the rank's":
        return bool({"runnable_wait", "idle", "stopped"} & shares.keys())
    return "runnable_wait" in shares


def _input_stall(t: Telemetry, peer_tels: Sequence[Telemetry]) -> str | None:
    """An idle compute gap on a busy job: the rank waits on its input, not on a CPU."""
    peers = _median([p.gap_busy_pct for p in peer_tels])
    if t.gap_busy_pct is None or peers is None:
        return None
    if t.gap_busy_pct <= GAP_IDLE_PCT and t.gap_busy_pct <= GAP_IDLE_FRAC * peers:
        return (
            f"input stall: the process was idle for {100 - t.gap_busy_pct:.0f}% of its compute "
            f"gap (busy {t.gap_busy_pct:.0f}% vs {peers:.0f}% on its peers): waiting on its data "
            "loader or storage, not on a CPU"
        )
    return None


def hardware_rises(t: Telemetry, peer_tels: Sequence[Telemetry]) -> dict[str, int]:
    """The hardware signals (HW_SIGNALS) the rank shows and its peers do not."""
    out: dict[str, int] = {}
    for name in HW_SIGNALS:
        v = getattr(t, name)
        if v is None or v <= 0:
            continue
        peers = _median([getattr(p, name) for p in peer_tels])
        if peers is None or peers <= 0:
            out[name] = int(v)
    return out


def _hw_words(t: Telemetry, rises: dict[str, int]) -> str:
    words = []
    if "xid_count" in rises:
        last = f", last XID {t.xid_last}" if t.xid_last is not None else ""
        words.append(f"{rises['xid_count']} XID event(s){last}")
    if "ecc_uncorrected" in rises:
        words.append(f"{rises['ecc_uncorrected']} uncorrected ECC error(s)")
    if "nvlink_errors" in rises:
        words.append(f"{rises['nvlink_errors']} NVLink error(s)")
    if "remap_failed" in rises:
        words.append("row remapping failed (the GPU needs service)")
    if "remap_pending" in rises:
        words.append("a page retirement / row remap waits for a GPU reset")
    ident = t.gpu_serial or t.gpu_uuid
    where = f" on GPU {ident}" + (f" at {t.gpu_pci_bus}" if t.gpu_pci_bus else "") if ident else ""
    return f"GPU hardware errors{where}: {'; '.join(words)}, none on its peers"


def nic_evidence(members: Sequence[tuple[str, Telemetry]]) -> dict[str, Any]:
    """NIC port error counts of a link or collective finding's ranks, per host.

    ``members`` are (host, telemetry) of the ranks involved. The counters are
    the host's (every rank of a host reports the same NICs), so each host
    counts once, with the largest value its ranks reported. The result has the
    totals over hosts of every NIC_FIELDS counter that any rank reported, and
    ``nic_hosts``: the hosts whose counters rose, with their counts. Empty when
    no rank reported NIC counters.
    """
    per_host: dict[str, dict[str, int]] = {}
    for host, t in members:
        for name in NIC_FIELDS:
            v = getattr(t, name)
            if v is not None:
                h = per_host.setdefault(host, {})
                h[name] = max(h.get(name, 0), int(v))
    if not per_host:
        return {}
    out: dict[str, Any] = {
        name: sum(h[name] for h in per_host.values() if name in h)
        for name in NIC_FIELDS
        if any(name in h for h in per_host.values())
    }
    out["nic_hosts"] = {
        host: {k: v for k, v in h.items() if v > 0}
        for host, h in sorted(per_host.items())
        if any(v > 0 for v in h.values())
    }
    return out


def clock_explains(clock_ratio: float) -> float:
    """The slowdown (fraction) that an SM clock at `clock_ratio` of the reference causes."""
    return CLOCK_BOUND * (1.0 / clock_ratio - 1.0)


def diagnose(
    rank_tel: Telemetry, peer_tels: Sequence[Telemetry], slowdown: float | None = None
) -> Cause:
    """The causes that explain a rank's `slowdown` (measured extra time, a fraction),
    best first; `unknown` (saying what was checked) when none does."""
    t = rank_tel
    cpu = is_cpu(t)
    # only what this kind of node could report: a CPU rank has no GPU fields to miss
    missing = reportable(t, {n for n in DIAG_FIELDS if getattr(t, n) is None} | set(t.missing))

    peers_sm = _median([p.sm_mhz for p in peer_tels])
    peers_temp = _median([p.temp_c for p in peer_tels])
    peers_cpu = _median([p.cpu_pct for p in peer_tels])
    peers_proc = _median([p.proc_cpu_pct for p in peer_tels])
    ref_sm, ref_name = (peers_sm, "its peers") if peers_sm else (t.sm_mhz_max, "its max")

    clocks_low: bool | None = None
    clock_fit: float | None = None  # share of the slowdown the clock deficit explains
    if t.sm_mhz is not None and ref_sm:
        c = t.sm_mhz / ref_sm
        if slowdown is not None and slowdown > 0:
            clock_fit = min(1.0, max(0.0, clock_explains(c)) / slowdown) if c > 0 else 1.0
            clocks_low = c < 1.0 - CLOCK_NOISE_FRAC and clock_fit >= EXPLAIN_MIN
        else:
            clocks_low = c < CLOCK_LOW_FRAC
    power_frac = t.power_w / t.power_limit_w if t.power_w is not None and t.power_limit_w else None
    hot: bool | None = None
    if t.temp_c is not None:
        hot = (
            t.temp_c >= peers_temp + TEMP_ABOVE_PEERS_C
            if peers_temp is not None
            else t.temp_c >= TEMP_HOT_C
        )
    thermal_why = _active(t.throttle, THERMAL_REASONS)
    power_why = _active(t.throttle, POWER_REASONS)
    slowing = _active(t.throttle, SLOWING_REASONS)
    pcie = pcie_degraded(t)
    peers_pcie = _median([pcie_degraded(p) for p in peer_tels])
    host = _host_signals(t, peers_cpu, peers_proc)
    if peer_tels:
        # qualitative fit: present on this rank and absent on its peers (a
        # signal that fires on the peers' medians too is the fleet's, not this rank's)
        peer = Telemetry(
            steal_pct=_median([p.steal_pct for p in peer_tels]),
            psi_cpu_some=_median([p.psi_cpu_some for p in peer_tels]),
            load1=_median([p.load1 for p in peer_tels]),
            ncpu=t.ncpu,
            cpu_pct=peers_cpu,
        )
        fleet = {_signal_key(w) for w in _host_signals(peer, None, None)}
        host = [w for w in host if _signal_key(w) not in fleet]
    hw = hardware_rises(t, peer_tels)
    # The host's quantitative fit, where the slowdown is measured and some
    # mechanism's figures are there; it replaces the fixed cut-offs.
    hfit = host_fit(t, peer_tels, slowdown) if slowdown is not None and slowdown > 0 else HostFit()
    host_by_fit = hfit.explained is not None and hfit.explained >= EXPLAIN_MIN

    evidence: dict[str, Any] = {
        "sm_mhz": _r(t.sm_mhz),
        "peers_sm_mhz": _r(peers_sm),
        "temp_c": _r(t.temp_c),
        "peers_temp_c": _r(peers_temp),
        "power_frac": None if power_frac is None else round(power_frac, 3),
        "throttle": {r: True for r in _active(t.throttle, (*SLOWING_REASONS, "sync_boost"))},
        "pcie_degraded": pcie,
    }
    clk = (
        f"SM {t.sm_mhz:.0f} MHz vs {ref_sm:.0f} MHz on {ref_name}"
        if t.sm_mhz is not None and ref_sm
        else "SM clock not reported"
    )

    fits: dict[str, str] = {}
    absent = "; absent on its peers" if peer_tels else ""
    if clocks_low is not False:
        if thermal_why:
            fits["thermal"] = f"thermal throttling ({', '.join(thermal_why)}; {clk})"
        elif clocks_low and hot:
            fits["thermal"] = f"running hot ({t.temp_c:.0f} C vs {_fmt(peers_temp)} C) with {clk}"
        if power_why:
            fits["power"] = f"power capped ({', '.join(power_why)}; {clk})"
        elif clocks_low and power_frac is not None and power_frac >= POWER_CAP_FRAC:
            fits["power"] = f"drawing {power_frac:.0%} of its power limit with {clk}"
    if hw:
        # A GPU error explains a slow rank whatever its clocks do (a remap or
        # an XID recovery stalls it, NVLink replays slow its transfers).
        fits["hardware"] = _hw_words(t, hw)
    if clocks_low and not fits:
        known_ok = t.throttle is not None or (hot is False and power_frac is not None)
        if known_ok and not (set(slowing) - {"apps_clocks"}):
            fits["clocks"] = (
                f"clocks low ({clk}), no throttle reason: locked clocks or a misconfigured GPU"
            )
    # PCIe and host evidence fits whatever the clocks do when the slowdown is
    # measured (it is then ranked against the clock's fit); without it, only
    # with normal clocks, as in the seed.
    if clocks_low is not True or slowdown is not None:
        if pcie is not None and pcie > 0 and not (peers_pcie or 0) > 0:
            fits["pcie"] = (
                f"PCIe link below its maximum (gen {t.pcie_gen}/{t.pcie_gen_max}, "
                f"x{t.pcie_width}/x{t.pcie_width_max}: {pcie:.0%} of bandwidth lost{absent})"
            )
        stall = _input_stall(t, peer_tels) if hfit.mechanism is None else None
        uncovered = [w for w in host if not _measured_by(w, hfit.shares)]
        if host_by_fit:
            fits["host"] = hfit.text
        elif stall:
            fits["host"] = stall + absent
        elif uncovered:
            clocks = (
                ""
                if cpu
                else " with GPU clocks normal"
                if not clocks_low
                else " with GPU clocks low too"
            )
            busy = (
                f"; busy {t.gap_busy_pct:.0f}% of its compute gap"
                if t.gap_busy_pct is not None
                else ""
            )
            fits["host"] = f"host CPU contention ({'; '.join(uncovered)}{busy}{absent}){clocks}"
    reported = {k: getattr(t, k) for k in HW_EVIDENCE if getattr(t, k) is not None}
    if hw or any(isinstance(v, int) and v > 0 for k, v in reported.items() if k in HW_SIGNALS):
        evidence["hardware"] = {
            **reported,
            "peers": {k: _median([getattr(p, k) for p in peer_tels]) for k in HW_SIGNALS},
        }
    if host or "host" in fits or hfit.shares:
        evidence.update(
            cpu_pct=_r(t.cpu_pct),
            peers_cpu_pct=_r(peers_cpu),
            steal_pct=_r(t.steal_pct),
            psi_cpu_some=_r(t.psi_cpu_some),
            load_per_cpu=None if t.load1 is None or not t.ncpu else round(t.load1 / t.ncpu, 2),
            proc_cpu_pct=_r(t.proc_cpu_pct),
            gap_busy_pct=_r(t.gap_busy_pct),
            peers_gap_busy_pct=_r(_median([p.gap_busy_pct for p in peer_tels])),
        )
        evidence.update(hfit.evidence)
        if host and hfit.shares:
            evidence["host_signals"] = host  # qualitative: no share of their own

    if fits:
        # explained: the clock kinds' quantitative fit; None for qualitative ones
        def fit_of(kind: str) -> float | None:
            if kind in ("thermal", "power", "clocks"):
                return None if clock_fit is None else round(clock_fit, 3)
            if kind == "host" and host_by_fit:
                return hfit.explained
            return None

        def order(kind: str) -> float:
            f = fit_of(kind)
            return QUALITATIVE_FIT if f is None else f

        ranked = sorted(fits, key=lambda k: (-order(k), list(fits).index(k)))
        kind, text = ranked[0], fits[ranked[0]]
        explained = fit_of(kind)
        if explained is not None and slowdown is not None:
            text += f"; explains {explained:.0%} of {_its(slowdown)}"
        if clocks_low is None and not cpu:
            text += " (clocks could not be compared: SM clock or a reference missing)"
        alts = [{"kind": k, "text": fits[k], "explained": fit_of(k)} for k in ranked[1:]]
        return Cause(kind, text, evidence, missing, explained, alts)
    why = _why_unknown(t, clocks_low, clk, slowing, cpu)
    if slowdown is not None and clock_fit is not None:
        why += f"; the clock explains {clock_fit:.0%} of {_its(slowdown)}"
    if slowdown is not None and hfit.mechanism is not None and hfit.explained is not None:
        why += (
            f"; the host explains {hfit.explained:.0%} ({hfit.mechanism.replace('_', ' ')})"
            f" of {_its(slowdown)}"
        )
    return Cause("unknown", why, evidence, missing)


def _its(slowdown: float) -> str:
    """The slowdown a fit explains, named as what it is: the rank's compute gap over its
    reference (its peers', or its own pace), not the job's loss (the line's `loss`)."""
    return f"its slowdown (compute gap {slowdown:+.1%})"


def _why_unknown(
    t: Telemetry, clocks_low: bool | None, clk: str, slowing: list[str], cpu: bool
) -> str:
    if all(getattr(t, name) is None for name in DIAG_FIELDS):
        return "no telemetry for this rank: cause cannot be told"
    if clocks_low is False and slowing:
        return (
            f"throttle reason reported ({', '.join(slowing)}) but clocks normal ({clk}): "
            "contradictory, and no PCIe or host problem found"
        )
    if clocks_low and slowing:
        return f"clocks low ({clk}) with throttle reason {', '.join(slowing)}, which no rule maps"
    if clocks_low:
        return f"clocks low ({clk}) but no throttle, temperature or power data to tell why"
    # What was absent is the finding's `missing`, named once per job by the human
    # text (cli/run_summary.py), not in every line's cause.
    if cpu:
        return (
            "nothing in the telemetry explains it (checked on this CPU rank: host CPU busy, "
            "steal, pressure and load, the process's CPU time in its gaps, run delay, "
            "cgroup throttling)"
        )
    return (
        f"nothing in the telemetry explains it (checked: SM clock ({clk}), throttle "
        f"reasons, temperature, power, PCIe link, host CPU, GPU error counters)"
    )


def _r(v: float | None) -> float | None:
    return None if v is None else round(float(v), 1)


def _fmt(v: float | None) -> str:
    return "?" if v is None else f"{v:.0f}"
