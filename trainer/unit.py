"""A learner unit of several ranks: start them together, and restart them together.

`python -m trainer learner --ranks R` runs this supervisor, which starts R rank processes
(`--rank r`) joined through a fresh gloo file store. If any rank dies, whatever killed it,
the supervisor kills the others and starts a new generation of all R: rank 0 then says
HELLO again and the syncer sees a new incarnation that rejoins like any other learner.
A half-dead unit never trains on.

Each generation's rank PIDs go to RUN_DIR/units/learner-N.json (atomically), so a chaos
backend can kill or pause a single rank. The supervisor itself never imports torch.
"""
from __future__ import annotations

import ctypes
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .atomic import atomic_write_json
from .events import EventLog
from .signals import on_signal

MAX_GENERATIONS = 200        # restarts are bounded: a unit that cannot stay up gives up
RESTART_BACKOFF = (0.2, 5.0)  # seconds, doubled per consecutive failure, with jitter
STOP_TIMEOUT = 15.0          # after SIGTERM, ranks get this long to push and leave
FOLLOWER_GRACE = 5.0         # after rank 0 exits cleanly, the others get this long to follow
POLL = 0.05
HEALTHY_AFTER = 30.0         # a generation that lived this long resets the backoff
FATAL_EXIT = 3               # a rank that exits so was refused or found no syncer: no restart
_PR_SET_PDEATHSIG = 1


def restart_backoff(base: float, failures: int, cap: float) -> float:
    """The delay before a restart after `failures` short lives in a row: doubling from
    `base`, capped, so a unit (or a learner) failing at every start does not spin."""
    return min(cap, base * 2 ** max(0, failures - 1))


def units_file(run_dir: str | os.PathLike, learner: int) -> Path:
    """Where a unit publishes the PIDs of its current ranks."""
    return Path(run_dir) / "units" / f"learner-{learner}.json"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class UnitOptions:
    learner: int
    ranks: int
    run_dir: str | None
    log_dir: str | None = None   # each rank's output; default: inherit the supervisor's


class UnitSupervisor:
    def __init__(self, opts: UnitOptions, rank_argv: Callable[[int, str], list[str]]) -> None:
        self.opts = opts
        self.rank_argv = rank_argv
        self.stopping = threading.Event()
        self.events = EventLog(opts.run_dir, f"learner-{opts.learner}-unit", learner=opts.learner)
        self.procs: list[subprocess.Popen] = []

    # ----------------------------------------------------------------- signals
    def request_stop(self, *_: object) -> None:
        """SIGTERM: rank 0 pushes its residual progress and tells the others to stop."""
        self.stopping.set()
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass

    # ----------------------------------------------------------------- one generation
    def _spawn(self, generation: int, store: str) -> None:
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        self.procs = []
        for rank in range(self.opts.ranks):
            self.procs.append(subprocess.Popen(self.rank_argv(rank, store), env=env, stdin=subprocess.DEVNULL,
                                               preexec_fn=_die_with_parent))
        pids = [p.pid for p in self.procs]
        if self.opts.run_dir is not None:
            atomic_write_json(units_file(self.opts.run_dir, self.opts.learner),
                              {"learner": self.opts.learner, "supervisor": os.getpid(),
                               "generation": generation, "ranks": pids})
        self.events.emit("unit_start", generation=generation, ranks=pids)

    def _kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def _watch(self) -> tuple[str, int | None, int | None]:
        """Until the generation ends: ("done", ...), ("straggler", rank, None) or ("failed", rank, exit code)."""
        stop_deadline = leader_done_at = None
        while True:
            codes = [p.poll() for p in self.procs]
            for rank, code in enumerate(codes):
                if code not in (None, 0):
                    return "failed", rank, code
            if all(code == 0 for code in codes):
                return "done", None, None
            now = time.monotonic()
            if codes[0] == 0:  # rank 0 finished the unit's work; a rank that does not follow is killed
                leader_done_at = leader_done_at or now
                if now - leader_done_at > FOLLOWER_GRACE:
                    return "straggler", codes.index(None), None
            if self.stopping.is_set():
                stop_deadline = stop_deadline or now + STOP_TIMEOUT
                if now > stop_deadline:
                    return "failed", codes.index(None), None
            time.sleep(POLL)

    # ----------------------------------------------------------------- the unit
    def run(self) -> int:
        failures = 0
        for generation in range(MAX_GENERATIONS):
            started = time.monotonic()
            with tempfile.TemporaryDirectory(prefix=f"islands-unit-{self.opts.learner}-") as tmp:
                self._spawn(generation, os.path.join(tmp, "store"))
                outcome, rank, code = self._watch()
                self._kill_all()
            if outcome in ("done", "straggler"):
                reason = "clean" if outcome == "done" else f"rank {rank} did not follow rank 0 out; killed"
                self.events.emit("unit_stop", generation=generation, reason=reason)
                return 0
            self.events.emit("unit_failed", generation=generation, rank=rank, exit_code=code,
                             stopping=self.stopping.is_set())
            if self.stopping.is_set():
                return 1
            if code == FATAL_EXIT:  # refused, no syncer, a task that cannot load: so does the unit
                self.events.emit("unit_stop", generation=generation, reason=f"rank {rank} gave up")
                return FATAL_EXIT
            failures = 1 if time.monotonic() - started > HEALTHY_AFTER else failures + 1
            delay = restart_backoff(RESTART_BACKOFF[0], failures, RESTART_BACKOFF[1]) * random.uniform(0.5, 1.0)
            if self.stopping.wait(delay):
                return 1
            self.events.emit("unit_restart", generation=generation + 1, after_failure_of_rank=rank)
        self.events.emit("unit_stop", generation=MAX_GENERATIONS, reason="too many restarts")
        return 1


def run_unit(opts: UnitOptions, rank_argv: Callable[[int, str], list[str]]) -> int:
    supervisor = UnitSupervisor(opts, rank_argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        # From a thread: request_stop sets the Event the restart backoff waits on.
        signal.signal(sig, on_signal(supervisor.request_stop))
    try:
        return supervisor.run()
    finally:
        supervisor._kill_all()
        supervisor.events.close()
