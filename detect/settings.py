"""Every tunable of the detector core, validated in one place.

`Settings` is frozen: a change (config file, scenario ``[detector]`` table, an
operator at run time) builds a new validated object with `Settings.set` or
`Settings.from_mapping`, and the daemon hands it to every job's
`JobMonitor.update_settings` (its detector and its rebalance policy).
A bad key or value raises `SettingsError` naming the key, the value and what is
allowed, so a typo in a TOML file never silently falls back to a default.

Each field's bound is stated once, as `msgspec.Meta` on its type (as the wire's
records state theirs: artemis.common.bounds); the rebalance bounds are the
policy's own types (artemis.rebalance.settings).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Annotated, Any, Literal, get_args

from artemis.common.bounds import FLOAT_MAX, bounds_of
from artemis.rebalance.settings import (
    CORRECTION_ACTIONS,
    AtLeast0,
    AtLeast1,
    CorrectionAction,
    Mode,
    ShiftFrac,
)
from msgspec import Meta


class SettingsError(ValueError):
    """A setting key is unknown or its value is not allowed."""


HardwareClasses = Literal["auto", "on", "off"]
RankRule = Literal["adaptive", "seed"]
HARDWARE_CLASSES: tuple[str, ...] = get_args(HardwareClasses)
REBALANCE: tuple[str, ...] = get_args(Mode)
MODES: tuple[str, ...] = get_args(RankRule)

# A slowdown threshold: above 1x its reference (its words keep the point: "1.0").
Ratio = Annotated[float, Meta(gt=1.0, le=FLOAT_MAX, description="a number greater than 1.0")]
Positive = Annotated[float, Meta(gt=0, le=FLOAT_MAX)]
Peers = Annotated[int, Meta(ge=2)]  # a median needs two others to mean anything
Seconds = Annotated[float, Meta(ge=0, le=FLOAT_MAX)]
# A list setting: comma-separated on the command line, a TOML list or string in a file.
Actions = Annotated[
    tuple[CorrectionAction, ...],
    Meta(description=f"a comma-separated list of {', '.join(CORRECTION_ACTIONS)} (or none)"),
]
GpuCount = Annotated[
    Annotated[int, Meta(ge=1)] | None,
    Meta(description="a positive integer or none (= number of ranks)"),
]


@dataclass(frozen=True)
class Settings:
    # A rank is suspect when its compute gap is this many times the median of
    # the other ranks of its island (or class), or of its own warm-up history.
    suspect_ratio: Ratio = 1.10
    # Flagged after `flag_after` suspect windows out of the last `flag_window`.
    flag_after: AtLeast1 = 3
    flag_window: AtLeast1 = 4
    # Cleared after this many consecutive healthy windows.
    clear_after: AtLeast1 = 3
    # Baselines come from the first `warmup_windows` healthy windows after window 0.
    warmup_windows: AtLeast1 = 5
    # Compare ranks within their GPU class: auto = only when classes differ in an island.
    hardware_classes: HardwareClasses = "auto"
    # An island (or class) with fewer ranks than this judges ranks by their own history.
    min_island_peers: Peers = 3
    drift_ratio: Ratio = 1.10  # island median gap vs its warm-up
    collective_ratio: Ratio = 1.15  # island transfer time vs its warm-up
    link_ratio: Ratio = 1.15  # bridge time vs its warm-up
    # A hardware class's median compute gap vs the stored baseline of the job's workload
    # (across jobs, detect/baselines.py): `change` / `regression` from this share on.
    change_ratio: Ratio = 1.05
    # Hang bound = max(hang_floor_s, hang_step_factor x median step time).
    hang_floor_s: Positive = 10.0
    hang_step_factor: Positive = 20.0
    rebalance: Mode = "off"
    # Bounds for the rebalance policy (read by the policy, typed with its bounds).
    max_shift_frac: ShiftFrac = 0.25
    min_samples: AtLeast1 = 1
    min_plan_interval_windows: AtLeast0 = 4
    # GPUs in the job for the cost in GPU-hours; None = one per rank.
    gpu_count: GpuCount = None
    # The rank rule: adaptive (peers with a noise-scaled threshold + a change test
    # against the rank's own baseline, DETECTOR.md) or the seed's fixed ratio.
    mode: RankRule = "adaptive"
    # Corrections (docs/DESIGN.md "Corrections"): off, recommend (an entry in the
    # incident, nothing runs) or apply (sent to the rank's agent, verified, undone).
    corrections: Mode = "recommend"
    corrections_allow: Actions = CORRECTION_ACTIONS  # the actions the policy may take
    corrections_approve: Actions = ()  # these wait for a person (artemis-coordinator approve)
    corrections_min_interval_s: Seconds = 3600.0  # per GPU, between two corrections
    corrections_max_gpus_per_job: AtLeast1 = 2  # distinct GPUs of a job ever corrected
    approval_expiry_s: Seconds = 3600.0  # an unanswered approval expires after this
    # A correction sent and not acknowledged this long fails (its agent never answered).
    correction_ack_timeout_s: Seconds = 300.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            _check_type(f.name, value)
            problem = _BOUNDS[f.name].problem(value)
            if problem:
                raise SettingsError(
                    f"setting {f.name}={value!r} is not allowed: expected {problem}"
                )
        if self.flag_after > self.flag_window:
            raise SettingsError(
                f"setting flag_after={self.flag_after} is not allowed: expected at most "
                f"flag_window ({self.flag_window})"
            )

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(Settings))

    @staticmethod
    def describe(key: str) -> str:
        """What `key` allows, in words (for errors and --help)."""
        if key not in _PARSE:
            raise SettingsError(_unknown(key))
        return _words(key)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def set(self, key: str, value: str) -> Settings:
        """A copy with `key` parsed from the string `value` (e.g. from a command)."""
        if key not in _PARSE:
            raise SettingsError(_unknown(key))
        parsed = _PARSE[key](key, value)
        problem = _BOUNDS[key].problem(parsed)
        if problem:
            raise _bad(key, value, problem)
        return replace(self, **{key: parsed})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], base: Settings | None = None) -> Settings:
        """Settings from a TOML table: values may be native (1.1, 3, true) or strings."""
        out = base if base is not None else cls()
        changes: dict[str, Any] = {}
        for key, value in data.items():
            if key not in _PARSE:
                raise SettingsError(_unknown(key))
            if isinstance(value, str):
                changes[key] = _PARSE[key](key, value)
            else:
                changes[key] = _coerce(key, value)
        return replace(out, **changes)


def _unknown(key: str) -> str:
    return f"unknown setting {key!r}: allowed keys are {', '.join(Settings.names())}"


def _bad(key: str, value: Any, allowed: str) -> SettingsError:
    return SettingsError(f"setting {key}={value!r} is not allowed: expected {allowed}")


def _parse_float(key: str, text: str) -> float:
    try:
        v = float(text.strip())
    except ValueError:
        raise _bad(key, text, _words(key)) from None
    return v


def _parse_int(key: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise _bad(key, text, _words(key)) from None


def _parse_opt_int(key: str, text: str) -> int | None:
    if text.strip().lower() in ("", "none", "auto", "null"):
        return None
    return _parse_int(key, text)


def _parse_actions(key: str, text: str) -> tuple[str, ...]:
    items = [t.strip().lower() for t in text.split(",")]
    out = tuple(t for t in items if t and t != "none")
    for t in out:
        if t not in CORRECTION_ACTIONS:
            raise _bad(key, text, _words(key))
    return out


def _parse_choice(choices: tuple[str, ...], aliases: Mapping[str, str]) -> _Parser:
    def parse(key: str, text: str) -> str:
        t = text.strip().lower()
        t = aliases.get(t, t)
        if t not in choices:
            raise _bad(key, text, _words(key))
        return t

    return parse


_BOOL_ALIASES = {"true": "on", "false": "off", "yes": "on", "no": "off", "1": "on", "0": "off"}


def _coerce(key: str, value: Any) -> Any:
    """A native TOML value to the field's type (bool for hardware_classes, int for floats)."""
    kind = _words(key)
    if key == "hardware_classes" and isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, bool):
        raise _bad(key, value, kind)
    if key in _FLOAT_KEYS and isinstance(value, int):
        return float(value)
    if value is None and _BOUNDS[key].optional:
        return None
    if key in _LIST_KEYS and isinstance(value, (list, tuple)):
        if not all(isinstance(v, str) for v in value):
            raise _bad(key, value, kind)
        return _parse_actions(key, ",".join(value))
    return value


def _check_type(key: str, value: Any) -> None:
    ok: bool
    if key in _FLOAT_KEYS:
        ok = isinstance(value, float) and not isinstance(value, bool)
    elif key in _INT_KEYS:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif key in _LIST_KEYS:
        ok = isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    elif _BOUNDS[key].optional:
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
    else:
        ok = isinstance(value, str)
    if not ok:
        raise _bad(key, value, _words(key))


_Parser = Callable[[str, str], Any]

# Every field's bound, read from its annotation (a typed value outside it is refused).
_BOUNDS = bounds_of(Settings)
_FLOAT_KEYS = frozenset(k for k, b in _BOUNDS.items() if b.base is float)
_INT_KEYS = frozenset(k for k, b in _BOUNDS.items() if b.base is int and not b.optional)
_LIST_KEYS = frozenset(k for k, b in _BOUNDS.items() if typing.get_origin(b.base) is tuple)
_ALIASES = {"hardware_classes": _BOOL_ALIASES}


def _parser(key: str) -> _Parser:
    """How a string (a command, a TOML string) parses to the field's type."""
    b = _BOUNDS[key]
    if key in _LIST_KEYS:
        return _parse_actions
    if b.choices:
        return _parse_choice(b.choices, _ALIASES.get(key, {}))
    if b.base is float:
        return _parse_float
    return _parse_opt_int if b.optional else _parse_int


_PARSE: dict[str, _Parser] = {k: _parser(k) for k in Settings.names()}


def _words(key: str) -> str:
    """What `key` allows, as a parse error and --help say it."""
    if key == "hardware_classes":
        return "one of auto, on, off (or true/false)"  # the aliases parse too
    return _BOUNDS[key].describe()
