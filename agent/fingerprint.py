"""Per-rank fingerprints on the agent's side (docs/DESIGN.md "Fingerprints").

A rank's SOFTWARE fingerprint (``protocol.records.Software``) is put together
from three places:

* the host: ``kernel`` from ``os.uname().release``;
* the telemetry sources that know the rank's GPU and its stack, through their
  optional ``software(target)`` method: NVML (``gpu_model``
  nvmlDeviceGetName, ``driver`` nvmlSystemGetDriverVersion, ``cuda``
  nvmlSystemGetCudaDriverVersion_v2), AMD SMI (``gpu_model``, ``driver``
  amdsmi_get_gpu_driver_info, ``cuda`` as ``rocm-X.Y.Z`` from
  amdsmi_get_rocm_version), the simulator (its scenario's ``[software]``);
* the rank's ring: ``nccl`` from the header's ``nccl_version``
  (ncclGetVersion), ``env`` and ``torch`` from the env sidecar its writer
  left beside it (ring/format.py), filtered again here so no writer can
  make the agent send a name the privacy rule leaves out.

Later places win. The WORKLOAD signature hashes the rank's per-step
collective signature on its main communicator (``workload_signature``), which
the summariser learns (``WindowSummarizer.step_signature``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog
from artemis.agent.telemetry.base import RankTarget, TelemetrySource
from artemis.protocol.records import SOFTWARE_COMPONENTS, Software
from artemis.ring import format as rf
from artemis.ring.reader import RingHeader

log = structlog.get_logger("artemis.agent")

__all__ = [
    "host_software",
    "nccl_version",
    "read_env_sidecar",
    "ring_software",
    "software_of",
    "workload_signature",
]


def nccl_version(code: int) -> str | None:
    """``ncclGetVersion``'s code as ``2.21.5`` (NCCL_VERSION_CODE: major*10000 +
    minor*100 + patch from 2.9 on, major*1000 + minor*100 + patch before); RCCL
    uses the same encoding. None for 0 (unknown)."""
    if code <= 0:
        return None
    if code >= 10000:
        major, rest = divmod(code, 10000)
    else:
        major, rest = divmod(code, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def read_env_sidecar(header: RingHeader) -> tuple[str | None, dict[str, str]] | None:
    """(torch version, kept env) from the ring's env sidecar, or None when the writer
    left none (the header's WRITER_ENV bit clear, an older writer) or it is unreadable
    or another process's (a stale file: its pid is not the ring's)."""
    if not header.writer_flags & rf.WRITER_ENV:
        return None
    path = Path(rf.env_sidecar_path(header.path))
    try:
        with open(path, "rb") as fh:
            raw = fh.read(rf.ENV_MAX_BYTES)
    except OSError as e:
        log.warning("env sidecar unreadable", path=path.name, error=str(e))
        return None
    got = rf.decode_env_sidecar(raw)
    if got is None or got[0] != header.pid:
        log.warning("env sidecar ignored: not this ring's", path=path.name)
        return None
    _, torch, env = got
    return torch, rf.filter_env(env)


def ring_software(header: RingHeader) -> dict[str, Any]:
    """What the ring tells: nccl (header), env and torch (sidecar)."""
    out: dict[str, Any] = {}
    nccl = nccl_version(header.nccl_version)
    if nccl:
        out["nccl"] = nccl
    side = read_env_sidecar(header)
    if side is not None:
        torch, env = side
        if torch:
            out["torch"] = torch
        out["env"] = env
    return out


def host_software(sources: Iterable[TelemetrySource], target: RankTarget) -> dict[str, Any]:
    """kernel from uname, then what each source's ``software(target)`` says (a source
    that fails is skipped: the fingerprint never costs the agent its windows)."""
    out: dict[str, Any] = {"kernel": os.uname().release}
    for src in sources:
        fn = getattr(src, "software", None)
        if fn is None:
            continue
        try:
            got = fn(target)
        except Exception as e:  # a vendor library's failure is not ours to raise
            log.warning("software fingerprint source failed", source=src.name, error=str(e))
            continue
        out.update({k: v for k, v in got.items() if v not in (None, "")})
    return out


def software_of(*parts: Mapping[str, Any]) -> Software:
    """The parts merged in order (later ones win; env merged by name) as a Software."""
    merged: dict[str, Any] = {}
    env: dict[str, str] = {}
    for p in parts:
        for c in SOFTWARE_COMPONENTS:
            v = p.get(c)
            if v not in (None, ""):
                merged[c] = str(v)
        env.update(p.get("env") or {})
    merged["env"] = env
    return Software.from_dict(merged)


def workload_signature(step: Sequence[tuple[int, int]]) -> str:
    """Hex hash (32 digits) of one step's collectives, in order: the count of them, and
    each one's function and bytes (docs/DESIGN.md "Fingerprints")."""
    text = f"n={len(step)}|" + "|".join(f"{rf.FUNC_NAMES.get(f, f'func{f}')}:{b}" for f, b in step)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
