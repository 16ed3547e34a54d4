"""VerbsAdapter against a fake shaped like pyverbs (rdma-core's Python binding).

No RDMA device or rxe kernel module exists on the development machine, so
these tests drive ``protocol/rdma/verbs.py`` through a stand-in for pyverbs
with the same module layout (``pyverbs.device``, ``.pd``, ``.cq``, ``.mr``,
``.qp``, ``.wr``, ``.addr``, ``.pyverbs_error``, ``.libibverbs_enums``), the
same class names and constructor keywords (``GlobalRoute(dgid, flow_label,
sgid_index, hop_limit=1, traffic_class)`` as rdma-core's addr.pyx has it),
the same enum names and values (``ibv_gid_type_sysfs``, the anonymous
``IBV_LINK_LAYER_*``), and ``PyverbsRDMAError`` with ``error_code``. What it
cannot show is a real NIC's behaviour: tests/test_rdma_device.py is for that.
"""

from __future__ import annotations

import os
import sys
import types
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
from artemis.protocol.rdma import verbs
from artemis.protocol.rdma.adapter import AdapterError
from artemis.protocol.rdma.verbs import (
    VerbsAdapter,
    choose_gid_index,
    gid_bytes,
    gid_family,
    gid_valid,
    probe,
    roce_version,
)

LINK_LOCAL = "fe80:0000:0000:0000:5054:00ff:fe12:3456"
V4 = "0000:0000:0000:0000:0000:ffff:0a00:0005"  # ::ffff:10.0.0.5
V6 = "fd00:0000:0000:0001:5054:00ff:fe12:3456"
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
# The usual RoCE table of a Mellanox port with one IPv4 and one IPv6 address:
# each address twice, as RoCE v1 and as RoCE v2 (show_gids lists the same).
ROCE_TABLE = [
    (LINK_LOCAL, "IB/RoCE v1"),
    (LINK_LOCAL, "RoCE v2"),
    (V4, "IB/RoCE v1"),
    (V4, "RoCE v2"),
    (V6, "IB/RoCE v1"),
    (V6, "RoCE v2"),
    (ZERO, None),
    (ZERO, None),
]


class World:
    """What the fake 'kernel' holds, and a log of what was created and closed."""

    def __init__(
        self,
        table: list[tuple[str, str | None]],
        link_layer: int = 2,
        fail: str | None = None,
    ) -> None:
        self.table = table
        self.link_layer = link_layer
        self.fail = fail  # name of a class whose construction fails with PyverbsRDMAError
        self.opened: list[Any] = []
        self.closed: list[Any] = []
        self.rtr: Any = None
        self.gid_type_queries = 0


def fake_pyverbs(world: World, drop_enum: str | None = None) -> dict[str, types.ModuleType]:
    mods = {
        n: types.ModuleType(n)
        for n in (
            "pyverbs",
            "pyverbs.addr",
            "pyverbs.cq",
            "pyverbs.device",
            "pyverbs.mr",
            "pyverbs.pd",
            "pyverbs.qp",
            "pyverbs.wr",
            "pyverbs.pyverbs_error",
            "pyverbs.libibverbs_enums",
        )
    }
    for n, m in mods.items():
        if n != "pyverbs":
            setattr(mods["pyverbs"], n.split(".")[1], m)

    class PyverbsError(Exception):
        def __init__(self, msg: str, error_code: int = -1) -> None:
            if error_code != -1:
                msg = f"{msg}. Errno: {error_code}, {os.strerror(error_code)}"
            super().__init__(msg)

    class PyverbsRDMAError(PyverbsError):
        def __init__(self, msg: str, error_code: int = -1) -> None:
            super().__init__(msg, error_code)
            self._error_code = error_code

        @property
        def error_code(self) -> int:
            return self._error_code

    mods["pyverbs.pyverbs_error"].__dict__.update(
        PyverbsError=PyverbsError, PyverbsRDMAError=PyverbsRDMAError
    )

    class Obj:
        def __init__(self, *a: Any, **kw: Any) -> None:
            if world.fail == type(self).__name__:
                raise PyverbsRDMAError(f"Failed to create {type(self).__name__}", 12)
            self.args, self.kw = a, kw
            world.opened.append(self)

        def close(self) -> None:
            world.closed.append(self)

    e = mods["pyverbs.libibverbs_enums"]

    class ibv_access_flags(IntEnum):
        IBV_ACCESS_LOCAL_WRITE = 1

    class ibv_qp_type(IntEnum):
        IBV_QPT_RC = 2

    class ibv_wr_opcode(IntEnum):
        IBV_WR_SEND = 2

    class ibv_send_flags(IntEnum):
        IBV_SEND_SIGNALED = 2

    class ibv_wc_status(IntEnum):
        IBV_WC_SUCCESS = 0
        IBV_WC_LOC_LEN_ERR = 1

    class ibv_gid_type_sysfs(IntEnum):
        IBV_GID_TYPE_SYSFS_IB_ROCE_V1 = 0
        IBV_GID_TYPE_SYSFS_ROCE_V2 = 1

    enums = (ibv_access_flags, ibv_qp_type, ibv_wr_opcode, ibv_send_flags, ibv_wc_status)
    e.__dict__.update({c.__name__: c for c in (*enums, ibv_gid_type_sysfs)})
    e.__dict__.update(
        IBV_LINK_LAYER_UNSPECIFIED=0,
        IBV_LINK_LAYER_INFINIBAND=1,
        IBV_LINK_LAYER_ETHERNET=2,
    )
    if drop_enum is not None:
        delattr(e, drop_enum)

    class GID:
        def __init__(self, val: str | None = None) -> None:
            self.gid = val or ZERO

        def __str__(self) -> str:
            return self.gid

    class GlobalRoute:
        def __init__(
            self,
            dgid: GID | None = None,
            flow_label: int = 0,
            sgid_index: int = 0,
            hop_limit: int = 1,
            traffic_class: int = 0,
        ) -> None:
            self.dgid = str(dgid)
            self.flow_label, self.sgid_index = flow_label, sgid_index
            self.hop_limit, self.traffic_class = hop_limit, traffic_class

    class AHAttr:
        def __init__(self, port_num: int = 1, is_global: int = 0, dlid: int = 0, gr: Any = None):
            self.port_num, self.is_global, self.dlid, self.gr = port_num, is_global, dlid, gr

    mods["pyverbs.addr"].__dict__.update(GID=GID, GlobalRoute=GlobalRoute, AHAttr=AHAttr)

    class PortAttr:
        lid = 0
        active_mtu = 3
        state = 4
        gid_tbl_len = len(world.table)
        link_layer = world.link_layer

    class Context(Obj):
        def query_port(self, port: int) -> PortAttr:
            return PortAttr()

        def query_gid(self, port: int, index: int) -> GID:
            if index >= len(world.table):
                raise PyverbsRDMAError(f"Failed to query gid {index} of port {port}")
            return GID(world.table[index][0])

        def query_gid_type(self, port: int, index: int) -> int:
            world.gid_type_queries += 1
            t = world.table[index][1]
            if t is None:
                raise PyverbsRDMAError("Failed to query gid type", 22)
            return 1 if t == "RoCE v2" else 0

    class Device:
        name = b"mlx5_0"

    mods["pyverbs.device"].__dict__.update(
        Context=Context, get_device_list=lambda: [Device()], PortAttr=PortAttr
    )

    class PD(Obj):
        pass

    class CompChannel(Obj):
        def __init__(self, ctx: Any) -> None:
            super().__init__(ctx)
            self._r, self._w = os.pipe()

        @property
        def fd(self) -> int:  # a property of the class, as in cq.pyx (rdma-core >= 57)
            return self._r

        def close(self) -> None:
            super().close()
            os.close(self._r)
            os.close(self._w)

        def get_cq_event(self, cq: Any) -> None:
            raise PyverbsRDMAError("Failed to get CQ event", 11)

    class CQ(Obj):
        def req_notify(self) -> None: ...

        def poll(self, n: int) -> tuple[int, list[Any]]:
            return 0, []

        def ack_events(self, n: int) -> None: ...

    mods["pyverbs.cq"].__dict__.update(CompChannel=CompChannel, CQ=CQ)

    class MR(Obj):
        buf = 0x10000
        lkey = 7

        def write(self, data: bytes, n: int, off: int) -> None: ...

    mods["pyverbs.mr"].__dict__["MR"] = MR
    mods["pyverbs.pd"].__dict__["PD"] = PD

    class QPCap:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    class QPInitAttr(QPCap):
        pass

    class QPAttr:
        def __init__(self, port_num: int = 1) -> None:
            self.port_num = port_num

    class QP(Obj):
        qp_num = 0x11

        def to_rtr(self, attr: QPAttr) -> None:
            world.rtr = attr

        def to_rts(self, attr: QPAttr) -> None: ...

        def post_recv(self, wr: Any) -> None: ...

        def post_send(self, wr: Any) -> None: ...

    mods["pyverbs.qp"].__dict__.update(QPCap=QPCap, QPInitAttr=QPInitAttr, QPAttr=QPAttr, QP=QP)

    class WR:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    mods["pyverbs.wr"].__dict__.update(RecvWR=WR, SendWR=WR, SGE=lambda *a: a)
    return mods


def install(
    monkeypatch: pytest.MonkeyPatch, world: World, drop_enum: str | None = None
) -> dict[str, types.ModuleType]:
    mods = fake_pyverbs(world, drop_enum)
    for name, m in mods.items():
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.setattr(verbs, "_pv", None)  # import again, from the fake
    return mods


def sysfs(root: Path, table: list[tuple[str, str | None]], dev: str = "mlx5_0") -> Path:
    d = root / f"sys/class/infiniband/{dev}/ports/1/gid_attrs/types"
    d.mkdir(parents=True)
    for i, (_, t) in enumerate(table):
        if t is not None:
            (d / str(i)).write_text(t + "\n")
    return root


REMOTE = {"qpn": 0x22, "psn": 5, "gid": V4, "lid": 0, "mtu": 3}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    """The RoCE host (ROCE_TABLE's GIDs), its fake pyverbs installed."""
    w = World(ROCE_TABLE)
    install(monkeypatch, w)
    return w


def opened(world: World, tmp_path: Path, **kw: Any) -> VerbsAdapter:
    a = VerbsAdapter(sysfs_root=kw.pop("root", tmp_path), **kw)
    a.open(4096, 4, 4)
    return a


# ---------------------------------------------------------------- GRH hop limit


def test_the_grh_hop_limit_lets_rocev2_cross_routers(world: World, tmp_path: Path) -> None:
    a = opened(world, sysfs(tmp_path, ROCE_TABLE))
    a.connect(REMOTE)
    gr = world.rtr.ah_attr.gr
    assert gr.hop_limit == 255  # pyverbs' default 1 dies at the first router
    assert (world.rtr.ah_attr.is_global, gr.dgid, gr.sgid_index) == (1, V4, a.gid_index)
    a.close()


# ---------------------------------------------------------------- GID choice


def test_default_gid_is_the_rocev2_ipv4_one(world: World, tmp_path: Path) -> None:
    a = opened(world, tmp_path, root=sysfs(tmp_path, ROCE_TABLE))
    assert a.gid_index == 3
    assert a.local_info()["gid"] == V4
    assert world.gid_type_queries == 0  # sysfs answered, as NCCL reads it
    a.connect(REMOTE)
    assert world.rtr.ah_attr.gr.sgid_index == 3
    a.close()


def test_gid_type_from_libibverbs_when_sysfs_is_not_there(world: World, tmp_path: Path) -> None:
    a = opened(world, tmp_path)  # an empty root: no gid_attrs
    assert a.gid_index == 3 and world.gid_type_queries > 0
    a.close()


def test_configured_gid_index_is_kept(world: World, tmp_path: Path) -> None:
    a = opened(world, sysfs(tmp_path, ROCE_TABLE), gid_index=5)
    assert a.gid_index == 5 and a.local_info()["gid"] == V6
    a.close()


def test_infiniband_uses_gid_index_0(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    table: list[tuple[str, str | None]] = [
        ("fe80:0000:0000:0000:0002:c903:0001:0001", "IB/RoCE v1")
    ]
    world = World(table, link_layer=1)
    install(monkeypatch, world)
    a = opened(world, sysfs(tmp_path, table))
    assert a.gid_index == 0
    a.close()


def _t(*rows: tuple[str, int | None]) -> list[tuple[bytes | None, int | None]]:
    return [(gid_bytes(g), v) for g, v in rows]


@pytest.mark.parametrize(
    ("table", "want"),
    [
        (_t((LINK_LOCAL, 1), (LINK_LOCAL, 2), (V4, 1), (V4, 2)), 3),
        (_t((LINK_LOCAL, 1), (V4, 1)), 1),  # IPv4 beats link-local even as RoCE v1
        (_t((LINK_LOCAL, 1), (LINK_LOCAL, 2)), 0),  # nothing valid: index 0, as NCCL
        (_t((LINK_LOCAL, 1), (V6, 2)), 0),  # IPv6 is not the default family
        (_t((V4, 2), (V4, 1)), 0),  # already v2: a v1 candidate does not replace it
        (_t((LINK_LOCAL, 1), (ZERO, None), (V4, 2)), 2),  # empty entries are skipped
        ([(gid_bytes(LINK_LOCAL), 1), (None, None), (gid_bytes(V4), 2)], 2),  # unreadable one
    ],
)
def test_gid_choice_follows_nccl(table: list[tuple[bytes | None, int | None]], want: int) -> None:
    assert choose_gid_index(table, infiniband=False) == want


def test_gid_choice_for_ipv6() -> None:
    table = _t((LINK_LOCAL, 1), (V4, 2), (V6, 1), (V6, 2))
    assert choose_gid_index(table, infiniband=False, family="ipv6") == 3


def test_gid_helpers() -> None:
    v4, ll = gid_bytes(V4), gid_bytes(LINK_LOCAL)
    assert v4 is not None and ll is not None
    assert gid_family(v4) == "ipv4" and gid_family(ll) == "ipv6"
    assert gid_valid(v4) and not gid_valid(ll) and not gid_valid(bytes(16))
    assert gid_bytes("zz") is None and gid_bytes("00:11") is None
    assert [roce_version(t) for t in ("IB/RoCE v1\n", "RoCE v1", "RoCE v2\n", "", None)] == [
        1,
        1,
        2,
        None,
        None,
    ]


# ---------------------------------------------------------------- errors and clean-up


def test_a_missing_enum_is_an_adapter_error_and_closes_what_was_opened(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    world = World(ROCE_TABLE)
    install(monkeypatch, world, drop_enum="ibv_access_flags")
    a = VerbsAdapter(sysfs_root=tmp_path)
    with pytest.raises(AdapterError, match="opening the queue pair"):
        a.open(4096, 4, 4)
    assert world.opened and set(map(id, world.closed)) == set(map(id, world.opened))
    # closed in reverse order of opening, and only once
    assert [type(o).__name__ for o in world.closed] == ["CQ", "CompChannel", "PD", "Context"]


@pytest.mark.parametrize("fail", ["PD", "CQ", "MR", "QP"])
def test_a_verbs_failure_while_opening_closes_what_was_opened(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fail: str
) -> None:
    world = World(ROCE_TABLE, fail=fail)
    install(monkeypatch, world)
    a = VerbsAdapter(sysfs_root=tmp_path)
    with pytest.raises(AdapterError, match="Errno: 12"):
        a.open(4096, 4, 4)
    assert set(map(id, world.closed)) == set(map(id, world.opened))
    a.close()  # idempotent
    assert len(world.closed) == len(world.opened)


def test_missing_enums_after_open_are_adapter_errors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    world = World(ROCE_TABLE)
    mods = install(monkeypatch, world)
    a = opened(world, sysfs(tmp_path, ROCE_TABLE))
    e = mods["pyverbs.libibverbs_enums"]
    monkeypatch.delattr(e, "ibv_wr_opcode")
    with pytest.raises(AdapterError, match="post_send"):
        a.post_send(0, 1, b"x")
    monkeypatch.delattr(e, "ibv_wc_status")
    with pytest.raises(AdapterError, match="poll_cq"):
        a.poll(8)
    monkeypatch.delattr(mods["pyverbs.addr"], "GlobalRoute")
    with pytest.raises(AdapterError, match="connecting"):
        a.connect(REMOTE)
    a.close()
    assert set(map(id, world.closed)) == set(map(id, world.opened))


def test_get_event_without_an_event_is_false(world: World, tmp_path: Path) -> None:
    a = opened(world, sysfs(tmp_path, ROCE_TABLE))
    assert a.get_event() is False  # EAGAIN from the non-blocking channel
    a.close()


def test_probe_against_the_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, World(ROCE_TABLE))
    assert probe() == (True, "RDMA devices: mlx5_0")


def test_a_failed_open_inside_the_transport_leaves_nothing_open(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The agent end opens its queue pair after authenticating over the real
    # TCP side channel; the QP cannot be created: the connect fails cleanly
    # and every verbs object it had opened is closed again.
    import asyncio

    from artemis.protocol.rdma.loopback import LoopbackAdapter
    from artemis.protocol.rdma.transport import RdmaTransport

    world = World(ROCE_TABLE, fail="QP")
    install(monkeypatch, world)
    secret = b"s" * 16

    async def main() -> None:
        async def handler(ch: Any) -> None:
            await ch.close()

        server = RdmaTransport(LoopbackAdapter, buffer_size=4096, buffers=8, secret=secret)
        listener = await server.listen("127.0.0.1:0", handler)
        client = RdmaTransport(
            lambda d, p, g: VerbsAdapter(d, p, g, sysfs_root=tmp_path),
            buffer_size=4096,
            buffers=8,
            secret=secret,
        )
        with pytest.raises(AdapterError, match="Errno: 12"):
            await client.connect(listener.address)
        await listener.close()

    asyncio.run(asyncio.wait_for(main(), 20))
    assert [type(o).__name__ for o in world.opened] == [
        "Context",
        "PD",
        "CompChannel",
        "CQ",
        "MR",
        "MR",
    ]
    assert set(map(id, world.closed)) == set(map(id, world.opened))
