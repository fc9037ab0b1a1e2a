"""trainer.finite answers as torch.isfinite(t).all() does, on every path it takes."""
from __future__ import annotations

import pytest
import torch

from trainer.finite import all_finite, finite

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("values", [[1.0, 2.0], [1.0, NAN], [-INF, 0.0], [INF], [], [3e38, -3e38]])
def test_finite_agrees_with_torch(dtype: torch.dtype, values: list[float]) -> None:
    t = torch.tensor(values, dtype=torch.float32).to(dtype)  # 3e38 is Inf in half precision
    assert finite(t) == bool(torch.isfinite(t).all())
    assert finite(t.reshape(-1, 1).t()) == bool(torch.isfinite(t).all())  # a strided view


def test_a_tensor_that_requires_grad_is_checked_without_a_graph() -> None:
    assert finite(torch.ones(3, requires_grad=True))
    assert not all_finite([torch.ones(2), torch.tensor([NAN], requires_grad=True)])
    assert all_finite([])
