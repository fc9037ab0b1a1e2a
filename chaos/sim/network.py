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

    def cut(self, mode: str, direction: str, by: int) -> None:
        """A partition starts (by=1) or ends (by=-1): the whole link refused, or its streams
        blackholed."""
        if mode == "refuse":
            self.refusals += by
        else:
            for s in streams(direction):
                self.blackholes[s] += by

    def slow(self, latency_ms: float, jitter_ms: float, direction: str, on: bool) -> None:
        """A latency toxic added (on) or removed."""
        for s in streams(direction):
            (self.latency[s].append if on else self.latency[s].remove)((latency_ms, jitter_ms))

    def heal(self) -> bool:
        """Every fault off the link; whether there was any."""
        faulty = bool(self.refusals or any(self.blackholes.values()) or any(self.latency.values()))
        self.refusals, self.blackholes, self.latency = 0, {UP: 0, DOWN: 0}, {UP: [], DOWN: []}
        return faulty


def streams(direction: str) -> tuple[str, ...]:
    return (UP, DOWN) if direction == "both" else (direction,)
