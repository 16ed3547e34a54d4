"""Typed TOML config loading shared by both daemons.

A config file is a TOML table mapped onto a dataclass. Unknown keys and values
of the wrong type are errors that name the file, the key and what is allowed;
command-line flags are applied on top (see each daemon's config module).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(ValueError):
    """A config file or flag is wrong; the message names where and what is allowed."""


T = TypeVar("T")


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None


def toml_value(v: Any) -> str:
    """One value written as TOML (the generated daemon configs: scalars and lists).
    Raises TypeError naming a value TOML cannot carry here."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write a value of type {type(v).__name__} as TOML")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: unexpected value {value!r}")
    if origin in (list, tuple):
        (inner, *_) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table")
        return from_mapping(tp, value, where)
    if tp is dict or typing.get_origin(tp) is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table")
        return dict(value)
    raise ConfigError(f"{where}: unsupported type {_type_name(tp)}")


def from_mapping(cls: type[T], data: dict[str, Any], where: str) -> T:
    """Build dataclass `cls` from a mapping; `where` prefixes error messages."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(names))}"
        )
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


def load_config(cls: type[T], path: str | Path | None, overrides: dict[str, Any]) -> T:
    """File (if any) first, then flags that were given (None = not given)."""
    data: dict[str, Any] = read_toml(path) if path else {}
    given = {k: v for k, v in overrides.items() if v is not None}
    base = from_mapping(cls, data, str(path) if path else "config")
    return dataclasses.replace(base, **given)  # type: ignore[type-var]
