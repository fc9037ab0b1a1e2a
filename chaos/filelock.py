"""An exclusive lock between processes (flock(2) on a lock file), with a bounded wait.

flock's lock belongs to the open file description, so two threads that each open the lock
file exclude each other too; it is released when the descriptor closes, by the kernel if
the holder dies, so a crashed run never leaves a lock held.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

POLL_SECONDS = 0.05


class LockTimeout(TimeoutError):
    """Another process held the lock for longer than the caller would wait."""


@contextmanager
def flocked(path: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block; LockTimeout
    after `timeout` s of waiting."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LockTimeout(f"{path}: held by another process for over {timeout:.0f}s") from None
                time.sleep(POLL_SECONDS)
        yield
    finally:
        os.close(fd)


def hold(path: Path, note: dict) -> int | None:
    """Take an exclusive flock on `path` without waiting and write `note` (who holds it) into
    it: the open descriptor, to close when done (the kernel closes it if the holder dies);
    None while another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(note).encode())
    return fd


def holder(path: Path) -> dict:
    """What the holder of `path` wrote of itself ({} if nothing readable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
