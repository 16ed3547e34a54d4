"""Settings bounds, stated once as ``msgspec.Meta`` on a field's type, as the wire's records are.

A settings class annotates each bounded field (``Annotated[float, Meta(ge=0, lt=1)]``,
``Literal["off", "on"]``); ``Bound.of`` reads that annotation, msgspec does the check
(``msgspec.convert``), and ``describe`` says what is allowed in the words errors
have always used ("a number in [0, 1)", "an integer of at least 1"), so an error
still names the key, the value and the allowed range. Whole bounds print without a
point (``ge=0.0`` -> "0").

``Meta(description=...)`` replaces the generated words where they would say less
than the field means (an optional count, a choice with aliases).

As on the wire (protocol/records.py), a bound below refuses NaN and an upper
bound of ``FLOAT_MAX`` refuses +inf: it only says "finite" and is not printed.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

FLOAT_MAX = sys.float_info.max  # an upper bound that only refuses +inf


@dataclass(frozen=True, slots=True)
class Bound:
    """The allowed values of one settings field, read from its annotated type."""

    tp: Any  # the field's type, Meta and all: what msgspec checks against
    lo: float | None = None
    lo_open: bool = False  # gt rather than ge
    hi: float | None = None
    hi_open: bool = False  # lt rather than le
    integer: bool = False
    choices: tuple[str, ...] = ()
    words: str = ""  # Meta(description=...): said instead of the generated words
    base: Any = None  # the type under the annotations (float, int, a Literal)
    optional: bool = False  # X | None: None is allowed too

    @classmethod
    def of(cls, tp: Any) -> Bound:
        """The bound an annotation states (``Annotated[..., Meta]``, ``Literal``, ``X | None``)."""
        base, metas, optional = _peel(tp)
        lo = hi = None
        lo_open = hi_open = False
        words = ""
        for m in metas:
            if m.ge is not None or m.gt is not None:
                lo, lo_open = (m.gt, True) if m.gt is not None else (m.ge, False)
            if m.lt is not None or (m.le is not None and m.le != FLOAT_MAX):
                hi, hi_open = (m.lt, True) if m.lt is not None else (m.le, False)
            words = m.description or words
        choices: tuple[str, ...] = ()
        if typing.get_origin(base) is Literal:
            choices = tuple(str(c) for c in typing.get_args(base))
        return cls(tp, lo, lo_open, hi, hi_open, base is int, choices, words, base, optional)

    def describe(self) -> str:
        """What is allowed, in words (for error messages and --help)."""
        if self.words:
            return self.words
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        noun = "an integer" if self.integer else "a number"
        lo, hi = _num(self.lo), _num(self.hi)
        if self.hi is not None:
            close = ")" if self.hi_open else "]"
            return f"{noun} in {'(' if self.lo_open else '['}{lo}, {hi}{close}"
        if self.lo_open:
            return f"{noun} greater than {lo}"
        return f"{noun} of at least {lo}"

    def problem(self, value: Any) -> str:
        """ "" when ``value`` is allowed, else what is allowed (for an error message)."""
        try:
            msgspec.convert(value, self.tp)
        except msgspec.ValidationError:
            return self.describe()
        return ""


def bounds_of(cls: type) -> dict[str, Bound]:
    """Every field of a settings class whose annotation states a bound, by name."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for name, tp in hints.items():
        b = Bound.of(tp)
        if b.lo is not None or b.hi is not None or b.choices or b.words:
            out[name] = b
    return out


def _num(v: float | None) -> str:
    # Whole numbers print without a point: typing caches equal Annotated types, so
    # Meta(ge=0) may come back as another module's Meta(ge=0.0).
    if v is None:
        return ""
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _peel(tp: Any) -> tuple[Any, list[msgspec.Meta], bool]:
    """(the base type, every Meta on it, whether None is allowed), through ``Annotated``
    and ``X | None``."""
    metas: list[msgspec.Meta] = []
    optional = False
    while True:
        if typing.get_origin(tp) is typing.Annotated:
            args = typing.get_args(tp)
            metas.extend(m for m in args[1:] if isinstance(m, msgspec.Meta))
            tp = args[0]
            continue
        if typing.get_origin(tp) in (typing.Union, types.UnionType):  # X | None
            some = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(some) == 1:
                tp, optional = some[0], True
                continue
        return tp, metas, optional


def out_of_bounds(obj: Any, bounds: Mapping[str, Bound], where: str = "") -> str:
    """ "" when every bounded field of ``obj`` is allowed, else a message naming the first
    that is not: ``WHERE.KEY: expected WORDS, got VALUE`` (for a config file's errors)."""
    for name, bound in bounds.items():
        value = getattr(obj, name)
        problem = bound.problem(value)
        if problem:
            return f"{where}{name}: expected {problem}, got {value!r}"
    return ""
