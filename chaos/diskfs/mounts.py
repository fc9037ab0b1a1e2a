"""Whether a path is a mount point, and unmounting a FUSE mount (also one whose daemon died)."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def mount_type(path: str | os.PathLike) -> str | None:
    """The file system type mounted at `path` (e.g. `fuse.diskfs`), or None if it is no mount point."""
    target = os.path.realpath(path)
    found = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) >= 5 and _unescape(fields[4]) == target:
            found = right.split()[0] if right else "?"  # the last one listed is the one on top
    return found


def is_mounted(path: str | os.PathLike) -> bool:
    return mount_type(path) is not None


def is_dead(path: str | os.PathLike) -> bool:
    """A FUSE mount whose daemon is gone: stat fails with ENOTCONN."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


def unmount(mount: str | os.PathLike, lazy: bool = True, timeout: float = 10.0) -> None:
    """`fusermount3 -u [-z] mount`; nothing if `mount` is not mounted. RuntimeError if it
    stays mounted."""
    if not is_mounted(mount):
        return
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise RuntimeError(f"cannot unmount {mount}: fusermount3 is not installed")
    cmd = [tool, "-u", *(["-z"] if lazy else []), os.fspath(mount)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(cmd)} did not finish within {timeout:g} s") from None
    if done.returncode != 0 and is_mounted(mount):
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")


def wait_unmounted(mount: str | os.PathLike, timeout: float) -> bool:
    """True once `mount` is no mount point (polled), False if it still is after `timeout`."""
    deadline = time.monotonic() + timeout
    while is_mounted(mount):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True
