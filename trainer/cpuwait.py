"""How long a thread waited for a CPU it was ready to use: the machine's share in a step rate.

Linux counts, per thread, the time it spent runnable but not running (the second field of
/proc/thread-self/schedstat, nanoseconds). A learner whose accelerator is the CPU and that
shares a machine's cores with other learners cannot step at its solo rate: three learners
on two cores each wait about a third of the time. Goodput's capacity (trainer/metrics.py)
counts only the time a learner could have computed, so that "the machine was full" is not
read as "the protocol wasted it". Time paused (SIGSTOP) or asleep is not waiting for a CPU,
so it still counts as capacity the learner lost.
"""
from __future__ import annotations

import time

SCHEDSTAT = "/proc/thread-self/schedstat"
SAMPLE_EVERY = 0.25  # seconds between readings (a reading costs ~15 µs)


def read_wait(path: str = SCHEDSTAT) -> float | None:
    """This thread's time spent waiting on a run queue so far (seconds), or None where the
    kernel does not say (no schedstat, another OS)."""
    try:
        with open(path, encoding="ascii") as fh:
            fields = fh.read().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class CpuWait:
    """Samples of the calling thread's run-queue wait, at most every SAMPLE_EVERY seconds:
    `sample()` returns the cumulative wait when a new reading is due, else None."""

    def __init__(self, every: float = SAMPLE_EVERY, path: str = SCHEDSTAT) -> None:
        self.every = every
        self.path = path
        self._next = 0.0
        self.available = read_wait(path) is not None

    def sample(self) -> float | None:
        if not self.available:
            return None
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.every
        value = read_wait(self.path)
        return round(value, 4) if value is not None else None
