"""Local OS processes the harness starts, signals, and cleans up after a crash.

Every process runs in its own session (process group), so a kill or a pause reaches all
of its threads and children. Each started process is written to a registry file with its
kernel start time; a later run reads the registry and kills what an earlier run that
died (even by SIGKILL) left behind, without ever touching a recycled PID.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def paused(self) -> bool:
        return self.running() and proc_state(self.popen.pid) == "T"

    def start(self, spares: "SparePool | None" = None) -> None:
        """Start cold, or turn a warm spare from `spares` into this process when it can."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
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


class Registry:
    """The processes one cluster started, in a file of its own with its owner's PID and start
    time: `local/<name>-<owner pid>-<n>.json` under the islands home.

    `reap_leftovers` kills the processes of clusters of the same name whose owner is gone (a
    run that crashed or was SIGKILLed before it could stop them), and never those of a live
    owner: two runs on one machine at once used to share one file, and the second to start
    killed the first's syncer and learners."""

    _instances = 0

    def __init__(self, name: str) -> None:
        Registry._instances += 1
        self.name = name
        self.owner = os.getpid()
        self.owner_start = proc_start_time(self.owner)
        self.path = islands_home() / "local" / f"{name}-{self.owner}-{Registry._instances}.json"

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
        entries = [e for e in self.entries() if e["name"] != name and e["pid"] != pid]
        entries.append({"name": name, "pid": pid, "start": proc_start_time(pid), "argv": argv[:4]})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"owner": self.owner, "owner_start": self.owner_start, "processes": entries}))
        os.replace(tmp, self.path)

    def orphaned(self) -> list[Path]:
        """Registry files of this name whose owner process is gone."""
        out = []
        for path in sorted(self.path.parent.glob(f"{self.name}*.json")):
            parts = path.stem.rsplit("-", 2)
            ours = path.stem == self.name or (len(parts) == 3 and parts[0] == self.name
                                              and parts[1].isdigit() and parts[2].isdigit())
            if path == self.path or not ours:
                continue
            data = self._load(path)
            owner = data.get("owner")
            if owner is not None and proc_start_time(int(owner)) == data.get("owner_start"):
                continue  # a live run's cluster: not ours to touch
            out.append(path)
        return out

    def reap_leftovers(self, timeout: float = 10.0) -> list[str]:
        """Kill the processes that runs of this name left running when their owner died;
        returns their names."""
        killed, reaped = [], []
        for path in self.orphaned():
            entries = self._load(path)["processes"]
            for e in entries:
                pid, start = int(e["pid"]), e.get("start")
                if start is None or proc_start_time(pid) != start:
                    continue  # gone, or the PID now belongs to someone else
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    continue
                killed.append(f"{e['name']} (pid {pid})")
            reaped.append((path, entries))
        deadline = time.monotonic() + timeout
        for path, entries in reaped:
            for e in entries:
                while proc_start_time(int(e["pid"])) == e.get("start") and proc_state(int(e["pid"])) not in (None, "Z"):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            path.unlink(missing_ok=True)
        return killed
