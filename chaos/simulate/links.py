"""When a message between a learner and the syncer arrives, given the schedule's link faults.

A partition (any mode or direction: a cut request or reply stalls the exchange alike)
holds what is sent during it until it heals; latency delays each message by its
milliseconds in the directions it names (Toxiproxy: upstream is learner -> syncer).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

UP = "upstream"      # learner -> syncer
DOWN = "downstream"  # syncer -> learner


@dataclass
class Link:
    cuts: list[tuple[float, float]] = field(default_factory=list)
    delays: list[tuple[float, float, float, str]] = field(default_factory=list)  # start, end, seconds, direction

    def cut_until(self, t: float) -> float | None:
        """When the partition holding `t` heals (chained partitions heal at the last end)."""
        end = None
        for a, b in self.cuts:  # sorted by start (add_cut)
            if a <= (t if end is None else end) < b:
                end = b
        return end

    def add_cut(self, start: float, end: float) -> None:
        bisect.insort(self.cuts, (start, end))

    def delay(self, t: float, direction: str) -> float:
        return sum(s for a, b, s, d in self.delays if a <= t < b and d in ("both", direction))

    def deliver(self, t: float, direction: str) -> float:
        """Arrival time of a message sent at `t`."""
        if not self.cuts and not self.delays:
            return t
        healed = self.cut_until(t)
        sent = t if healed is None else healed
        return sent + self.delay(sent, direction)
