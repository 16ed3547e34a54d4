"""Rings exactly as a minor-0 writer made them (a plugin or job writer from before the
versioned header fields), for the rolling-upgrade tests.

The layout is frozen here on purpose, independent of ``artemis.ring.format``:
the bytes an old plugin wrote do not change when the format grows. Every byte
from offset 288 on is zero except ``write_index``, and slots are 64 bytes.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0x31474E4952534D41
_HEAD = struct.Struct("<QIIIIiiiiQIIQQQQIi")  # offsets 0..96
_BODY = struct.Struct("<BBBBBBBBiQQQQQQ")  # slot offsets 4..64


@dataclass(frozen=True)
class OldRecord:
    coll_seq: int
    nbytes: int
    start: int
    end: int
    kind: int = 1  # coll
    func: int = 1  # AllReduce
    dtype: int = 8  # ncclFloat32
    clock: int = 1  # device
    algo: int = 2  # RING
    proto: int = 3  # SIMPLE
    nchannels: int = 2
    peer: int = -1


def write_minor0_ring(
    path: Path,
    cap: int,
    records: list[OldRecord],
    *,
    job: str,
    comm_hash: int,
    rank: int,
    nranks: int,
    clock_kind: int = 1,  # device_ns
    plugin_version: int = 5,
    global_rank: int = -1,
    host: str = "",
    comm_name: str = "",
    pid: int | None = None,
    finished: bool = False,
) -> None:
    buf = bytearray(512 + cap * 64)
    _HEAD.pack_into(
        buf,
        0,
        MAGIC,
        1,
        512,
        64,
        cap,
        rank,
        nranks,
        1,
        os.getpid() if pid is None else pid,
        comm_hash,
        clock_kind,
        1 if finished else 0,  # flags: FINISHED
        0,
        123,
        456 if finished else 0,
        0,
        plugin_version,
        global_rank,
    )
    for off, text in ((96, job), (160, comm_name), (224, host)):
        raw = text.encode()[:63]
        buf[off : off + len(raw)] = raw
    for t, r in enumerate(records):
        off = 512 + (t % cap) * 64
        lock = struct.unpack_from("<I", buf, off)[0]
        struct.pack_into("<I", buf, off, lock + 2)
        _BODY.pack_into(
            buf,
            off + 4,
            r.kind,
            r.func,
            r.dtype,
            2,  # done
            r.clock,
            r.algo,
            r.proto,
            r.nchannels,
            r.peer,
            t,
            r.coll_seq,
            r.nbytes,
            0,
            r.start,
            r.end,
        )
    struct.pack_into("<Q", buf, 320, len(records))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(bytes(buf))
    os.rename(tmp, path)  # a scanning agent never maps it half-written
