"""The local backend's supervisor: what exits on its own comes back, with backoff; what a
fault killed stays down; a fatal exit is final."""
from __future__ import annotations

import threading

from chaos.supervisor import Supervisor
from trainer.unit import FATAL_EXIT


class Procs:
    """Processes as exit codes; `respawn` brings one back at the current time."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.codes: dict[str, int | None] = {"syncer": None, "learner-1": None}
        self.starts = {name: 0.0 for name in self.codes}
        self.held_down: set[str] = set()
        self.respawned: list[tuple[str, float]] = []

    def supervised(self) -> list[str]:
        return list(self.codes)

    def exit_code(self, name: str) -> int | None:
        return self.codes[name]

    def started_at(self, name: str) -> float | None:
        return self.starts[name]

    def held(self, name: str) -> bool:
        return name in self.held_down

    def respawn(self, name: str) -> None:
        self.codes[name] = None
        self.starts[name] = self.clock.now
        self.respawned.append((name, self.clock.now))


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def rig():
    clock = Clock()
    procs = Procs(clock)
    events: list[tuple[str, dict]] = []
    sup = Supervisor(procs, lambda kind, **f: events.append((kind, f)), threading.RLock(), clock)
    return clock, procs, events, sup


def test_an_exit_on_its_own_is_recorded_and_restarted_after_its_delay() -> None:
    clock, procs, events, sup = rig()
    procs.codes["learner-1"] = 1
    sup.check("learner-1")
    assert events == [("exit", {"target": "learner-1", "exit_code": 1, "lived": 100.0, "restart": True})]
    assert procs.respawned == [], "restarted before its delay"
    clock.now += 1.0  # a life of 100 s resets the backoff: the first delay, 1 s
    sup.check("learner-1")
    assert procs.respawned == [("learner-1", 101.0)]
    assert events[-1] == ("restart", {"target": "learner-1", "exit_code": 1, "delay": 1.0, "failures": 0,
                                      "by": "supervisor"})


def test_short_lives_in_a_row_double_the_delay() -> None:
    clock, procs, events, sup = rig()
    delays = []
    for _ in range(4):
        procs.codes["learner-1"] = 1
        sup.check("learner-1")
        died = clock.now
        while not procs.respawned or procs.respawned[-1][1] < died:
            clock.now += 0.25
            sup.check("learner-1")
        delays.append(procs.respawned[-1][1] - died)
        clock.now += 0.5  # lives of half a second: each one short
    assert delays == [1.0, 1.0, 2.0, 4.0]


def test_a_process_a_fault_killed_stays_down() -> None:
    clock, procs, events, sup = rig()
    procs.codes["syncer"] = -9
    procs.held_down.add("syncer")
    clock.now += 60.0
    sup.check("syncer")
    assert procs.respawned == [] and events == []


def test_a_fatal_exit_is_final() -> None:
    clock, procs, events, sup = rig()
    procs.codes["learner-1"] = FATAL_EXIT
    for _ in range(10):
        sup.check("learner-1")
        clock.now += 10.0
    assert procs.respawned == []
    assert events == [("exit", {"target": "learner-1", "exit_code": FATAL_EXIT, "lived": 100.0, "restart": False})]
