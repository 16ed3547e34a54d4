"""``backend="artemis"`` with no ``import artemis.job``: torch's backend autoload.

pyproject.toml declares ``register`` under ``[project.entry-points."torch.backends"]``.
At the end of ``import torch``, torch loads and calls every entry point of that group
(``torch._import_device_backends``; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns that
off) and turns any exception there into a failed ``import torch``. So this module
loads with the standard library only, registers a creator that imports the backend
(``artemis.job.backend``) only when the first ``artemis`` group is made, and logs its
own failure in one line instead of raising. ``import artemis.job`` registers through
here too, so both ways give torch the same creator.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

BACKEND_NAME = "artemis"
DEVICES = ["cpu", "cuda"]
log = logging.getLogger("artemis.job")


def _create(opts: Any, pg_options: Any) -> Any:
    """The creator torch calls per group: the real one, imported on first use."""
    from artemis.job.backend import _create as create

    return create(opts, pg_options)


def register_creator(creator: Any) -> bool:
    """Register ``creator`` as the ``artemis`` backend unless one is (True when one is
    registered on return). Raises what torch raises."""
    dist: Any = sys.modules.get("torch.distributed")
    if dist is None:
        import torch.distributed as dist
    if not dist.is_available():
        return False
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, creator, extended_api=True, devices=DEVICES)
    return True


def register() -> None:
    """The entry point: register the lazy creator; never raise (it would fail ``import torch``)."""
    try:
        register_creator(_create)
    except Exception as e:
        log.warning(
            "artemis backend: not registered with torch.distributed (%s: %s); "
            "`import artemis.job` in the training script registers it",
            type(e).__name__,
            e,
        )
