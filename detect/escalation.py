"""What an engineer must check for an incident, per cause, with the numbers filled in.

Pure: `escalation(kind, cause, evidence, hosts, ...)` turns an incident's cause
(the finding's `cause`: kind, text, evidence) and its episode evidence into one
paragraph of text. These are checks for a person, never commands Artemis runs
(docs/DESIGN.md "Incidents"). A number that is absent is written as absent,
never invented.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ESCALATION_CAUSES = (
    "thermal",
    "power",
    "clocks",
    "pcie",
    "host",
    "hardware",
    "link",
    "collective",
    "island",
    "hang",
    "missing",
    "unknown",
)


# The host checks of a CPU rank (where a GPU job's would name nvidia-smi): its threads,
# its wait for a CPU, its cgroup's quota and the scheduler's view.
_HOST_TOOLS = (
    "the process's threads' CPU (`top -H -p PID`), its wait for a CPU "
    "(`cat /proc/PID/schedstat`: the second number is run delay, ns), its cgroup's "
    "throttling (`cpu.stat` of the cgroup in /proc/PID/cgroup) and the scheduler's "
    "view (`perf sched`)"
)


def _n(v: Any, fmt: str = ".0f", unit: str = "") -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        return "not reported"
    return f"{v:{fmt}}{unit}"


def _where(rank: int | None, hosts: Sequence[str]) -> str:
    who = f"rank {rank}" if rank is not None else "the ranks named"
    return f"{who} on {', '.join(hosts)}" if hosts else who


def _tel(evidence: Mapping[str, Any], name: str) -> tuple[Any, Any]:
    """(rank, peers) episode means of one telemetry field, from the incident's evidence."""
    t = (evidence.get("telemetry") or {}).get(name) or {}
    return t.get("rank"), t.get("peers")


def escalation(
    kind: str,
    cause: Mapping[str, Any] | None,
    evidence: Mapping[str, Any],
    *,
    rank: int | None,
    hosts: Sequence[str],
    subject: str,
    finding_evidence: Mapping[str, Any] | None = None,
    unit: str = "gpu",
) -> dict[str, Any]:
    """`{"cause", "check"}`: the recommended check for an incident of `kind` whose
    latest cause is `cause`. `evidence` is the incident's episode evidence
    (means over the episode, DESIGN "Incidents"); `finding_evidence` the latest
    finding's own evidence (NIC counters of a link, a hang's dumps). `unit` is the
    job's `cost.unit`: a CPU job (`cpu`) gets host checks, never a GPU tool's."""
    ce: Mapping[str, Any] = (cause or {}).get("evidence") or {}
    fe: Mapping[str, Any] = finding_evidence or {}
    where = _where(rank, hosts)
    ck = str((cause or {}).get("kind") or "")
    if kind in ("link", "collective"):
        return {"cause": kind, "check": _network(kind, subject, hosts, fe)}
    if kind == "island":
        return {
            "cause": "island",
            "check": (
                f"every rank of island {subject} slowed together against its warm-up "
                f"(median compute gap {_n(fe.get('median_gap_ms'), '.1f', ' ms')} vs "
                f"{_n(fe.get('baseline_gap_ms'), '.1f', ' ms')}): look for what the island "
                "shares: a new input pipeline or data shard, a job-wide config change, a "
                f"shared power or cooling domain on {', '.join(hosts) or 'its hosts'}"
            ),
        }
    if kind in ("change", "regression"):
        return {"cause": kind, "check": _baseline_check(kind, subject, fe)}
    if kind == "hang":
        dumps = fe.get("dumps") or []
        return {
            "cause": "hang",
            "check": (
                f"the job stopped progressing; ranks behind: {fe.get('behind') or subject} "
                f"(collective {fe.get('collective', 'unknown')}). Read the dumps "
                f"({', '.join(dumps) if dumps else 'none written'}) for the collective they "
                "wait in, then check those ranks' processes (py-spy dump), "
                + (_HOST_TOOLS if unit == "cpu" else "their GPUs (nvidia-smi / amd-smi)")
                + " and the network path between their hosts"
            ),
        }
    if kind == "missing":
        return {
            "cause": "missing",
            "check": (
                f"ranks {subject or 'named'} stopped reporting"
                f"{' from ' + ', '.join(hosts) if hosts else ''}: check the node agent "
                "(artemis-agent) is running and reaches the coordinator, and whether the "
                "node or the rank processes died (dmesg, the scheduler's log)"
            ),
        }
    sm, peers_sm = _tel(evidence, "sm_mhz")
    sm = sm if sm is not None else ce.get("sm_mhz")
    peers_sm = peers_sm if peers_sm is not None else ce.get("peers_sm_mhz")
    clocks = f"SM {_n(sm, '.0f', ' MHz')} vs {_n(peers_sm, '.0f', ' MHz')} on its peers"
    if ck == "clocks":
        check = (
            f"application clocks locked on {where}? {clocks} with no throttle reason. "
            "Check `nvidia-smi -q -d CLOCK` (AMD: `amd-smi metric --clock`) for applied or "
            "locked clocks, and reset them with `nvidia-smi -rgc` (locked GPU clocks) or "
            "`nvidia-smi -rac` (application clocks)"
        )
    elif ck == "thermal":
        temp, peers_temp = _tel(evidence, "temp_c")
        temp = temp if temp is not None else ce.get("temp_c")
        peers_temp = peers_temp if peers_temp is not None else ce.get("peers_temp_c")
        check = (
            f"thermal throttling on {where}: {_n(temp, '.0f', ' C')} vs "
            f"{_n(peers_temp, '.0f', ' C')} on its peers, {clocks}. Check the airflow and "
            "fans of that GPU's slot and the inlet temperature of its chassis "
            "(`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`)"
        )
    elif ck == "power":
        pf = ce.get("power_frac")
        pw, _ = _tel(evidence, "power_w")
        lim, peers_lim = _tel(evidence, "power_limit_w")
        check = (
            f"power capped on {where}: drawing {_n(pw, '.0f', ' W')} of a "
            f"{_n(lim, '.0f', ' W')} limit ({_n(None if pf is None else 100 * pf, '.0f', '%')})"
            f" vs a {_n(peers_lim, '.0f', ' W')} limit on its peers, {clocks}. Check the power "
            "cap against the board limit (`nvidia-smi -q -d POWER`: enforced vs default "
            "limit; AMD: `amd-smi metric --power`) and the node's PSU and power policy"
        )
    elif ck == "pcie":
        gen, gen_max = _tel(evidence, "pcie_gen")
        width, width_max = _tel(evidence, "pcie_width")
        check = (
            f"PCIe link degraded on {where}: gen {_n(gen)} x{_n(width)} (peers gen "
            f"{_n(gen_max)} x{_n(width_max)}), {_n(ce.get('pcie_degraded'), '.0%')} of its "
            "bandwidth lost. Compare link width and generation against their maximum "
            "(`nvidia-smi -q -d PCIE`, `lspci -vv`: LnkSta vs LnkCap); reseat the GPU or "
            "check its riser"
        )
    elif ck == "host":
        busy = ce.get("gap_busy_pct")
        peers_busy = ce.get("peers_gap_busy_pct")
        text = str((cause or {}).get("text") or "")
        if ce.get("mechanism") == "cgroup_throttled":
            check = (
                f"CPU quota on {where}: the rank's cgroup was throttled "
                f"{_n(ce.get('cg_throttled_pct'))}% of the time vs "
                f"{_n(ce.get('peers_cg_throttled_pct'))}% on its peers. Check the quota of the "
                "process's cgroup (/proc/<pid>/cgroup; cpu.cfs_quota_us on cgroup v1, cpu.max "
                "on v2) against its peers'"
            )
        elif ce.get("mechanism") == "stopped":
            check = (
                f"stopped process on {where}: it was stopped (state T) "
                f"{_n(ce.get('stopped_pct'))}% of the time vs {_n(ce.get('peers_stopped_pct'))}% "
                "on its peers. Find what stops it: a job scheduler's suspend or preemption, a "
                "debugger or profiler attached (`ps -o stat,pid,cmd -p <pid>`, its parent, "
                "`cat /proc/<pid>/status` TracerPid), a cgroup freezer"
            )
        elif text.startswith("input stall"):
            check = (
                f"input stall on {where}: the process was busy {_n(busy)}% of its compute "
                f"gap vs {_n(peers_busy)}% on its peers, not running while it could have: "
                "waiting on its input, or stopped. Check the data loader's workers (count, "
                "prefetch, pinned memory), the storage or network filesystem it reads, and "
                "that rank's data shard; and whether something stops the process (state T "
                "in `ps -o stat -p <pid>`: a debugger, a job-control or cgroup freezer)"
            )
            # (idle time cannot tell a blocked read from a stopped process: both leave
            # the CPU free and neither is run delay; DETECTOR.md "Diagnosis", `idle`)
        else:
            check = (
                f"host CPU contention on {where}: host CPU {_n(ce.get('cpu_pct'))}% busy vs "
                f"{_n(ce.get('peers_cpu_pct'))}% on its peers, steal "
                f"{_n(ce.get('steal_pct'))}%, the rank's process {_n(ce.get('proc_cpu_pct'))}% "
                "of a core. Find the noisy neighbour process (`top`, `pidstat`) or VM, and "
                "check the rank's CPU affinity and the data loader's worker count"
            )
    elif ck == "hardware":
        hw = ce.get("hardware") or {}
        ids = ", ".join(
            f"{k} {hw[k]}" for k in ("gpu_uuid", "gpu_serial", "gpu_pci_bus") if hw.get(k)
        )
        counts = ", ".join(
            f"{k} {v}"
            for k, v in hw.items()
            if k not in ("gpu_uuid", "gpu_serial", "gpu_pci_bus", "peers") and v
        )
        check = (
            f"GPU hardware errors on {where} ({counts or 'counts not reported'}), none on its "
            f"peers. Drain the node, read the XIDs in the kernel log (`dmesg | grep -i xid`), "
            f"`nvidia-smi -q -d ECC,ROW_REMAPPER` (AMD: `amd-smi metric --ecc`); a remap "
            f"pending needs a GPU reset; open an RMA ticket with {ids or 'the GPU identity'}"
        )
    elif unit == "cpu":
        check = (
            f"slow on {where} with no cause in the host telemetry. Compare that rank's "
            f"process and host with its peers' by hand: {_HOST_TOOLS}, and the rank's own "
            "work (an uneven data shard)"
        )
        ck = "unknown"
    else:
        missing = list((cause or {}).get("missing") or [])
        check = (
            f"slow on {where} with no cause in the telemetry ({clocks}). Compare that GPU "
            "and host by hand: clocks and throttle reasons (`nvidia-smi -q -d "
            "CLOCK,PERFORMANCE`), PCIe link, host CPU load, and the rank's own work "
            "(an uneven data shard)"
            + (f"; telemetry missing: {', '.join(missing)}" if missing else "")
        )
        ck = "unknown"
    return {"cause": ck, "check": check}


def _network(kind: str, subject: str, hosts: Sequence[str], fe: Mapping[str, Any]) -> str:
    nic = fe.get("nic_hosts") or {}
    named = "; ".join(
        f"{h}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) for h, c in nic.items()
    )
    if kind == "link":
        what = (
            f"the bridge link {subject} slowed (bridge {_n(fe.get('bridge_ms'), '.1f', ' ms')} "
            f"vs {_n(fe.get('baseline_bridge_ms'), '.1f', ' ms')} at warm-up)"
        )
    else:
        what = (
            f"the collectives of island {subject} slowed (transfer "
            f"{_n(fe.get('transfer_ms'), '.1f', ' ms')} vs "
            f"{_n(fe.get('baseline_transfer_ms'), '.1f', ' ms')} at warm-up)"
        )
    if named:
        where = f"NIC port error counters rose on {named}: check those ports, their cables and "
        where += "the switch ports they connect to (`ibstat`, `perfquery`, the switch's log)"
    else:
        where = (
            "no NIC counter rose on "
            + (", ".join(hosts) if hosts else "its hosts")
            + ": check the NICs and switch path between those hosts (`ibstat`, `perfquery`, "
            "congestion from other jobs on the same switches)"
        )
    return f"{what}; {where}"


def _baseline_check(kind: str, subject: str, fe: Mapping[str, Any]) -> str:
    """What to check when a class is slower than its workload's stored baseline."""
    base = fe.get("baseline") or {}
    slower = (
        f"{_n(fe.get('step_ms'), '.1f', ' ms')} per step vs "
        f"{_n(fe.get('baseline_step_ms'), '.1f', ' ms')} in the baseline "
        f"({_n(fe.get('slower_pct'), '+.1f', '%')}, from jobs {', '.join(base.get('jobs') or [])})"
    )
    if kind == "change":
        changed = fe.get("changed") or {}
        what = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in sorted(changed.items()))
        return (
            f"class {subject or 'of the job'} runs this workload slower than its baseline, "
            f"{slower}, since a software change: {what}. Rerun on the old version to "
            "confirm (`artemis regress` on one node), then report it to the vendor or pin it"
        )
    return (
        f"class {subject or 'of the job'} runs this workload slower than its baseline, "
        f"{slower}, with the same fingerprint (driver, libraries, NCCL_* settings): look "
        "for what is not fingerprinted: the input pipeline, the storage, the network "
        "fabric's congestion, firmware or BIOS settings, other jobs on the nodes"
    )
