"""One simulated link per learner, as the live harness has one proxy per link.

A request goes up (learner → syncer) and its reply comes down; each direction can be
delayed (Toxiproxy's `latency`) or hold nothing (`timeout` 0, the `blackhole` partition:
data vanishes, the connection hangs), and the whole link can refuse (a disabled proxy:
open connections are reset, new ones refused). Faults stack: two overlapping faults on one
direction both have to end before data flows again."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

UP, DOWN = "upstream", "downstream"
BASE_DELAY = 0.0005  # one way, on 127.0.0.1 through a proxy


@dataclass
class Link:
    learner: int
    rng: random.Random
    latency: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: {UP: [], DOWN: []})
    blackholes: dict[str, int] = field(default_factory=lambda: {UP: 0, DOWN: 0})
    refusals: int = 0

    def delay(self, direction: str) -> float:
        extra = sum(max(0.0, ms + self.rng.uniform(-jitter, jitter)) for ms, jitter in self.latency[direction])
        return BASE_DELAY + extra / 1000.0

    def carries(self, direction: str) -> bool:
        return not self.refusals and not self.blackholes[direction]

    @property
    def refusing(self) -> bool:
        return self.refusals > 0


def streams(direction: str) -> tuple[str, ...]:
    return (UP, DOWN) if direction == "both" else (direction,)
