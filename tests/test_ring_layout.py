"""The Python ring format (artemis.ring.format) matches the C header byte for byte."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from artemis.ring import format as rf

REPO = Path(__file__).resolve().parents[1]
HEADER = REPO / "profiler_plugin" / "artemis_ring.h"

_SLOT = [f[0] for f in rf.SLOT_FIELDS]
_HDR = [f[0] for f in rf.HEADER_FIELDS]
# ArtemisSlotCpu nests the base slot as `base`; the dtype flattens it.
_CPU_C = ["base", *(f[0] for f in rf.SLOT_CPU_EXTRA)]


def _c_source() -> str:
    lines = [
        "#include <stddef.h>",
        "#include <stdio.h>",
        '#include "artemis_ring.h"',
        '#define F(T, m) printf(#T " " #m " %zu %zu\\n", offsetof(T, m), sizeof(((T*)0)->m));',
        '#define C(x) printf("const " #x " %llu\\n", (unsigned long long)(x));',
        "int main(void) {",
        '  printf("size ArtemisSlot %zu\\n", sizeof(ArtemisSlot));',
        '  printf("size ArtemisRingHeader %zu\\n", sizeof(ArtemisRingHeader));',
        '  printf("size ArtemisSlotCpu %zu\\n", sizeof(ArtemisSlotCpu));',
    ]
    lines += [f"  F(ArtemisSlot, {n})" for n in _SLOT]
    lines += [f"  F(ArtemisSlotCpu, {n})" for n in _CPU_C]
    lines += [f"  F(ArtemisSlotCpu, base.{n})" for n in _SLOT]
    lines += [f"  F(ArtemisRingHeader, {n})" for n in _HDR]
    text = HEADER.read_text()
    consts = re.findall(r"\b(ARTEMIS_[A-Z0-9_]+)\s*=", text)
    consts += re.findall(r"#define\s+(ARTEMIS_[A-Z0-9_]+)\s+\S", text)
    lines += [f"  C({c})" for c in consts if c != "ARTEMIS_RING_H"]
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "a C compiler is needed to check the ring layout"
    d = tmp_path_factory.mktemp("layout")
    src = d / "layout.c"
    src.write_text(_c_source())
    exe = d / "layout"
    subprocess.run(
        [cc, "-std=c11", "-Wall", "-Werror", "-I", str(HEADER.parent), "-o", str(exe), str(src)],
        check=True,
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    res: dict[str, dict[str, object]] = {"size": {}, "const": {}}
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "size":
            res["size"][parts[1]] = int(parts[2])
        elif parts[0] == "const":
            res["const"][parts[1]] = int(parts[2])
        else:
            res.setdefault(parts[0], {})[parts[1]] = (int(parts[2]), int(parts[3]))
    return res


def _np_layout(dt: object) -> dict[str, tuple[int, int]]:
    import numpy as np

    assert isinstance(dt, np.dtype)
    assert dt.fields is not None
    return {n: (int(off), sub.itemsize) for n, (sub, off, *_) in dt.fields.items()}


def test_slot_layout(c_layout: dict[str, dict[str, object]]) -> None:
    assert c_layout["size"]["ArtemisSlot"] == rf.SLOT_DTYPE.itemsize == rf.SLOT_SIZE
    assert c_layout["ArtemisSlot"] == _np_layout(rf.SLOT_DTYPE)


def test_cpu_slot_layout(c_layout: dict[str, dict[str, object]]) -> None:
    c = c_layout["ArtemisSlotCpu"]
    assert c_layout["size"]["ArtemisSlotCpu"] == rf.SLOT_CPU_DTYPE.itemsize == rf.SLOT_CPU_SIZE
    # The base slot is its prefix, field for field.
    assert c["base"] == (0, rf.SLOT_SIZE)
    assert {n: c[f"base.{n}"] for n in _SLOT} == _np_layout(rf.SLOT_DTYPE)
    flat = {n: v for n, v in c.items() if n != "base" and not n.startswith("base.")}
    flat.update({n: c[f"base.{n}"] for n in _SLOT})
    assert flat == _np_layout(rf.SLOT_CPU_DTYPE)
    assert {
        c_layout["const"]["ARTEMIS_SLOT_MINOR_BASE"]: (rf.SLOT_SIZE, rf.SLOT_DTYPE),
        c_layout["const"]["ARTEMIS_SLOT_MINOR_CPU"]: (rf.SLOT_CPU_SIZE, rf.SLOT_CPU_DTYPE),
    } == rf.SLOT_LAYOUTS


def test_header_layout(c_layout: dict[str, dict[str, object]]) -> None:
    assert c_layout["size"]["ArtemisRingHeader"] == rf.HEADER_DTYPE.itemsize
    assert c_layout["ArtemisRingHeader"] == _np_layout(rf.HEADER_DTYPE)


def test_every_c_field_is_mirrored(c_layout: dict[str, dict[str, object]]) -> None:
    # A field added to the C structs but not to the dtypes would go unnoticed by
    # the offset comparison above; count the members in the header text instead.
    text = HEADER.read_text()
    for struct, names in (
        ("ArtemisSlot", _SLOT),
        ("ArtemisSlotCpu", _CPU_C),
        ("ArtemisRingHeader", _HDR),
    ):
        body = re.search(r"typedef struct " + struct + r" \{(.*?)\}", text, re.S)
        assert body is not None
        code = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
        members = re.findall(r"\b([a-z_0-9]+)(?:\[[^\]]*\])*;", code)
        assert members == names, struct


# C constants whose Python name is not the C name without ARTEMIS_ (and RING_).
_TABLES = ("ARTEMIS_FUNC_", "ARTEMIS_DT_", "ARTEMIS_ALGO_", "ARTEMIS_PROTO_")


def _py_name(c_name: str) -> str:
    name = c_name.removeprefix("ARTEMIS_")
    return name if hasattr(rf, name) else name.removeprefix("RING_")


def test_constants_match(c_layout: dict[str, dict[str, object]]) -> None:
    # Every constant of the header has its Python mirror with the same value;
    # the code tables (func, dtype, algo, proto) are checked as name tables below.
    c = c_layout["const"]
    checked = 0
    for cname, value in c.items():
        if cname.startswith(_TABLES):
            continue
        name = _py_name(cname)
        assert hasattr(rf, name), f"{cname} has no mirror in ring_format"
        assert getattr(rf, name) == value, cname
        checked += 1
    assert checked >= 25  # the regex found the constants at all
    assert c["ARTEMIS_FUNC_BRIDGE"] == rf.FUNC_BRIDGE
    assert c["ARTEMIS_DT_UINT8"] == rf.DT_UINT8
    for name, code in (("HOST", 0), ("DEVICE_NS", 1), ("DEVICE_TICKS", 2)):
        assert c[f"ARTEMIS_CLOCK_{name}"] == code
        assert rf.CLOCK_KIND_NAMES[code] == name.lower()
        assert rf.CLOCK_KINDS[name.lower()] == code
    ticks = _code_table(c, "ARTEMIS_TICK_SRC_")
    assert {rf.TICK_SOURCE_NAMES[v].upper(): v for v in ticks.values()} == ticks


def _code_table(c: dict[str, object], prefix: str) -> dict[str, int]:
    return {
        k[len(prefix) :]: int(v)  # type: ignore[call-overload]
        for k, v in c.items()
        if k.startswith(prefix)
    }


def test_name_tables_cover_every_code(c_layout: dict[str, dict[str, object]]) -> None:
    c = c_layout["const"]
    funcs = _code_table(c, "ARTEMIS_FUNC_")
    assert sorted(funcs.values()) == sorted(rf.FUNC_NAMES)
    for cname, code in funcs.items():
        assert rf.FUNC_NAMES[code].upper() == cname
    dts = _code_table(c, "ARTEMIS_DT_")
    assert sorted(dts.values()) == sorted(rf.DTYPE_NAMES) == sorted(rf.DTYPE_SIZES)
    for cname, code in dts.items():
        # NCCL spells the fp8 types ncclFloat8e4m3/e5m2; the C enum says FP8.
        nccl = rf.DTYPE_NAMES[code].upper().removeprefix("NCCL").replace("FLOAT8", "FP8")
        assert nccl == cname
    algos = _code_table(c, "ARTEMIS_ALGO_")
    assert {rf.ALGO_NAMES[v]: v for v in algos.values()} == {
        k if k != "UNKNOWN" else "Unknown": v for k, v in algos.items()
    }
    protos = _code_table(c, "ARTEMIS_PROTO_")
    assert {rf.PROTO_NAMES[v]: v for v in protos.values()} == {
        k if k != "UNKNOWN" else "Unknown": v for k, v in protos.items()
    }


def test_packer_follows_the_field_table() -> None:
    body = rf.packer(rf.SLOT_FIELDS, "kind", "end")
    assert body.size == rf.SLOT_SIZE - 4
    head = rf.packer(rf.HEADER_FIELDS, "magic", "global_rank")
    assert head.size == rf.header_offset("job")
    assert rf.packer(rf.HEADER_FIELDS, "minor", "tsc_hz").size == 312 - 288
    with pytest.raises(ValueError, match="job"):
        rf.packer(rf.HEADER_FIELDS, "global_rank", "job")


def test_job_writer_imports_no_agent_machinery() -> None:
    # A training script imports artemis.job; the ring format must not drag the
    # agent (its reader, daemon, telemetry, protocol, structlog) in with it.
    code = (
        "import sys, artemis.job.ring_writer\n"
        "bad = sorted(m for m in sys.modules if m.startswith('artemis.') and not "
        "m.startswith(('artemis.job', 'artemis.rebalance')) and "
        "m not in ('artemis.agent', 'artemis.ring', 'artemis.ring.format', 'artemis.ring.writer'))\n"
        "bad += [m for m in ('structlog', 'msgpack', 'typer') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == ""


def test_env_sidecar_round_trip_and_bounds(tmp_path: Path) -> None:
    env = {f"NCCL_V{i:03d}": "x" * 300 for i in range(rf.ENV_MAX_VARS + 10)}
    raw = rf.encode_env_sidecar(42, env, torch="2.5.1")
    assert len(raw) <= rf.ENV_MAX_BYTES and raw.startswith(rf.ENV_MAGIC + b"\0pid=42\0")
    got = rf.decode_env_sidecar(raw)
    assert got is not None
    pid, torch, back = got
    assert (pid, torch) == (42, "2.5.1")
    assert list(back) == sorted(back) and all(env[k] == v for k, v in back.items())
    assert len(back) < rf.ENV_MAX_VARS  # 64 KiB holds fewer of these than the count bound
    assert rf.decode_env_sidecar(b"something else\0pid=1\0") is None
    ring = tmp_path / "j.0000000000000001.r0.ring"
    assert rf.write_env_sidecar(ring, raw)
    assert Path(rf.env_sidecar_path(ring)).read_bytes() == raw
    # a path the file system refuses: False, nothing left behind
    (tmp_path / "x.ring.env").mkdir()
    assert not rf.write_env_sidecar(tmp_path / "x.ring", raw)
    assert sorted(p.name for p in tmp_path.iterdir()) == [ring.name + ".env", "x.ring.env"]
