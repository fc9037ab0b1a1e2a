"""Local OS processes the harness starts, signals, and cleans up after a crash.

Every process runs in its own session (process group), so a kill or a pause reaches all
of its threads and children. Each started process is written to a registry file with its
kernel start time; a later run reads the registry and kills what an earlier run that
died (even by SIGKILL) left behind, without ever touching a recycled PID.
"""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .filelock import flocked

if TYPE_CHECKING:
    from .spares import SparePool


def log_tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a process's log, indented, for an error message (its own
    words, e.g. argparse's reason for exit code 2); a note if there is no log."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"    (no log: {exc.strerror or exc})"
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in kept) if kept else "    (the log is empty)"


def islands_home() -> Path:
    return Path(os.environ.get("ISLANDS_HOME", str(Path.home() / ".cache" / "islands")))


def proc_start_time(pid: int) -> int | None:
    """Kernel start time of `pid` in clock ticks, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def proc_state(pid: int) -> str | None:
    """One-letter process state (R, S, T for stopped, Z...), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def proc_parent(pid: int) -> int | None:
    """Parent PID of `pid`, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def signal_pid(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    popen: subprocess.Popen | None = None
    started_at: float | None = None  # monotonic time of the last start

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def exit_code(self) -> int | None:
        """Its exit status once it has exited, else None (running, or never started)."""
        return self.popen.poll() if self.popen is not None else None

    def paused(self) -> bool:
        return self.running() and proc_state(self.popen.pid) == "T"

    def start(self, spares: "SparePool | None" = None) -> None:
        """Start cold, or turn a warm spare from `spares` into this process when it can."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.started_at = time.monotonic()
        self.popen = spares.take(self.argv, self.env, self.log) if spares is not None else None
        if self.popen is not None:
            return
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)

    def signal(self, sig: int) -> bool:
        if not self.running():
            return False
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> bool:
        killed = self.signal(signal.SIGKILL)
        if self.popen is not None:
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        return killed

    def terminate(self, timeout: float) -> int | None:
        """SIGCONT then SIGTERM (a stopped process cannot act on SIGTERM), then SIGKILL."""
        if not self.running():
            return self.popen.returncode if self.popen is not None else None
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.returncode


def start_recorded(name: str, argv: list[str], log_dir: Path, env: dict[str, str],
                   registry: "Registry", spares: "SparePool | None" = None) -> ManagedProcess:
    """Start `argv` (from a warm spare when `spares` has one) logging to LOG_DIR/<name>.log
    and record it, so a later run can reap it."""
    proc = ManagedProcess(name, argv, log_dir / f"{name}.log", env)
    proc.start(spares)
    registry.record(proc)
    return proc


LOCK_TIMEOUT = 30.0  # a registry update takes milliseconds; longer means a stuck holder


class Registry:
    """The processes one cluster started, in a file of its own naming its owner (PID, kernel
    start time, run directory): `local/<name>-<owner pid>-<n>.json` under the islands home.

    `reap_leftovers` kills the processes of clusters of the same name whose owner is gone (a
    run that crashed or was SIGKILLed before it could stop them), and never those of a live
    owner: two runs on one machine at once used to share one file, and the second to start
    killed the first's syncer and learners.

    Every read-modify-write of a file holds a thread lock and an flock on its sibling
    `.lock` file: warm spares are recorded from the pool's refills while the controller
    records restarts, and two runs starting together may reap one dead run's file at once."""

    _numbers = itertools.count(1)  # next() is atomic: two clusters made at once get two files

    def __init__(self, name: str, run_dir: str | os.PathLike | None = None) -> None:
        self.name = name
        self.owner = os.getpid()
        self.owner_start = proc_start_time(self.owner)
        self.run_dir = str(Path(run_dir).resolve()) if run_dir is not None else None
        self.path = islands_home() / "local" / f"{name}-{self.owner}-{next(Registry._numbers)}.json"
        self._lock = threading.Lock()

    @property
    def lock_path(self) -> Path:
        return _lock_path(self.path)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock, flocked(self.lock_path, LOCK_TIMEOUT):
            yield

    @staticmethod
    def _load(path: Path) -> dict:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {"processes": []}
        return data if isinstance(data, dict) else {"processes": data}  # a file from before owners: orphaned

    def entries(self) -> list[dict]:
        """The processes this cluster recorded: name, pid, start (clock ticks since boot), argv."""
        return self._load(self.path)["processes"]

    def record(self, proc: ManagedProcess) -> None:
        self.record_pid(proc.name, proc.pid, proc.argv)

    def record_pid(self, name: str, pid: int, argv: list[str]) -> None:
        """Record `name` as `pid`; an entry with the same name or PID (a spare that became
        this process) is replaced."""
        with self._locked():
            entries = [e for e in self.entries() if e["name"] != name and e["pid"] != pid]
            entries.append({"name": name, "pid": pid, "start": proc_start_time(pid), "argv": argv[:4]})
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"owner": self.owner, "owner_start": self.owner_start,
                                       "run_dir": self.run_dir, "processes": entries}))
            os.replace(tmp, self.path)

    def close(self) -> None:
        """The cluster stopped what it started: nothing of it is left to reap."""
        with self._locked():
            self.path.unlink(missing_ok=True)
            self.lock_path.unlink(missing_ok=True)

    def _ours(self, path: Path) -> bool:
        """A registry file of this name (`islands` is not `islands-test`), not this one's."""
        parts = path.stem.rsplit("-", 2)
        named = path.stem == self.name or (len(parts) == 3 and parts[0] == self.name
                                           and parts[1].isdigit() and parts[2].isdigit())
        return named and path != self.path

    def orphaned(self) -> list[Path]:
        """Registry files of this name whose owner process is gone."""
        return [path for path in sorted(self.path.parent.glob(f"{self.name}*.json"))
                if self._ours(path) and not _owner_alive(self._load(path))]

    def reap_leftovers(self, timeout: float = 10.0) -> list[str]:
        """Kill the processes that runs of this name left running when their owner died;
        returns their names. Each file is reaped under its lock and judged again there, so
        of two runs starting together only one reaps it."""
        killed = []
        for path in self.orphaned():
            with flocked(_lock_path(path), LOCK_TIMEOUT):
                data = self._load(path) if path.exists() else None
                if data is None or _owner_alive(data):
                    continue  # another run reaped it first
                killed += _kill_recorded(data["processes"], timeout)
                path.unlink(missing_ok=True)
                _lock_path(path).unlink(missing_ok=True)
        return killed


def _lock_path(path: Path) -> Path:
    return path.with_suffix(".lock")


def _owner_alive(data: dict) -> bool:
    """Whether the run that wrote a registry file still runs: its owner PID started at the
    recorded time. A file from before owners has none and counts as dead."""
    owner = data.get("owner")
    if owner is None:
        return False
    start = proc_start_time(int(owner))
    if data.get("owner_start") is None:
        return start is not None  # start unknown: alive while the PID is, never reaped by mistake
    return start == data.get("owner_start")


def _kill_recorded(entries: list[dict], timeout: float) -> list[str]:
    """SIGKILL the process group of every entry still running as recorded (never a PID now
    someone else's), then wait up to `timeout` s for them to go; their names."""
    killed, signalled = [], []
    for e in entries:
        pid, start = int(e["pid"]), e.get("start")
        if start is None or proc_start_time(pid) != start:
            continue  # gone, or the PID now belongs to someone else
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
        killed.append(f"{e['name']} (pid {pid})")
        signalled.append((pid, start))
    deadline = time.monotonic() + timeout
    for pid, start in signalled:
        while proc_start_time(pid) == start and proc_state(pid) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
    return killed
