"""Group commit: many pushes made durable for the price of one.

Every accepted push must be on disk (its write-ahead file and the members' record in
meta.json) before it is acknowledged. Done one push at a time that is four fsyncs per push,
taken in turn: at 64 learners whose pushes arrive together the last one waits for ~250
fsyncs. Here the pushes that arrive while a commit is being written wait for the next one
and share it. Whichever waiting thread finds no commit running leads the next one:

  1. one sync makes every staged file's contents durable (`syncfs` where it is a barrier,
     an `fsync` per file elsewhere: storage.py);
  2. each staged file is renamed into place and each directory holding one is fsynced;
  3. under the owner's lock, every push of the group is applied in memory (its `apply`),
     and the state to record (meta.json's document) is taken;
  4. that document is written atomically (temp file, fsync, rename, fsync of the directory);
  5. the group's waiters are released, and only then do they acknowledge.

So a group of any size costs four sync calls, and nothing is visible in memory (to a merge,
a heartbeat's versions or an ACK) before its file is durable and in place. A commit with no
file (a new incarnation at HELLO, the state at start and at stop) takes the same path, so
meta.json is written by one thread at a time and never goes back to an older document.

What a failure means (docs/durability.md):
- in steps 1-2 (a sync, a rename, a directory fsync): the whole group fails. Nothing is
  applied, every file of the group is removed (temporaries and any already renamed), and
  every waiter gets the error: none acknowledges.
- in step 4 (meta.json): the group's pushes are durable and in place, and applied, so they
  count: their waiters are released as committed (a crash now would recover them from
  their files). A commit with no file, which exists to make the document durable, fails.
  The next commit writes the document again.
- a failed sync (SyncFailed, in any step) also marks the disk failed: every later commit
  fails at once with DiskFailed. After an fsync error the kernel may have dropped the
  pages it could not write, and a later fsync would succeed without them; only a restart
  that reads the state back from disk knows what is there (the syncer exits for one).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

from .storage import FILES, Storage, SyncFailed, temp_path

COMMIT_TIMEOUT = 60.0  # a waiter gives up (and does not acknowledge) after this long


@dataclass
class Staged:
    """One push's write-ahead file, written to `tmp` but not yet durable, and what its
    outcome does in memory, under the owner's lock: `apply` once a commit made it durable,
    `abandon` once it is certain it never will be (its group failed, or its waiter gave up
    before a commit took it). Whoever decides the outcome runs one of them, exactly once: a
    waiter that gives up while its group is being written leaves the outcome to that group."""

    tmp: Path
    final: Path
    apply: Callable[[], None]
    renamed: bool = False
    abandon: Callable[[], None] | None = None


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


class StillCommitting(TimeoutError):
    """A waiter gave up while the group that holds its file is being written: the file may
    yet become durable, and that group's outcome applies or abandons it."""


class DiskFailed(OSError):
    """A sync failed earlier: nothing more is made durable until a restart rereads the disk."""


def write_staged(final: Path, *parts: bytes | memoryview, storage: Storage = FILES) -> Staged:
    """Write `parts` one after the other beside `final` under a temporary name, without an
    fsync (the commit makes it durable); a failed write leaves no file. `apply` is filled
    in by the caller."""
    storage.mkdir(final.parent)
    tmp = temp_path(final)
    storage.create(tmp, parts)
    return Staged(tmp, final, lambda: None)


class GroupCommit:
    """Durable writes of staged files plus one JSON document, shared by concurrent callers.

    `lock` gives the owner's lock: `apply` callbacks and `document()` run under it (looked
    up at each commit, so the owner may replace its lock). `commit` must be called without
    holding it."""

    def __init__(self, root: Path, meta_path: Path, lock: Callable[[], ContextManager],
                 document: Callable[[], dict], written: Callable[[int, int, dict], None] | None = None,
                 storage: Storage = FILES, sync_data: bool = True) -> None:
        self.root = root
        self.meta_path = meta_path
        self.lock = lock
        self.document = document
        self.written = written  # (meta bytes, staged files, document) after each group, under `lock`
        self.storage = storage
        self.sync_data = sync_data  # False only for the ack_before_sync defect (defects.py)
        self.stats = CommitStats()
        self.failed: SyncFailed | None = None  # the first failed sync; the disk is not trusted since
        self.document_error: OSError | None = None  # the last failed write of the document, if any
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
                    if request not in self._queue:
                        # A commit holds it: the file may yet be durable (and applied); that
                        # commit decides, so nothing is released here.
                        raise StillCommitting(f"group commit: not durable within {timeout:.0f} s; its group "
                                              "is still being written")
                    self._queue.remove(request)
                    break
                self._cond.wait(left)
        if not request.done:  # given up before any commit took it: it never will be durable
            _discard(request.staged, self.storage)
            self._abandon([request.staged] if request.staged is not None else [])
            raise TimeoutError(f"group commit: not durable within {timeout:.0f} s")
        if request.error is not None:
            raise request.error
        return request.group

    def _abandon(self, staged: list[Staged]) -> None:
        with self.lock():
            for s in staged:
                if s.abandon is not None:
                    s.abandon()

    def _run(self, batch: list[_Request]) -> None:
        """Lead one commit for `batch`; every request in it ends done, with an error if its part failed."""
        staged = [r.staged for r in batch if r.staged is not None]
        error: BaseException | None = None
        document_error: BaseException | None = None
        store = self.storage
        try:
            if self.failed is not None:
                raise DiskFailed(self.failed.errno, f"a sync failed earlier ({self.failed.strerror}): "
                                                    "nothing is made durable until a restart", self.failed.filename)
            if self.sync_data:
                store.sync_files([s.tmp for s in staged], self.root)
            for s in staged:
                store.rename(s.tmp, s.final)
                s.renamed = True
            for directory in sorted({s.final.parent for s in staged}):
                store.fsync_dir(directory)
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter of the group
            error = self._note(exc)
            for s in staged:
                _discard(s, store)
            self._abandon(staged)
        if error is None:
            try:
                with self.lock():
                    for s in staged:
                        s.apply()
                    document = self.document()
                nbytes = store.atomic_write_json(self.meta_path, document)
                self.document_error = None
                with self.lock():
                    if self.written is not None:
                        self.written(nbytes, len(staged), document)
            except BaseException as exc:  # noqa: BLE001 - the group's files are in place and applied
                document_error = self._note(exc)
                if isinstance(exc, OSError):
                    self.document_error = exc
        self.stats.groups += 1
        self.stats.files += len(staged)
        with self._cond:
            for r in batch:
                r.done, r.group = True, len(batch)
                r.error = error if error is not None else (document_error if r.staged is None else None)

    def _note(self, exc: BaseException) -> BaseException:
        if isinstance(exc, SyncFailed):
            self.note_failed(exc)
        return exc

    def note_failed(self, exc: SyncFailed) -> None:
        """A sync failed (here or elsewhere on this disk): no group is made durable after it."""
        if self.failed is None:
            self.failed = exc


def _discard(staged: Staged | None, storage: Storage = FILES) -> None:
    """Remove a failed push's files: its temporary, and its final file if already renamed."""
    if staged is None:
        return
    for path in (staged.tmp, staged.final) if staged.renamed else (staged.tmp,):
        try:
            storage.unlink(path)
        except OSError:
            pass
