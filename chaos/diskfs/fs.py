"""The FUSE operations: each kernel request, through the fault policy, into the model.

`DiskFS` is the mfusepy operations object (mfusepy is imported only by `serve`, so this
module and its tests need no libfuse). Every operation is counted and, under `slow`,
delayed before it takes the lock; the mode's errno (modes.ERRNOS) is raised before the
model changes, so a refused write changes nothing. One lock serialises the model and the
backing directory, so effects reach the host in the order the model made them.

Handles map to inodes, not paths (libfuse's `nullpath_ok`: reads, writes, fsyncs come with
the handle alone). Without `hard_remove`, libfuse renames a file unlinked while open to
`.fuse_hiddenNNN` until its last close, as every libfuse file system does, so fstat of such a
file still works (with `hard_remove` it fails with ESTALE, and Python's read() calls fstat);
the model never makes those names durable.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from typing import Any, Callable

from .backing import Backing
from .model import Model, fs_error
from .modes import FaultPolicy

log = logging.getLogger("chaos.diskfs")

RENAME_NOREPLACE = 1
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
FUSE_CAP_WRITEBACK_CACHE = 1 << 16


class DiskFS:
    """mfusepy operations over a `Model`, a `Backing` directory and a `FaultPolicy`."""

    use_ns = True  # mfusepy: times in integer nanoseconds

    def __init__(self, model: Model, backing: Backing, policy: FaultPolicy,
                 context: Callable[[], tuple[int, int, int]] | None = None) -> None:
        self.model = model
        self.backing = backing
        self.policy = policy
        self.context = context or (lambda: (model.uid, model.gid, os.getpid()))
        self._lock = threading.RLock()
        self._handles: dict[int, int] = {}  # fh -> inode
        self._next_fh = 1
        self._flushed = False

    # ----------------------------------------------------------------------- helpers

    def _ino(self, path: str | None, fh: int | None) -> int:
        if fh:
            ino = self._handles.get(fh)
            if ino is not None:
                return ino
        if path is None:
            raise fs_error(errno.EBADF, "no path and no open handle")
        return self.model.lookup(path)

    def _open_handle(self, ino: int) -> int:
        self.model.pin(ino)
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = ino
        return fh

    def _apply(self, effects: list) -> None:
        if effects:
            self.backing.apply(effects)

    # ----------------------------------------------------------------------- lifecycle

    def init_with_config(self, conn: Any, config: Any) -> None:
        """No writeback cache: every write reaches the daemon when it happens."""
        if conn is not None:
            conn.want &= ~FUSE_CAP_WRITEBACK_CACHE
        if config is not None:
            config.use_ino = 1
            config.nullpath_ok = 1  # handle operations come by handle: an unlinked open file has no path
            config.negative_timeout = 0.0

    def destroy(self, path: str) -> None:
        self.flush_all()

    def flush_all(self) -> int:
        """Clean unmount: the whole volatile view becomes durable. Returns the bytes that were not."""
        with self._lock:
            unsynced = self.model.unsynced_bytes()
            self._apply(self.model.sync_all())
            self._flushed = True
            return unsynced

    def status(self) -> dict[str, Any]:
        with self._lock:
            unsynced, files = self.model.unsynced_bytes(), self.model.file_count()
        return {**self.policy.snapshot(), "unsynced_bytes": unsynced, "files": files}

    # ----------------------------------------------------------------------- metadata

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, int]:
        self.policy.enter("getattr")
        with self._lock:
            return self.model.stat(self._ino(path, fh))

    def access(self, path: str, amode: int) -> int:
        """No permission checks (every process acts as the owner): only existence."""
        self.policy.enter("access")
        with self._lock:
            self.model.lookup(path)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        mode = self.policy.enter("statfs")
        host = os.statvfs(self.backing.root)
        size = host.f_frsize or host.f_bsize or 4096
        free = 0 if mode == "full" else host.f_bavail * size // 4096
        return dict(f_bsize=4096, f_frsize=4096, f_blocks=host.f_blocks * size // 4096, f_bfree=free,
                    f_bavail=free, f_files=host.f_files, f_ffree=host.f_ffree, f_favail=host.f_favail,
                    f_namemax=255)

    def chmod(self, path: str | None, mode: int, fh: int | None = None) -> int:
        self.policy.enter("chmod")
        with self._lock:
            self.model.chmod(self._ino(path, fh), mode)
        return 0

    def chown(self, path: str | None, uid: int, gid: int, fh: int | None = None) -> int:
        self.policy.enter("chown")
        with self._lock:
            self.model.chown(self._ino(path, fh), uid, gid)
        return 0

    def utimens(self, path: str | None, times: tuple[int | None, int | None] | None = None,
                fh: int | None = None) -> int:
        """`times`: (atime, mtime) in ns, None for one to leave as it is; None for both now."""
        self.policy.enter("utimens")
        now = time.time_ns()
        atime, mtime = times if times is not None else (now, now)
        with self._lock:
            self.model.utimens(self._ino(path, fh), atime, mtime)
        return 0

    # ----------------------------------------------------------------------- directories

    def opendir(self, path: str) -> int:
        self.policy.enter("opendir")
        with self._lock:
            ino = self.model.lookup(path)
            if not self.model.node(ino).is_dir:
                raise fs_error(errno.ENOTDIR, path)
            return self._open_handle(ino)

    def readdir(self, path: str | None, fh: int) -> list[tuple[str, dict[str, int], int]]:
        self.policy.enter("readdir")
        with self._lock:
            ino = self._ino(path, fh)
            out = [(".", {"st_mode": stat.S_IFDIR, "st_ino": ino}, 0), ("..", {"st_mode": stat.S_IFDIR}, 0)]
            for name, child in self.model.readdir(ino):
                kind = stat.S_IFDIR if self.model.node(child).is_dir else stat.S_IFREG
                out.append((name, {"st_mode": kind, "st_ino": child}, 0))
            return out

    def releasedir(self, path: str | None, fh: int) -> int:
        self.policy.enter("releasedir")
        return self._release(fh)

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        mode = self.policy.enter("fsyncdir")
        self.policy.fail("fsyncdir", mode)
        with self._lock:
            self._apply(self.model.fsyncdir(self._ino(path, fh)))
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        fault = self.policy.enter("mkdir")
        self.policy.fail("mkdir", fault)
        uid, gid, _ = self.context()
        with self._lock:
            self.model.mkdir(path, mode, uid, gid)
        return 0

    def rmdir(self, path: str) -> int:
        self.policy.enter("rmdir")
        with self._lock:
            self.model.rmdir(path)
            self.model.collect()
        return 0

    # ----------------------------------------------------------------------- names

    def unlink(self, path: str) -> int:
        self.policy.enter("unlink")
        with self._lock:
            self.model.unlink(path)
            self.model.collect()
        return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        """Flags: 0 or RENAME_NOREPLACE; RENAME_EXCHANGE and RENAME_WHITEOUT are EINVAL."""
        self.policy.enter("rename")
        if flags & ~RENAME_NOREPLACE:
            raise fs_error(errno.EINVAL, f"rename flags {flags:#x}: only RENAME_NOREPLACE is supported")
        with self._lock:
            self._apply(self.model.rename(old, new, noreplace=bool(flags & RENAME_NOREPLACE)))
            self.model.collect()
        return 0

    # ----------------------------------------------------------------------- files

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        fault = self.policy.enter("create")
        self.policy.fail("create", fault)
        uid, gid, _ = self.context()
        with self._lock:
            ino = self.model.create(path, mode, uid, gid, exclusive=bool(flags & os.O_EXCL))
            if flags & os.O_TRUNC and self.model.size(ino):
                self.model.truncate(ino, 0)
            return self._open_handle(ino)

    def mknod(self, path: str, mode: int, dev: int) -> int:
        fault = self.policy.enter("mknod")
        if not stat.S_ISREG(mode):
            raise fs_error(errno.EPERM, "only regular files")
        self.policy.fail("mknod", fault)
        uid, gid, _ = self.context()
        with self._lock:
            self.model.create(path, mode, uid, gid, exclusive=True)
        return 0

    def open(self, path: str, flags: int) -> int:
        self.policy.enter("open")
        with self._lock:
            ino = self.model.lookup(path)
            if self.model.node(ino).is_dir:
                raise fs_error(errno.EISDIR, path)
            if flags & os.O_TRUNC and self.model.size(ino):
                self.model.truncate(ino, 0)
            return self._open_handle(ino)

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        self.policy.enter("read")
        with self._lock:
            return self.model.read(self._ino(path, fh), offset, size)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        mode = self.policy.enter("write")
        self.policy.fail("write", mode)
        with self._lock:
            return self.model.write(self._ino(path, fh), offset, data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        mode = self.policy.enter("truncate")
        with self._lock:
            ino = self._ino(path, fh)
            if length > self.model.size(ino):
                self.policy.fail("truncate", mode)
            self.model.truncate(ino, length)
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        """close(2): nothing becomes durable."""
        self.policy.enter("flush")
        return 0

    def release(self, path: str | None, fh: int) -> int:
        self.policy.enter("release")
        return self._release(fh)

    def _release(self, fh: int) -> int:
        with self._lock:
            ino = self._handles.pop(fh, None)
            if ino is not None:
                self.model.unpin(ino)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        """fsync/fdatasync: the file's content becomes durable. Under `eio` the file is marked
        clean without becoming durable (fsyncgate): a retried fsync finds nothing to write."""
        op = "fdatasync" if datasync else "fsync"
        mode = self.policy.enter(op)
        with self._lock:
            ino = self._ino(path, fh)
            if self.policy.errno_for(op, mode) is not None:
                self.model.forget_dirty(ino)
                self.policy.fail(op, mode)
            self._apply(self.model.fsync(ino))
        return 0


# --------------------------------------------------------------------------- mounting


def mount_options() -> dict[str, Any]:
    """libfuse options. `auto_unmount`: fusermount3 unmounts when the daemon dies (even by
    SIGKILL). No `writeback_cache`, no `kernel_cache`: writes reach the daemon as they
    happen and an open drops cached pages. `allow_other` (root only: others need
    user_allow_other in /etc/fuse.conf): any user may look in."""
    return dict(foreground=True, nothreads=False, auto_unmount=True, allow_other=os.geteuid() == 0,
                use_ino=True, fsname="islands-diskfs", subtype="diskfs")


def serve(ops: DiskFS, mountpoint: str) -> None:
    """Mount `ops` at `mountpoint` and serve until unmounted or SIGTERM/SIGINT/SIGHUP
    (libfuse's handlers end the loop and unmount). Blocks; needs libfuse3 and mfusepy."""
    import mfusepy

    class _FUSE(mfusepy.FUSE):
        """mfusepy, passing on what its libfuse3 wrappers drop: rename's flags, the handle of
        ftruncate/fchmod/fchown/futimens (the path is null for an unlinked open file), and
        UTIME_NOW/UTIME_OMIT."""

        def _decode(self, path: bytes | None) -> str | None:
            return None if path is None else path.decode(self.encoding, self.errors)

        @staticmethod
        def _fh(fip: Any) -> int | None:
            return fip.contents.fh if fip else None

        def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
            return self.operations.rename(self._decode(old), self._decode(new), flags)

        def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
            return self.operations.truncate(self._decode(path), length, self._fh(fip))

        def chmod_fuse_3(self, path: bytes | None, mode: int, fip: Any) -> int:
            return self.operations.chmod(self._decode(path), mode, self._fh(fip))

        def chown_fuse_3(self, path: bytes | None, uid: int, gid: int, fip: Any) -> int:
            uid = -1 if uid == 0xFFFFFFFF else uid
            gid = -1 if gid == 0xFFFFFFFF else gid
            return self.operations.chown(self._decode(path), uid, gid, self._fh(fip))

        def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
            times = None
            if buf:
                now = time.time_ns()
                times = tuple(None if ts.tv_nsec == UTIME_OMIT else now if ts.tv_nsec == UTIME_NOW
                              else ts.tv_sec * 10**9 + ts.tv_nsec for ts in (buf.contents.actime, buf.contents.modtime))
            return self.operations.utimens(self._decode(path), times, self._fh(fip))

    ops.context = mfusepy.fuse_get_context
    _FUSE(ops, mountpoint, **mount_options())
