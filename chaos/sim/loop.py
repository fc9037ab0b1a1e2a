"""Virtual time: a clock that moves only when the next action is due, and the actions."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

EPOCH_MONOTONIC = 1000.0        # where the virtual monotonic clock starts
EPOCH_WALL = 1_800_000_000.0    # and the virtual wall clock (2027-01-15)


@dataclass
class VirtualTime:
    """Actions run in time order, ties in the order they were scheduled: one run of a seed is
    one sequence of actions, whatever the machine."""

    now: float = EPOCH_MONOTONIC
    actions: int = 0
    _queue: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    _seq: int = 0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return EPOCH_WALL + (self.now - EPOCH_MONOTONIC)

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (max(when, self.now), self._seq, action))

    def after(self, delay: float, action: Callable[[], None]) -> None:
        self.at(self.now + delay, action)

    def run_until(self, end: float, max_actions: int) -> None:
        """Run every action due before `end`, then stand at `end`. `max_actions` bounds the
        count: a livelock (an action that schedules itself at the same instant) is an error."""
        while self._queue and self._queue[0][0] < end:
            when, _, action = heapq.heappop(self._queue)
            self.now = when
            self.actions += 1
            if self.actions > max_actions:
                raise RuntimeError(f"simulation: more than {max_actions} actions by t={when:.3f}: a livelock")
            action()
        self.now = max(self.now, end)


class Stoppable:
    """A process a SIGSTOP can hold: what reaches it while paused waits, in order, and runs
    when it is resumed, for as long as `running()` says it still exists."""

    def __init__(self) -> None:
        self.paused = False
        self._held: list[Callable[[], None]] = []

    def running(self) -> bool:
        return True

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        held, self._held = self._held, []
        for action in held:
            if not self.running():
                return
            action()

    def when_running(self, action: Callable[[], None]) -> None:
        """Run `action` now, or when resumed; never once the process is gone."""
        if not self.running():
            return
        if self.paused:
            self._held.append(action)
        else:
            action()

    def forget_held(self) -> None:
        self.paused = False
        self._held.clear()
