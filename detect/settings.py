"""Every tunable of the detector core, validated in one place.

`Settings` is frozen: a change (config file, scenario ``[detector]`` table, an
operator at run time) builds a new validated object with `Settings.set` or
`Settings.from_mapping`, and the daemon hands it to every job's
`JobMonitor.update_settings` (its detector and its rebalance policy).
A bad key or value raises `SettingsError` naming the key, the value and what is
allowed, so a typo in a TOML file never silently falls back to a default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from typing import Any

from artemis.rebalance.policy import BOUNDS, bound_problem


class SettingsError(ValueError):
    """A setting key is unknown or its value is not allowed."""


HARDWARE_CLASSES = ("auto", "on", "off")
REBALANCE = ("off", "recommend", "apply")
MODES = ("adaptive", "seed")


@dataclass(frozen=True)
class Settings:
    # A rank is suspect when its compute gap is this many times the median of
    # the other ranks of its island (or class), or of its own warm-up history.
    suspect_ratio: float = 1.10
    # Flagged after `flag_after` suspect windows out of the last `flag_window`.
    flag_after: int = 3
    flag_window: int = 4
    # Cleared after this many consecutive healthy windows.
    clear_after: int = 3
    # Baselines come from the first `warmup_windows` healthy windows after window 0.
    warmup_windows: int = 5
    # Compare ranks within their GPU class: auto = only when classes differ in an island.
    hardware_classes: str = "auto"
    # An island (or class) with fewer ranks than this judges ranks by their own history.
    min_island_peers: int = 3
    drift_ratio: float = 1.10  # island median gap vs its warm-up
    collective_ratio: float = 1.15  # island transfer time vs its warm-up
    link_ratio: float = 1.15  # bridge time vs its warm-up
    # A hardware class's median compute gap vs the stored baseline of the job's workload
    # (across jobs, detect/baselines.py): `change` / `regression` from this share on.
    change_ratio: float = 1.05
    # Hang bound = max(hang_floor_s, hang_step_factor x median step time).
    hang_floor_s: float = 10.0
    hang_step_factor: float = 20.0
    rebalance: str = "off"
    # Bounds for the rebalance policy (read by the policy, checked against its BOUNDS).
    max_shift_frac: float = 0.25
    min_samples: int = 1
    min_plan_interval_windows: int = 4
    # GPUs in the job for the cost in GPU-hours; None = one per rank.
    gpu_count: int | None = None
    # The rank rule: adaptive (peers with a noise-scaled threshold + a change test
    # against the rank's own baseline, DETECTOR.md) or the seed's fixed ratio.
    mode: str = "adaptive"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            _check_type(f.name, value)
            problem = _RULES[f.name][1](value)
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
        if key not in _RULES:
            raise SettingsError(_unknown(key))
        return _RULES[key][2]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def set(self, key: str, value: str) -> Settings:
        """A copy with `key` parsed from the string `value` (e.g. from a command)."""
        if key not in _RULES:
            raise SettingsError(_unknown(key))
        parsed = _RULES[key][0](key, value)
        problem = _RULES[key][1](parsed)
        if problem:
            raise _bad(key, value, problem)
        return replace(self, **{key: parsed})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], base: Settings | None = None) -> Settings:
        """Settings from a TOML table: values may be native (1.1, 3, true) or strings."""
        out = base if base is not None else cls()
        changes: dict[str, Any] = {}
        for key, value in data.items():
            if key not in _RULES:
                raise SettingsError(_unknown(key))
            if isinstance(value, str):
                changes[key] = _RULES[key][0](key, value)
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
        raise _bad(key, text, _RULES[key][2]) from None
    return v


def _parse_int(key: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise _bad(key, text, _RULES[key][2]) from None


def _parse_opt_int(key: str, text: str) -> int | None:
    if text.strip().lower() in ("", "none", "auto", "null"):
        return None
    return _parse_int(key, text)


def _parse_choice(choices: tuple[str, ...], aliases: Mapping[str, str]) -> _Parser:
    def parse(key: str, text: str) -> str:
        t = text.strip().lower()
        t = aliases.get(t, t)
        if t not in choices:
            raise _bad(key, text, _RULES[key][2])
        return t

    return parse


_BOOL_ALIASES = {"true": "on", "false": "off", "yes": "on", "no": "off", "1": "on", "0": "off"}


def _coerce(key: str, value: Any) -> Any:
    """A native TOML value to the field's type (bool for hardware_classes, int for floats)."""
    kind = _RULES[key][2]
    if key == "hardware_classes" and isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, bool):
        raise _bad(key, value, kind)
    if key in _FLOAT_KEYS and isinstance(value, int):
        return float(value)
    if key == "gpu_count" and value is None:
        return None
    return value


def _check_type(key: str, value: Any) -> None:
    ok: bool
    if key in _FLOAT_KEYS:
        ok = isinstance(value, float) and not isinstance(value, bool)
    elif key in _INT_KEYS:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif key == "gpu_count":
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
    else:
        ok = isinstance(value, str)
    if not ok:
        raise _bad(key, value, _RULES[key][2])


_Parser = Callable[[str, str], Any]
_Check = Callable[[Any], str]


def _ratio(v: float) -> str:
    return "" if math.isfinite(v) and v > 1.0 else "a number greater than 1.0"


def _pos(v: float) -> str:
    return "" if math.isfinite(v) and v > 0 else "a number greater than 0"


def _at_least(n: int) -> _Check:
    return lambda v: "" if v >= n else f"an integer of at least {n}"


def _choice(choices: tuple[str, ...]) -> _Check:
    return lambda v: "" if v in choices else f"one of {', '.join(choices)}"


def _opt_count(v: int | None) -> str:
    return "" if v is None or v >= 1 else "a positive integer or none (= number of ranks)"


# key -> (parse a string, check a typed value -> problem or "", what is allowed)
_RULES: dict[str, tuple[_Parser, Callable[[Any], str], str]] = {
    "suspect_ratio": (_parse_float, _ratio, "a number greater than 1.0"),
    "flag_after": (_parse_int, _at_least(1), "an integer of at least 1"),
    "flag_window": (_parse_int, _at_least(1), "an integer of at least 1"),
    "clear_after": (_parse_int, _at_least(1), "an integer of at least 1"),
    "warmup_windows": (_parse_int, _at_least(1), "an integer of at least 1"),
    "hardware_classes": (
        _parse_choice(HARDWARE_CLASSES, _BOOL_ALIASES),
        _choice(HARDWARE_CLASSES),
        "one of auto, on, off (or true/false)",
    ),
    "min_island_peers": (_parse_int, _at_least(2), "an integer of at least 2"),
    "drift_ratio": (_parse_float, _ratio, "a number greater than 1.0"),
    "collective_ratio": (_parse_float, _ratio, "a number greater than 1.0"),
    "link_ratio": (_parse_float, _ratio, "a number greater than 1.0"),
    "change_ratio": (_parse_float, _ratio, "a number greater than 1.0"),
    "hang_floor_s": (_parse_float, _pos, "a number greater than 0"),
    "hang_step_factor": (_parse_float, _pos, "a number greater than 0"),
    "rebalance": (_parse_choice(REBALANCE, {}), _choice(REBALANCE), "one of off, recommend, apply"),
    # The policy's bounds, stated once in artemis.rebalance.policy.BOUNDS.
    **{
        k: (parse, partial(bound_problem, k), BOUNDS[k].describe())
        for k, parse in (
            ("max_shift_frac", _parse_float),
            ("min_samples", _parse_int),
            ("min_plan_interval_windows", _parse_int),
        )
    },
    "gpu_count": (_parse_opt_int, _opt_count, "a positive integer or none (= number of ranks)"),
    "mode": (_parse_choice(MODES, {}), _choice(MODES), "one of adaptive, seed"),
}
_FLOAT_KEYS = frozenset(
    k for k, f in Settings.__dataclass_fields__.items() if f.type in ("float", float)
)
_INT_KEYS = frozenset(k for k, f in Settings.__dataclass_fields__.items() if f.type in ("int", int))
