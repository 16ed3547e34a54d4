"""The real adapter: an RC queue pair through pyverbs (rdma-core's Python binding).

This is the only module that calls verbs. pyverbs is imported lazily, so the
rest of Artemis installs and runs without it; ``probe()`` says in one line
whether RDMA can work here and why not.

Compatibility handled here:

* enums live in ``pyverbs.libibverbs_enums`` from rdma-core 59 and in
  ``pyverbs.enums`` up to 58; only the class form (``ibv_qp_type.IBV_QPT_RC``)
  exists in both;
* ``CompChannel.fd`` exists from rdma-core 57; without it there is no way to
  wait for completions without blocking the event loop, so we refuse with a
  clear message instead of busy-polling;
* ``pyverbs.base`` calls ``logging.basicConfig`` at import: any root handler
  it adds is removed again, so the daemon's own logging set-up stands;
* RoCE (and Soft-RoCE) needs a GRH: the address vector is always global, with
  the GID at ``gid_index`` as source and a hop limit of 255, as NCCL sets it
  (``ncclIbRtrQp``): pyverbs' ``GlobalRoute`` defaults to 1, which a RoCEv2
  packet exhausts at the first router, so two hosts in different subnets
  would never connect;
* the source GID, when ``gid_index`` is negative (the default, like NCCL's
  ``NCCL_IB_GID_INDEX=-1``), is chosen as NCCL's ``ncclIbGetGidIndex`` does
  (``choose_gid_index``): index 0 on InfiniBand; on RoCE the first valid GID
  that is IPv4 and RoCE v2 (NCCL's defaults ``NCCL_IB_ADDR_FAMILY=AF_INET``,
  ``NCCL_IB_ROCE_VERSION_NUM=2``), else index 0. Index 0 is usually the
  link-local RoCE v1 GID, which cannot cross a router. The RoCE version is
  read from ``/sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<i>``
  (under an injectable root), else from ``Context.query_gid_type``;
* an attribute an enum module lacks (``AttributeError``, a pyverbs release
  without some name) is an ``AdapterError`` like any verbs failure, and every
  failure while opening closes what was already opened.

Completions are never waited for in a blocking call (``ibv_get_cq_event`` is
not bound ``nogil`` and would freeze the loop): the completion channel's fd is
non-blocking and the transport reads it from ``loop.add_reader``.

Not tested on hardware in this repository's CI (no device, no rxe module
there): tests/test_rdma_verbs.py drives this module against a fake shaped
like pyverbs (same module, class and enum names, ``PyverbsRDMAError``), and
tests/test_rdma_device.py runs as-is on a node with an RDMA NIC or Soft-RoCE.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
from types import SimpleNamespace
from typing import Any

from artemis.protocol.rdma.adapter import RECV_TAG, AdapterError, Completion, Info

# RC timing, as in rdma-core's tests/base.py: RNR timer 12 (0.64 ms), ack
# timeout 14 (~67 ms), 7 transport retries, rnr_retry 7 = retry forever (our
# credits make RNR impossible, so this only matters if the peer misbehaves).
MIN_RNR_TIMER = 12
TIMEOUT = 14
RETRY_CNT = 7
RNR_RETRY = 7
# GRH hop limit, as NCCL sets it: pyverbs' GlobalRoute default of 1 stops at the first router.
HOP_LIMIT = 255
# ibv_gid_type_sysfs (rdma-core libibverbs/driver.h): what Context.query_gid_type returns.
_GID_TYPE_SYSFS_ROCE_V2 = 1
_IBV_LINK_LAYER_INFINIBAND = 1
# Errors of a pyverbs call beyond its own: an attribute a release lacks, a bad value.
_CALL_ERRORS = (AttributeError, TypeError, ValueError, OSError)

_pv: SimpleNamespace | None = None


def _import_pyverbs() -> SimpleNamespace:
    """Import the pyverbs pieces we use, without letting pyverbs touch logging."""
    global _pv
    if _pv is not None:
        return _pv
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import pyverbs.addr as addr
        import pyverbs.cq as cq
        import pyverbs.device as device
        import pyverbs.mr as mr
        import pyverbs.pd as pd
        import pyverbs.qp as qp
        import pyverbs.wr as wr
        from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError

        try:
            import pyverbs.libibverbs_enums as enums  # rdma-core >= 59
        except ImportError:
            import pyverbs.enums as enums  # rdma-core <= 58
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
    _pv = SimpleNamespace(
        addr=addr, cq=cq, device=device, mr=mr, pd=pd, qp=qp, wr=wr, e=enums,
        PyverbsError=PyverbsError, PyverbsRDMAError=PyverbsRDMAError,
    )  # fmt: skip
    return _pv


# ---------------------------------------------------------------- GID choice (pure)


def gid_bytes(gid: str) -> bytes | None:
    """The 16 bytes of a GID written as pyverbs prints it (8 groups of 4 hex digits)."""
    try:
        raw = bytes.fromhex(gid.replace(":", ""))
    except ValueError:
        return None
    return raw if len(raw) == 16 else None


def gid_family(raw: bytes) -> str:
    """ "ipv4" for an IPv4-mapped GID (::ffff:a.b.c.d, or its ff0e: multicast form), else "ipv6"."""
    if raw[:12] == bytes(10) + b"\xff\xff":
        return "ipv4"
    if raw[:4] == b"\xff\x0e\x00\x00" and raw[4:12] == bytes(6) + b"\xff\xff":
        return "ipv4"
    return "ipv6"


def gid_valid(raw: bytes) -> bool:
    """Configured (not all zero, not a bare fe80::) and not link-local, as NCCL's validGid."""
    link_local = raw[:8] == b"\xfe\x80" + bytes(6)
    return raw != bytes(16) and not link_local


def roce_version(text: str | None) -> int | None:
    """1 or 2 from a gid_attrs/types entry ("IB/RoCE v1", "RoCE v1", "RoCE v2")."""
    if text is None:
        return None
    t = text.strip()
    if t.startswith(("IB/RoCE v1", "RoCE v1")):
        return 1
    if t.startswith("RoCE v2"):
        return 2
    return None


def choose_gid_index(
    gids: list[tuple[bytes | None, int | None]],
    infiniband: bool,
    family: str = "ipv4",
    version: int = 2,
) -> int:
    """The GID index NCCL's ncclIbGetGidIndex picks (without NCCL_IB_ADDR_RANGE).

    ``gids[i]`` is (raw GID or None if unreadable, RoCE version or None) for
    index i of the port's table. InfiniBand: 0 (NCCL's routable-FLID choice is
    not made). RoCE: start at 0 and walk the table; a candidate of the wanted
    family replaces a best of the other family; otherwise a valid candidate of
    the wanted family replaces the best when it has the wanted RoCE version
    and the best has another version or is not valid.
    """
    if infiniband or not gids:
        return 0
    best = 0
    for cand in range(1, len(gids)):
        g, gv = gids[best]
        c, cv = gids[cand]
        if c is None:
            continue
        fam_c = gid_family(c)
        fam_g = gid_family(g) if g is not None else None
        if fam_c != fam_g and fam_c == family:
            best = cand
        elif fam_c == family and gid_valid(c):
            best_valid = g is not None and gid_valid(g)
            if (gv != cv or not best_valid) and cv == version:
                best = cand
    return best


def _gid_types_path(root: str | os.PathLike[str], device: str, port: int, index: int) -> str:
    return os.path.join(
        os.fspath(root), f"sys/class/infiniband/{device}/ports/{port}/gid_attrs/types/{index}"
    )


def _name(dev: Any) -> str:
    n = dev.name
    return n.decode() if isinstance(n, bytes) else str(n)


def probe() -> tuple[bool, str]:
    """(True, devices) when pyverbs imports and an RDMA device exists, else (False, why)."""
    try:
        pv = _import_pyverbs()
    except ImportError as ex:
        return False, (
            f"pyverbs is not importable ({ex}); install artemis[rdma] with a matching "
            "rdma-core (protocol/rdma/README.md)"
        )
    try:
        devices = pv.device.get_device_list()
    except pv.PyverbsError as ex:
        # Without kernel RDMA support this raises instead of returning [].
        return False, f"no RDMA device ({ex}; kernel without InfiniBand/RDMA support?)"
    if not devices:
        return False, "no RDMA device found (ibv_devices lists none)"
    if not hasattr(pv.cq.CompChannel, "fd"):
        return False, "pyverbs is older than rdma-core 57: CompChannel.fd is missing"
    return True, "RDMA devices: " + ", ".join(_name(d) for d in devices)


class VerbsAdapter:
    """``adapter.RdmaAdapter`` over pyverbs: one RC QP, one CQ, two MRs."""

    def __init__(
        self,
        device: str | None = None,
        port: int = 1,
        gid_index: int = -1,
        sysfs_root: str | os.PathLike[str] = "/",
    ) -> None:
        self.device = device
        self.port = port
        self.gid_index = gid_index  # < 0: choose as NCCL does (choose_gid_index)
        self.sysfs_root = sysfs_root
        self._objs: list[Any] = []  # closed in reverse order
        self._size = 0
        self._recv_wrs: list[Any] = []
        self._closed = False

    def _fail(self, what: str, ex: BaseException) -> AdapterError:
        return AdapterError(f"{what} on {self.device or 'RDMA device'} port {self.port}: {ex}")

    def open(self, buffer_size: int, recv_buffers: int, send_slots: int) -> None:
        pv = _import_pyverbs()
        e = pv.e
        try:
            if self.device is None:
                devices = pv.device.get_device_list()
                if not devices:
                    raise AdapterError("no RDMA device found")
                self.device = _name(devices[0])
            ctx = pv.device.Context(name=self.device)
            self._objs.append(ctx)
            pd = pv.pd.PD(ctx)
            self._objs.append(pd)
            cc = pv.cq.CompChannel(ctx)
            self._objs.append(cc)
            fd = getattr(cc, "fd", None)
            if fd is None:
                raise AdapterError(
                    "pyverbs is older than rdma-core 57 (CompChannel.fd missing): "
                    "cannot wait for completions without blocking"
                )
            os.set_blocking(fd, False)
            cq = pv.cq.CQ(ctx, recv_buffers + send_slots, None, cc, 0)
            self._objs.append(cq)
            access = e.ibv_access_flags.IBV_ACCESS_LOCAL_WRITE
            recv_mr = pv.mr.MR(pd, buffer_size * recv_buffers, access)
            send_mr = pv.mr.MR(pd, buffer_size * send_slots, access)
            self._objs += [recv_mr, send_mr]
            cap = pv.qp.QPCap(
                max_send_wr=send_slots, max_recv_wr=recv_buffers, max_send_sge=1, max_recv_sge=1
            )
            init = pv.qp.QPInitAttr(
                qp_type=e.ibv_qp_type.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=1
            )
            attr = pv.qp.QPAttr(port_num=self.port)
            attr.qp_access_flags = access
            qp = pv.qp.QP(pd, init, attr)  # an RC QP comes back in INIT
            self._objs.append(qp)
            port_attr = ctx.query_port(self.port)
            if self.gid_index < 0:
                self.gid_index = self._choose_gid(pv, ctx, port_attr)
            gid = ctx.query_gid(self.port, self.gid_index)
        except AdapterError:
            self.close()
            raise
        except (pv.PyverbsError, *_CALL_ERRORS) as ex:
            self.close()
            raise self._fail("opening the queue pair", ex) from ex
        except BaseException:
            self.close()
            raise
        self._pv, self._cc, self._cq, self._qp = pv, cc, cq, qp
        self._recv_mr, self._send_mr, self._size = recv_mr, send_mr, buffer_size
        self._access = access
        self._info: Info = {
            "qpn": int(qp.qp_num),
            "psn": secrets.randbits(24),
            "gid": str(gid),
            "lid": int(port_attr.lid),
            "mtu": int(port_attr.active_mtu),
        }
        # Receive WRs never change per buffer: build them once.
        self._recv_wrs = [
            pv.wr.RecvWR(
                wr_id=RECV_TAG | i,
                num_sge=1,
                sg=[pv.wr.SGE(recv_mr.buf + i * buffer_size, buffer_size, recv_mr.lkey)],
            )
            for i in range(recv_buffers)
        ]

    def _choose_gid(self, pv: SimpleNamespace, ctx: Any, port_attr: Any) -> int:
        """The source GID index for ``gid_index < 0`` (see ``choose_gid_index``)."""
        ib = getattr(pv.e, "IBV_LINK_LAYER_INFINIBAND", _IBV_LINK_LAYER_INFINIBAND)
        if int(port_attr.link_layer) == ib:
            return 0
        gids: list[tuple[bytes | None, int | None]] = []
        for i in range(int(port_attr.gid_tbl_len)):
            try:
                raw = gid_bytes(str(ctx.query_gid(self.port, i)))
            except pv.PyverbsError:
                raw = None  # an unmapped index (containers): skipped, as NCCL does
            # only a valid GID's version matters to the choice (choose_gid_index)
            valid = raw is not None and gid_valid(raw)
            gids.append((raw, self._gid_version(pv, ctx, i) if valid else None))
        chosen = choose_gid_index(gids, infiniband=False)
        logging.getLogger(__name__).info(
            "RDMA %s port %s: source GID index %d (RoCE v%s)",
            self.device,
            self.port,
            chosen,
            gids[chosen][1] if gids else "?",
        )
        return chosen

    def _gid_version(self, pv: SimpleNamespace, ctx: Any, index: int) -> int | None:
        assert self.device is not None
        try:
            with open(_gid_types_path(self.sysfs_root, self.device, self.port, index)) as f:
                return roce_version(f.read())
        except OSError:
            pass  # not mounted / EINVAL in a container: ask libibverbs
        try:
            t = int(ctx.query_gid_type(self.port, index))
        except (pv.PyverbsError, *_CALL_ERRORS):
            return None
        return 2 if t == _GID_TYPE_SYSFS_ROCE_V2 else 1

    def local_info(self) -> Info:
        return dict(self._info)

    def connect(self, remote: Info) -> None:
        pv = self._pv
        try:
            a = pv.qp.QPAttr(port_num=self.port)
            a.qp_access_flags = self._access
            # Both ends must use the same path MTU: the smaller active one.
            a.path_mtu = min(int(self._info["mtu"]), int(remote["mtu"]))
            a.dest_qp_num = int(remote["qpn"])
            a.rq_psn = int(remote["psn"])
            a.sq_psn = int(self._info["psn"])
            a.max_dest_rd_atomic = 1
            a.max_rd_atomic = 1
            a.min_rnr_timer, a.timeout = MIN_RNR_TIMER, TIMEOUT
            a.retry_cnt, a.rnr_retry = RETRY_CNT, RNR_RETRY
            gr = pv.addr.GlobalRoute(
                dgid=pv.addr.GID(str(remote["gid"])),
                sgid_index=self.gid_index,
                hop_limit=HOP_LIMIT,
            )
            a.ah_attr = pv.addr.AHAttr(
                port_num=self.port, is_global=1, dlid=int(remote["lid"]), gr=gr
            )
            self._qp.to_rtr(a)
            self._qp.to_rts(a)
        except (KeyError, ValueError, TypeError) as ex:
            raise AdapterError(f"bad remote QP info {remote!r}: {ex}") from ex
        except (pv.PyverbsError, AttributeError) as ex:
            raise self._fail("connecting the queue pair (INIT->RTR->RTS)", ex) from ex

    def post_recv(self, buf_index: int) -> None:
        try:
            self._qp.post_recv(self._recv_wrs[buf_index])
        except self._pv.PyverbsError as ex:
            raise self._fail("post_recv", ex) from ex

    def post_send(self, slot: int, wr_id: int, data: bytes) -> None:
        pv, e = self._pv, self._pv.e
        n = len(data)
        off = slot * self._size
        try:
            self._send_mr.write(data, n, off)
            wr = pv.wr.SendWR(
                wr_id=wr_id,
                opcode=e.ibv_wr_opcode.IBV_WR_SEND,
                num_sge=1,
                sg=[pv.wr.SGE(self._send_mr.buf + off, n, self._send_mr.lkey)],
                send_flags=e.ibv_send_flags.IBV_SEND_SIGNALED,
            )
            self._qp.post_send(wr)
        except (pv.PyverbsError, AttributeError) as ex:
            raise self._fail("post_send", ex) from ex

    def fileno(self) -> int:
        return int(self._cc.fd)

    def arm(self) -> None:
        try:
            self._cq.req_notify()
        except self._pv.PyverbsError as ex:
            raise self._fail("req_notify", ex) from ex

    def get_event(self) -> bool:
        try:
            self._cc.get_cq_event(self._cq)
        except self._pv.PyverbsRDMAError as ex:
            if getattr(ex, "error_code", None) in (errno.EAGAIN, errno.EWOULDBLOCK):
                return False
            raise self._fail("get_cq_event", ex) from ex
        return True

    def ack(self, events: int) -> None:
        if events:
            self._cq.ack_events(events)

    def poll(self, max_entries: int) -> list[Completion]:
        pv = self._pv
        try:
            success = pv.e.ibv_wc_status.IBV_WC_SUCCESS
            _, wcs = self._cq.poll(max_entries)
        except (pv.PyverbsError, AttributeError) as ex:
            raise self._fail("poll_cq", ex) from ex
        out: list[Completion] = []
        for wc in wcs:
            recv = bool(wc.wr_id & RECV_TAG)
            index = wc.wr_id & ~RECV_TAG if recv else wc.wr_id
            if wc.status != success:
                out.append(Completion(recv, index, False, _status(pv, wc.status, wc.vendor_err)))
            elif recv:
                out.append(
                    Completion(
                        True, index, True, data=self._recv_mr.read(wc.byte_len, index * self._size)
                    )
                )
            else:
                out.append(Completion(False, index, True))
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # QP before CQ before channel before PD before context; pyverbs would
        # also close dependants through the context, but explicit is clearer
        # when a close fails.
        for obj in reversed(self._objs):
            try:
                obj.close()
            except Exception as ex:
                logging.getLogger(__name__).warning("closing %s failed: %s", type(obj).__name__, ex)
        self._objs.clear()


def _status(pv: SimpleNamespace, status: int, vendor_err: int) -> str:
    try:
        name = pv.e.ibv_wc_status(status).name
    except (ValueError, TypeError, AttributeError):
        name = f"status {status}"
    return f"{name} (vendor error {vendor_err:#x})"
