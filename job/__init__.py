"""artemis.job: what a training script may import. Nothing here imports torch at import time.

Rebalance plans (see rebalance/README.md, "The job side")::

    from artemis.job import RebalanceClient, install_weighted_allreduce

The rules, files and maths live in ``artemis.rebalance``; this package holds
only what the training script calls.
"""

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
