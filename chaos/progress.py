"""What a chaos run is doing, printed as it happens: `chaos run`, `replay` and `demo` are
otherwise silent for the minute or more a run takes.

It reads only the files the run writes (`events/*.jsonl`, `history.jsonl`), so it needs no
hook in the controller or the backends: a line when every learner trains, one per fault
as it starts and stops, what each heal did, and a heartbeat (version, loss, who is
stepping) when nothing else was said for a while.
"""
from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable, TextIO

POLL_SECONDS = 1.0
HEARTBEAT_SECONDS = 10.0
STEPPING_WINDOW = 3.0  # a learner whose last inner step is older than this is not stepping
STOP_JOIN_SECONDS = 5.0


class JsonlTail:
    """The complete lines appended to one JSONL file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        out = []
        for line in complete.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


def describe_fault(fault: dict) -> str:
    """`kill learner-1`, `partition learner-2, learner-3`, from a history entry's fault."""
    target = fault.get("target") or ", ".join(fault.get("targets") or [])
    return f"{fault.get('kind', '?')} {target}".strip()


class RunProgress:
    """Turns a run directory's new lines into progress lines; `poll()` is the whole logic."""

    def __init__(self, run_dir: Path, learners: int, heartbeat: float = HEARTBEAT_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run_dir = Path(run_dir)
        self.learners = learners
        self.heartbeat = heartbeat
        self.clock = clock
        self.created = clock()
        self.history = JsonlTail(self.run_dir / "history.jsonl")
        self.events: dict[Path, JsonlTail] = {}
        self.last_step: dict[int, float] = {}
        self.loss: dict[int, float] = {}
        self.version = 0
        self.rounds = 0
        self.t0: float | None = None  # the schedule's clock start (history "begin")
        self.all_training = False
        self.ended = False  # the schedule is done: the heartbeat says what the run does instead
        self.phase: tuple[str, float] | None = None  # what the run does after its schedule, and since when
        self.last_said = clock()

    def _when(self, t: float) -> str:
        """On the schedule's clock once it started (as the history's `at`), else since start-up."""
        if self.t0 is None:
            return f"{t - self.created:5.1f} s after start"
        return f"t={t - self.t0:5.1f} s"

    def _read_events(self) -> None:
        for path in sorted((self.run_dir / "events").glob("*.jsonl")):
            tail = self.events.setdefault(path, JsonlTail(path))
            for e in tail.read():
                kind = e.get("kind")
                if kind == "inner_step" and e.get("learner") is not None:
                    self.last_step[int(e["learner"])] = float(e["t"])
                    try:
                        self.loss[int(e["learner"])] = float(e["loss"])
                    except (TypeError, ValueError):
                        pass
                elif kind == "merge":
                    self.version = max(self.version, int(e.get("version", 0)))
                elif kind == "sync_step":
                    self.rounds = max(self.rounds, int(e.get("round", 0)) + 1)

    def _history_line(self, entry: dict) -> str | None:
        what = entry.get("event")
        if what == "begin":
            self.t0 = float(entry["t"])
            return (f"schedule started: {entry.get('faults', 0)} fault(s), "
                    f"{float(entry.get('duration', 0)):.0f} s on the schedule's clock")
        if what in ("start", "stop"):
            verb = "started" if what == "start" else "stopped"
            head = f"faults[{entry.get('index')}] {describe_fault(entry.get('fault') or {})} {verb}"
            if not entry.get("ok", True):
                return f"{head}: FAILED: {entry.get('error')}"
            return f"{head}: {entry.get('did')}"
        if what == "heal":
            if not entry.get("ok", True):
                return f"heal ({entry.get('reason')}) FAILED: {entry.get('error')}"
            did = entry.get("did") or []
            return f"heal ({entry.get('reason')}): {'; '.join(did)}" if did else None
        if what == "settle":
            return f"the final heal undid a fault: training {entry.get('seconds')} s more before stopping"
        if what == "cleanup":
            return f"cleaned up what a crashed earlier run left: {', '.join(entry.get('killed') or [])}"
        if what == "end":
            self.ended = True
            errors = entry.get("errors") or []
            tail = f" ({len(errors)} error(s))" if errors else ""
            return f"schedule done{tail}; stopping the cluster and checking the run"
        return None

    def _pulse(self) -> str:
        now = self.clock()
        stepping = sorted(n for n, t in self.last_step.items() if now - t <= STEPPING_WINDOW)
        names = ", ".join(f"learner-{n}" for n in stepping) or "none"
        loss = f"{statistics.fmean(self.loss.values()):.3f}" if self.loss else "…"
        clock = f"version {self.version}" if self.rounds == 0 else f"round {self.rounds}"
        return f"{clock}, training loss {loss}, stepping: {names}"

    def poll(self) -> list[str]:
        """New progress lines since the last call (each already prefixed with its time)."""
        self._read_events()
        now = self.clock()
        lines: list[str] = []

        def say(t: float, text: str) -> None:
            lines.append(f"chaos: {self._when(t)}  {text}")

        if not self.all_training:
            trained = [n for n in self.last_step if 1 <= n <= self.learners]
            if len(trained) >= self.learners:
                self.all_training = True
                say(max(self.last_step[n] for n in trained), f"every learner is training ({self.learners} learners)")
        for entry in self.history.read():
            text = self._history_line(entry)  # before say(): a "begin" starts the schedule's clock
            if text:
                say(float(entry.get("t", now)), text)
        if not lines and now - self.last_said >= self.heartbeat:
            if self.phase is not None:
                text, since = self.phase
                say(now, f"{text} ({now - since:.0f} s so far)")
            elif self.ended:
                say(now, "stopping the cluster and checking the run")
            elif self.all_training:
                say(now, self._pulse())
            else:
                say(now, f"starting: {len(self.last_step)} of {self.learners} learners training so far")
        if lines:
            self.last_said = now
        return lines


    def set_phase(self, text: str) -> str:
        """What the run does now that its schedule is over (stopping, scoring, a reference
        run): the next heartbeats say it, with the time it has taken so far."""
        self.phase = (text, self.clock())
        self.last_said = self.clock()
        return f"chaos: {self._when(self.clock())}  {text}"


class ProgressPrinter:
    """Prints RunProgress's lines from a daemon thread while a run goes on (a context manager).

    The thread only reads files and sleeps, so it keeps its 10 s heartbeat on a loaded
    machine: the proxies, which used to share the controller's process and its GIL, run
    in a process of their own (chaos/backends/local.py)."""

    def __init__(self, progress: RunProgress, out: TextIO | None = None, poll: float = POLL_SECONDS) -> None:
        self.progress = progress
        self.out = out or sys.stdout
        self.poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-progress", daemon=True)

    def _emit(self) -> None:
        for line in self.progress.poll():
            print(line, file=self.out, flush=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self._emit()
            except OSError:  # a file vanished mid-read: the next poll sees the new state
                continue

    def phase(self, text: str) -> None:
        """Say what the run does now, at once, and keep saying it in the heartbeat."""
        print(self.progress.set_phase(text), file=self.out, flush=True)

    def __enter__(self) -> ProgressPrinter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(STOP_JOIN_SECONDS)
        if self._thread.is_alive():
            print(f"chaos: the progress printer did not stop within {STOP_JOIN_SECONDS:.0f} s", file=sys.stderr)
            return
        try:
            self._emit()  # what was written after the last poll (the end of the schedule)
        except OSError:
            pass
