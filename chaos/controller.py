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
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from faults import Event, Schedule
from faults.schedule import stays_down
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
# Proxy API calls: a per-call timeout of this many measured round trips, at least
# MIN_CALL_TIMEOUT s (the default client's 5 s, bounded below so a fast machine's 2 ms
# round trip does not make a 40 ms timeout); a stop retries for STOP_DEADLINE s and a heal
# for HEAL_DEADLINE s (a proxy SIGSTOPped for 20 s mid-run is waited for, not given up on).
CALL_TIMEOUT_RTTS = 50
MIN_CALL_TIMEOUT = 2.0
STOP_DEADLINE = 60.0
HEAL_DEADLINE = 120.0
SIGNAL_HEAL_DEADLINE = 10.0  # ^C: heal promptly, the user is waiting
# How long a stopped run waits for a worker inside an action to finish it: the longest
# action is a restart waiting for its process to listen (chaos/backends/local.py START_TIMEOUT).
WORKER_JOIN_SECONDS = 95.0


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while a schedule was running."""


class History:
    """Append-only JSONL, flushed per line, readable after a crash. Stamped with this
    machine's clocks, or a simulator's (chaos/sim)."""

    def __init__(self, path: str | Path, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()
        self._monotonic, self._wall = monotonic, wall

    def record(self, **fields: Any) -> dict:
        entry = {"t": self._monotonic(), "wall": self._wall(), **fields}
        with self._lock:
            self._fh.write(json.dumps(entry, default=str) + "\n")
        return entry

    def close(self) -> None:
        with self._lock:
            self._fh.close()


class MemoryHistory:
    """A History kept in memory, each entry as read_history() would read it back (the
    simulator's exploration judges a run without writing it)."""

    def __init__(self, monotonic: Callable[[], float], wall: Callable[[], float]) -> None:
        self.entries: list[dict] = []
        self._monotonic, self._wall = monotonic, wall

    def record(self, **fields: Any) -> dict:
        entry = {"t": self._monotonic(), "wall": self._wall(), **fields}
        self.entries.append(json.loads(json.dumps(entry, default=str)))  # a few a run: the round trip itself
        return entry

    def close(self) -> None:
        pass


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
    """Applies a schedule on its own clock: each fault in a worker of its own.

    A slow action (a syncer restart waits seconds for it to listen, an API call a starved
    proxy answers late) holds up only the faults on the same thing: a fault waits for the
    one before it on its process or link (``Schedule.predecessors``) and for nothing else.
    One loop that applied every action in turn started a latency fault due during a 3.6 s
    syncer restart that late, and still stopped it on time: 0.36 s of its 3 s in force.
    """

    def __init__(self, cluster: Cluster, schedule: Schedule, history: History,
                 clock: Callable[[], float] = time.monotonic, settle: float = SETTLE_AFTER_FINAL_HEAL) -> None:
        self.cluster = cluster
        self.settle = settle
        self.schedule = schedule
        self.history = history
        self.clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._crashed: BaseException | None = None
        self.api: dict = {}  # the proxy API's measured round trip and the call timeout sized from it
        self.errors: list[str] = []

    # ----------------------------------------------------------- healing
    def heal(self, reason: str, deadline: float = 0.0) -> list[str]:
        """Heal everything; with a `deadline` (seconds), retry until it has passed: a final
        heal that cannot reach the proxy (starved, or stopped) waits for it rather than
        leave the links cut. What stayed unhealed is recorded with the failure."""
        attempts, until = 0, self.clock() + deadline
        while True:
            attempts += 1
            try:
                with self._api_deadline(max(0.0, until - self.clock())):
                    done = self.cluster.heal_all()
                extra = {"attempts": attempts} if attempts > 1 else {}
                self.history.record(event="heal", reason=reason, did=done, ok=True, **extra)
                return done
            except Exception as exc:  # noqa: BLE001 - recorded; the run goes on to its checks
                if self.clock() < until and not self._stop.is_set():
                    self._stop.wait(min(1.0, max(0.0, until - self.clock())))
                    continue
                error = f"{type(exc).__name__}: {exc}"
                self.history.record(event="heal", reason=reason, ok=False, error=error, attempts=attempts,
                                    unhealed=self._in_force())
                self._error(f"heal ({reason}): {exc}")
                return []

    def _in_force(self) -> list[str]:
        """The faults whose start worked and whose stop did not (or has not come): what a heal
        that failed left in place."""
        entries = read_history(self.history.path)
        stopped = {e["index"] for e in entries if e.get("event") == "stop" and e.get("ok")}
        return [f"faults[{e['index']}] {e.get('kind')} {', '.join(e['fault'].get('targets') or [e['fault'].get('target')])}"
                for e in entries if e.get("event") == "start" and e.get("ok") and e["index"] not in stopped]

    @contextmanager
    def _api_deadline(self, seconds: float) -> Iterator[None]:
        """Calls to the proxy's API from this thread retry until `seconds` have passed."""
        client = getattr(self.cluster, "toxiproxy", None)
        if client is None or not hasattr(client, "within") or seconds <= 0:
            yield
            return
        with client.within(seconds):
            yield

    def _size_api_calls(self) -> None:
        """The proxy API's per-call timeout from its measured round trip (median of a few
        GET /version): CALL_TIMEOUT_RTTS round trips, never under MIN_CALL_TIMEOUT s."""
        client = getattr(self.cluster, "toxiproxy", None)
        if client is None or not hasattr(client, "version"):
            return
        rtts = []
        for _ in range(3):
            started = self.clock()
            try:
                client.version()
            except Exception:  # noqa: BLE001 - an unreachable proxy is met, and recorded, by the faults
                return
            rtts.append(self.clock() - started)
        rtt = sorted(rtts)[1]
        client.timeout = round(max(MIN_CALL_TIMEOUT, CALL_TIMEOUT_RTTS * rtt), 3)
        self.api = {"round_trip": round(rtt, 4), "call_timeout": round(client.timeout, 3)}

    def _error(self, message: str) -> None:
        with self._lock:
            self.errors.append(message)

    # ----------------------------------------------------------- actions
    def apply(self, event: Event, t0: float, waited: dict | None = None) -> dict:
        """Do one action now and record it: when it was planned, when it was issued (`at`)
        and how long it took, all on the schedule's clock. A start's calls to the proxy
        retry until the fault's planned end (past it, it would be in force for nothing); a
        stop's for STOP_DEADLINE s, since a fault left in force spoils the rest of the run."""
        started = self.clock()
        shift = float((waited or {}).get("shifted_by") or 0.0)
        budget = (t0 + event.fault.end + shift - started) if event.action == "start" else STOP_DEADLINE
        try:
            nemesis = nemesis_for(event.fault)  # an unknown kind is recorded like any failed action
            with self._api_deadline(budget):
                did = (nemesis.start if event.action == "start" else nemesis.stop)(self.cluster, event.fault)
            ok, error = True, None
        except Exception as exc:  # noqa: BLE001 - recorded in the history, the run goes on
            did, ok, error = None, False, f"{type(exc).__name__}: {exc}"
            self._error(f"faults[{event.index}] {event.action}: {error}")
        extra = {"waited_for": waited} if waited else {}
        if ok and event.action == "start" and (units := nemesis.affected(self.cluster, event.fault)) is not None:
            extra["units"] = units  # what a node fault hit: the checks judge their recovery
        return self.history.record(event=event.action, index=event.index, kind=event.fault.kind,
                                   fault=describe_fault(event.fault), planned=event.time,
                                   at=round(started - t0, 4), took=round(self.clock() - started, 4),
                                   did=did, ok=ok, error=error, **extra)

    def _fault_worker(self, index: int, fault: Any, t0: float, before: list[int],
                      done: dict[int, threading.Event], entries: list[dict]) -> None:
        """One fault: start it when due (once the fault before it on the same thing is
        over), stop it when due. Stops regardless of the start's outcome: a start that
        failed half way (one of two links cut) must still be undone."""
        try:
            self._wait_until(t0 + fault.at)
            waited, shift = None, 0.0
            pending = [i for i in before if not done[i].is_set()]
            if pending:
                since = self.clock()
                for i in pending:
                    self._wait_for(done[i])
                # A fault before it on the same target still held it (a restart is slow):
                # this one starts once those are over, and keeps its whole duration.
                shift = max(0.0, self.clock() - (t0 + fault.at))
                waited = {"fault": pending[-1], "faults": pending, "seconds": round(self.clock() - since, 4),
                          "shifted_by": round(shift, 4)}
            starting = self.apply(Event(fault.at, "start", index, fault), t0, waited)
            with self._lock:
                entries.append(starting)
            if stays_down(fault):
                return  # down until the final heal
            self._wait_until(t0 + fault.end + shift)
            stopping = self.apply(Event(fault.end, "stop", index, fault), t0)
            with self._lock:
                entries.append(stopping)
        except Interrupted:
            return
        except BaseException as exc:  # a bug of the harness: the run stops, healed, and says why
            self._crashed = exc
            self._stop.set()
        finally:
            done[index].set()

    def _apply_schedule(self, t0: float) -> list[dict]:
        """Every fault in its own worker; returns the history entries once all are done."""
        faults = self.schedule.faults
        before = self.schedule.predecessors()
        done = {i: threading.Event() for i in range(len(faults))}
        entries: list[dict] = []
        workers = [threading.Thread(target=self._fault_worker, args=(i, f, t0, before.get(i, []), done, entries),
                                    name=f"chaos-fault-{i}", daemon=True) for i, f in enumerate(faults)]
        for worker in workers:
            worker.start()
        try:
            for i in range(len(faults)):
                self._wait_for(done[i])
        finally:
            # Stopped early (a signal, a worker's crash): the workers still inside an action
            # finish it before anything heals or stops the cluster, which would otherwise race
            # a restart in flight (a syncer started after the cluster stopped, left running).
            for worker in workers:
                worker.join(timeout=WORKER_JOIN_SECONDS)
            if self._crashed is not None:
                raise self._crashed
        with self._lock:
            return sorted(entries, key=lambda e: e["t"])

    # ----------------------------------------------------------- the run
    def _wait_until(self, deadline: float) -> None:
        while not self._stop.is_set():
            remaining = deadline - self.clock()
            if remaining <= 0:
                return
            self._stop.wait(min(remaining, 0.5))
        raise Interrupted("stopped by a signal")

    def _wait_for(self, flag: threading.Event) -> None:
        while not flag.wait(0.2):
            if self._stop.is_set():
                raise Interrupted("stopped by a signal")

    def run(self, duration: float, heal_first: bool = True) -> list[dict]:
        """Apply the schedule, wait out `duration` seconds from t0, heal. Returns the history entries."""
        handlers = self._install_signal_handlers()
        entries: list[dict] = []
        try:
            if heal_first:
                self.heal("start", deadline=HEAL_DEADLINE)
            self._size_api_calls()
            t0 = self.clock()
            self.history.record(event="begin", seed=self.schedule.seed, faults=len(self.schedule.faults),
                                duration=duration, tolerance=getattr(self.cluster, "action_tolerance", None),
                                **({"api": self.api} if self.api else {}))
            entries = self._apply_schedule(t0)
            self._wait_until(self._end(t0, duration, entries))
            if self.heal("end", deadline=HEAL_DEADLINE) and self.settle > 0:
                self.history.record(event="settle", seconds=self.settle)
                self._wait_until(self.clock() + self.settle)
        except Interrupted:
            self.heal("signal", deadline=SIGNAL_HEAL_DEADLINE)
            raise
        except BaseException:
            self.heal("exception", deadline=SIGNAL_HEAL_DEADLINE)
            raise
        finally:
            self._restore_signal_handlers(handlers)
            self.history.record(event="end", errors=self.errors)
        return entries

    def _end(self, t0: float, duration: float, entries: list[dict]) -> float:
        """When the run ends: `duration` after t0, and never sooner than the planned tail
        (duration − the last action's planned time) after the last action really finished.
        On a loaded machine a restart can take 10 s; without this, the time left to
        recover after the last fault, which the checks judge, would shrink to nothing."""
        planned = t0 + duration
        if not entries:
            return planned
        last = max(entries, key=lambda e: (e["planned"], e["at"]))
        tail = max(0.0, duration - last["planned"])
        finished = t0 + max(e["at"] + e["took"] for e in entries)  # on the controller's own clock
        end = max(planned, finished + tail)
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
