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
    """This process's software fingerprint (torch is imported: the benchmark ran)."""
    import torch

    out: dict[str, Any] = {"kernel": os.uname().release, "torch": str(torch.__version__)}
    if device == "cuda":
        out["gpu_model"] = torch.cuda.get_device_name(0)
        hip = getattr(torch.version, "hip", None)
        out["cuda"] = f"rocm-{hip}" if hip else str(torch.version.cuda)
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    out["env"] = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("NCCL_", "RCCL_", "TORCH_NCCL_", "CUDA_", "HSA_"))
        and not any(m in k.upper() for m in ("KEY", "TOKEN", "SECRET", "PASSWORD"))
    }  # PROVISIONAL: replaced by agent.fingerprint's helpers when the fprint branch lands
    return out
