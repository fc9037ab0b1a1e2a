"""The outer step: token-weighted merging of pseudo-gradients and Nesterov momentum.

The outer optimizer is exactly torch.optim.SGD(lr, momentum, nesterov=True, dampening=0)
with p.grad = Δ, written out so its momentum lives in our durable state files:

    buf ← μ·buf + Δ          (buf starts at 0, so the first buf is Δ, as in torch)
    p   ← p − lr·(Δ + μ·buf)

Merging is a token-weighted average of pushes. Push i carries Δ_i, the progress its
learner made over s_i inner steps on T_i tokens. A push spanning more than one round
(the learner's queue coalesced pushes while the syncer was unreachable) is scaled back
to one round's worth, g_i = Δ_i / max(1, s_i / H), so it counts as the r_i rounds it is,
not as one giant step. Then

    Δ = Σ_i w_i · g_i,    w_i = T_i / max(Σ_k T_k, L · T_round)

where T_round = H × tokens per step and L is the number of live learners. A learner that
processed more tokens counts more. An absent learner contributes nothing but still
counts in the denominator (weight 0, as in Decoupled DiLoCo), so a merge that only one of
three live learners made in time moves Θ a third as far; the outer step per round stays
the same whether a round's pushes arrive together or one by one. If every token count
is 0 the pushes weigh equally.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class OuterConfig:
    lr: float = 0.7
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"outer-lr: must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"outer-momentum: must be in [0, 1), got {self.momentum}")


def nesterov_step(params: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor],
                  grad: dict[str, torch.Tensor], cfg: OuterConfig) -> None:
    """One in-place outer Nesterov step over the named tensors of one fragment."""
    with torch.no_grad():
        for name, g in grad.items():
            buf = momentum[name]
            buf.mul_(cfg.momentum).add_(g)
            params[name].sub_(g.add(buf, alpha=cfg.momentum), alpha=cfg.lr)


@dataclass
class Contribution:
    """One accepted push, decoded to fp32."""

    learner: int
    incarnation: int
    seq: int
    tokens: int
    base_version: int
    delta: dict[str, torch.Tensor] = field(repr=False)
    steps: int = 0

    @property
    def ident(self) -> str:
        return push_id(self.learner, self.incarnation, self.seq)


def push_id(learner: int, incarnation: int, seq: int) -> str:
    return f"{learner}:{incarnation}:{seq}"


def merge_weights(contribs: list[Contribution], expected_tokens: float = 0.0) -> list[float]:
    """w_i = T_i / max(Σ T, expected), or equal weights when no tokens were reported."""
    tokens = [max(0, c.tokens) for c in contribs]
    total = sum(tokens)
    if total <= 0:
        return [1.0 / len(contribs)] * len(contribs)
    denominator = max(float(total), expected_tokens)
    return [t / denominator for t in tokens]


def round_scale(steps: int, sync_every: int) -> float:
    """1 / (rounds a push spans): a coalesced push of 2H steps counts as two rounds."""
    return 1.0 / max(1.0, steps / sync_every) if sync_every > 0 else 1.0


def merge(contribs: list[Contribution], expected_tokens: float = 0.0,
          sync_every: int = 0) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The merged pseudo-gradient and the weight of each push."""
    if not contribs:
        raise ValueError("merge needs at least one contribution")
    weights = merge_weights(contribs, expected_tokens)
    out: dict[str, torch.Tensor] = {}
    for c, w in zip(contribs, weights):
        scale = w * round_scale(c.steps, sync_every)
        for name, d in c.delta.items():
            if name in out:
                out[name].add_(d, alpha=scale)
            else:
                out[name] = d.mul(scale)
    return out, weights
