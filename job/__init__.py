"""artemis.job: what a training script may import. Nothing here imports torch at import time.

Rebalance plans (see rebalance/README.md, "The job side")::

    from artemis.job import RebalanceClient, install_weighted_allreduce

The rules, files and maths live in ``artemis.rebalance``; this package holds
only what the training script calls.
"""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .detector import Detector, PrometheusExporter


def _inside_import_torch() -> bool:
    """True while ``import torch`` runs: its backend autoload (job/_autoload.py) imports
    this package then, where each millisecond is every job's, so the names below wait
    for their first use (``__getattr__``). Any other import loads them now, as always."""
    spec = getattr(sys.modules.get("torch"), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


if TYPE_CHECKING or not _inside_import_torch():
    from artemis.rebalance.files import PlanFormatError

    from .rebalance import RebalanceClient, rank_slice, uniform_split
    from .torch_helpers import (
        RebalancedBatchSampler,
        UnevenBatchSplitter,
        WeightedAllreduce,
        global_mean_loss,
        install_weighted_allreduce,
        scale_gradients,
    )

# Where each name loads from on first use (the deferred ones above, and these two,
# which need torch and the agent's summariser).
_LAZY = {
    "PlanFormatError": "artemis.rebalance.files",
    "RebalanceClient": "artemis.job.rebalance",
    "rank_slice": "artemis.job.rebalance",
    "uniform_split": "artemis.job.rebalance",
    "RebalancedBatchSampler": "artemis.job.torch_helpers",
    "UnevenBatchSplitter": "artemis.job.torch_helpers",
    "WeightedAllreduce": "artemis.job.torch_helpers",
    "global_mean_loss": "artemis.job.torch_helpers",
    "install_weighted_allreduce": "artemis.job.torch_helpers",
    "scale_gradients": "artemis.job.torch_helpers",
    "Detector": "artemis.job.detector",
    "PrometheusExporter": "artemis.job.detector",
}

__all__ = [
    "PlanFormatError",
    "RebalanceClient",
    "RebalancedBatchSampler",
    "UnevenBatchSplitter",
    "WeightedAllreduce",
    "global_mean_loss",
    "install_weighted_allreduce",
    "rank_slice",
    "scale_gradients",
    "uniform_split",
]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'artemis.job' has no attribute {name!r}")


def register_backend() -> None:
    """Register the ``artemis`` torch.distributed backend now (needs torch)."""
    from .backend import register

    register()


def _register_when_torch_loads() -> None:
    """``import artemis.job`` registers the backend without importing torch itself.

    The node agent imports this package too and must not pay for torch; so when
    torch is not loaded yet, a meta-path finder registers the backend right after
    ``torch.distributed`` finishes loading. Either way torch gets the autoload's
    creator, which imports the backend only when a group is made (torch.distributed
    loads inside ``import torch``, before torch can serve the backend's imports).
    """
    import sys

    from ._autoload import register

    if "torch.distributed" in sys.modules:
        register()
        return
    import importlib.abc
    import importlib.machinery
    from collections.abc import Sequence
    from types import ModuleType

    if any(getattr(f, "_artemis", False) for f in sys.meta_path):
        return

    class _Finder(importlib.abc.MetaPathFinder):
        _artemis = True

        def find_spec(
            self,
            name: str,
            path: Sequence[str] | None = None,
            target: ModuleType | None = None,
        ) -> importlib.machinery.ModuleSpec | None:
            if name != "torch.distributed":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            real_exec = loader.exec_module

            def exec_module(module: ModuleType) -> None:
                real_exec(module)
                if getattr(module, "is_available", lambda: False)():
                    register()

            loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _Finder())


_register_when_torch_loads()
__all__ += ["Detector", "PrometheusExporter", "register_backend"]
