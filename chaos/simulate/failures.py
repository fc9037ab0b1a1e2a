"""The cluster's failures: one seeded Poisson stream, superposed per learner, not per chip.

Each of N chips fails at rate r. Their superposition is one Poisson process of rate N·r
whose events land on learner j with probability chips_j / N: the same process as N
per-chip streams, drawn with one exponential and one uniform per failure. At 1.2M chips
that is a failure every 26 s instead of 1.2M timers.

Times are unit-rate gaps divided by the rate, so a doubled MTBI stretches the very same
draw (common random numbers): comparisons across MTBIs see the same failures, not new luck.
All three systems see the same failures too: the same chips break at the same times.
"""
from __future__ import annotations

import random
from typing import NamedTuple

from .dists import Dist


class Failures(NamedTuple):
    times: list[float]    # seconds, increasing
    learners: list[int]   # the learner (0-based) holding the failed chip


def failure_stream(rate: float, learners: int, duration: float, seed: int) -> Failures:
    """Failures in [0, duration) of a cluster failing at `rate` per second, spread evenly
    over `learners` equal learners."""
    if rate <= 0:
        return Failures([], [])
    rng = random.Random(f"{seed}:failures")
    times: list[float] = []
    owners: list[int] = []
    clock = 0.0
    while True:
        clock += rng.expovariate(1.0)
        t = clock / rate
        if t >= duration:
            return Failures(times, owners)
        times.append(t)
        owners.append(min(learners - 1, int(rng.random() * learners)))


def draws(dist: Dist, n: int, seed: int, stream: str) -> list[float]:
    """n recovery draws in failure order from their own seeded stream: failure k always gets
    draw k, whatever happened to the failures before it."""
    rng = random.Random(f"{seed}:{stream}")
    return [dist.sample(rng) for _ in range(n)]
