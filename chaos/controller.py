"""The controller: applies a schedule to a running cluster on one monotonic clock.

It records every action as actually done (planned time, real time, what was done, any
error) into a JSONL history, and it always heals: heal-all runs at start (to clean up
after a crashed earlier run), at the normal end, on an exception, and on SIGINT/SIGTERM.
Each fault kind's nemesis (chaos/nemesis/) does the injecting; like Jepsen's nemesis it
only injects, and deciding whether the system coped is the checkers' job.
"""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from faults import Event, Schedule
from trainer.signals import set_on_signal

from .backends.base import Cluster
from .nemesis import nemesis_for

HISTORY_FILE = "history.jsonl"
# When the final heal had something to undo (a fault still in force at the end, e.g. a
# kill with restart: false), the cluster trains this long before the run ends. Without it
# a syncer restarted by the final heal would be stopped at once, and every check that
# judges the state after the last heal (converged, final loss, rejoined) would judge a
# cluster that never had a chance to recover.
SETTLE_AFTER_FINAL_HEAL = 15.0


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while a schedule was running."""


class History:
    """Append-only JSONL, flushed per line, readable after a crash."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def record(self, **fields: Any) -> dict:
        entry = {"t": time.monotonic(), "wall": time.time(), **fields}
        with self._lock:
            self._fh.write(json.dumps(entry, default=str) + "\n")
        return entry

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def read_history(path: str | Path) -> list[dict]:
    out = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.endswith("\n"):
                    out.append(json.loads(line))
    except FileNotFoundError:
        pass
    return out


def describe_fault(fault: Any) -> dict:
    return fault.to_dict()


class Controller:
    def __init__(self, cluster: Cluster, schedule: Schedule, history: History,
                 clock: Callable[[], float] = time.monotonic, settle: float = SETTLE_AFTER_FINAL_HEAL) -> None:
        self.cluster = cluster
        self.settle = settle
        self.schedule = schedule
        self.history = history
        self.clock = clock
        self._stop = threading.Event()
        self.errors: list[str] = []

    # ----------------------------------------------------------- healing
    def heal(self, reason: str) -> list[str]:
        try:
            done = self.cluster.heal_all()
            self.history.record(event="heal", reason=reason, did=done, ok=True)
            return done
        except Exception as exc:  # noqa: BLE001 - recorded; healing is retried at the end
            self.history.record(event="heal", reason=reason, ok=False, error=f"{type(exc).__name__}: {exc}")
            self.errors.append(f"heal ({reason}): {exc}")
            return []

    # ----------------------------------------------------------- actions
    def apply(self, event: Event, t0: float) -> dict:
        started = self.clock()
        try:
            nemesis = nemesis_for(event.fault)  # an unknown kind is recorded like any failed action
            did = (nemesis.start if event.action == "start" else nemesis.stop)(self.cluster, event.fault)
            ok, error = True, None
        except Exception as exc:  # noqa: BLE001 - recorded in the history, the run goes on
            did, ok, error = None, False, f"{type(exc).__name__}: {exc}"
            self.errors.append(f"faults[{event.index}] {event.action}: {error}")
        return self.history.record(event=event.action, index=event.index, kind=event.fault.kind,
                                   fault=describe_fault(event.fault), planned=event.time,
                                   at=round(started - t0, 4), took=round(self.clock() - started, 4),
                                   did=did, ok=ok, error=error)

    # ----------------------------------------------------------- the run
    def _wait_until(self, deadline: float) -> None:
        while not self._stop.is_set():
            remaining = deadline - self.clock()
            if remaining <= 0:
                return
            self._stop.wait(min(remaining, 0.5))
        raise Interrupted("stopped by a signal")

    def run(self, duration: float, heal_first: bool = True) -> list[dict]:
        """Apply the schedule, wait out `duration` seconds from t0, heal. Returns the history entries."""
        handlers = self._install_signal_handlers()
        entries = []
        try:
            if heal_first:
                self.heal("start")
            t0 = self.clock()
            self.history.record(event="begin", seed=self.schedule.seed, faults=len(self.schedule.faults),
                                duration=duration)
            events = self.schedule.events()
            for event in events:
                self._wait_until(t0 + event.time)
                entries.append(self.apply(event, t0))
            self._wait_until(self._end(t0, duration, events))
            if self.heal("end") and self.settle > 0:
                self.history.record(event="settle", seconds=self.settle)
                self._wait_until(self.clock() + self.settle)
        except Interrupted:
            self.heal("signal")
            raise
        except BaseException:
            self.heal("exception")
            raise
        finally:
            self._restore_signal_handlers(handlers)
            self.history.record(event="end", errors=self.errors)
        return entries

    def _end(self, t0: float, duration: float, events: list) -> float:
        """When the run ends: `duration` after t0, and never sooner than the planned tail
        (duration − the last action's time) after the last action really finished. On a
        loaded machine a restart can take 10 s and push every later action back; without
        this, the time left to recover after the last fault, which the checks judge, would
        shrink to nothing."""
        planned = t0 + duration
        if not events:
            return planned
        tail = max(0.0, duration - events[-1].time)
        end = max(planned, self.clock() + tail)
        if end > planned + 0.5:
            self.history.record(event="tail", planned_end=round(duration, 3), extended_by=round(end - planned, 3),
                                tail=round(tail, 3))
        return end

    def interrupt(self) -> None:
        self._stop.set()

    def _install_signal_handlers(self) -> dict:
        saved = {}
        if threading.current_thread() is not threading.main_thread():
            return saved
        for sig in (signal.SIGINT, signal.SIGTERM):
            saved[sig] = signal.signal(sig, set_on_signal(self._stop))  # no lock inside the handler
        return saved

    @staticmethod
    def _restore_signal_handlers(saved: dict) -> None:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
