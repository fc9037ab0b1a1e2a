"""Group commit: many pushes made durable for the price of one.

Every accepted push must be on disk (its write-ahead file and the members' record in
meta.json) before it is acknowledged. Done one push at a time that is four fsyncs per push,
taken in turn: at 64 learners whose pushes arrive together the last one waits for ~250
fsyncs. Here the pushes that arrive while a commit is being written wait for the next one
and share it. Whichever waiting thread finds no commit running leads the next one:

  1. one sync of the file system makes every staged file's contents durable
     (`syncfs`; `fsync` per file where the call does not exist);
  2. each staged file is renamed into place and each directory holding one is fsynced;
  3. under the owner's lock, every push of the group is applied in memory (its `apply`),
     and the state to record (meta.json's document) is taken;
  4. that document is written atomically (temp file, fsync, rename, fsync of the directory);
  5. the group's waiters are released, and only then do they acknowledge.

So a group of any size costs four sync calls, and nothing is visible in memory (to a merge,
a heartbeat's versions or an ACK) before its file is durable and in place. A commit with no
file (a new incarnation at HELLO, the state at start and at stop) takes the same path, so
meta.json is written by one thread at a time and never goes back to an older document.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

from .atomic import atomic_write_json, fsync_dir

COMMIT_TIMEOUT = 60.0  # a waiter gives up (and does not acknowledge) after this long


@dataclass
class Staged:
    """One push's write-ahead file, written to `tmp` but not yet durable, and its acceptance
    in memory (`apply`, run under the owner's lock by the commit that makes it durable)."""

    tmp: Path
    final: Path
    apply: Callable[[], None]


@dataclass
class _Request:
    staged: Staged | None
    done: bool = False
    error: BaseException | None = None
    group: int = 0


@dataclass
class CommitStats:
    """How many commits were led and how many files they made durable."""

    groups: int = 0
    files: int = 0


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_SYNCFS = _load_syncfs()


def sync_files(paths: list[Path], root: Path) -> None:
    """Make the contents of `paths` durable: one syncfs of the file system holding `root`,
    or an fsync per file where syncfs is unavailable (or fails)."""
    if not paths:
        return
    if _SYNCFS is not None:
        fd = os.open(root, os.O_RDONLY)
        try:
            if _SYNCFS(fd) == 0:
                return
        finally:
            os.close(fd)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_staged(final: Path, *parts: bytes | memoryview) -> Staged:
    """Write `parts` one after the other beside `final` under a temporary name, without an
    fsync (the commit makes it durable). `apply` is filled in by the caller."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as fh:
        for part in parts:
            fh.write(part)
    return Staged(tmp, final, lambda: None)


class GroupCommit:
    """Durable writes of staged files plus one JSON document, shared by concurrent callers.

    `lock` gives the owner's lock: `apply` callbacks and `document()` run under it (looked
    up at each commit, so the owner may replace its lock). `commit` must be called without
    holding it."""

    def __init__(self, root: Path, meta_path: Path, lock: Callable[[], ContextManager],
                 document: Callable[[], dict], written: Callable[[int, int], None] | None = None) -> None:
        self.root = root
        self.meta_path = meta_path
        self.lock = lock
        self.document = document
        self.written = written  # (meta bytes, staged files) after each group, under `lock`
        self.stats = CommitStats()
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._leading = False

    def commit(self, staged: Staged | None = None, timeout: float = COMMIT_TIMEOUT) -> int:
        """Return once `staged` (or, with None, the owner's current state) is durable, with
        the size of the group that made it so. Raises what the group's write raised."""
        request = _Request(staged)
        deadline = time.monotonic() + timeout
        with self._cond:
            self._queue.append(request)
            while not request.done:
                if not self._leading:
                    self._leading = True
                    batch, self._queue = self._queue, []
                    self._cond.release()
                    try:
                        self._run(batch)
                    finally:
                        self._cond.acquire()
                        self._leading = False
                        self._cond.notify_all()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    if request in self._queue:
                        self._queue.remove(request)
                        _discard(request.staged)
                    raise TimeoutError(f"group commit: not durable within {timeout:.0f} s")
                self._cond.wait(left)
        if request.error is not None:
            raise request.error
        return request.group

    def _run(self, batch: list[_Request]) -> None:
        """Lead one commit for `batch`; every request in it ends done, with an error if any step failed."""
        staged = [r.staged for r in batch if r.staged is not None]
        error: BaseException | None = None
        try:
            sync_files([s.tmp for s in staged], self.root)
            for s in staged:
                os.replace(s.tmp, s.final)
            for directory in sorted({s.final.parent for s in staged}):
                fsync_dir(directory)
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter of the group
            error = exc
            for s in staged:
                _discard(s)
        if error is None:
            try:
                with self.lock():
                    for s in staged:
                        s.apply()
                    document = self.document()
                nbytes = atomic_write_json(self.meta_path, document)
                with self.lock():
                    if self.written is not None:
                        self.written(nbytes, len(staged))
            except BaseException as exc:  # noqa: BLE001
                error = exc
        self.stats.groups += 1
        self.stats.files += len(staged)
        with self._cond:
            for r in batch:
                r.done, r.error, r.group = True, error, len(batch)


def _discard(staged: Staged | None) -> None:
    if staged is not None:
        staged.tmp.unlink(missing_ok=True)
