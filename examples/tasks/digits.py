"""Handwritten digits (scikit-learn's bundled 8x8 images, no download) with a small MLP.

Run it:  python -m trainer run --task examples/tasks/digits.py:task
Under faults:  python -m chaos run examples/schedules/kill-partition-latency.yaml --task examples/tasks/digits.py:task
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

BATCH = 32
HELD_OUT = 297  # the last images: never trained on
NOISE = 0.1  # pixel noise added to every training image


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Each image moved by up to one pixel each way, plus a little noise.

    Why: a learner's shard is 750 images, and a learner does thousands of steps a second on
    a CPU, so a 30-second run is a thousand epochs. Unaugmented, the held-out loss bottoms
    out within a few seconds and then climbs (0.31 → 0.49 in a fault-free 20-s run; 0.28 →
    0.70 in a compose run whose lone surviving learner trained its half alone for 3 s), and
    chaos run's no_divergence rightly calls that a sustained rise. Shifted, the same 40,000
    steps keep improving (held-out 0.21 at the end against 0.61 without)."""
    b = len(x)
    padded = F.pad(x.view(b, 8, 8), (1, 1, 1, 1))
    offsets = torch.randint(0, 3, (2, b), generator=g)
    grid = torch.arange(8)
    rows = grid[None, :] + offsets[0][:, None]
    cols = grid[None, :] + offsets[1][:, None]
    moved = padded[torch.arange(b)[:, None, None], rows[:, :, None], cols[:, None, :]].reshape(b, 64)
    return moved + NOISE * torch.randn(moved.shape, generator=g)


class Digits:
    def __init__(self) -> None:
        data = load_digits()
        x = torch.tensor(data.data, dtype=torch.float32) / 16.0  # pixels 0..16
        y = torch.tensor(data.target, dtype=torch.long)
        self.train_x, self.train_y = x[:-HELD_OUT], y[:-HELD_OUT]
        self.test_x, self.test_y = x[-HELD_OUT:], y[-HELD_OUT:]

    def model(self) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                   torch.nn.Linear(128, 10))

    def inner_optimizer(self, params) -> torch.optim.Optimizer:  # optional: the default is AdamW(--inner-lr)
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)

    def batches(self, shard: int, shards: int, seed: int):
        xs, ys = self.train_x[shard::shards], self.train_y[shard::shards]  # every shards-th image
        g = torch.Generator().manual_seed(seed * 1000 + shard)
        while True:  # endless: one shuffled epoch after another
            order = torch.randperm(len(xs), generator=g)
            for i in range(0, len(order) - BATCH + 1, BATCH):
                idx = order[i:i + BATCH]
                yield augment(xs[idx], g), ys[idx]

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    def tokens(self, batch) -> int:
        return len(batch[1])  # samples

    def eval_batches(self):
        return [(self.test_x[i:i + 100], self.test_y[i:i + 100]) for i in range(0, HELD_OUT, 100)]

    def metrics(self, model: torch.nn.Module, batch) -> dict[str, float]:
        x, y = batch
        return {"accuracy": (model(x).argmax(dim=1) == y).float().mean().item()}


task = Digits
