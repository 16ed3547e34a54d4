"""Protocol codec: msgspec (the shipped codec) against one Spec table over msgpack, per rank-window.

``python -m bench codec``. Both codecs derive from the same schema
(protocol/records.py) and validate the same things; they differ in who walks
the decoded data:

- **msgspec** (shipped): ``artemis.protocol.codec``: msgspec decodes the body
  straight into the typed messages, checking every type, bound and string in
  C; numeric columns of a columnar batch are checked per column with numpy.
- **spec table**: ``msgpack.unpackb`` to plain maps, then one Python walk
  driven by a table of ``FieldSpec`` (``records.field_specs``): a type and
  bound test per field per rank (the numeric columns use the same numpy
  checks). This is the best form of the previous design, without generated
  code.

Rows: a ``windows`` message of K ranks as columns (minor 1.1) and as per-rank
maps (minor 1.0), and a heartbeat of K ranks' progress. Columns: microseconds
per rank-window (per rank for the heartbeat) to encode (typed message to
frame body), to decode + validate with each codec, the ratio spec/msgspec, and
raw ``msgpack.unpackb`` of the same body (no validation) for scale. Each
figure is the median of RUNS timed runs.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack
from artemis.protocol.codec import decode_frame_body, encode
from artemis.protocol.columns import COLUMNS, NumCol, WindowColumns, from_wire
from artemis.protocol.messages import PROTOCOL_VERSION, Heartbeat, Windows
from artemis.protocol.records import (
    FieldSpec,
    RankProgress,
    RankWindow,
    Telemetry,
    field_specs,
)

RUNS = 7
TARGET_S = 0.2  # each run lasts about this long


def _window(rank: int) -> RankWindow:
    return RankWindow(
        job="job-1", comm="0123456789abcdef", rank=rank, nranks=8, host="node-a", window=37,
        step_lo=1850, step_hi=1900, coll_lo=7400, coll_hi=7600, gap_ms=81.5 + rank % 8,
        coll_ms=18.25, step_ms=100.0, collectives=200, bytes=1 << 33, lost=0, clock="device",
        island="nvidia", hw_class="H100", samples=32,
        telemetry=Telemetry(
            vendor="nvidia", gpu_model="NVIDIA H100 80GB HBM3", gpu_index=rank % 8, sm_mhz=1410.0,
            sm_mhz_max=1980.0, mem_mhz=2619.0, temp_c=61.0, power_w=400.0, power_limit_w=700.0,
            throttle={"hw_thermal": False, "sw_power_cap": False}, pcie_gen=5, pcie_gen_max=5,
            pcie_width=16, pcie_width_max=16, cpu_pct=35.0, steal_pct=0.0, iowait_pct=0.1,
            psi_cpu_some=0.5, load1=12.0, ncpu=96, proc_cpu_pct=101.0,
        ),
    )  # fmt: skip


# --------------------------------------------------------------------------- the spec table

_RW = field_specs(RankWindow)
_TEL = field_specs(Telemetry)
_RP = field_specs(RankProgress)
_MISSING: Any = object()


class Invalid(Exception):
    pass


def _scalar(s: FieldSpec, v: Any) -> Any:
    k = s.kind
    if v is None:
        if s.optional:
            return None
        raise Invalid(s.name)
    if k == "i":
        if type(v) is not int or not s.lo <= v <= s.hi:
            raise Invalid(s.name)
    elif k == "f":
        if type(v) is int:
            v = float(v)
        if type(v) is not float or not (s.lo <= v <= s.hi) or not math.isfinite(v):
            raise Invalid(s.name)
    elif k == "s":
        if type(v) is not str or not s.min_len <= len(v) <= (s.max_len or 1 << 30):
            raise Invalid(s.name)
        if s.choices and v not in s.choices:
            raise Invalid(s.name)
    elif k == "b":
        if type(v) is not bool:
            raise Invalid(s.name)
    elif k == "t":
        if type(v) is not dict:
            raise Invalid(s.name)
        for key, x in v.items():
            if type(key) is not str or len(key) > 64 or type(x) is not bool:
                raise Invalid(s.name)
    elif k == "m":
        if type(v) is not list or len(v) > 64:
            raise Invalid(s.name)
        for x in v:
            if type(x) is not str or len(x) > 64:
                raise Invalid(s.name)
        v = tuple(v)
    return v


def _record(specs: tuple[FieldSpec, ...], cls: Any, m: Any) -> Any:
    if type(m) is not dict:
        raise Invalid(cls.__name__)
    kw: dict[str, Any] = {}
    for s in specs:
        v = m.get(s.name, _MISSING)
        if v is _MISSING:
            if not s.optional and s.kind != "r" and s.name != "missing":
                raise Invalid(s.name)
            continue
        kw[s.name] = _record(_TEL, Telemetry, v) if s.kind == "r" else _scalar(s, v)
    return cls(**kw)


_COL_SPECS = {s.name: s for s in _RW} | {f"tel_{s.name}": s for s in _TEL}


class _Batch:
    """What from_wire reads (attributes), built from a plain decoded map."""

    def __init__(self, m: dict[str, Any]) -> None:
        n = m["n"]
        if type(n) is not int or n < 0:
            raise Invalid("n")
        self.n = n
        for name, kind in COLUMNS.items():
            v = m.get(name)
            if kind in ("i", "f", "oi", "of"):
                v = None if v is None else NumCol(*v)
            elif v is not None:
                s = _COL_SPECS[name]
                if type(v) is not list:
                    raise Invalid(name)
                v = [_scalar(s, x) for x in v]
            setattr(self, name, v)


def spec_decode(body: bytes) -> Any:
    m = msgpack.unpackb(body, raw=False)
    if type(m) is not dict or m.get("v", [0])[0] != PROTOCOL_VERSION[0]:
        raise Invalid("envelope")
    t = m.get("t")
    if t == "windows":
        if "cols" in m:
            return Windows(host=m["host"], columns=from_wire(_Batch(m["cols"])), seq=m["seq"])
        recs = tuple(_record(_RW, RankWindow, w) for w in m["windows"])
        return Windows(host=m["host"], windows=recs, seq=m["seq"])
    if t == "heartbeat":
        prog = tuple(_record(_RP, RankProgress, p) for p in m.get("progress", ()))
        return Heartbeat(
            progress=prog, buffered=m.get("buffered", 0), dropped=m.get("dropped", 0),
            seq=m["seq"],
        )  # fmt: skip
    raise Invalid(str(t))


# --------------------------------------------------------------------------- timing


def _per_call_us(fn: Callable[[], object]) -> float:
    """Microseconds per call of ``fn``, median of RUNS runs of about TARGET_S each."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= TARGET_S / 4:
            break
        n *= 2
    n = max(1, int(n * TARGET_S / dt))
    runs = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def _cases() -> list[tuple[str, int, Any, tuple[int, int]]]:
    out: list[tuple[str, int, Any, tuple[int, int]]] = []
    for k in (8, 512, 8192):
        cols = WindowColumns.from_records([_window(r) for r in range(k)])
        out.append((f"windows 1.1 columns, {k} ranks", k, Windows(host="n", columns=cols), (1, 1)))
    for k in (8, 512):
        msg = Windows(host="n", windows=[_window(r) for r in range(k)])
        out.append((f"windows 1.0 maps, {k} ranks", k, msg, (1, 0)))
    progress = tuple(
        RankProgress("job-1", "0123456789abcdef", r, "node-a", 7599, None, 0.0, 0.01)
        for r in range(8)
    )
    out.append(("heartbeat, 8 ranks", 8, Heartbeat(progress=progress), PROTOCOL_VERSION))
    return out


def main() -> int:
    rows = []
    for name, k, msg, version in _cases():
        frame = encode(msg, version=version, max_frame=1 << 30)
        body = frame[4:]
        assert decode_frame_body(body) == spec_decode(body) or version == (1, 0)
        enc = _per_call_us(partial(encode, msg, version=version, max_frame=1 << 30)) / k
        ours = _per_call_us(partial(decode_frame_body, body)) / k
        spec = _per_call_us(partial(spec_decode, body)) / k
        raw = _per_call_us(partial(msgpack.unpackb, body, raw=False)) / k
        rows.append((name, len(body) / k, enc, ours, spec, raw))
    head = (
        f"{'message':<30}{'B/rank':>7}{'encode':>9}{'msgspec':>9}{'spec table':>11}"
        f"{'ratio':>7}{'raw unpackb':>12}"
    )
    print(
        f"codec, microseconds per rank-window (decode = decode + validate), median of {RUNS} runs"
    )
    print(head)
    print("-" * len(head))
    for name, size, enc, ours, spec, raw in rows:
        print(
            f"{name:<30}{size:>7.0f}{enc:>9.2f}{ours:>9.2f}{spec:>11.2f}"
            f"{spec / ours:>7.1f}{raw:>12.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
