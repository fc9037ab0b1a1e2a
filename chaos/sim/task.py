"""The stand-in task: linear regression whose optimum is known, cheap enough that a minute
of simulated training costs milliseconds, and whose loss says how far Θ is from it.

y = x·w* + b* + ε with ε ~ N(0, NOISE²): the best possible loss is NOISE² (0.01), the
untrained model's is about ‖w*‖² + b*² (≈ 8), so `final_loss` has a real margin to judge."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

DIM = 8
NOISE = 0.1
BATCH = 16
EVAL_BATCHES = 4
POOL = 64
_POOLS: dict[int, list] = {}   # shard -> its batches (one per learner: a few KB each)


class LinearTask:
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(12345)
        self.w = torch.randn(DIM, generator=g)
        self.b = float(torch.randn(1, generator=g))

    def model(self) -> torch.nn.Module:
        return torch.nn.Linear(DIM, 1)

    def _batch(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(BATCH, DIM, generator=g)
        return x, x @ self.w + self.b + NOISE * torch.randn(BATCH, generator=g)

    def batches(self, shard: int, shards: int, seed: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batch i of a shard is the same whatever `start`: the shard's pool of POOL batches,
        made once per process, walked from an offset the seed picks (a minute of simulated
        training reads thousands, and ten thousand runs need not draw them anew)."""
        pool = self._pool(shard)
        i = start + seed % POOL
        while True:
            yield pool[i % POOL]
            i += 1

    def _pool(self, shard: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """A shard's POOL batches (read-only: every run in the process walks them)."""
        pool = _POOLS.get(shard)
        if pool is None:
            g = torch.Generator().manual_seed(1_000_003 + shard * 7919)
            pool = [tuple(t.numpy() for t in self._batch(g)) for _ in range(POOL)]
            for x, y in pool:
                x.flags.writeable = y.flags.writeable = False
            _POOLS[shard] = pool
        return pool

    def sgd_step(self, params: dict[str, torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor], lr: float) -> float:
        """One SGD step on the MSE, its gradient in closed form (no autograd: the simulator
        runs thousands a second); returns the loss before the step."""
        return self.sgd_step_views(*self.views(params), batch, lr)

    @staticmethod
    def views(params: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
        """The weight row and the bias as numpy views of the parameters: a step through them
        updates the parameters in place (made once per model, not once per step)."""
        return params["weight"].detach().numpy()[0], params["bias"].detach().numpy()

    @staticmethod
    def sgd_step_views(w: np.ndarray, b: np.ndarray, batch: tuple[np.ndarray, np.ndarray], lr: float) -> float:
        """sgd_step on the views `views` gave, the same operations in the same order (the
        same bits: a seed's event log does not change)."""
        x, y = batch  # numpy: the pool's batches
        err = x @ w
        err += b[0] - y
        n = len(y)
        w -= (2.0 * lr / n) * (err @ x)
        b -= (2.0 * lr / n) * np.add.reduce(err)  # err.sum() without its Python wrapper
        return float(err @ err) / n

    def loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if torch.is_grad_enabled():  # a loss to train on: the module's forward, differentiable
            x, y = (torch.as_tensor(t) for t in batch)
            return ((torch.nn.functional.linear(x, model.weight, model.bias).squeeze(-1) - y) ** 2).mean()
        # Scored (Θ after every merge, under no_grad): the same MSE in numpy, a few numpy
        # calls where torch's dispatch costs a few microseconds per operation.
        x, y = (t.numpy() if isinstance(t, torch.Tensor) else t for t in batch)
        err = x @ model.weight.detach().numpy()[0]
        err += model.bias.detach().numpy()[0] - y
        return torch.tensor(float(err @ err) / len(y))

    def tokens(self, batch: tuple[torch.Tensor, torch.Tensor]) -> int:
        return int(batch[0].shape[0])

    def eval_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(999)
        return [self._batch(g) for _ in range(EVAL_BATCHES)]


SPEC = "chaos.sim.task:LinearTask"
