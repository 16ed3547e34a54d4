"""What keys a regress run: the node's name, its hardware class, its software fingerprint.

The software fingerprint is the contract's dict (docs/DESIGN.md "Fingerprints"):
``gpu_model driver cuda nccl torch kernel`` and ``env``, an unknown component absent.
"""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Any


def node_name(override: str | None = None) -> str:
    return override or socket.gethostname()


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name (the first one listed), or the platform's machine name."""
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.machine() or "unknown"


def hardware_class(device: str, software: dict[str, Any]) -> str:
    """GPU model on a GPU node (as the coordinator's hardware classes), else ``cpu <model>``."""
    if device == "cuda":
        return str(software.get("gpu_model") or "unknown GPU")
    return f"cpu {cpu_model()}"


def software(device: str) -> dict[str, Any]:
    """This process's software fingerprint, put together as the agent puts a rank's
    (agent/fingerprint.py): ``kernel`` from uname and what the GPU's telemetry source
    says (NVML or AMD SMI: ``gpu_model``, ``driver``, ``cuda``), then what torch says
    in this process (``torch``; on a GPU ``nccl`` from torch's NCCL/RCCL, and
    ``gpu_model`` / ``cuda`` where no telemetry source knows them), and ``env``:
    this process's kept variables (the privacy filter of ring/format.py). torch
    is imported already: the benchmark ran."""
    import torch
    from artemis.agent.fingerprint import host_software, nccl_version, software_of
    from artemis.agent.telemetry import AmdSmiSource, NvmlSource, RankTarget
    from artemis.ring.format import filter_env

    cuda = device == "cuda"
    own: dict[str, Any] = {"torch": str(torch.__version__), "env": filter_env(dict(os.environ))}
    if cuda:
        own["gpu_model"] = torch.cuda.get_device_name(0)
        hip = getattr(torch.version, "hip", None)
        own["cuda"] = f"rocm-{hip}" if hip else torch.version.cuda
        v = torch.cuda.nccl.version()
        if isinstance(v, tuple):  # (major, minor, patch)
            own["nccl"] = ".".join(str(x) for x in v)
        elif isinstance(v, int):
            own["nccl"] = nccl_version(v)
    sources: list[Any] = [NvmlSource(), AmdSmiSource()] if cuda else []
    host = host_software(
        sources, RankTarget(rank=0, pid=os.getpid(), gpu_index=0 if cuda else None)
    )
    # Later parts win: the telemetry source's driver-level view over torch's.
    torch_part = {k: v for k, v in own.items() if k not in ("env",)}
    return software_of(torch_part, host, {"env": own["env"], "torch": own["torch"]}).to_dict()
