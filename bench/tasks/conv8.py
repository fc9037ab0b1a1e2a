"""A small conv net on synthetic 8x8 images: four classes (a horizontal bar, a vertical bar,
either diagonal) under Gaussian noise. Not one of the examples: a task like the one issue
26's user brought, whose fast steps `trainer run`'s defaults merged 7.4% of.

    python -m trainer run --task bench/tasks/conv8.py:task
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

BATCH = 32


class Conv8:
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        n = 8192
        y = torch.randint(0, 4, (n,), generator=g)
        x = torch.randn(n, 1, 8, 8, generator=g) * 0.8
        eye = torch.eye(8)
        patterns = torch.zeros(4, 8, 8)
        patterns[0, 3:5, :] = 1.0
        patterns[1, :, 3:5] = 1.0
        patterns[2] = 1.5 * eye
        patterns[3] = 1.5 * eye.flip(1)
        x[:, 0] += patterns[y]
        self.x, self.y = x[:-1024], y[:-1024]
        self.tx, self.ty = x[-1024:], y[-1024:]

    def model(self):
        return torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(8 * 64, 4))

    def batches(self, shard, shards, seed):
        xs, ys = self.x[shard::shards], self.y[shard::shards]
        g = torch.Generator().manual_seed(seed * 1000 + shard)
        while True:
            i = torch.randint(0, len(xs), (BATCH,), generator=g)
            yield xs[i], ys[i]

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def tokens(self, batch):
        return len(batch[1])

    def eval_batches(self):
        return [(self.tx[i:i + 256], self.ty[i:i + 256]) for i in range(0, 1024, 256)]

    def metrics(self, model, batch) -> dict[str, float]:
        x, y = batch
        return {"accuracy": (model(x).argmax(dim=1) == y).float().mean().item()}

    def describe(self) -> dict:
        return {"data": "synthetic 8x8 bars", "loss_unit": "nats/image"}

task = Conv8
