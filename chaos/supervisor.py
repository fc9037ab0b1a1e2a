"""Restart what exits on its own, with backoff, as compose's and Swarm's restart policies do.

The local backend's processes (the syncer, the learner units, the proxy server) are
watched by one thread. A process the controller killed on purpose is *held*: it stays
down until the fault's stop restarts it. Any other exit (a crash, an OOM kill, a task
that raised outside a unit) is seen, recorded as an `exit` event, and restarted after a
delay that doubles with each short life in a row (trainer/unit.py's backoff: 1 s, 2 s, 4 s
... at most 30 s; a life of HEALTHY_AFTER s resets it). An exit with FATAL_EXIT (the syncer
refused the learner, its task cannot load) is final, as under `trainer run`. The
`restart` event that follows closes the window the checks judge recovery after.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from trainer.unit import FATAL_EXIT, HEALTHY_AFTER, restart_backoff

POLL_SECONDS = 0.25
BASE_DELAY = 1.0
MAX_DELAY = 30.0


class Supervised(Protocol):
    """What the supervisor needs of a cluster."""

    def supervised(self) -> list[str]: ...               # the names it watches
    def exit_code(self, name: str) -> int | None: ...    # None while it runs (or was never started)
    def started_at(self, name: str) -> float | None: ...  # monotonic time of its current start
    def held(self, name: str) -> bool: ...               # down on purpose (a kill fault)
    def respawn(self, name: str) -> None: ...            # start it again (under the cluster's lock)


@dataclass
class _Down:
    since: float
    exit_code: int
    failures: int


class Supervisor:
    """One thread restarting whatever of `cluster` exits on its own; `emit(kind, **fields)`
    records what it saw and did (the cluster's `supervisor` event log)."""

    def __init__(self, cluster: Supervised, emit: Callable[..., None], lock: threading.RLock,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.emit = emit
        self.lock = lock
        self.clock = clock
        self._stop = threading.Event()
        self._down: dict[str, _Down] = {}
        self._failures: dict[str, int] = {}
        self._thread = threading.Thread(target=self._loop, name="chaos-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before the cluster stops its processes, so none is restarted)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=MAX_DELAY)

    def _loop(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            for name in self.cluster.supervised():
                if self._stop.is_set():
                    return
                try:
                    self.check(name)
                except Exception as exc:  # noqa: BLE001 - a failed restart is retried after the next delay
                    self.emit("restart_failed", target=name, error=f"{type(exc).__name__}: {exc}")
                    down = self._down.get(name)
                    if down is not None:
                        down.since, down.failures = self.clock(), down.failures + 1

    def check(self, name: str) -> None:
        """One look at `name`: note an exit on its own, restart it once its delay has passed."""
        with self.lock:
            code = self.cluster.exit_code(name)
            if code is None or self.cluster.held(name):
                self._down.pop(name, None)
                return
            now = self.clock()
            down = self._down.get(name)
            if down is None:
                started = self.cluster.started_at(name)
                lived = now - started if started is not None else None
                failures = 0 if lived is not None and lived >= HEALTHY_AFTER else self._failures.get(name, 0) + 1
                self._failures[name] = failures
                down = self._down[name] = _Down(now, code, failures)
                self.emit("exit", target=name, exit_code=code, lived=None if lived is None else round(lived, 3),
                          restart=code != FATAL_EXIT)
            if code == FATAL_EXIT:
                return  # refused, or its task cannot load: a restart would only fail again
            delay = restart_backoff(BASE_DELAY, down.failures, MAX_DELAY)
            if now - down.since < delay:
                return
            self.cluster.respawn(name)
            self._down.pop(name, None)
            self.emit("restart", target=name, exit_code=code, delay=round(now - down.since, 3),
                      failures=down.failures, by="supervisor")
