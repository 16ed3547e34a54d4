"""The shared-memory ring format in Python: the one mirror of ``profiler_plugin/artemis_ring.h``.

Every Python reader and writer of rings takes the layout from here: the agent's
reader (``artemis.ring.reader``), the summariser, the daemon, the job-side
writer (``artemis.ring.writer``) and the simulator. ``tests/test_ring_layout.py``
compiles the C header and checks every constant, offset and size below against it.

This module imports nothing but numpy and the standard library, so a training
script that imports ``artemis.job`` gets the format without the agent's
machinery (``artemis.agent/__init__`` is empty; ``tests/test_ring_layout.py``
checks that importing the job-side writer loads no other ``artemis.agent`` module).

Versions (docs/DESIGN.md, "Ring format"): ``version`` is the major; a reader
refuses another major. ``minor`` grows when fields are added in space older
writers left zeroed, so every minor reads as the newest with those fields zero;
minor-0 rings (plugins before the field existed) carry 0 there. ``slot_minor``
names the slot layout: 0 is the 64-byte ``ArtemisSlot``, 1 the 128-byte
``ArtemisSlotCpu`` (the base slot, then process CPU time). The base slot is a
prefix of every slot layout.
"""

from __future__ import annotations

import contextlib
import os
import struct
from typing import Any

import numpy as np

# -- constants (#define in the header) ----------------------------------------

RING_MAGIC = 0x31474E4952534D41  # "AMSRING1" little-endian
RING_VERSION = 1  # major
RING_MINOR = 2  # the newest minor this code reads and writes (2: life_flags)
SLOT_MINOR_BASE = 0
SLOT_MINOR_CPU = 1
HEADER_SIZE = 512
SLOT_SIZE = 64
SLOT_CPU_SIZE = 128
DEFAULT_SLOTS = 8192
MIN_SLOTS = 4
MAX_SLOTS = 1 << 22
NAME_LEN = 64

# -- enums --------------------------------------------------------------------

CLOCK_HOST = 0
CLOCK_DEVICE_NS = 1
CLOCK_DEVICE_TICKS = 2
CLOCK_KIND_NAMES = {
    CLOCK_HOST: "host",
    CLOCK_DEVICE_NS: "device_ns",
    CLOCK_DEVICE_TICKS: "device_ticks",
}
CLOCK_KINDS = {v: k for k, v in CLOCK_KIND_NAMES.items()}

TICK_SRC_NONE = 0
TICK_SRC_DEFAULT = 1
TICK_SRC_HIP = 2
TICK_SOURCE_NAMES = {TICK_SRC_NONE: "none", TICK_SRC_DEFAULT: "default", TICK_SRC_HIP: "hip"}

WRITER_RCCL = 1 << 0
WRITER_TSC = 1 << 1
WRITER_BACKEND = 1 << 2
WRITER_ENV = 1 << 3  # an env sidecar was written beside the ring (see the end of this file)

RING_FINISHED = 1 << 0

LIFE_FLOCK = 1 << 0  # header.life_flags: the writer holds a shared flock on the ring (lifetime.py)

KIND_COLL = 1
KIND_P2P = 2
KIND_BRIDGE = 3
KIND_NAMES = {KIND_COLL: "coll", KIND_P2P: "p2p", KIND_BRIDGE: "bridge"}

STATE_IN_FLIGHT = 1
STATE_DONE = 2
STATE_NAMES = {STATE_IN_FLIGHT: "in_flight", STATE_DONE: "done"}

REC_HOST = 0
REC_DEVICE = 1
REC_CLOCK_NAMES = {REC_HOST: "host", REC_DEVICE: "device"}

# Codes -> the names NCCL puts in its descriptors (a code is its position here).
FUNC_NAMES: dict[int, str] = dict(
    enumerate(
        ("Unknown", "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce",
         "AlltoAll", "Gather", "Scatter", "Send", "Recv", "SendRecv", "Bridge")
    )
)  # fmt: skip
FUNC_CODES = {v: k for k, v in FUNC_NAMES.items()}
FUNC_BRIDGE = FUNC_CODES["Bridge"]

# NCCL's datatypes by code (position): name, element size in bytes.
_DTYPES = (
    ("Unknown", 1), ("ncclInt8", 1), ("ncclUint8", 1), ("ncclInt32", 4), ("ncclUint32", 4),
    ("ncclInt64", 8), ("ncclUint64", 8), ("ncclFloat16", 2), ("ncclFloat32", 4),
    ("ncclFloat64", 8), ("ncclBfloat16", 2), ("ncclFloat8e4m3", 1), ("ncclFloat8e5m2", 1),
)  # fmt: skip
DTYPE_NAMES: dict[int, str] = {c: name for c, (name, _size) in enumerate(_DTYPES)}
DTYPE_CODES = {v: k for k, v in DTYPE_NAMES.items()}
DT_UINT8 = DTYPE_CODES["ncclUint8"]
DTYPE_SIZES: dict[int, int] = {c: size for c, (_name, size) in enumerate(_DTYPES)}
# Element size by NCCL datatype name (what a Coll descriptor carries).
DTYPE_SIZE_BY_NAME = {DTYPE_NAMES[c]: s for c, s in DTYPE_SIZES.items() if c}

ALGO_NAMES: dict[int, str] = dict(
    enumerate(
        ("Unknown", "TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
    )
)
PROTO_NAMES: dict[int, str] = {0: "Unknown", 1: "LL", 2: "LL128", 3: "SIMPLE"}

# -- structs: (name, numpy format, offset), in the header's member order --------

Fields = list[tuple[str, str, int]]

SLOT_FIELDS: Fields = [
    ("lock", "<u4", 0),
    ("kind", "u1", 4),
    ("func", "u1", 5),
    ("dtype", "u1", 6),
    ("state", "u1", 7),
    ("clock", "u1", 8),
    ("algo", "u1", 9),
    ("proto", "u1", 10),
    ("nchannels", "u1", 11),
    ("peer", "<i4", 12),
    ("seq", "<u8", 16),
    ("coll_seq", "<u8", 24),
    ("bytes", "<u8", 32),
    ("enqueue_ns", "<u8", 40),
    ("start", "<u8", 48),
    ("end", "<u8", 56),
]
# ArtemisSlotCpu: ``base`` (an ArtemisSlot) flattened, then the CPU times.
SLOT_CPU_EXTRA: Fields = [
    ("cpu_start_ns", "<u8", 64),
    ("cpu_end_ns", "<u8", 72),
    ("reserved", f"V{SLOT_CPU_SIZE - 80}", 80),
]
SLOT_CPU_FIELDS: Fields = SLOT_FIELDS + SLOT_CPU_EXTRA

HEADER_FIELDS: Fields = [
    ("magic", "<u8", 0),
    ("version", "<u4", 8),
    ("header_size", "<u4", 12),
    ("slot_size", "<u4", 16),
    ("capacity", "<u4", 20),
    ("rank", "<i4", 24),
    ("nranks", "<i4", 28),
    ("nnodes", "<i4", 32),
    ("pid", "<i4", 36),
    ("comm_hash", "<u8", 40),
    ("clock_kind", "<u4", 48),
    ("flags", "<u4", 52),
    ("tick_hz", "<u8", 56),
    ("created_ns", "<u8", 64),
    ("finished_ns", "<u8", 72),
    ("dropped", "<u8", 80),
    ("plugin_version", "<u4", 88),
    ("global_rank", "<i4", 92),
    ("job", f"S{NAME_LEN}", 96),
    ("comm_name", f"S{NAME_LEN}", 160),
    ("host", f"S{NAME_LEN}", 224),
    # minor >= 1; zero in minor-0 rings
    ("minor", "<u2", 288),
    ("slot_minor", "<u2", 290),
    ("tick_source", "<u4", 292),
    ("writer_flags", "<u4", 296),
    ("nccl_version", "<u4", 300),
    ("tsc_hz", "<u8", 304),
    ("host_fallback", "<u8", 312),
    ("write_index", "<u8", 320),
    ("tsc_anchor", "(2,2)<u8", 328),
    # minor >= 2; zero in older rings
    ("life_flags", "<u4", 360),
    ("reserved2", f"V{HEADER_SIZE - 364}", 364),
]


def _dtype(fields: Fields, itemsize: int) -> np.dtype[Any]:
    return np.dtype(
        {
            "names": [f[0] for f in fields],
            "formats": [f[1] for f in fields],
            "offsets": [f[2] for f in fields],
            "itemsize": itemsize,
        }
    )


SLOT_DTYPE = _dtype(SLOT_FIELDS, SLOT_SIZE)
SLOT_CPU_DTYPE = _dtype(SLOT_CPU_FIELDS, SLOT_CPU_SIZE)
HEADER_DTYPE = _dtype(HEADER_FIELDS, HEADER_SIZE)

# slot_minor -> (slot size, dtype). A reader refuses a slot_minor not listed here.
SLOT_LAYOUTS: dict[int, tuple[int, np.dtype[Any]]] = {
    SLOT_MINOR_BASE: (SLOT_SIZE, SLOT_DTYPE),
    SLOT_MINOR_CPU: (SLOT_CPU_SIZE, SLOT_CPU_DTYPE),
}

_OFFSETS = {n: off for n, _, off in HEADER_FIELDS}
_SLOT_OFFSETS = {n: off for n, _, off in SLOT_CPU_FIELDS}


def header_offset(name: str) -> int:
    """Byte offset of a header field."""
    return _OFFSETS[name]


def slot_offset(name: str) -> int:
    """Byte offset of a slot field (CPU-slot fields included)."""
    return _SLOT_OFFSETS[name]


_STRUCT_CODES = {"u1": "B", "<u2": "H", "<u4": "I", "<i4": "i", "<u8": "Q"}


def packer(fields: Fields, first: str, last: str) -> struct.Struct:
    """A ``struct.Struct`` for the contiguous run of scalar fields ``first..last``.

    Derived from the field table (so writers never spell the layout again);
    packs at the offset of ``first``. Raises ValueError for a gap or a
    non-scalar field in the run.
    """
    names = [f[0] for f in fields]
    run = fields[names.index(first) : names.index(last) + 1]
    codes, at = ["<"], run[0][2]
    for name, fmt, off in run:
        if off != at or fmt not in _STRUCT_CODES:
            raise ValueError(f"field {name!r} does not continue a packed scalar run")
        code = _STRUCT_CODES[fmt]
        codes.append(code)
        at += struct.calcsize("<" + code)
    return struct.Struct("".join(codes))


def comm_hex(comm_hash: int) -> str:
    return f"{comm_hash:016x}"


def ring_filename(job: str, comm_hash: int, rank: int) -> str:
    """The file name the plugin (and the job-side writer) give a ring."""
    return f"{job}.{comm_hash:016x}.r{rank}.ring"


# -- the env sidecar (artemis_ring.h "Env sidecar") -----------------------------
#
# Beside a ring ``<name>.ring`` its writer leaves ``<name>.ring.env``, written
# once at creation, before the ring's rename (so a reader that sees the ring sees
# its sidecar whole) and only when the header's WRITER_ENV bit is set: NUL-ended
# ``key=value`` records, the first ``artemis-env=1``, then ``pid=<writer pid>``,
# optionally ``torch=<version>`` (the artemis backend), then ``env.NAME=VALUE``
# for every kept variable (protocol.records.keep_env_name; a writer that cannot
# fit one in ENV_MAX_BYTES leaves it out). A writer that cannot write it (a full
# /dev/shm) leaves the bit clear and carries on.

ENV_SUFFIX = ".env"
ENV_MAX_BYTES = 65536
ENV_MAX_VARS = 256
ENV_VALUE_MAX = 1024
ENV_NAME_MAX = 128  # a name must be shorter
ENV_MAGIC = b"artemis-env=1"


# The variables a fingerprint keeps: the job's communication and runtime settings.
# A name holding one of SECRET_MARKERS (any case) is never kept (docs/OPERATING.md
# "Regressions across changes", privacy). The plugin applies the same rule in C
# (profiler_plugin/ring.c art_env_keep); tests/test_fingerprint_plugin.py checks
# that both keep the same names.
ENV_PREFIXES = ("NCCL_", "RCCL_", "TORCH_NCCL_", "CUDA_", "HSA_")
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def keep_env_name(name: str) -> bool:
    """A variable the fingerprint keeps: one of ENV_PREFIXES, no secret marker."""
    upper = name.upper()
    return (
        len(name) < ENV_NAME_MAX
        and name.startswith(ENV_PREFIXES)
        and not any(m in upper for m in SECRET_MARKERS)
    )


def filter_env(env: Any) -> dict[str, str]:
    """The kept variables of a name -> value mapping, values cut at ENV_VALUE_MAX, at
    most ENV_MAX_VARS of them (by sorted name)."""
    kept = sorted((str(k), str(v)[:ENV_VALUE_MAX]) for k, v in env.items() if keep_env_name(str(k)))
    return dict(kept[:ENV_MAX_VARS])


def env_sidecar_path(ring_path: str | os.PathLike[str]) -> str:
    return os.fspath(ring_path) + ENV_SUFFIX


def encode_env_sidecar(pid: int, env: dict[str, str], torch: str | None = None) -> bytes:
    """The sidecar's bytes (variables already filtered by the caller), bounded like
    the plugin's: values cut at ENV_VALUE_MAX, at most ENV_MAX_VARS, ENV_MAX_BYTES."""
    recs = [ENV_MAGIC, f"pid={pid}".encode()]
    if torch:
        recs.append(f"torch={torch}".encode())
    out = b"".join(r + b"\0" for r in recs)
    for name in sorted(env)[:ENV_MAX_VARS]:
        rec = f"env.{name}={env[name][:ENV_VALUE_MAX]}".encode(errors="replace") + b"\0"
        if len(out) + len(rec) <= ENV_MAX_BYTES:
            out += rec
    return out


def decode_env_sidecar(raw: bytes) -> tuple[int, str | None, dict[str, str]] | None:
    """(pid, torch version or None, env) from a sidecar's bytes; None when it is not one."""
    recs = raw[:ENV_MAX_BYTES].split(b"\0")
    if not recs or recs[0] != ENV_MAGIC:
        return None
    pid, torch = -1, None
    env: dict[str, str] = {}
    for r in recs[1:]:
        key, sep, value = r.decode("utf-8", "replace").partition("=")
        if not sep:
            continue
        if key == "pid" and value.isdigit():
            pid = int(value)
        elif key == "torch" and value:
            torch = value
        elif key.startswith("env.") and len(env) < ENV_MAX_VARS:
            env[key[4:]] = value[:ENV_VALUE_MAX]
    return pid, torch, env


def write_env_sidecar(ring_path: str | os.PathLike[str], data: bytes) -> bool:
    """Write a sidecar atomically (temp file, rename); False (nothing left behind, an
    older sidecar of the path removed) when the file system refuses it."""
    path = env_sidecar_path(ring_path)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return True
    except OSError:
        for p in (tmp, path):
            with contextlib.suppress(OSError):
                os.unlink(p)
        return False
