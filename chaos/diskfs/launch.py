"""Start, stop and power-cut a diskfs daemon from the harness or a test.

The daemon runs as its own process in its own session (a signal to the harness's group
does not reach it). `power_loss` SIGKILLs the daemon's pid only, not its group: libfuse's
`auto_unmount` leaves a `fusermount3` watcher in that group which unmounts the dead mount;
if it was killed too, or the mount lingers, `fusermount3 -uz` does it. Either way the mount
point is left usable for a new daemon. A harness that times the cut uses `cut_power` (the
signal only) and `reap_power_cut` later, before it mounts again.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..processes import log_tail, signal_pid
from . import mounts

ROOT = Path(__file__).resolve().parents[2]


class DiskfsError(RuntimeError):
    """The daemon did not start, stop or unmount as asked; the message says what did not happen."""


def ready_path(log_path: str | os.PathLike) -> Path:
    """Where `start_diskfs` asks the daemon to announce itself: beside its log."""
    log = Path(log_path)
    return log.with_name(log.name + ".ready")


def start_diskfs(backing: str | os.PathLike, mount: str | os.PathLike, control: str | os.PathLike,
                 log_path: str | os.PathLike, timeout: float = 30.0,
                 mode_file: str | os.PathLike | None = None) -> subprocess.Popen:
    """Start `python -m chaos.diskfs` and return once its mount answers (its ready file names
    its pid). DiskfsError with the log's tail if it exits first or is not ready in `timeout`."""
    log = Path(log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    ready = ready_path(log)
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "chaos.diskfs", "--backing", os.fspath(backing), "--mount", os.fspath(mount),
            "--control", os.fspath(control), "--ready-file", str(ready), "--foreground",
            *(["--mode-file", os.fspath(mode_file)] if mode_file is not None else [])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    with open(log, "ab") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if json.loads(ready.read_text()).get("pid") == popen.pid:
                return popen
        except (OSError, ValueError):
            pass
        if popen.poll() is not None:
            raise DiskfsError(f"diskfs at {mount} exited with status {popen.returncode} before its mount was "
                              f"ready; the end of {log}:\n{log_tail(log)}")
        if time.monotonic() >= deadline:
            power_loss(popen, mount)
            raise DiskfsError(f"diskfs at {mount} was not ready within {timeout:g} s (killed); "
                              f"the end of {log}:\n{log_tail(log)}")
        time.sleep(0.02)


def stop_diskfs(popen: subprocess.Popen, mount: str | os.PathLike, timeout: float = 15.0) -> int:
    """Clean stop: SIGTERM (the daemon flushes everything, unmounts and exits 0). If it has
    not exited within `timeout`: SIGKILL and a lazy unmount. Returns its exit status."""
    if popen.poll() is None:
        try:
            os.kill(popen.pid, signal.SIGCONT)  # a paused daemon cannot act on SIGTERM
            os.kill(popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            power_loss(popen, mount)
            return popen.returncode
    _release_mount(mount)
    return popen.returncode


def cut_power(popen: subprocess.Popen) -> None:
    """SIGKILL the daemon and return at once: from this moment it runs no instruction, so
    nothing more becomes durable; the power is off. Its teardown (seconds for a large
    process on a loaded machine) is `reap_power_cut`'s, before the mount is used again."""
    if popen.poll() is None:
        signal_pid(popen.pid, signal.SIGKILL)


def reap_power_cut(popen: subprocess.Popen, mount: str | os.PathLike, timeout: float = 10.0) -> None:
    """Wait for a daemon that `cut_power` killed to be gone and leave its mount point an
    ordinary, usable directory again."""
    try:
        popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DiskfsError(f"diskfs pid {popen.pid} at {mount} did not die within {timeout:g} s of SIGKILL") from None
    # At once, not after auto_unmount's watcher: under load it was seen to take 10 s; a
    # lazy unmount takes ms.
    _release_mount(mount, wait=0.0)


def power_loss(popen: subprocess.Popen, mount: str | os.PathLike, timeout: float = 10.0) -> None:
    """SIGKILL the daemon: what was not durable is gone (it lived only in the daemon's memory).
    Returns once the mount point is an ordinary, usable directory again."""
    cut_power(popen)
    reap_power_cut(popen, mount, timeout)


def _release_mount(mount: str | os.PathLike, wait: float = 5.0) -> None:
    """Wait (at most `wait` s) for auto_unmount's watcher to unmount `mount`, else unmount it lazily."""
    if not mounts.wait_unmounted(mount, wait):
        mounts.unmount(mount, lazy=True)
    if mounts.is_mounted(mount):
        raise DiskfsError(f"{mount} is still mounted after the daemon's end and fusermount3 -uz")
    try:
        os.listdir(mount)
    except OSError as exc:
        raise DiskfsError(f"{mount} is not a usable directory after the daemon's end: {exc}") from None
