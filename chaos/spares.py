"""A pool of warm spare processes that a restart takes instead of starting Python cold.

Each spare (chaos/spare_main.py) has already imported and warmed the modules a role
needs; taking one sends it the role's command line and hands back its Popen, so the
caller holds the process exactly as if it had started it. The pool refills itself as
soon as a spare is taken: the refill's imports run while the taken spare starts its
role, never on the restart's critical path. A command the pool cannot serve (another
interpreter or environment, or none left) starts cold, as before.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

SPARE_SCRIPT = Path(__file__).with_name("spare_main.py")


class SparePool:
    """`size` spares of interpreter `python`, started with environment `env` and
    warmed by importing `preload`; their own output goes to `log`."""

    def __init__(self, python: str, env: dict[str, str], preload: list[str], log: Path, size: int,
                 on_start=None) -> None:
        if size < 0:
            raise ValueError(f"size: must be >= 0, got {size}")
        self.python = str(python)
        self.env = dict(env)
        self.preload = list(preload)
        self.log = Path(log)
        self.size = size
        self.on_start = on_start  # called with each new spare's Popen (the registry records it)
        self.idle: list[subprocess.Popen] = []
        self.closed = False
        self.taken = 0
        self._lock = threading.RLock()  # restarts of two targets at once (the controller's workers)

    def start(self) -> None:
        self._refill()

    def _refill(self) -> None:
        with self._lock:
            self._refill_locked()

    def _refill_locked(self) -> None:
        self.idle = [p for p in self.idle if p.poll() is None]  # a spare that died is replaced
        while not self.closed and len(self.idle) < self.size:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log, "ab") as out:
                popen = subprocess.Popen([self.python, str(SPARE_SCRIPT), "--preload", ",".join(self.preload)],
                                         env=self.env, stdin=subprocess.PIPE, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            self.idle.append(popen)
            if self.on_start is not None:
                self.on_start(popen)

    def serves(self, argv: list[str], env: dict[str, str]) -> bool:
        """A spare can become `argv` only under the same interpreter and environment it
        was started with (imports may read the environment)."""
        return not self.closed and self.size > 0 and len(argv) >= 2 and argv[0] == self.python and env == self.env

    def take(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen | None:
        """A live spare turned into `argv` (its output appended to `log`), or None."""
        if not self.serves(argv, env):
            return None
        with self._lock:
            return self._take_locked(argv, env, log)

    def _take_locked(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen | None:
        while self.idle:
            popen = self.idle.pop(0)
            if popen.poll() is not None:
                continue
            request = json.dumps({"argv": argv[1:], "env": env, "log": str(log), "cwd": os.getcwd()}) + "\n"
            try:
                popen.stdin.write(request.encode())
                popen.stdin.close()
            except (BrokenPipeError, OSError):
                continue  # it died between poll and write: try the next one
            self.taken += 1
            self._refill()
            return popen
        self._refill()
        return None

    def close(self, timeout: float = 10.0) -> None:
        """Kill the idle spares (they hold nothing) and reap them."""
        with self._lock:  # no refill can start one after this
            self.closed = True
            idle, self.idle = self.idle, []
        for popen in idle:
            try:
                os.killpg(popen.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
        for popen in idle:
            try:
                popen.stdin.close()
            except OSError:
                pass
            try:
                popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass


def start_spares(python: str, env: dict[str, str], preload: list[str], log_dir: Path, size: int,
                 registry) -> SparePool | None:
    """A started pool of `size` spares (None for 0), each recorded in `registry` (a
    chaos.processes.Registry) so a later run reaps the spares of one that died."""
    if not size:
        return None
    pool = SparePool(python, env, preload, log_dir / "spares.log", size,
                     on_start=lambda popen: registry.record_pid(f"spare-{popen.pid}", popen.pid, ["spare"]))
    pool.start()
    return pool
