"""Generated fast validators for the protocol's records and messages.

messages.py describes every record and message as a tuple of ``Spec`` (field
name, check, required/default) and validates a decoded map field by field with
precise error paths. That generic walk costs a call, a closure and a couple of
dict operations per field. This module compiles the same description into one
straight-line Python function per record type: every check is inlined as
``type(v) is int and lo <= v <= hi`` and the like, absent optional fields cost
one ``dict.get``, and no error text or path is built.

The fast function only answers "valid, here is the object" or raises. Any
exception (``Reject``, a ``KeyError`` for a missing required field, anything
else) sends the caller back to the slow, precise path, which is the authority:
it produces the exact ProtocolError (reason, text, field path) or, should the
fast path ever be stricter than the slow one, the value. So the fast path must
never accept what the slow path refuses, nor return a different value; it may
refuse more (that only costs time).

Each check is described to the compiler by a "kind" tuple, registered by the
check factories in messages.py:

=====================================  ============================================
``("str", max_len, nonempty)``         ``type(v) is str`` and the length bounds
``("choice", frozenset)``              a str in the set
``("int", lo, hi)``                    ``type(v) is int`` (bool refused), in range
``("float", lo, hi)``                  finite float in range, or an int in range
                                       (converted with ``float``)
``("bool",)``                          ``type(v) is bool``
``("bytes", lo, hi)``                  ``type(v) is bytes``, length in range
``("opt", kind)``                      None, or ``kind``
``("pred", fn)``                       ``fn(v)`` is true (the value is kept as is)
``("list", kind, min_len, max_len)``   a list, each entry ``kind``; becomes a tuple
``("call", fn)``                       ``v = fn(v)``; ``fn`` raises when invalid
``("slow", check)``                    ``v = check(v, "", name)``: the slow check
=====================================  ============================================
"""

from __future__ import annotations

import dataclasses
import keyword
import math
import types
from collections.abc import Callable, Sequence
from typing import Any

Kind = tuple[Any, ...]


class Reject(Exception):
    """Raised by generated code: the value is not valid (the slow path says why)."""


_MISSING: Any = object()


class _Gen:
    """Source text and bound constants of one generated function."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ns: dict[str, Any] = {"Reject": Reject, "_MISSING": _MISSING}
        self._n = 0

    def const(self, value: Any) -> str:
        """An expression for ``value``: a literal for plain ints/finite floats, else a bound name."""
        if type(value) is int or (type(value) is float and math.isfinite(value)):
            return repr(value)
        for k, v in self.ns.items():
            if v is value:
                return k
        self._n += 1
        name = f"_k{self._n}"
        self.ns[name] = value
        return name

    def var(self) -> str:
        self._n += 1
        return f"_v{self._n}"

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)


def _transforms(kind: Kind) -> bool:
    """Whether the check stores something else than the value it was given."""
    tag = kind[0]
    if tag == "opt":
        return _transforms(kind[1])
    return tag in ("float", "list", "call", "slow")


def _check(g: _Gen, kind: Kind, v: str, name: str, ind: int) -> None:
    """Emit statements that validate variable ``v`` (rebinding it if the check converts)."""
    tag = kind[0]
    fail = "raise Reject"
    if tag == "str":
        _, max_len, nonempty = kind
        lo = 1 if nonempty else 0
        g.emit(ind, f"if type({v}) is not str or not {lo} <= len({v}) <= {max_len}: {fail}")
    elif tag == "choice":
        g.emit(ind, f"if type({v}) is not str or {v} not in {g.const(kind[1])}: {fail}")
    elif tag == "int":
        _, lo, hi = kind
        g.emit(ind, f"if type({v}) is not int or not {lo} <= {v} <= {hi}: {fail}")
    elif tag == "float":
        _, lo, hi = kind
        lo_s, hi_s = g.const(float(lo)), g.const(float(hi))
        if math.isfinite(lo) and math.isfinite(hi):
            # Finite bounds refuse NaN (every comparison is false) and +-inf.
            float_ok = f"{lo_s} <= {v} <= {hi_s}"
        elif math.isfinite(lo) and hi == math.inf:
            float_ok = f"{lo_s} <= {v} < {hi_s}"
        else:
            float_ok = f"{lo_s} <= {v} <= {hi_s} and {g.const(math.isfinite)}({v})"
        g.emit(ind, f"if type({v}) is float:")
        g.emit(ind + 1, f"if not {float_ok}: {fail}")
        g.emit(ind, f"elif type({v}) is int and {lo_s} <= {v} <= {hi_s}:")
        g.emit(ind + 1, f"{v} = float({v})")
        g.emit(ind, f"else: {fail}")
    elif tag == "bool":
        g.emit(ind, f"if type({v}) is not bool: {fail}")
    elif tag == "bytes":
        _, lo, hi = kind
        g.emit(ind, f"if type({v}) is not bytes or not {lo} <= len({v}) <= {hi}: {fail}")
    elif tag == "opt":
        g.emit(ind, f"if {v} is not None:")
        _check(g, kind[1], v, name, ind + 1)
    elif tag == "pred":
        g.emit(ind, f"if not {g.const(kind[1])}({v}): {fail}")
    elif tag == "list":
        _, inner, min_len, max_len = kind
        g.emit(ind, f"if type({v}) is not list or not {min_len} <= len({v}) <= {max_len}: {fail}")
        if inner[0] == "call":
            g.emit(ind, f"{v} = tuple(map({g.const(inner[1])}, {v}))")
        elif not _transforms(inner):
            x = g.var()
            g.emit(ind, f"for {x} in {v}:")
            _check(g, inner, x, name, ind + 1)
            g.emit(ind, f"{v} = tuple({v})")
        else:
            x, acc = g.var(), g.var()
            g.emit(ind, f"{acc} = []")
            g.emit(ind, f"for {x} in {v}:")
            _check(g, inner, x, name, ind + 1)
            g.emit(ind + 1, f"{acc}.append({x})")
            g.emit(ind, f"{v} = tuple({acc})")
    elif tag == "call":
        g.emit(ind, f"{v} = {g.const(kind[1])}({v})")
    elif tag == "slow":
        g.emit(ind, f"{v} = {g.const(kind[1])}({v}, '', {name!r})")
    else:
        raise ValueError(f"unknown check kind {kind!r}")


def _fields(g: _Gen, specs: Sequence[Any], kind_of: Callable[[Any], Kind]) -> dict[str, str]:
    """Emit the field reads and checks; return field name -> variable."""
    out: dict[str, str] = {}
    for s in specs:
        v = g.var()
        out[s.name] = v
        kind = kind_of(s.check)
        name = repr(s.name)
        if s.required:
            # A missing key raises KeyError: the slow path reports it.
            g.emit(1, f"{v} = m[{name}]")
            _check(g, kind, v, s.name, 1)
        elif s.factory is None and s.default is None and kind[0] == "opt":
            # Absent and null are the same value here: one get, no default branch.
            g.emit(1, f"{v} = get({name})")
            _check(g, kind, v, s.name, 1)
        else:
            g.emit(1, f"{v} = get({name}, _MISSING)")
            g.emit(1, f"if {v} is _MISSING:")
            if s.factory is not None:
                g.emit(2, f"{v} = {g.const(s.factory)}()")
            else:
                g.emit(2, f"{v} = {g.const(s.default)}")
            g.emit(1, "else:")
            _check(g, kind, v, s.name, 2)
    return out


def _direct_setters(cls: Any, names: Sequence[str]) -> list[Any] | None:
    """Slot setters for building ``cls`` without its ``__init__``, or None if that is not safe.

    Only for a slots dataclass whose fields are exactly ``names``, all set by
    ``__init__`` and with no ``__post_init__``: then storing every slot leaves
    the same object as ``cls(**kw)`` without the frozen ``__setattr__`` detour.
    """
    if not dataclasses.is_dataclass(cls) or not isinstance(cls, type):
        return None
    if hasattr(cls, "__post_init__") or "__slots__" not in cls.__dict__:
        return None
    fs = dataclasses.fields(cls)
    if sorted(f.name for f in fs) != sorted(names) or not all(f.init for f in fs):
        return None
    setters = []
    for n in names:
        d = cls.__dict__.get(n)
        if type(d) is not types.MemberDescriptorType:
            return None
        setters.append(d.__set__)
    return setters


def _filler(cls: Any, names: Sequence[str]) -> type | None:
    """A plain (not frozen) class with the very slot layout of ``cls``, or None.

    The generated code fills one of these with ordinary (specialised, cheap)
    attribute stores and then assigns ``__class__ = cls``: three times cheaper
    than a frozen dataclass ``__init__`` (one ``object.__setattr__`` call per
    field) and twice cheaper than calling the slot setters. CPython only allows
    the assignment between classes of identical layout (same base, same slots
    in the same order), and this is probed here once, together with the
    result being equal to ``cls(**kw)``, so a change to the record classes
    falls back to the setters or to ``__init__`` instead of breaking.
    """
    if _direct_setters(cls, names) is None or cls.__bases__ != (object,):
        return None
    slots = cls.__dict__["__slots__"]
    if isinstance(slots, str) or not all(
        type(n) is str and n.isidentifier() and not keyword.iskeyword(n) for n in slots
    ):
        return None
    twin = type(f"_{cls.__name__}Filler", (), {"__slots__": tuple(slots), "__module__": __name__})
    try:
        probe: Any = object.__new__(twin)
        for i, n in enumerate(names):
            setattr(probe, n, i)
        probe.__class__ = cls
        ok = type(probe) is cls and probe == cls(**{n: i for i, n in enumerate(names)})
    except Exception:
        return None
    return twin if ok else None


def compile_record(
    specs: Sequence[Any],
    cls: Callable[..., Any],
    kind_of: Callable[[Any], Kind],
    *,
    post: str | None = None,
    empty: Any = None,
    label: str = "record",
) -> Callable[[Any], Any]:
    """A function ``fast(v)`` returning ``cls`` built from map ``v`` or raising.

    ``post``: a cross-field condition that refuses the record, written with
    ``{field}`` placeholders (e.g. ``"{step_hi} < {step_lo}"``). ``empty``: the
    object to return for an empty map, if any.
    """
    g = _Gen()
    g.emit(0, "def fast(m):")
    g.emit(1, "if type(m) is not dict: raise Reject")
    if empty is not None:
        g.emit(1, f"if not m: return {g.const(empty)}")
    g.emit(1, "get = m.get")
    var = _fields(g, specs, kind_of)
    if post is not None:
        g.emit(1, f"if {post.format(**var)}: raise Reject")
    names = [s.name for s in specs]
    twin = _filler(cls, names)
    setters = _direct_setters(cls, names)
    if twin is not None:
        g.emit(1, f"o = {g.const(object.__new__)}({g.const(twin)})")
        for n in names:
            g.emit(1, f"o.{n} = {var[n]}")
        g.emit(1, f"o.__class__ = {g.const(cls)}")
        g.emit(1, "return o")
    elif setters is None:
        args = ", ".join(f"{n}={var[n]}" for n in names)
        g.emit(1, f"return {g.const(cls)}({args})")
    else:
        g.emit(1, f"o = {g.const(object.__new__)}({g.const(cls)})")
        for n, s in zip(names, setters, strict=True):
            g.emit(1, f"{g.const(s)}(o, {var[n]})")
        g.emit(1, "return o")
    return _finish(g, label)


def compile_message(
    specs: Sequence[Any],
    cls: Callable[..., Any],
    kind_of: Callable[[Any], Kind],
    *,
    post: str | None = None,
    label: str = "message",
) -> Callable[[Any, int, tuple[int, int]], Any]:
    """A function ``fast(m, seq, version)`` returning the message built from map ``m`` or raising."""
    g = _Gen()
    g.emit(0, "def fast(m, seq, version):")
    g.emit(1, "get = m.get")
    var = _fields(g, specs, kind_of)
    if post is not None:
        g.emit(1, f"if {post.format(**var)}: raise Reject")
    args = "".join(f", {s.name}={var[s.name]}" for s in specs)
    g.emit(1, f"return {g.const(cls)}(seq=seq, version=version{args})")
    return _finish(g, label)


def _finish(g: _Gen, label: str) -> Any:
    src = "\n".join(g.lines) + "\n"
    code = compile(src, f"<protocol fast check: {label}>", "exec")
    exec(code, g.ns)
    fn = g.ns["fast"]
    fn.__fastcheck_source__ = src
    return fn
