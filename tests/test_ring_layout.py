"""The numpy mirrors of the ring structs match the C header byte for byte."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from artemis.agent import ring
from artemis.job import ring_writer

REPO = Path(__file__).resolve().parents[1]
HEADER = REPO / "profiler_plugin" / "artemis_ring.h"

_SLOT = [f[0] for f in ring.SLOT_FIELDS]
_HDR = [f[0] for f in ring.HEADER_FIELDS]


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
    ]
    lines += [f"  F(ArtemisSlot, {n})" for n in _SLOT]
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
    assert c_layout["size"]["ArtemisSlot"] == ring.SLOT_DTYPE.itemsize == ring.SLOT_SIZE
    assert c_layout["ArtemisSlot"] == _np_layout(ring.SLOT_DTYPE)


def test_header_layout(c_layout: dict[str, dict[str, object]]) -> None:
    assert c_layout["size"]["ArtemisRingHeader"] == ring.HEADER_DTYPE.itemsize
    assert c_layout["ArtemisRingHeader"] == _np_layout(ring.HEADER_DTYPE)


def test_every_c_field_is_mirrored(c_layout: dict[str, dict[str, object]]) -> None:
    # A field added to the C structs but not to the dtypes would go unnoticed by
    # the offset comparison above; count the members in the header text instead.
    text = HEADER.read_text()
    for struct, names in (("ArtemisSlot", _SLOT), ("ArtemisRingHeader", _HDR)):
        body = re.search(r"typedef struct " + struct + r" \{(.*?)\}", text, re.S)
        assert body is not None
        code = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
        members = re.findall(r"\b([a-z_0-9]+)(?:\[[^\]]*\])*;", code)
        assert members == names, struct


def test_constants_match(c_layout: dict[str, dict[str, object]]) -> None:
    c = c_layout["const"]
    assert c["ARTEMIS_RING_MAGIC"] == ring.RING_MAGIC == ring_writer._MAGIC
    assert c["ARTEMIS_RING_VERSION"] == ring.RING_VERSION == ring_writer._VERSION
    assert c["ARTEMIS_RING_HEADER_SIZE"] == ring.HEADER_SIZE
    assert c["ARTEMIS_RING_SLOT_SIZE"] == ring.SLOT_SIZE
    assert c["ARTEMIS_RING_MIN_SLOTS"] == ring.MIN_SLOTS == ring_writer._MIN_SLOTS
    assert c["ARTEMIS_RING_MAX_SLOTS"] == ring.MAX_SLOTS == ring_writer._MAX_SLOTS
    assert c["ARTEMIS_RING_FINISHED"] == ring.RING_FINISHED == ring_writer._FINISHED
    assert c["ARTEMIS_KIND_BRIDGE"] == ring.KIND_BRIDGE == ring_writer._KIND_BRIDGE
    assert c["ARTEMIS_FUNC_BRIDGE"] == ring_writer._FUNC_BRIDGE
    assert c["ARTEMIS_STATE_DONE"] == ring.STATE_DONE == ring_writer._STATE_DONE
    assert c["ARTEMIS_STATE_IN_FLIGHT"] == ring.STATE_IN_FLIGHT
    assert c["ARTEMIS_REC_DEVICE"] == ring.REC_DEVICE == ring_writer.REC_DEVICE
    assert c["ARTEMIS_REC_HOST"] == ring.REC_HOST == ring_writer.REC_HOST
    for name, code in (("HOST", 0), ("DEVICE_NS", 1), ("DEVICE_TICKS", 2)):
        assert c[f"ARTEMIS_CLOCK_{name}"] == code
        assert ring.CLOCK_KIND_NAMES[code] == name.lower()
        assert ring_writer.CLOCK_KINDS[name.lower()] == code


def _code_table(c: dict[str, object], prefix: str) -> dict[str, int]:
    return {
        k[len(prefix) :]: int(v)  # type: ignore[call-overload]
        for k, v in c.items()
        if k.startswith(prefix)
    }


def test_name_tables_cover_every_code(c_layout: dict[str, dict[str, object]]) -> None:
    c = c_layout["const"]
    funcs = _code_table(c, "ARTEMIS_FUNC_")
    assert sorted(funcs.values()) == sorted(ring.FUNC_NAMES)
    for cname, code in funcs.items():
        assert ring.FUNC_NAMES[code].upper() == cname.replace("ALLTOALL", "ALLTOALL")
    dts = _code_table(c, "ARTEMIS_DT_")
    assert sorted(dts.values()) == sorted(ring.DTYPE_NAMES) == sorted(ring.DTYPE_SIZES)
    for cname, code in dts.items():
        # NCCL spells the fp8 types ncclFloat8e4m3/e5m2; the C enum says FP8.
        nccl = ring.DTYPE_NAMES[code].upper().removeprefix("NCCL").replace("FLOAT8", "FP8")
        assert nccl == cname
    algos = _code_table(c, "ARTEMIS_ALGO_")
    assert {ring.ALGO_NAMES[v]: v for v in algos.values()} == {
        k if k != "UNKNOWN" else "Unknown": v for k, v in algos.items()
    }
    protos = _code_table(c, "ARTEMIS_PROTO_")
    assert {ring.PROTO_NAMES[v]: v for v in protos.values()} == {
        k if k != "UNKNOWN" else "Unknown": v for k, v in protos.items()
    }
