"""The durable state's one seam: every byte the syncer makes durable goes through a Storage.

Two implementations share the interface: `FileStorage`, the real files with their atomic
discipline (this module), and `SimDisk` (simdisk.py), a disk in memory that knows what
survives a power loss. The syncer, its state directory, the group commit and the
quarantine take a Storage, so the same code is tested crash state by crash state in one
process and runs live on a real disk.

The rules a caller keeps, on either:
- a file is made under a temporary name (`create`), made durable (`fsync` or, for a group,
  `sync_files`), renamed into place and its directory fsynced: only then does it count;
- a temporary never outlives the operation that made it: `create` removes its partial file
  when a write fails, and callers remove theirs when a later step fails;
- a failed sync is never retried into a success: after an fsync or syncfs error the kernel
  may have dropped the dirty pages and a second call would report nothing (PostgreSQL's
  "fsyncgate", 2018). `SyncFailed` says so, and the syncer stops trusting the disk.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable, Iterable

from .compact_json import sorted_keys

FUSE_SUPER_MAGIC = 0x65735546
TEMP_SUFFIX = ".tmp"


class SyncFailed(OSError):
    """An fsync, fdatasync or syncfs failed: what it covered is in an unknown state."""


def is_full(exc: BaseException) -> bool:
    """A write refused for space (ENOSPC, EDQUOT): nothing was written, nothing is in doubt."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def describe_error(exc: BaseException) -> str:
    """`OSError: [Errno 28] No space left on device: 'x'` as `ENOSPC (No space left on device) on x`."""
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        where = f" on {exc.filename}" if exc.filename else ""
        return f"{name} ({exc.strerror or os.strerror(exc.errno)}){where}"
    return f"{type(exc).__name__}: {exc}"


def temp_path(final: Path) -> Path:
    """The temporary name beside `final` (hidden, `.tmp`: recovery removes any left by a crash)."""
    return final.parent / f".{final.name}.{os.getpid()}.{threading.get_ident()}{TEMP_SUFFIX}"


class Storage(ABC):
    """What the syncer's durable state needs of a disk. Paths are absolute or relative to the
    process's directory, as the caller gives them."""

    # ----------------------------------------------------------- writes
    @abstractmethod
    def create(self, path: Path, parts: Iterable[bytes | memoryview]) -> int:
        """Write a new file (replacing any at `path`) from `parts`, without a sync; returns
        its size. On error the partial file is removed and the error raised."""

    @abstractmethod
    def fsync(self, path: Path) -> None:
        """Make the contents of `path` durable (raises SyncFailed)."""

    @abstractmethod
    def sync_files(self, paths: list[Path], root: Path) -> None:
        """Make the contents of `paths` durable, as cheaply as the disk allows (raises SyncFailed)."""

    @abstractmethod
    def rename(self, src: Path, dst: Path) -> None:
        """Atomically replace `dst` by `src` (durable once `dst`'s directory is fsynced)."""

    @abstractmethod
    def fsync_dir(self, path: Path) -> None:
        """Make the entries of directory `path` durable (raises SyncFailed)."""

    @abstractmethod
    def unlink(self, path: Path) -> None:
        """Remove `path` if it exists."""

    @abstractmethod
    def mkdir(self, path: Path) -> None:
        """Create `path` and its missing parents, each made durable in its parent."""

    # ----------------------------------------------------------- reads
    @abstractmethod
    def read_bytes(self, path: Path) -> bytes:
        """The whole file (FileNotFoundError if absent)."""

    @abstractmethod
    def exists(self, path: Path) -> bool: ...

    @abstractmethod
    def listdir(self, path: Path) -> list[str]:
        """Names in directory `path`, sorted; [] when it does not exist."""

    @abstractmethod
    def is_dir(self, path: Path) -> bool: ...

    # ----------------------------------------------------------- built on the primitives
    def atomic_write(self, path: Path, data: bytes | memoryview, *more: bytes | memoryview) -> int:
        """Write `path` atomically and durably: temporary file, fsync, rename, fsync of the
        directory. Nothing is left behind when a step fails."""
        self.mkdir(path.parent)
        tmp = temp_path(path)
        size = self.create(tmp, (data, *more))
        try:
            self.fsync(tmp)
            self.rename(tmp, path)
        except BaseException:
            self.unlink(tmp)
            raise
        self.fsync_dir(path.parent)
        return size

    def atomic_write_json(self, path: Path, obj: object) -> int:
        # One line, not indented: Python's C encoder, five times faster than the indented
        # one, on a path that runs once per acknowledged push.
        return self.atomic_write(path, sorted_keys(obj).encode())

    def read_json(self, path: Path) -> dict | None:
        try:
            return json.loads(self.read_bytes(path))
        except FileNotFoundError:
            return None

    def glob(self, directory: Path, suffix: str) -> list[Path]:
        """Files in `directory` whose names end with `suffix` and do not start with a dot, sorted."""
        return [directory / n for n in self.listdir(directory)
                if n.endswith(suffix) and not n.startswith(".") and not self.is_dir(directory / n)]

    def sync_tree(self, root: Path) -> int:
        """Make every directory entry under `root`, and `root`'s own, durable: what recovery
        is about to act on. mkdir skips a directory that exists, so one whose creator was
        killed between mkdir(2) and the fsync of its parent would otherwise stay undurable,
        with everything later written into it. Returns how many directories were synced."""
        synced = 0
        stack = [Path(root)]
        if Path(root).parent != Path(root):
            self.fsync_dir(Path(root).parent)
            synced += 1
        while stack:
            directory = stack.pop()
            stack += [directory / n for n in self.listdir(directory) if self.is_dir(directory / n)]
            self.fsync_dir(directory)
            synced += 1
        return synced

    def remove_temporaries(self, root: Path) -> int:
        """Temporary files (`.*.tmp`) under `root` left by a process that died mid-write;
        never valid state. Returns how many were removed."""
        removed = 0
        stack = [root]
        while stack:
            directory = stack.pop()
            for name in self.listdir(directory):
                path = directory / name
                if self.is_dir(path):
                    stack.append(path)
                elif name.startswith(".") and name.endswith(TEMP_SUFFIX):
                    self.unlink(path)
                    removed += 1
        return removed


# ----------------------------------------------------------------------------- the real disk


def _load_libc_fn(name: str, argtypes: list) -> Callable | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_SYNCFS = _load_libc_fn("syncfs", [ctypes.c_int])
_STATFS = _load_libc_fn("statfs", [ctypes.c_char_p, ctypes.c_void_p])


def filesystem_type(path: Path) -> int | None:
    """statfs(2)'s f_type of the file system holding `path` (None where it cannot be read)."""
    if _STATFS is None:
        return None
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86_64 and arm64
    if _STATFS(os.fsencode(path), buf) != 0:
        return None
    return int.from_bytes(buf.raw[:ctypes.sizeof(ctypes.c_long)], "little", signed=True)


def syncfs_is_a_barrier(path: Path) -> bool:
    """Whether one syncfs(2) of `path`'s file system makes every file on it durable.

    Not on FUSE: the kernel does not forward syncfs to a FUSE daemon (only virtiofs sets
    sync_fs), so it returns 0 having made nothing durable there (docs/diskfs.md measured
    it); a state directory on a FUSE file system (gcsfuse, s3fs, our disk-fault layer)
    needs an fsync per file, which the daemon does receive."""
    return _SYNCFS is not None and filesystem_type(path) not in (None, FUSE_SUPER_MAGIC)


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        raise SyncFailed(exc.errno, f"fsync failed: {exc.strerror}", str(path)) from exc
    finally:
        os.close(fd)


class FileStorage(Storage):
    """The real disk. `syncfs` for a group only where it is a barrier (syncfs_is_a_barrier,
    decided once per root); an fsync per file elsewhere. Never a fallback after an error."""

    def __init__(self) -> None:
        self._barrier: dict[Path, bool] = {}

    def create(self, path: Path, parts: Iterable[bytes | memoryview]) -> int:
        size = 0
        try:
            with open(path, "wb") as fh:
                for part in parts:
                    fh.write(part)
                    size += len(part)
        except BaseException:
            try:
                os.unlink(path)
            except OSError:
                pass
            raise
        return size

    def fsync(self, path: Path) -> None:
        _fsync_path(path)

    def sync_files(self, paths: list[Path], root: Path) -> None:
        if not paths:
            return
        barrier = self._barrier.get(root)
        if barrier is None:
            barrier = self._barrier[root] = syncfs_is_a_barrier(root)
        if not barrier:
            for path in paths:
                _fsync_path(path)
            return
        fd = os.open(root, os.O_RDONLY)
        try:
            if _SYNCFS(fd) != 0:  # type: ignore[misc]
                err = ctypes.get_errno()
                raise SyncFailed(err, f"syncfs failed: {os.strerror(err)}", str(root))
        finally:
            os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def fsync_dir(self, path: Path) -> None:
        _fsync_path(path, directory=True)

    def unlink(self, path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def mkdir(self, path: Path) -> None:
        missing = []
        probe = Path(path)
        while not probe.exists():
            missing.append(probe)
            if probe.parent == probe:
                break
            probe = probe.parent
        for directory in reversed(missing):
            try:
                directory.mkdir()
            except FileExistsError:
                continue
            self.fsync_dir(directory.parent)  # a new directory's entry is durable only then

    def read_bytes(self, path: Path) -> bytes:
        return Path(path).read_bytes()

    def exists(self, path: Path) -> bool:
        return Path(path).exists()

    def listdir(self, path: Path) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def is_dir(self, path: Path) -> bool:
        return Path(path).is_dir()


FILES = FileStorage()
