"""PyTorch helpers for uneven splits: slice the global batch, weight the gradients.

torch is imported inside the functions so ``artemis.job`` imports without it.

The arithmetic: rank i holds n_i of the G samples of a step and computes the
mean-loss gradient g_i over them. DDP all-reduces and divides by the world size
W, giving (1/W) sum g_i: the global mean only when every n_i = G/W. Weighting
each g_i by w_i = n_i * W / G first gives (1/W) sum n_i W/G g_i = (1/G) sum n_i g_i,
the mean over every sample of the step, whatever the split. So either multiply
the loss by ``client.grad_weight(step)`` before ``backward()``, or install
``WeightedAllreduce`` as the DDP comm hook. Use a mean-reduced loss, and note that
BatchNorm statistics (not gradients) still depend on the local batch size.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .rebalance import RebalanceClient, rank_slice

if TYPE_CHECKING:
    import torch


class UnevenBatchSplitter:
    """Cuts this rank's slice out of a step's global batch (same order on every rank).

    Every rank loads the same global batch (same seed) and keeps
    ``[lo, hi)`` of it; the slices of all ranks tile the batch, so every sample is
    used exactly once per step.
    """

    def __init__(self, client: RebalanceClient) -> None:
        self.client = client

    def split(self, step: int, *batch: Any) -> tuple[Any, ...]:
        """This rank's part of each of ``batch`` (tensors or sequences of G items)."""
        lo, hi = self.client.slice_for_step(step)
        out = []
        for b in batch:
            if len(b) != self.client.global_batch:
                raise ValueError(
                    f"step {step}: a global batch of {len(b)} items, expected "
                    f"{self.client.global_batch}"
                )
            out.append(b[lo:hi])
        return tuple(out)


class RebalancedBatchSampler:
    """Batch sampler yielding this rank's indices per step, sized by the plan in force.

    Each epoch shuffles the dataset the same way on every rank (``seed + epoch``),
    cuts it into global batches of G indices (an incomplete last one is dropped so
    every step has exactly G samples) and yields this rank's slice of each. The
    sampler counts steps from ``start_step`` across epochs; the training loop must
    number its steps the same way (pass the same step to ``grad_weight``).
    Works as ``DataLoader(dataset, batch_sampler=...)``.
    """

    def __init__(
        self,
        dataset_size: int,
        client: RebalanceClient,
        *,
        shuffle: bool = True,
        seed: int = 0,
        start_step: int = 0,
    ) -> None:
        if dataset_size < client.global_batch:
            raise ValueError("the dataset is smaller than one global batch")
        self.dataset_size = dataset_size
        self.client = client
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.step = start_step  # the step of the next batch yielded

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.dataset_size // self.client.global_batch

    def global_batches(self) -> Iterator[list[int]]:
        idx = list(range(self.dataset_size))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(idx)
        g = self.client.global_batch
        for k in range(len(self)):
            yield idx[k * g : (k + 1) * g]

    def __iter__(self) -> Iterator[list[int]]:
        for gbatch in self.global_batches():
            lo, hi = rank_slice(self.client.split_for_step(self.step), self.client.rank)
            self.step += 1
            yield gbatch[lo:hi]


def scale_gradients(params: Any, weight: float) -> None:
    """Multiply every gradient of ``params`` (a module or an iterable of tensors) by ``weight``.

    For loops that all-reduce gradients themselves: scale, then all-reduce and
    divide by the world size. (Under DDP the all-reduce runs inside backward, so
    scale the loss or use ``WeightedAllreduce`` instead.)
    """
    it: Iterable[Any] = params.parameters() if hasattr(params, "parameters") else params
    for p in it:
        if p.grad is not None:
            p.grad.mul_(weight)


class WeightedAllreduce:
    """DDP comm hook: weights each rank's bucket by its grad weight, then averages.

    ``install_weighted_allreduce(ddp_model, client)`` registers it; call
    ``set_step(step)`` before each backward so the weight follows the plan.
    """

    def __init__(self, client: RebalanceClient, group: Any = None) -> None:
        self.client = client
        self.group = group
        self.weight = 1.0

    def set_step(self, step: int) -> float:
        self.weight = self.client.grad_weight(step)
        return self.weight

    def hook(self, state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        import torch.distributed as dist

        buf = bucket.buffer()
        buf.mul_(self.weight / self.client.world_size)
        fut = dist.all_reduce(buf, group=self.group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])


def install_weighted_allreduce(
    ddp_model: Any, client: RebalanceClient, group: Any = None
) -> WeightedAllreduce:
    import torch
    import torch.distributed as dist

    w = WeightedAllreduce(client, group)

    def hook(state: Any, bucket: Any) -> Any:
        return w.hook(state, bucket)

    # DDP checks the hook's annotations against the real classes; with postponed
    # (string) annotations that check fails, so give it the objects it compares with.
    hook.__annotations__ = {
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    ddp_model.register_comm_hook(None, hook)
    return w


def global_mean_loss(
    loss: torch.Tensor, n_local: int, global_batch: int, group: Any = None
) -> float:
    """The step's loss over every sample, from each rank's mean loss over its own samples."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(loss.detach()) * n_local / global_batch], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return float(t.item())


__all__ = [
    "RebalancedBatchSampler",
    "UnevenBatchSplitter",
    "WeightedAllreduce",
    "global_mean_loss",
    "install_weighted_allreduce",
    "scale_gradients",
]
