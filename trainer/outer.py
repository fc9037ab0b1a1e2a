"""The outer step: token-weighted merging of pseudo-gradients and Nesterov momentum.

The outer optimizer is exactly torch.optim.SGD(lr, momentum, nesterov=True, dampening=0)
with p.grad = Δ, written out so its momentum lives in our durable state files:

    buf ← μ·buf + Δ          (buf starts at 0, so the first buf is Δ, as in torch)
    p   ← p − lr·(Δ + μ·buf)

Merging: pushes from the same learner in one merge are summed (they are consecutive
increments of its progress, so together they are its progress since it last adopted the
global parameters) and learners are weighted by the tokens they really processed:

    Δ = Σ_l (T_l / Σ_k T_k) · Δ_l

A learner that processed more tokens moved further on more data and counts more. An
absent learner contributes nothing but still counts in the denominator (weight 0, as in
Decoupled DiLoCo): the sum is normalised by max(Σ_k T_k, expected), where `expected` is
the tokens a full round of the live learners would bring. So a merge that only one of
three live learners made in time moves Θ a third as far, and the outer step per round
stays the same whether the pushes of a round arrive together or one by one. If every
token count is 0 the learners weigh equally.
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
            raise ValueError(f"outer_lr: must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"outer_momentum: must be in [0, 1), got {self.momentum}")


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

    @property
    def ident(self) -> str:
        return push_id(self.learner, self.incarnation, self.seq)


def push_id(learner: int, incarnation: int, seq: int) -> str:
    return f"{learner}:{incarnation}:{seq}"


def merge_weights(contribs: list[Contribution], expected_tokens: float = 0.0) -> dict[int, float]:
    """Per-learner weights T_l / max(Σ T, expected), or equal weights when no tokens were reported."""
    tokens: dict[int, int] = {}
    for c in contribs:
        tokens[c.learner] = tokens.get(c.learner, 0) + max(0, c.tokens)
    total = sum(tokens.values())
    if total <= 0:
        return {learner: 1.0 / len(tokens) for learner in tokens}
    denominator = max(float(total), expected_tokens)
    return {learner: t / denominator for learner, t in tokens.items()}


def expected_round_tokens(contribs: list[Contribution], live_learners: int) -> float:
    """Tokens a full round would bring: live learners × the median tokens of one learner's push."""
    per_learner: dict[int, int] = {}
    for c in contribs:
        per_learner[c.learner] = per_learner.get(c.learner, 0) + max(0, c.tokens)
    values = sorted(per_learner.values())
    median = values[len(values) // 2] if values else 0
    return float(max(live_learners, len(per_learner)) * median)


def merge(contribs: list[Contribution], expected_tokens: float = 0.0) -> tuple[dict[str, torch.Tensor], dict[int, float]]:
    """The token-weighted pseudo-gradient and the weights used."""
    if not contribs:
        raise ValueError("merge needs at least one contribution")
    weights = merge_weights(contribs, expected_tokens)
    out: dict[str, torch.Tensor] = {}
    for c in contribs:
        w = weights[c.learner]
        for name, d in c.delta.items():
            if name in out:
                out[name].add_(d, alpha=w)
            else:
                out[name] = d.mul(w)
    return out, weights
