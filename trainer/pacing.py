"""How long a learner's step takes when it must not run as fast as the CPU allows.

Two ways, one per flag, shared by the trainer's learners and the torchft peer of the
benchmarks so both systems are slowed alike:
- `--speed s`: after a step of own compute time c, wait c·(1/s − 1), sleeping (the CPU is
  free) or spinning (the core stays busy, as a slower chip keeps its host busy);
- `--step-time T`: an emulated accelerator. Steps start at most once per T seconds, the
  host's own work (logging, pushes) overlapping the slot. A step that ran over starts the
  next slot late; nothing catches up in a burst.
"""
from __future__ import annotations

import threading
import time


class StepPacer:
    def __init__(self, speed: float = 1.0, slowdown: str = "sleep", step_time: float = 0.0) -> None:
        self.speed = speed
        self.slowdown = slowdown
        self.step_time = step_time
        self._slot: float | None = None  # when the current step's slot began (--step-time)

    def after_step(self, compute_s: float, stop: threading.Event) -> None:
        """Hold the caller after a step of `compute_s` seconds; returns early once `stop` is set."""
        if self.step_time > 0:
            self._pace(compute_s, stop)
            return
        if self.speed >= 1.0:
            return
        extra = compute_s * (1.0 / self.speed - 1.0)
        if self.slowdown == "sleep":
            stop.wait(extra)
            return
        deadline = time.perf_counter() + extra  # spin: other processes see a busy core, as with a slow chip
        while time.perf_counter() < deadline and not stop.is_set():
            pass

    def _pace(self, compute_s: float, stop: threading.Event) -> None:
        now = time.perf_counter()
        if self._slot is None:
            self._slot = now - compute_s  # the first slot began when the first step did
        due = self._slot + self.step_time
        if due > now:
            stop.wait(due - now)
        self._slot = max(due, now)
