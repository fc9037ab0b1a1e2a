"""One system's simulated goodput and what it lost, in one shape for every system.

Every loss is a fraction of the same capacity (all chips, the whole simulated time), so
goodput plus the losses is 1, and a category a system cannot have is 0 rather than absent:
a script can compare systems key by key.
"""
from __future__ import annotations

from dataclasses import dataclass, field

SYSTEMS = ("decoupled", "elastic-dp", "dp")

LOSSES = {
    "stall": "the whole system idle, waiting for a restart or a reconfiguration",
    "recovery": "a failed unit's share while it is out: a learner restarting, fetching state and "
                "rejoining, or (the paper's learner) reconfiguring; an elastic job's failed slice until "
                "it returns",
    "rollback": "work redone from the last checkpoint, or the step in progress, when a "
                "data-parallel job (or the paper's learner, itself one) fails",
    "lost_with_learner": "a killed learner's steps since its last push",
    "stale_pushes": "pushes more than --max-staleness versions old, thrown away (push_dropped, stale)",
    "paused": "schedules only: learners frozen by a pause",
    "slow_steps": "schedules only: steps slower than the rate capacity credits a learner (--pace)",
    "edge": "schedules only: work in flight at the window's ends (merged after it, or before it)",
}


@dataclass
class SystemResult:
    seconds: float                      # the simulated (or scheduled) window
    capacity: float                     # unit-seconds of capacity (chips or learners x seconds)
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOSSES, 0.0))  # unit-seconds
    info: dict[str, float] = field(default_factory=dict)

    @property
    def goodput(self) -> float:
        if self.capacity <= 0:
            return 1.0
        return max(0.0, 1.0 - sum(self.lost.values()) / self.capacity)

    def fractions(self) -> dict[str, float]:
        return {k: (v / self.capacity if self.capacity > 0 else 0.0) for k, v in self.lost.items()}

    def to_json(self) -> dict:
        return {"goodput": round(self.goodput, 6),
                "lost": {k: round(v, 6) for k, v in self.fractions().items()},
                "lost_seconds": {k: round(v * self.seconds, 3) for k, v in self.fractions().items()},
                "simulated_seconds": round(self.seconds, 3),
                **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.info.items()}}
