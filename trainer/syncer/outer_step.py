"""One merge's arithmetic: the outer step over a fragment's pushes, computed on copies.

Pure: the fragment's state and the pushes in, the new state out (nothing is committed
here), so a merge can be computed, checked for non-finite values and thrown away."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import SyncerConfig
from ..finite import all_finite
from ..outer import (Contribution, OuterConfig, delayed_nesterov_step, final_average, merge, merge_weights,
                     nesterov_step, round_fraction, staleness_factors)
from .fragment_state import FragmentState


@dataclass
class OuterStep:
    """A merge computed on copies of a fragment's state, not yet committed."""

    expected: float
    staleness: list[int]
    raw: list[float]
    factors: list[float]
    weights: list[float]
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    accum: dict[str, torch.Tensor]
    accum_count: int
    outer: dict
    finite: bool


class OuterStepper:
    """The outer optimizer's rules for one run: staleness policy, momentum and its warm-up."""

    def __init__(self, cfg: SyncerConfig, sync_every: int) -> None:
        self.cfg = cfg
        self.sync_every = sync_every
        self.outer = OuterConfig(cfg.outer_lr, cfg.outer_momentum)

    def momentum_now(self, rounds: float) -> float:
        """The outer momentum after `rounds` merged rounds: ramped up over --momentum-warmup."""
        warmup = self.cfg.warmup_rounds
        return self.outer.momentum * (min(1.0, rounds / warmup) if warmup > 0 else 1.0)

    def round_tokens(self, contribs: list[Contribution], weighed: list[int], step_tokens: dict[int, float]) -> float:
        """The weight denominator of a merge: the tokens of a full round, in which every
        weighed learner would have reported. The learners that did report count with the
        tokens they pushed; each one missing counts with as many steps as the reporters'
        pushes span (at most H) at its own tokens per step (a task decides what a step
        weighs; a learner not heard from yet counts at the mean of the others).

        So a round in which everyone reported has weights summing to 1 however many steps
        its pushes span: the first, staggered push of fragment f spans (f+1)·H/P steps and a
        final push only the last stretch, and weighing them by steps/H instead threw most of
        that progress away (issue 18: the first round moved fragment 0 by a quarter of the
        learners' progress). A lone push of one of two learners still weighs 1/2."""
        reported: dict[int, tuple[int, int]] = {}
        for c in contribs:
            tokens, steps = reported.get(c.learner, (0, 0))
            reported[c.learner] = (tokens + max(0, c.tokens), steps + max(0, c.steps))
        total = float(sum(t for t, _ in reported.values()))
        missing = [learner for learner in weighed if learner not in reported]
        if not missing:
            return total
        known = list(step_tokens.values()) or [c.tokens / c.steps for c in contribs if c.steps > 0]
        if not known:
            return total
        mean = sum(known) / len(known)
        span = min(float(self.sync_every), sum(s for _, s in reported.values()) / len(reported))
        return total + span * sum(step_tokens.get(learner, mean) for learner in missing)

    def step(self, frag: FragmentState, contribs: list[Contribution], weighed: list[int],
             step_tokens: dict[int, float], final: bool = False) -> OuterStep:
        """The new state of a fragment after merging `contribs`, computed on copies."""
        if final:
            return self.final_step(frag, contribs)
        expected = self.round_tokens(contribs, weighed, step_tokens)
        policy = self.cfg.staleness_policy
        staleness = [frag.version - c.base_version for c in contribs]
        raw = merge_weights(contribs, expected)
        factors = staleness_factors(policy, staleness)
        delta, weights = merge(contribs, expected, self.sync_every, factors)
        params = {n: t.clone() for n, t in frag.params.items()}
        momentum = {n: t.clone() for n, t in frag.momentum.items()}
        accum = {n: t.clone() for n, t in frag.accum.items()}
        accum_count = frag.accum_count
        if policy == "delayed-nesterov":
            averaged = accum_count + 1
            accum_count, stepped = delayed_nesterov_step(params, momentum, accum, accum_count, delta, self.outer,
                                                         self.cfg.nesterov_delay)
            outer = {"step": "delayed-nesterov", "delay": self.cfg.nesterov_delay, "momentum_step": stepped,
                     "accum_count": accum_count, "averaged": averaged if stepped else 0}
        else:
            fraction = round_fraction(weights) if self.cfg.momentum_unit == "round" else 1.0
            mu = self.momentum_now(frag.rounds)
            nesterov_step(params, momentum, delta, OuterConfig(self.outer.lr, mu), fraction)
            outer = {"step": "nesterov", "momentum_step": True, "round_fraction": round(fraction, 4),
                     "momentum": round(mu, 4)}
        finite = all_finite((*params.values(), *momentum.values(), *accum.values()))
        return OuterStep(expected, staleness, raw, factors, weights, params, momentum, accum, accum_count, outer,
                         finite)

    @staticmethod
    def final_step(frag: FragmentState, contribs: list[Contribution]) -> OuterStep:
        """The final round: Θ ← Θ − Σ_l w_l·D_l, where D_l is all of learner l's progress not
        yet merged (the sum of its pending pushes) and w_l its share of their tokens. With
        every learner in, Θ becomes the token-weighted mean of the learners' last models.
        No outer momentum or learning rate: nothing comes after this step to correct an
        extrapolation, and a weight per round (steps/H) would apply only part of a short
        last stretch, leaving fragments at different points of training."""
        delta, weights = final_average(contribs)
        params = {n: t.clone() for n, t in frag.params.items()}
        with torch.no_grad():
            for name, d in delta.items():
                params[name].sub_(d)
        momentum = {n: t.clone() for n, t in frag.momentum.items()}
        accum = {n: t.clone() for n, t in frag.accum.items()}
        staleness = [frag.version - c.base_version for c in contribs]
        finite = all_finite(params.values())
        return OuterStep(0.0, staleness, weights, [1.0] * len(contribs), weights, params, momentum, accum,
                         frag.accum_count, {"step": "final-average", "momentum_step": False}, finite)


def relative_change(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """||after − before|| / ||before|| over a fragment's tensors (||after − before|| when
    `before` is all zero); 7 significant digits, so that a real step never rounds to 0."""
    with torch.no_grad():
        diff = sum(float(torch.linalg.vector_norm(after[n] - before[n])) ** 2 for n in before) ** 0.5
        norm = sum(float(torch.linalg.vector_norm(before[n])) ** 2 for n in before) ** 0.5
    value = diff / norm if norm > 0 else diff
    return float(f"{value:.7g}") if value == value else value
