"""NCCL's debug logger seen from Python: printf formatting of what the plugin logs.

The stand-in (sim/nccl.py) hands the plugin a ``ncclDebugLogger_t``
(``nccl_abi.LOGFN``) whose integer-class varargs arrive as uint64 slots;
``format_c`` renders them as C's printf would.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence

_FMT = re.compile(r"%([-+ #0]*)(\d*)(?:\.(\d+))?(hh|h|ll|l|z|j|t)?([diouxXscp%])")
_WIDTH_BITS = {"hh": 8, "h": 16, None: 32, "l": 64, "ll": 64, "z": 64, "j": 64, "t": 64}


def format_c(fmt: str, args: Sequence[int]) -> str:
    """printf-style formatting of integer-class arguments (what loggers pass)."""
    it = iter(args)

    def one(m: re.Match[str]) -> str:
        flags, width, prec, length, conv = m.groups()
        if conv == "%":
            return "%"
        raw = next(it, 0)
        if conv == "s":
            text = ctypes.string_at(raw).decode("utf-8", "replace") if raw else "(null)"
            if prec is not None:
                text = text[: int(prec)]
        elif conv == "c":
            text = chr(raw & 0xFF)
        elif conv == "p":
            text = hex(raw)
        else:
            bits = _WIDTH_BITS[length]
            v = raw & ((1 << bits) - 1)
            if conv in "di" and v >> (bits - 1):
                v -= 1 << bits
            spec = {"o": "o", "x": "x", "X": "X"}.get(conv, "d")
            text = format(v, spec)
            if prec is not None:
                text = text.rjust(int(prec), "0")
        if width:
            pad = "0" if "0" in flags and "-" not in flags and conv not in "sc" else " "
            text = text.ljust(int(width)) if "-" in flags else text.rjust(int(width), pad)
        return text

    return _FMT.sub(one, fmt)
