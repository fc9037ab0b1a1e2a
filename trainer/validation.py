"""What a signed push may claim, checked before the syncer acknowledges anything.

A learner holding the secret can still be buggy or compromised, and every number it
sends ends up in a merge weight, a ledger or a JSON file. So each count is bounded by
what a learner can really have done in this run, and each pseudo-gradient by what the run
has seen:

- `steps`: the steps one incarnation claims for one fragment, summed over its accepted
  pushes, never exceed --max-step-rate × the incarnation's age, plus a slack of 4 rounds.
  The age (membership.Member.elapsed) is read from the monotonic clock while a syncer
  runs, persisted, and credited with a syncer's downtime by the boot clock (clock.py); no
  wall clock enters it. So a wall-clock step can neither grant a burst of steps (a jump
  forward adds nothing) nor lock a learner out (a jump back takes nothing away, and the
  age never decreases). A syncer restarted on another machine or after a reboot credits
  no downtime: at the default 20000 steps/s the budget an incarnation has accumulated
  covers any honest learner's steps meanwhile.
- `tokens` ≤ steps × --max-step-tokens, and `step_tokens` ≤ --max-step-tokens.
- `seq`, `position`, `incarnation` < 2^53 (wire.header_int); `base_version` ≤ the
  fragment's version (a push cannot be based on a version not served yet).
- `position` ≤ the position the incarnation was welcomed at + --max-step-rate × its age
  + 4 rounds (check_position: one data window per inner step), by the same age.
- the pseudo-gradient is finite after decoding (codec.decode), and its norm per round
  (‖Δ‖ / rounds spanned) is at most --max-norm-ratio × the median of the fragment's last
  32 accepted pushes once 8 are known; before that, at most ABSOLUTE_NORM_RATIO × (‖Θ_f‖
  + 1). The median is robust: one huge push cannot raise the bar for the next.

Refusals raise ProtocolError(OUT_OF_BOUNDS or IMPLAUSIBLE_NORM) naming the field.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from .protocol import ProtocolError, Reason

DEFAULT_MAX_STEP_TOKENS = 2 ** 30
ABSOLUTE_NORM_RATIO = 100.0
NORM_WINDOW = 32
NORM_WARMUP = 8
SLACK_ROUNDS = 4


@dataclass(frozen=True)
class PushBounds:
    max_step_rate: float
    max_step_tokens: int
    sync_every: int

    def check_counts(self, *, steps: int, tokens: int, step_tokens: int | float, claimed: int,
                     elapsed: float) -> None:
        """`claimed`: steps this incarnation's accepted pushes of the fragment already
        claimed; `elapsed`: the incarnation's age in seconds (Member.elapsed)."""
        allowed = self.max_step_rate * max(0.0, elapsed) + SLACK_ROUNDS * self.sync_every
        if steps < 1 and tokens > 0:
            raise ProtocolError(Reason.OUT_OF_BOUNDS, f"tokens={tokens} with steps={steps}")
        if claimed + steps > allowed:
            raise ProtocolError(Reason.OUT_OF_BOUNDS,
                                f"steps={steps}: this incarnation would have done {claimed + steps} steps of the "
                                f"fragment in {elapsed:.1f} s, over {allowed:.0f} (--max-step-rate "
                                f"{self.max_step_rate:g}/s + {SLACK_ROUNDS} rounds)")
        if tokens > steps * self.max_step_tokens:
            raise ProtocolError(Reason.OUT_OF_BOUNDS,
                                f"tokens={tokens} exceeds steps × --max-step-tokens = {steps} × {self.max_step_tokens}")
        if step_tokens > self.max_step_tokens:
            raise ProtocolError(Reason.OUT_OF_BOUNDS,
                                f"step_tokens={step_tokens} exceeds --max-step-tokens {self.max_step_tokens}")


def tensor_norm(tensors: dict[str, torch.Tensor]) -> float:
    """‖x‖₂ over every tensor, in float64 (an fp32 sum of squares of 3e38 would overflow)."""
    total = 0.0
    for t in tensors.values():
        norm = float(torch.linalg.vector_norm(t.detach(), dtype=torch.float64))  # cast inside the kernel
        total += norm * norm
    return total ** 0.5


@dataclass
class NormGuard:
    """The recent per-round norms of one fragment's accepted pushes."""

    ratio: float
    recent: deque = field(default_factory=lambda: deque(maxlen=NORM_WINDOW))

    def limit(self, params_norm: Callable[[], float]) -> tuple[float, str]:
        """The bound and why; `params_norm` (‖Θ_f‖, costly) is only called before the warm-up."""
        if len(self.recent) >= NORM_WARMUP:
            median = statistics.median(self.recent)
            return self.ratio * median, f"{self.ratio:g} × the median {median:.4g} of the last {len(self.recent)} pushes"
        theta = params_norm()
        return ABSOLUTE_NORM_RATIO * (theta + 1.0), \
            f"{ABSOLUTE_NORM_RATIO:g} × (‖Θ_f‖ {theta:.4g} + 1), before {NORM_WARMUP} pushes are known"

    def check(self, per_round_norm: float, params_norm: Callable[[], float]) -> None:
        bound, why = self.limit(params_norm)
        if not per_round_norm <= bound:  # also refuses NaN
            raise ProtocolError(Reason.IMPLAUSIBLE_NORM,
                                f"pseudo-gradient norm {per_round_norm:.4g} per round exceeds {bound:.4g} ({why})")

    def note(self, per_round_norm: float) -> None:
        self.recent.append(per_round_norm)


def check_position(position: int, start: int, elapsed: float, max_step_rate: float, sync_every: int) -> None:
    """A claimed data position (windows consumed, across incarnations) is at most where
    this incarnation started plus what it can have consumed since: one window per inner
    step, at --max-step-rate, plus SLACK_ROUNDS rounds. Without it a learner's own next
    incarnation could be welcomed at position 2^53 - 1 (issue 27)."""
    allowed = start + max_step_rate * max(0.0, elapsed) + SLACK_ROUNDS * sync_every
    if position > allowed:
        raise ProtocolError(Reason.OUT_OF_BOUNDS,
                            f"position={position}: this incarnation started at {start} and can have consumed at "
                            f"most {allowed - start:.0f} windows in {elapsed:.1f} s (--max-step-rate "
                            f"{max_step_rate:g}/s + {SLACK_ROUNDS} rounds)")
