"""The outer step: token-weighted merging of pseudo-gradients and Nesterov momentum.

For a merge of a full round the outer optimizer is exactly torch.optim.SGD(lr, momentum,
nesterov=True, dampening=0) with p.grad = Δ, written out so its momentum lives in our
durable state files:

    buf ← μ·buf + Δ          (buf starts at 0, so the first buf is Δ, as in torch)
    p   ← p − lr·(Δ + μ·buf) = p − lr·((1+μ)·Δ + μ²·buf_old)

Momentum per round, not per merge (--momentum-unit round, the default). Decoupled merges
are often partial: one learner of three in time, a late push, the residual pushes of
learners leaving at the end of a run. Counting each as a full step decays and re-applies
the momentum buffer once per merge, so a round that arrives in k pieces carries μ²·buf k
times: the outer step amplifies exactly the lone, late and final pushes (a run ended at a
held-out loss of 14.3 after two such merges following the learners' BYE). A merge worth
W of a round (W = round_fraction: the sum of its weights, at most 1) instead does

    p   ← p − lr·((1+μ)·Δ + μ²·c·buf),   c = (1 − μ^W) / (1 − μ)
    buf ← μ^W·buf + Δ

W = 1 is torch's step bit for bit; k merges whose fractions sum to 1 carry and decay the
old buffer exactly as one full merge does (Σ μ^(W_<j)·c(W_j) = 1, Π μ^(W_j) = μ), and Δ
itself, already weight-scaled, adds up as before. `--momentum-unit merge` keeps one full
step per merge (the behaviour before).

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

Staleness policies (--staleness-policy). The staleness of push i at merge time is
s_i = v − b_i, where v is the fragment's version before this merge and b_i the version
the push was based on (the `staleness` the merge event reports per contributor). A push
with v − b_i > S (--max-staleness) when it arrives is dropped under every policy.

    drop              w'_i = w_i                                        (the default)
    discount          w'_i = w_i · d_i,   d_i = (1 + s_i)^(-1/2)
    delayed-nesterov  w'_i = w_i, and the outer step below is delayed

The discount is NOT renormalised: Δ = Σ_i w'_i · g_i with the denominator of w_i
unchanged (raw tokens, live learners), so a stale push moves Θ less than a fresh one
with the same tokens, and fresh pushes (s = 0, d = 1) weigh exactly what `drop` gives
them. Renormalising would undo the discount whenever every push of a merge is equally
stale (a lone late push would get its full weight back) and would break the rule that
absent learners count with weight 0 in the denominator. So Σ w'_i ≤ Σ w_i ≤ 1.

Delayed Nesterov (--nesterov-delay k ≥ 1). Each fragment keeps, besides buf, an
accumulator A (starts at 0) and a count c (starts at 0), both durable with Θ_f. A merge
with merged pseudo-gradient Δ does

    c ← c + 1
    if c < k:                  A ← A + Δ
                               p ← p − lr·Δ                     (plain SGD step)
    else (c ≥ k):              ḡ   ← (A + Δ) / c                (the mean of the c Δs)
                               buf ← μ·buf + ḡ
                               p   ← p − lr·(Δ + μ·buf)         (one Nesterov-style step)
                               A ← 0,  c ← 0

so every merge applies its own Δ once, and the momentum term μ·buf is applied and
updated only on every k-th merge, from the mean Δ of the last k merges. With k = 1 every
merge is the momentum branch with ḡ = Δ / 1 = Δ, which is exactly nesterov_step, bit for
bit. (c > k only happens if k was lowered across a syncer restart; the mean is then over
the c Δs actually accumulated.)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

STALENESS_POLICIES = ("drop", "discount", "delayed-nesterov")


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
                  grad: dict[str, torch.Tensor], cfg: OuterConfig, fraction: float = 1.0) -> None:
    """One in-place outer Nesterov step over the named tensors of one fragment, for a merge
    worth `fraction` of a full round (see round_fraction; 1 is torch's step exactly)."""
    mu = cfg.momentum
    decay = mu ** fraction
    carry = (1.0 - decay) / (1.0 - mu) if mu > 0 else 0.0
    with torch.no_grad():
        for name, g in grad.items():
            buf = momentum[name]
            if fraction == 1.0:
                buf.mul_(mu).add_(g)
                params[name].sub_(g.add(buf, alpha=mu), alpha=cfg.lr)
                continue
            # p ← p − lr·((1+μ)·g + μ²·c·buf),  buf ← μ^W·buf + g
            params[name].sub_(g.mul(1.0 + mu).add_(buf, alpha=mu * mu * carry), alpha=cfg.lr)
            buf.mul_(decay).add_(g)


def round_fraction(weights: list[float]) -> float:
    """How much of a full round a merge is: the sum of its pushes' weights, at most 1.

    A round in which every weighed learner reported merges with weights summing to 1; a lone
    push of one of three learners is a third; a stale push under `discount` counts less."""
    return min(1.0, max(0.0, sum(weights)))


def delayed_nesterov_step(params: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor],
                          accum: dict[str, torch.Tensor], count: int, grad: dict[str, torch.Tensor],
                          cfg: OuterConfig, delay: int) -> tuple[int, bool]:
    """One in-place delayed-Nesterov merge (see the module docstring).

    `accum` holds the sum of the Δs merged since the last momentum step (a name missing
    from it counts as 0) and `count` how many; both are updated in place / returned.
    Returns (the new count, whether this merge took the momentum step).
    """
    if delay < 1:
        raise ValueError(f"nesterov-delay: must be >= 1, got {delay}")
    count += 1
    with torch.no_grad():
        if count < delay:
            for name, g in grad.items():
                if name in accum:
                    accum[name].add_(g)
                else:
                    accum[name] = g.clone()
                params[name].sub_(g, alpha=cfg.lr)
            return count, False
        for name, g in grad.items():
            total = accum[name].add(g) if name in accum else g
            mean = total.div(count)
            buf = momentum[name]
            buf.mul_(cfg.momentum).add_(mean)
            params[name].sub_(g.add(buf, alpha=cfg.momentum), alpha=cfg.lr)
        accum.clear()
        return 0, True


def staleness_discount(staleness: int) -> float:
    """d = (1 + s)^(-1/2); a push based on a newer version than v (s < 0) is not discounted."""
    return (1.0 + max(0, staleness)) ** -0.5


def staleness_factors(policy: str, staleness: list[int]) -> list[float]:
    """The factor each push's weight is multiplied by: d_i under `discount`, else 1."""
    if policy not in STALENESS_POLICIES:
        raise ValueError(f"staleness-policy: must be one of {', '.join(STALENESS_POLICIES)}, got {policy!r}")
    if policy == "discount":
        return [staleness_discount(s) for s in staleness]
    return [1.0] * len(staleness)


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


def merge(contribs: list[Contribution], expected_tokens: float = 0.0, sync_every: int = 0,
          factors: list[float] | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The merged pseudo-gradient and the weight of each push: w'_i = w_i · factors[i]
    (factors default to 1; the discount is not renormalised)."""
    if not contribs:
        raise ValueError("merge needs at least one contribution")
    weights = merge_weights(contribs, expected_tokens)
    if factors is not None:
        if len(factors) != len(contribs):
            raise ValueError(f"merge: {len(factors)} factors for {len(contribs)} contributions")
        weights = [w * f for w, f in zip(weights, factors)]
    out: dict[str, torch.Tensor] = {}
    for c, w in zip(contribs, weights):
        scale = w * round_scale(c.steps, sync_every)
        for name, d in c.delta.items():
            if name in out:
                out[name].add_(d, alpha=scale)
            else:
                out[name] = d.mul(scale)
    return out, weights


def final_average(contribs: list[Contribution]) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The final round's step: Σ_l w_l·D_l over learners l, where D_l sums learner l's
    pushes (successive pushes of one learner are successive stretches of its progress, so
    they add) and w_l = its tokens / all tokens (equal shares when no tokens were
    reported). Returns the step and, per contribution, the weight its learner got."""
    if not contribs:
        raise ValueError("final_average needs at least one contribution")
    tokens: dict[int, int] = {}
    for c in contribs:
        tokens[c.learner] = tokens.get(c.learner, 0) + max(0, c.tokens)
    total = sum(tokens.values())
    share = {l: (t / total if total > 0 else 1.0 / len(tokens)) for l, t in tokens.items()}
    out: dict[str, torch.Tensor] = {}
    for c in contribs:
        for name, d in c.delta.items():
            if name in out:
                out[name].add_(d, alpha=share[c.learner])
            else:
                out[name] = d.mul(share[c.learner])
    return out, [share[c.learner] for c in contribs]
