"""artemis.job: what a training script may import. Nothing here imports torch at import time.

Rebalance plans (see coordinator/REBALANCE.md)::

    from artemis.job import RebalanceClient, install_weighted_allreduce
"""

from .plan_files import PlanFormatError
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
