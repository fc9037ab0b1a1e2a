"""A task that cannot learn: a small classifier whose inner optimizer is SGD with lr 0.

The harness's planted defect for `final_loss` (and for `progress`, `rejoined` and
`no_divergence`): every learner steps, pushes and merges as usual, and Θ never moves.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

BATCH = 32


class Frozen:
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(2048, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def model(self) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    def inner_optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.0)

    def batches(self, shard: int, shards: int, seed: int):
        xs, ys = self.x[:-256][shard::shards], self.y[:-256][shard::shards]
        g = torch.Generator().manual_seed(seed * 1000 + shard)
        while True:
            i = torch.randint(0, len(xs), (BATCH,), generator=g)
            yield xs[i], ys[i]

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    def tokens(self, batch) -> int:
        return len(batch[1])

    def eval_batches(self):
        return [(self.x[-256:], self.y[-256:])]


task = Frozen
