"""NCCL's profiler-plugin ABI v4..v7, declared in ctypes for the stand-in (sim/nccl.py).

Our own declarations, written from NCCL's published profiler ABI (not from the
plugin's header, so the two are checked against each other);
tests/test_nccl_standin.py pins their sizes and offsets against
profiler_plugin/nccl_profiler_abi.h's. The versions are said once, in
``_ARMS``: NCCL only ever appends members to a union arm, or arms to the
union, so each version's descriptor is built from that table.
"""

from __future__ import annotations

from ctypes import (
    CFUNCTYPE,
    Structure,
    Union,
    c_bool,
    c_char_p,
    c_int,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_ulong,
    c_void_p,
)
from typing import Any

VERSIONS = (4, 5, 6, 7)

# -- event bits and states (profiler_plugin/nccl_profiler_abi.h) ------------

GROUP = 1 << 0
COLL = 1 << 1
P2P = 1 << 2
PROXY_OP = 1 << 3
PROXY_STEP = 1 << 4
PROXY_CTRL = 1 << 5
KERNEL_CH = 1 << 6
NET_PLUGIN = 1 << 7
GROUP_API = 1 << 8
COLL_API = 1 << 9
P2P_API = 1 << 10
KERNEL_LAUNCH = 1 << 11
CE_COLL = 1 << 12
CE_SYNC = 1 << 13
CE_BATCH = 1 << 14

STATE_KERNEL_CH_STOP = 22
STATE_GROUP_START_API_STOP = 23
STATE_GROUP_END_API_START = 24

# -- the event descriptor ------------------------------------------------------

_PARENT_GROUP = ("parentGroup", c_void_p)
_USER_TAG = ("userTag", c_uint64)
# The members a Coll and a CeColl (v6+) begin with.
_COLL_HEAD = [
    ("seqNumber", c_uint64),
    ("func", c_char_p),
    ("sendBuff", c_void_p),
    ("recvBuff", c_void_p),
    ("count", c_size_t),
    ("root", c_int),
    ("datatype", c_char_p),
]

# Each arm of the descriptor's union, in the union's order: the first ABI
# version that has it, its members there, and the members later versions
# append ({version: members}).
_ARMS: dict[str, tuple[int, list[Any], dict[int, list[Any]]]] = {
    "groupApi": (5, [("graphCaptured", c_bool), ("groupDepth", c_int)], {}),
    "collApi": (
        5,
        [
            ("func", c_char_p),
            ("count", c_size_t),
            ("datatype", c_char_p),
            ("root", c_int),
            ("stream", c_void_p),
            ("graphCaptured", c_bool),
        ],
        {7: [_USER_TAG]},
    ),
    "p2pApi": (
        5,
        [
            ("func", c_char_p),
            ("count", c_size_t),
            ("datatype", c_char_p),
            ("stream", c_void_p),
            ("graphCaptured", c_bool),
        ],
        {7: [_USER_TAG]},
    ),
    "kernelLaunch": (5, [("stream", c_void_p)], {}),
    "coll": (
        4,
        [
            *_COLL_HEAD,
            ("nChannels", c_uint8),
            ("nWarps", c_uint8),
            ("algo", c_char_p),
            ("proto", c_char_p),
        ],
        {
            5: [_PARENT_GROUP],
            7: [("kernelVariant", c_char_p), ("isSymColl", c_bool), _USER_TAG],
        },
    ),
    "p2p": (
        4,
        [
            ("func", c_char_p),
            ("buff", c_void_p),
            ("datatype", c_char_p),
            ("count", c_size_t),
            ("peer", c_int),
            ("nChannels", c_uint8),
        ],
        {5: [_PARENT_GROUP], 7: [_USER_TAG]},
    ),
    "proxyOp": (
        4,
        [
            ("pid", c_int),
            ("channelId", c_uint8),
            ("peer", c_int),
            ("nSteps", c_int),
            ("chunkSize", c_int),
            ("isSend", c_int),
        ],
        {},
    ),
    "proxyStep": (4, [("step", c_int)], {}),
    "kernelCh": (4, [("channelId", c_uint8), ("pTimer", c_uint64)], {}),
    "netPlugin": (4, [("id", c_int64), ("data", c_void_p)], {}),
    "ceColl": (
        6,
        [
            *_COLL_HEAD,
            ("syncStrategy", c_char_p),
            ("intraBatchSync", c_bool),
            ("batchSize", c_uint32),
            ("numBatches", c_uint32),
            ("ceSeqNum", c_uint32),
            ("stream", c_void_p),
        ],
        {7: [_USER_TAG]},
    ),
    "ceCollSync": (6, [("isComplete", c_bool), ("nRanks", c_int)], {}),
    "ceCollBatch": (
        6,
        [("numOps", c_int), ("totalBytes", c_size_t), ("useIntraSync", c_bool)],
        {},
    ),
    "kernelPhase": (
        7,
        [
            ("channelId", c_uint8),
            ("phaseId", c_uint8),
            ("phaseName", c_char_p),
            ("pTimer", c_uint64),
        ],
        {},
    ),
}


def _arm_types() -> dict[int, dict[str, type[Structure]]]:
    """{version: {arm: its Structure}}; versions whose arm is alike share one type."""
    shapes: dict[tuple[str, int], type[Structure]] = {}
    out: dict[int, dict[str, type[Structure]]] = {}
    for v in VERSIONS:
        out[v] = {}
        for arm, (first, members, grows) in _ARMS.items():
            if first > v:
                continue
            since = max((g for g in grows if g <= v), default=first)
            if (arm, since) not in shapes:
                fields = [*members, *(m for g in sorted(grows) if g <= v for m in grows[g])]
                name = f"_{arm[0].upper()}{arm[1:]}" + (f"V{since}" if grows else "")
                shapes[arm, since] = type(name, (Structure,), {"_fields_": fields})
            out[v][arm] = shapes[arm, since]
    return out


ARM_TYPES = _arm_types()


def _descriptor(v: int) -> type[Structure]:
    union = type(f"_UnionV{v}", (Union,), {"_fields_": list(ARM_TYPES[v].items())})
    type_field = c_uint8 if v == 4 else c_uint64  # v4's type is a uint8
    return type(
        f"DescrV{v}",
        (Structure,),
        {
            "_anonymous_": ("u",),
            "_fields_": [
                ("type", type_field),
                ("parentObj", c_void_p),
                ("rank", c_int),
                ("u", union),
            ],
        },
    )


DESCRIPTORS: dict[int, type[Structure]] = {v: _descriptor(v) for v in VERSIONS}
DescrV4, DescrV5, DescrV6, DescrV7 = (DESCRIPTORS[v] for v in VERSIONS)

# The arm types by the name of the version that shaped them (what the tests pin).
_CollV4, _P2pV4, _ProxyOp, _KernelCh = (
    ARM_TYPES[4][a] for a in ("coll", "p2p", "proxyOp", "kernelCh")
)
_CollV5, _P2pV5, _CollApiV5 = (ARM_TYPES[5][a] for a in ("coll", "p2p", "collApi"))
_CeCollV6 = ARM_TYPES[6]["ceColl"]
_CollV7, _CollApiV7, _KernelPhase = (ARM_TYPES[7][a] for a in ("coll", "collApi", "kernelPhase"))

# -- state arguments -------------------------------------------------------------


class _ArgsProxyStep(Structure):
    _fields_ = [("transSize", c_size_t)]


class _ArgsProxyCtrl(Structure):
    _fields_ = [("appendedProxyOps", c_int)]


class _ArgsNetPlugin(Structure):
    _fields_ = [("data", c_void_p)]


class _ArgsKernelCh(Structure):
    _fields_ = [("pTimer", c_uint64)]


class StateArgs(Union):
    """ncclProfilerEventStateArgs v4..v7 (8 bytes)."""

    _fields_ = [
        ("proxyStep", _ArgsProxyStep),
        ("proxyCtrl", _ArgsProxyCtrl),
        ("netPlugin", _ArgsNetPlugin),
        ("kernelCh", _ArgsKernelCh),
    ]


# -- the exported table (ncclProfiler_vN) ------------------------------------

# The variadic logger, seen from the callee: the fixed arguments, then the
# first integer-class variadic arguments. On x86-64 SysV and Linux aarch64,
# integer varargs travel exactly like named integer arguments, so declaring
# them as uint64 slots reads them; float varargs are not supported (shown raw).
_N_VARARGS = 8
LOGFN = CFUNCTYPE(None, c_int, c_ulong, c_char_p, c_int, c_char_p, *([c_uint64] * _N_VARARGS))
# Every pointer argument is passed as an address (int): fastest ctypes conversion.
_INIT_V5 = CFUNCTYPE(c_int, c_void_p, c_uint64, c_void_p, c_char_p, c_int, c_int, c_int, LOGFN)
_INIT_V4 = CFUNCTYPE(c_int, c_void_p, c_void_p, c_char_p, c_uint64, c_int, c_int, c_int, LOGFN)
_START = CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p)
_STOP = CFUNCTYPE(c_int, c_void_p)
_RECORD = CFUNCTYPE(c_int, c_void_p, c_int, c_void_p)
_FINALIZE = CFUNCTYPE(c_int, c_void_p)


def _plugin_struct(init: Any) -> type[Structure]:
    class _Plugin(Structure):
        _fields_ = [
            ("name", c_char_p),
            ("init", init),
            ("startEvent", _START),
            ("stopEvent", _STOP),
            ("recordEventState", _RECORD),
            ("finalize", _FINALIZE),
        ]

    return _Plugin


# v4's init takes (context, mask, name, hash, ...), v5+'s (context, hash, mask, name, ...).
_PLUGIN_V4 = _plugin_struct(_INIT_V4)
_PLUGIN_V5 = _plugin_struct(_INIT_V5)
PLUGIN_TABLES: dict[int, type[Structure]] = {
    v: _PLUGIN_V4 if v == 4 else _PLUGIN_V5 for v in VERSIONS
}
