"""A disk in memory that knows what survives a power loss: the Storage seam's second side.

Every file is an inode with two contents: the volatile one every reader sees, and the
durable one, the content at its last fsync (or sync of the whole disk). Every directory
has two sets of entries likewise: a name created, renamed or removed counts on the disk
only once its directory is fsynced. A power loss (`crash`) keeps exactly the durable
side: unsynced writes are gone, a file whose name was never made durable is gone, a new
file made durable under a name never synced is gone, and a rename not yet synced is
undone. This is the model of Jepsen's LazyFS and of ALICE's and CrashMonkey's "unsynced
is lost" crash states, and what POSIX promises; real file systems often keep more.

Faults: `fail(op, errno)` makes every later call of `op` (create, fsync, sync_files,
rename, fsync_dir, unlink, mkdir) raise OSError(errno) until `heal(op)`; a failed
`create` leaves nothing and a failed sync makes nothing durable.

Every call that changes the durable side records a snapshot (`images`), so a test can
restart from the state a power loss at any point of a run would have left
(`image_at(op)`), as the crash-state test does (tests/properties/test_crash_states.py).
The op counter (`ops`) advances on every mutating call and every sync.
"""
from __future__ import annotations

import errno as errnos
import hashlib
import os
import random
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Iterable

from .storage import Storage, SyncFailed

MUTATING = ("create", "fsync", "sync_files", "rename", "fsync_dir", "unlink", "mkdir")
SYNCS = ("fsync", "sync_files", "fsync_dir")


def _key(path: Path | str) -> str:
    """A name as the disk keys it: its normalised posix text. Text, not a PurePosixPath: a
    string hashes once and compares in C, where a path hashes and compares its parts in
    Python on every lookup (a simulated run makes hundreds of thousands)."""
    return _normal(os.fspath(path))


@lru_cache(maxsize=1 << 16)
def _normal(text: str) -> str:
    return str(PurePosixPath(text))


@lru_cache(maxsize=1 << 16)
def _parent(key: str) -> str:
    """A name's directory: every sync of a directory asks it of every name."""
    return str(PurePosixPath(key).parent)


@lru_cache(maxsize=1 << 16)
def _lineage(key: str) -> tuple[str, ...]:
    """`key` and every directory above it, nearest first."""
    path = PurePosixPath(key)
    return (key, *(str(p) for p in path.parents))


def _base_name(key: str) -> str:
    return PurePosixPath(key).name


@dataclass(frozen=True)
class Image:
    """The durable side at one instant: files (path text → content) and directories."""

    files: dict[str, bytes]
    dirs: frozenset[str]

    def digest(self) -> str:
        h = hashlib.sha256()
        for path in sorted(self.dirs):
            h.update(b"d" + str(path).encode() + b"\0")
        for path, data in sorted(self.files.items()):
            h.update(b"f" + str(path).encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()


@dataclass
class _Inode:
    data: bytes = b""
    durable: bytes = b""  # the content at the last sync; a never-synced file's is empty


@dataclass
class SimDisk(Storage):
    """`roots`: directories that exist, durably, before anything runs (a mount point)."""

    roots: tuple[str, ...] = ()
    record: bool = True
    ops: int = 0
    images: list[tuple[int, Image]] = field(default_factory=list)
    _inodes: dict[int, _Inode] = field(default_factory=dict)
    _names: dict[str, int] = field(default_factory=dict)          # volatile entries
    _durable_names: dict[str, int] = field(default_factory=dict)  # durable entries
    _dirs: set[str] = field(default_factory=set)
    _durable_dirs: set[str] = field(default_factory=set)
    _faults: dict[str, int] = field(default_factory=dict)
    _next: int = 1

    def __post_init__(self) -> None:
        self.lock = threading.RLock()
        for root in self.roots:
            for p in _lineage(_key(root)):
                self._dirs.add(p)
                self._durable_dirs.add(p)
        if self.record:
            self.images.append((0, self.image()))

    # ----------------------------------------------------------- faults
    def fail(self, op: str, code: int) -> None:
        if op not in MUTATING:
            raise ValueError(f"op {op!r} cannot fail (known: {', '.join(MUTATING)})")
        self._faults[op] = code

    def heal(self, op: str | None = None) -> None:
        if op is None:
            self._faults.clear()
        else:
            self._faults.pop(op, None)

    def _tick(self, op: str, path: Path | str) -> None:
        """Count the call, and raise the fault set for it (a sync's as SyncFailed)."""
        self.ops += 1
        code = self._faults.get(op)
        if code is not None:
            cls = SyncFailed if op in SYNCS else OSError
            raise cls(code, f"{errnos.errorcode.get(code, code)} (injected)", str(path))

    def _durable_changed(self) -> None:
        if self.record:
            self.images.append((self.ops, self.image()))

    # ----------------------------------------------------------- the durable side
    def image(self) -> Image:
        with self.lock:
            files = {p: self._inodes[i].durable for p, i in self._durable_names.items()
                     if self._reachable(p, self._durable_dirs)}
            dirs = frozenset(d for d in self._durable_dirs if self._reachable(d, self._durable_dirs))
            return Image(files, dirs)

    @staticmethod
    def _reachable(path: str, dirs: set[str] | frozenset[str]) -> bool:
        parent = _parent(path)
        return parent == path or parent in dirs

    def image_at(self, op: int) -> Image:
        """The durable side a power loss after `op` calls would have left."""
        chosen = self.images[0][1]
        for at, image in self.images:
            if at > op:
                break
            chosen = image
        return chosen

    @classmethod
    def from_image(cls, image: Image, record: bool = False) -> "SimDisk":
        """A disk holding `image`, as it comes back after the power returns."""
        disk = cls(record=False)
        for d in image.dirs:
            disk._dirs.add(d)
            disk._durable_dirs.add(d)
        for path, data in image.files.items():
            ino = disk._new_inode(data)
            disk._inodes[ino].durable = data
            disk._names[path] = ino
            disk._durable_names[path] = ino
        disk.record = record
        if record:
            disk.images.append((0, disk.image()))
        return disk

    def crash(self, rng: random.Random | None = None) -> "SimDisk":
        """A power loss now: a new disk holding only what was durable. With `rng`, each file
        whose unsynced content extends its durable content keeps a random prefix of the
        extension (a torn write, as a disk that wrote some sectors does)."""
        with self.lock:
            image = self.image()
            if rng is not None:
                files = dict(image.files)
                for path, ino in self._durable_names.items():
                    node = self._inodes[ino]
                    if path in files and node.data != node.durable and node.data.startswith(node.durable):
                        cut = rng.randrange(len(node.durable), len(node.data) + 1)
                        files[path] = node.data[:cut]
                image = Image(files, image.dirs)
        return SimDisk.from_image(image)

    # ----------------------------------------------------------- Storage
    def _new_inode(self, data: bytes) -> int:
        ino = self._next
        self._next += 1
        self._inodes[ino] = _Inode(data)
        return ino

    def _need_dir(self, path: str) -> None:
        if path not in self._dirs:
            raise FileNotFoundError(errnos.ENOENT, "No such file or directory", str(path))

    def create(self, path: Path, parts: Iterable[bytes | memoryview]) -> int:
        key = _key(path)
        with self.lock:
            self._tick("create", path)
            self._need_dir(_parent(key))
            data = b"".join(bytes(p) for p in parts)
            ino = self._names.get(key)
            if ino is None:
                self._names[key] = self._new_inode(data)
            else:  # open(O_TRUNC) rewrites the same inode: its durable content stays until a sync
                self._inodes[ino].data = data
            return len(data)

    def fsync(self, path: Path) -> None:
        key = _key(path)
        with self.lock:
            self._tick("fsync", path)
            ino = self._names.get(key)
            if ino is None:
                raise FileNotFoundError(errnos.ENOENT, "No such file or directory", str(path))
            node = self._inodes[ino]
            if node.durable != node.data:
                node.durable = node.data
                self._durable_changed()

    def sync_files(self, paths: list[Path], root: Path) -> None:
        with self.lock:
            self._tick("sync_files", root)
            changed = False
            for path in paths:
                node = self._inodes[self._names[_key(path)]]
                if node.durable != node.data:
                    node.durable, changed = node.data, True
            if changed:
                self._durable_changed()

    def rename(self, src: Path, dst: Path) -> None:
        s, d = _key(src), _key(dst)
        with self.lock:
            self._tick("rename", src)
            if s not in self._names:
                raise FileNotFoundError(errnos.ENOENT, "No such file or directory", str(src))
            self._need_dir(_parent(d))
            self._names[d] = self._names.pop(s)

    def fsync_dir(self, path: Path) -> None:
        key = _key(path)
        with self.lock:
            self._tick("fsync_dir", path)
            self._need_dir(key)
            changed = False
            for name in [n for n in self._durable_names if _parent(n) == key]:
                if self._names.get(name) != self._durable_names[name]:
                    del self._durable_names[name]
                    changed = True
            for name, ino in self._names.items():
                if _parent(name) == key and self._durable_names.get(name) != ino:
                    self._durable_names[name] = ino
                    changed = True
            for d in list(self._durable_dirs):
                if _parent(d) == key and d != key and d not in self._dirs:
                    self._durable_dirs.discard(d)
                    changed = True
            for d in self._dirs:
                if _parent(d) == key and d != key and d not in self._durable_dirs:
                    self._durable_dirs.add(d)
                    changed = True
            if changed:
                self._durable_changed()

    def unlink(self, path: Path) -> None:
        with self.lock:
            self._tick("unlink", path)
            self._names.pop(_key(path), None)

    def mkdir(self, path: Path) -> None:
        key = _key(path)
        with self.lock:
            missing = [p for p in _lineage(key) if p not in self._dirs]
            for d in reversed(missing):
                self._tick("mkdir", d)
                self._dirs.add(d)
                self.fsync_dir(_parent(d))

    def read_bytes(self, path: Path) -> bytes:
        with self.lock:
            ino = self._names.get(_key(path))
            if ino is None:
                raise FileNotFoundError(errnos.ENOENT, "No such file or directory", str(path))
            return self._inodes[ino].data

    def exists(self, path: Path) -> bool:
        key = _key(path)
        with self.lock:
            return key in self._names or key in self._dirs

    def listdir(self, path: Path) -> list[str]:
        key = _key(path)
        with self.lock:
            names = {_base_name(n) for n in self._names if _parent(n) == key}
            names |= {_base_name(d) for d in self._dirs if _parent(d) == key and d != key}
            return sorted(names)

    def is_dir(self, path: Path) -> bool:
        with self.lock:
            return _key(path) in self._dirs
