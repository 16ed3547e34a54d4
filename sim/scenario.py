"""Scenario files: parse and validate the TOML that describes a simulated job.

The schema is DESIGN.md's "Scenario files (sim)". Every error names the file,
the key and what is allowed; unknown keys are errors, so a typo never silently
turns a fault off.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

COMPUTE_FAULTS = ("clocks", "thermal", "power", "pcie", "host")
ISLAND_FAULTS = ("island", "collective")
FAULT_KINDS = (
    *COMPUTE_FAULTS,
    *ISLAND_FAULTS,
    "link",
    "hang",
    "agent_down",
    "clock_anomaly",
    "software",
    "stalls",
)
# What a clock_anomaly fault does to its ranks' device timer (sim/clockfault.py).
CLOCK_ANOMALIES = ("reversed", "jump", "wrap", "reset", "rate")
# `software`: a driver, library or configuration that makes every kernel (and every
# collective's transfer) of its ranks slower at healthy clocks, all ranks by default;
# the whole-job slowdown a change finding is about (docs/DESIGN.md "Scenarios").
# `stalls`: the rank sleeps before a pseudo-random `share` of its steps (a data
# loader's wait, a stopped process), each time `slowdown` x step_ms; its other steps
# are healthy, so its median gap stays its peers' and its mean carries the cost.
# Kinds that slow nothing: no finding is expected for them.
NO_SLOWDOWN = ("hang", "agent_down", "clock_anomaly")
REBALANCE_MODES = ("off", "recommend", "apply")
# [detector] corrections (issue 29): the coordinator's key, checked here by name so a
# scenario's typo is named before a run starts.
CORRECTION_MODES = ("off", "recommend", "apply")


MAX_RANKS = 1 << 20
MAX_WINDOWS = 10_000_000
MAX_WINDOW_STEPS = 1_000_000
_INT_MAX = (1 << 63) - 1


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the file, key and what is allowed."""


@dataclass(frozen=True)
class Fault:
    kind: str
    ranks: tuple[int, ...]  # ranks the fault touches (all ranks of the island for island kinds)
    island: str | None
    start_window: int
    end_window: int | None  # exclusive; None = to the end
    slowdown: float
    ramp_windows: int = 0  # the slowdown grows linearly to full size over these windows
    duty: float = 1.0  # fraction of windows (pseudo-random, fixed by seed) the fault is on
    seed: int = 0  # the scenario's seed and the fault's index: fixes the duty pattern
    anomaly: str | None = None  # clock_anomaly: one of CLOCK_ANOMALIES
    rate: float = 1.0  # clock_anomaly "rate": device seconds per true second
    on_plan: bool = False  # agent_down: dies when a rebalance plan reaches its host
    share: float = 1.0  # stalls: the fraction of the rank's steps it sleeps before

    def active(self, window: int) -> bool:
        return window >= self.start_window and (self.end_window is None or window < self.end_window)

    def level(self, window: int) -> float:
        """Share of the full slowdown in effect in `window` (0..1): ramp x duty."""
        if not self.active(window):
            return 0.0
        if self.duty < 1.0 and not _duty_on(self.seed, window, self.duty):
            return 0.0
        if self.ramp_windows > 0:
            return min(1.0, (window - self.start_window + 1) / self.ramp_windows)
        return 1.0


def _duty_on(seed: int, window: int, duty: float) -> bool:
    # A hash of (seed, window), not a stateful generator: the same window is on or
    # off whoever asks (model, telemetry, tests), in any order.
    u = np.random.default_rng([seed, window, 0x5EED]).random()
    return bool(u < duty)


@dataclass(frozen=True)
class Scenario:
    path: str
    ranks: int
    ranks_per_host: int
    islands: tuple[str, ...]
    classes: tuple[str, ...] | None
    class_speed: dict[str, float]
    step_ms: float
    collectives_per_step: int
    window_steps: int
    windows: int
    noise: float
    seed: int
    honours_plans: bool
    global_batch: int
    faults: tuple[Fault, ...] = ()
    detector: dict[str, Any] = field(default_factory=dict)
    # The noise model (DESIGN.md "Scenario files"); the defaults are the seed's
    # simulator: independent per-step compute noise only.
    rank_spread: float = 0.0
    shared_jitter: float = 0.0
    stall_prob: float = 0.0
    stall_ms: float = 40.0
    telemetry_noise: float = 0.0
    # Tensor-parallel groups of `tp` consecutive ranks, each with its own
    # communicator; data parallel across the groups, one communicator per TP
    # position (DESIGN.md "Scenario files"). 1 = plain data parallel.
    tp: int = 1
    # [software] and its [software.hosts.N] overrides (parse_software): component ->
    # value, plus "env" (name -> value) for every rank / for host N's ranks.
    software: dict[str, Any] = field(default_factory=dict)
    software_hosts: dict[int, dict[str, Any]] = field(default_factory=dict)

    def software_of(self, rank: int) -> dict[str, Any]:
        """The rank's software fingerprint as the simulator plays it: the defaults of its
        island's vendor, then [software], then its host's [software.hosts.N] (env merged
        by name). The GPU model defaults to the rank's hardware class."""
        vendor = self.islands[rank] if self.islands[rank] in SOFTWARE_DEFAULTS else "nvidia"
        model = self.classes[rank] if self.classes is not None else GPU_MODELS[vendor]
        out: dict[str, Any] = {**SOFTWARE_DEFAULTS[vendor], **SOFTWARE_COMMON, "gpu_model": model}
        env: dict[str, str] = {}
        for layer in (self.software, self.software_hosts.get(self.host_of(rank), {})):
            out.update({k: v for k, v in layer.items() if k != "env"})
            env.update(layer.get("env", {}))
        out["env"] = env
        return out

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s tensor-parallel group (itself alone when tp = 1)."""
        g = rank // self.tp
        return tuple(range(g * self.tp, (g + 1) * self.tp))

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks sharing `rank`'s data-parallel communicator (its TP position)."""
        return tuple(range(rank % self.tp, self.ranks, self.tp))

    @property
    def hosts(self) -> int:
        return math.ceil(self.ranks / self.ranks_per_host)

    def host_of(self, rank: int) -> int:
        return rank // self.ranks_per_host

    def host_name(self, host: int) -> str:
        return f"sim-node-{host}"

    @property
    def island_names(self) -> tuple[str, ...]:
        """Islands in order of first appearance."""
        return tuple(dict.fromkeys(self.islands))

    def island_ranks(self, island: str) -> tuple[int, ...]:
        return tuple(r for r, i in enumerate(self.islands) if i == island)

    def speed(self, rank: int) -> float:
        """Relative compute speed of a rank's hardware class (1.0 = reference)."""
        if self.classes is None:
            return 1.0
        return self.class_speed.get(self.classes[rank], 1.0)


_JOB_KEYS = {
    "ranks",
    "ranks_per_host",
    "islands",
    "classes",
    "class_speed",
    "step_ms",
    "collectives_per_step",
    "window_steps",
    "windows",
    "noise",
    "seed",
    "honours_plans",
    "global_batch",
    "rank_spread",
    "shared_jitter",
    "stall_prob",
    "stall_ms",
    "telemetry_noise",
    "tp",
}
_FAULT_KEYS = {
    "kind",
    "rank",
    "ranks",
    "island",
    "start_window",
    "end_window",
    "slowdown",
    "ramp_windows",
    "duty",
    "anomaly",
    "rate",
    "on_plan",
    "share",
}
_TOP_KEYS = {"job", "fault", "detector", "software"}

# [software]: the fingerprint components every rank reports (DESIGN.md "Scenario
# files"), and the plausible fixed fingerprint a scenario without the table gets.
SOFTWARE_KEYS = ("driver", "cuda", "nccl", "torch", "kernel", "gpu_model")
SOFTWARE_DEFAULTS: dict[str, dict[str, str]] = {
    "nvidia": {"driver": "550.54.15", "cuda": "12.4", "nccl": "2.21.5"},
    "amd": {"driver": "6.8.5", "cuda": "rocm-6.2.4", "nccl": "2.21.5"},
}
SOFTWARE_COMMON = {"torch": "2.5.1", "kernel": "6.1.0-sim"}
# The GPU model a rank reports when neither [job].classes nor [software] names one.
GPU_MODELS = {"nvidia": "NVIDIA H100 80GB HBM3", "amd": "AMD Instinct MI300X"}


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read scenario file: {e.strerror or e}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{p}: not valid TOML: {e}") from None
    return parse_scenario(data, str(p))


def parse_scenario(data: Mapping[str, Any], name: str = "<scenario>") -> Scenario:
    def err(key: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{name}: {key}: {msg}")

    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise err(
            ", ".join(sorted(unknown)), f"unknown table; allowed: {', '.join(sorted(_TOP_KEYS))}"
        )
    job = data.get("job")
    if not isinstance(job, dict):
        raise err("[job]", "missing; a scenario needs a [job] table")
    unknown = set(job) - _JOB_KEYS
    if unknown:
        raise err(
            "[job]." + sorted(unknown)[0], f"unknown key; allowed: {', '.join(sorted(_JOB_KEYS))}"
        )

    def integer(key: str, lo: int, default: int | None = None, hi: int = _INT_MAX) -> int:
        v = job.get(key, default)
        if v is None:
            raise err(f"[job].{key}", f"required: an integer in [{lo}, {hi}]")
        if isinstance(v, bool) or not isinstance(v, int) or not (lo <= v <= hi):
            raise err(f"[job].{key}", f"expected an integer in [{lo}, {hi}], got {v!r}")
        return v

    def number(key: str, lo: float, hi: float, default: float | None = None) -> float:
        v = job.get(key, default)
        if v is None:
            raise err(f"[job].{key}", f"required: a number in ({lo}, {hi}]")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v <= hi):
            raise err(f"[job].{key}", f"expected a number in [{lo}, {hi}], got {v!r}")
        return float(v)

    # Upper bounds: the simulator holds per-rank and per-window state, so an
    # absurd count must be refused by name, not run out of memory (found by
    # tests/fuzz, scenario target).
    ranks = integer("ranks", 2, hi=MAX_RANKS)
    rph = integer("ranks_per_host", 1, hi=MAX_RANKS)
    step_ms = number("step_ms", 0.01, 1e6)
    cps = integer("collectives_per_step", 1)
    if cps > 32:
        raise err("[job].collectives_per_step", f"expected at most 32, got {cps}")
    wsteps = integer("window_steps", 2, hi=MAX_WINDOW_STEPS)
    windows = integer("windows", 1, hi=MAX_WINDOWS)
    noise = number("noise", 0.0, 0.5, 0.0)
    seed = integer("seed", 0, 0)
    hp = job.get("honours_plans", True)
    if not isinstance(hp, bool):
        raise err("[job].honours_plans", f"expected true or false, got {hp!r}")
    gb = integer("global_batch", ranks, ranks * 32)
    rank_spread = number("rank_spread", 0.0, 0.5, 0.0)
    shared_jitter = number("shared_jitter", 0.0, 0.5, 0.0)
    stall_prob = number("stall_prob", 0.0, 0.5, 0.0)
    stall_ms = number("stall_ms", 0.0, 1e6, 40.0)
    telemetry_noise = number("telemetry_noise", 0.0, 0.5, 0.0)
    tp = integer("tp", 1, 1)
    if tp > 1:
        if ranks % tp or ranks // tp < 2:
            raise err("[job].tp", f"expected a divisor of ranks ({ranks}) at most {ranks // 2}")
        if rph % tp:
            raise err(
                "[job].tp",
                f"expected a divisor of ranks_per_host ({rph}): a TP group sits on one host",
            )

    def per_rank(key: str) -> tuple[str, ...] | None:
        v = job.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise err(f"[job].{key}", "expected a list of non-empty strings, one per rank")
        if len(v) != ranks:
            raise err(f"[job].{key}", f"expected {ranks} entries (one per rank), got {len(v)}")
        return tuple(v)

    islands = per_rank("islands") or tuple("nvidia" for _ in range(ranks))
    if tp > 1 and len(set(islands)) > 1:
        raise err("[job].tp", "tensor parallelism is simulated in one-island jobs only")
    classes = per_rank("classes")
    cs_raw = job.get("class_speed", {})
    if not isinstance(cs_raw, dict):
        raise err("[job].class_speed", "expected a table of class = relative speed")
    class_speed: dict[str, float] = {}
    for k, v in cs_raw.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v <= 10):
            raise err(f"[job].class_speed.{k}", f"expected a number in (0, 10], got {v!r}")
        if classes is None or k not in classes:
            raise err(f"[job].class_speed.{k}", "names a class that no rank has ([job].classes)")
        class_speed[k] = float(v)

    faults_raw = data.get("fault", [])
    if not isinstance(faults_raw, list):
        raise err("[[fault]]", "expected an array of tables ([[fault]])")
    faults = tuple(
        _parse_fault(f, i, name, ranks, islands, windows, seed) for i, f in enumerate(faults_raw)
    )

    software, software_hosts = parse_software(
        data.get("software", {}), name, math.ceil(ranks / rph)
    )

    det = data.get("detector", {})
    if not isinstance(det, dict):
        raise err("[detector]", "expected a table")
    for key, modes in (("rebalance", REBALANCE_MODES), ("corrections", CORRECTION_MODES)):
        if key in det and det[key] not in modes:
            raise err(f"[detector].{key}", f"expected one of {', '.join(modes)}, got {det[key]!r}")
    return Scenario(
        path=name,
        ranks=ranks,
        ranks_per_host=rph,
        islands=islands,
        classes=classes,
        class_speed=class_speed,
        step_ms=step_ms,
        collectives_per_step=cps,
        window_steps=wsteps,
        windows=windows,
        noise=noise,
        seed=seed,
        honours_plans=hp,
        global_batch=gb,
        faults=faults,
        detector=dict(det),
        rank_spread=rank_spread,
        shared_jitter=shared_jitter,
        stall_prob=stall_prob,
        stall_ms=stall_ms,
        telemetry_noise=telemetry_noise,
        tp=tp,
        software=software,
        software_hosts=software_hosts,
    )


def nccl_code(version: str) -> int:
    """ncclGetVersion's code for "2.21.5" (major*10000 + minor*100 + patch from 2.9 on)."""
    major, minor, patch = (int(x) for x in version.split("."))
    if (major, minor) >= (2, 9):
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def parse_software(
    sw: Any, name: str, hosts: int
) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """[software] and its [software.hosts.N] tables, checked: components are non-empty
    strings, nccl is X.Y.Z, env is a table of strings, N names a host of the job."""

    def err(key: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{name}: {key}: {msg}")

    def layer(t: Any, where: str, allow_hosts: bool) -> dict[str, Any]:
        if not isinstance(t, dict):
            raise err(where, "expected a table")
        allowed = {*SOFTWARE_KEYS, "env", *(("hosts",) if allow_hosts else ())}
        unknown = set(t) - allowed
        if unknown:
            raise err(
                f"{where}.{sorted(unknown)[0]}",
                f"unknown key; allowed: {', '.join(sorted(allowed))}",
            )
        out: dict[str, Any] = {}
        for k in SOFTWARE_KEYS:
            if k in t:
                v = t[k]
                if not isinstance(v, str) or not v or len(v) > 128:
                    raise err(f"{where}.{k}", f"expected a non-empty string, got {v!r}")
                if k == "nccl":
                    parts = v.split(".")
                    if len(parts) != 3 or not all(p.isdigit() for p in parts):
                        raise err(f"{where}.nccl", f"expected a version X.Y.Z, got {v!r}")
                out[k] = v
        if "env" in t:
            env = t["env"]
            if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
                raise err(f"{where}.env", 'expected a table of NAME = "value" strings')
            out["env"] = dict(env)
        return out

    base = layer(sw, "[software]", True)
    per_host: dict[int, dict[str, Any]] = {}
    hosts_raw = sw.get("hosts", {}) if isinstance(sw, dict) else {}
    if not isinstance(hosts_raw, dict):
        raise err("[software.hosts]", "expected tables [software.hosts.N]")
    for k, t in hosts_raw.items():
        if not str(k).isdigit() or int(k) >= hosts:
            raise err(f"[software.hosts.{k}]", f"expected a host number in 0..{hosts - 1}")
        per_host[int(k)] = layer(t, f"[software.hosts.{k}]", False)
    return base, per_host


def _parse_fault(
    f: Any, i: int, name: str, ranks: int, islands: tuple[str, ...], windows: int, seed: int = 0
) -> Fault:
    where = f"[[fault]] #{i + 1}"

    def err(key: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{name}: {where}.{key}: {msg}")

    if not isinstance(f, dict):
        raise ScenarioError(f"{name}: {where}: expected a table")
    unknown = set(f) - _FAULT_KEYS
    if unknown:
        raise err(sorted(unknown)[0], f"unknown key; allowed: {', '.join(sorted(_FAULT_KEYS))}")
    kind = f.get("kind")
    if kind not in FAULT_KINDS:
        raise err("kind", f"expected one of {', '.join(FAULT_KINDS)}, got {kind!r}")

    island = f.get("island")
    targets: tuple[int, ...]
    if kind in ISLAND_FAULTS:
        if island is None:
            raise err("island", f"required for kind {kind!r}: the island it slows")
        if island not in islands:
            raise err("island", f"no rank is in island {island!r}; islands: {sorted(set(islands))}")
        targets = tuple(r for r, x in enumerate(islands) if x == island)
    elif kind == "link":
        if len(set(islands)) < 2:
            raise err("kind", "'link' needs a job with two or more islands ([job].islands)")
        targets = ()
    elif kind == "software" and "rank" not in f and "ranks" not in f:
        targets = tuple(range(ranks))  # the whole job: every rank runs the same software
    else:
        if "rank" in f and "ranks" in f:
            raise err("rank", "give either rank or ranks, not both")
        if "rank" in f:
            raw: Any = [f["rank"]]
        elif "ranks" in f:
            raw = f["ranks"]
        else:
            raise err("rank", f"required for kind {kind!r}: rank = N or ranks = [..]")
        if not isinstance(raw, list) or not raw:
            raise err("ranks", "expected a non-empty list of rank numbers")
        for r in raw:
            if isinstance(r, bool) or not isinstance(r, int) or not (0 <= r < ranks):
                raise err("rank", f"expected a rank in [0, {ranks - 1}], got {r!r}")
        targets = tuple(sorted(set(raw)))

    start = f.get("start_window")
    if isinstance(start, bool) or not isinstance(start, int) or not (0 <= start < windows):
        raise err("start_window", f"required: an integer in [0, {windows - 1}], got {start!r}")
    end = f.get("end_window")
    if end is not None and (
        isinstance(end, bool) or not isinstance(end, int) or not (start < end <= windows)
    ):
        raise err("end_window", f"expected an integer in ({start}, {windows}], got {end!r}")
    slowdown = f.get("slowdown", 0.0)
    anomaly = f.get("anomaly")
    rate = f.get("rate", 1.3 if anomaly == "rate" else 1.0)
    if kind == "clock_anomaly":
        if anomaly not in CLOCK_ANOMALIES:
            raise err("anomaly", f"expected one of {', '.join(CLOCK_ANOMALIES)}, got {anomaly!r}")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (0.2 <= rate <= 5):
            raise err("rate", f"expected a number in [0.2, 5], got {rate!r}")
        if "rate" in f and anomaly != "rate":
            raise err("rate", "only for anomaly = 'rate'")
    elif "anomaly" in f or "rate" in f:
        raise err("anomaly" if "anomaly" in f else "rate", "only for kind 'clock_anomaly'")
    if isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)):
        # also where it is ignored (hang, agent_down, clock_anomaly): a typo such as
        # `slowdown .0 = 25` (a table) is named, not taken for a number
        raise err("slowdown", f"expected a number in (0, 5], got {slowdown!r}")
    if kind not in NO_SLOWDOWN:
        if "slowdown" not in f:
            raise err("slowdown", f"required for kind {kind!r}: extra time as a fraction")
        if isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)):
            raise err("slowdown", f"expected a number in (0, 5], got {slowdown!r}")
        if not (0 < slowdown <= 5):
            raise err("slowdown", f"expected a number in (0, 5], got {slowdown!r}")
    ramp = f.get("ramp_windows", 0)
    if isinstance(ramp, bool) or not isinstance(ramp, int) or ramp < 0:
        raise err("ramp_windows", f"expected an integer >= 0, got {ramp!r}")
    duty = f.get("duty", 1.0)
    if isinstance(duty, bool) or not isinstance(duty, (int, float)) or not (0 < duty <= 1):
        raise err("duty", f"expected a number in (0, 1], got {duty!r}")
    if (ramp or duty < 1) and kind in NO_SLOWDOWN:
        raise err("kind", f"ramp_windows and duty do not apply to kind {kind!r}")
    on_plan = f.get("on_plan", False)
    if not isinstance(on_plan, bool):
        raise err("on_plan", f"expected true or false, got {on_plan!r}")
    if on_plan and kind != "agent_down":
        raise err("on_plan", "only for kind 'agent_down'")
    share = f.get("share", 0.25 if kind == "stalls" else 1.0)
    if "share" in f and kind != "stalls":
        raise err("share", "only for kind 'stalls'")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not (0 < share <= 1):
        raise err("share", f"expected a number in (0, 1], got {share!r}")
    return Fault(
        kind=kind,
        ranks=targets,
        island=island,
        start_window=start,
        end_window=end,
        slowdown=float(slowdown),
        ramp_windows=ramp,
        duty=float(duty),
        seed=seed * 1000 + i,
        anomaly=anomaly,
        rate=float(rate),
        on_plan=on_plan,
        share=float(share),
    )
