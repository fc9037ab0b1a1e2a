"""The in-memory file system: a volatile view and the durable image beneath it (LazyFS-like).

Pure data, no FUSE and no I/O, so the durability rules can be tested without a mount.

Every inode carries two states: what processes see now (`data`, `entries`) and what would
survive a power loss (`durable_data`, `durable_entries`). Only three calls move the
second: `fsync` (a file's content and mode), `fsyncdir` (a directory's names) and
`sync_all` (everything, as at a clean unmount). Each returns the `Effect`s that bring the
backing directory (the durable image on the host disk) up to date; `crash()` drops the
volatile view back to the durable image, as a power loss would.

Rules, as Linux file systems allow them:
- A name becomes durable only with an fsyncdir of its directory, and points at the inode's
  *durable* content then (empty for a file never fsynced).
- A file rename is durable in the target directory after an fsyncdir of the target, and the
  old name leaves the durable image after an fsyncdir of the source: until both, the durable
  image may hold the file under both names or neither.
- A new directory becomes durable (empty) with an fsyncdir of its parent; its own names need
  its own fsyncdir.
- Simplification: a directory rename moves the directory's durable name at once (if it had
  one), instead of waiting for fsyncdir of both parents.
- A name starting with `.fuse_hidden` (libfuse's name for a file unlinked while open) is
  never durable: fsyncdir treats it as the unlink it stands for.
- fsyncgate: `forget_dirty` marks a file clean without making it durable, as Linux does to
  pages whose writeback failed; a later fsync with no new write then writes nothing.
"""
from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Iterator, Union

ROOT = 1
NAME_MAX = 255
STAGING = ".diskfs-staging"  # reserved at the root: the backing directory's temporary files
# libfuse renames a file unlinked (or renamed over) while open to `.fuse_hiddenNNN` and
# unlinks that at the last close: to the durable image such a name is an unlink.
HIDDEN = ".fuse_hidden"


# --------------------------------------------------------------------------- images and effects


@dataclass
class FileImage:
    data: bytes = b""
    mode: int = 0o644


@dataclass
class DirImage:
    entries: dict[str, "Node"] = field(default_factory=dict)
    mode: int = 0o755

    def as_dict(self) -> dict:
        """Nested {name: bytes | dict}: easy to compare in a test."""
        return {name: (e.as_dict() if isinstance(e, DirImage) else e.data) for name, e in sorted(self.entries.items())}


Node = Union[FileImage, DirImage]
Path = tuple[str, ...]  # names under the root; () is the root itself


@dataclass(frozen=True)
class WriteFile:
    """Replace (atomically) the file at `path` with `data`."""
    path: Path
    data: bytes
    mode: int


@dataclass(frozen=True)
class MakeDir:
    path: Path
    mode: int


@dataclass(frozen=True)
class Remove:
    """Remove `path`, a file or a whole directory tree; a missing path is fine."""
    path: Path


Effect = Union[WriteFile, MakeDir, Remove]


def fs_error(code: int, what: str = "") -> OSError:
    """An OSError with a positive errno: mfusepy returns it to the kernel as -errno."""
    return OSError(code, os.strerror(code) + (f": {what}" if what else ""))


# --------------------------------------------------------------------------- inodes


@dataclass
class Inode:
    ino: int
    is_dir: bool
    mode: int  # permission bits; the type comes from is_dir
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    data: bytearray = field(default_factory=bytearray)  # files: what readers see
    durable_data: bytes = b""  # files: what a power loss leaves
    durable_mode: int = 0o644
    dirty: bool = False  # files: written, truncated or chmodded since the last fsync
    entries: dict[str, int] = field(default_factory=dict)  # dirs: the volatile names
    durable_entries: dict[str, int] = field(default_factory=dict)  # dirs: the durable names
    dparents: set[tuple[int, str]] = field(default_factory=set)  # (dir, name) durable entries naming this inode
    opens: int = 0  # open handles (an unlinked open file lives on)
    vlinks: int = 0  # volatile names but hidden ones (0: unlinked, alive while open or durably named)


def _now() -> int:
    return time.time_ns()


def _split(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


def _check_name(name: str, parent: int) -> None:
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise fs_error(errno.ENAMETOOLONG, name[:40])
    if parent == ROOT and name == STAGING:
        raise fs_error(errno.EPERM, f"{STAGING} is reserved at the root (the backing directory's temporary files)")


def _linked(entries: dict[str, int]) -> dict[str, int]:
    """The names that count as links: all but libfuse's hidden names of unlinked open files."""
    return {n: c for n, c in entries.items() if not n.startswith(HIDDEN)}


class Model:
    """The file system's state. Not thread-safe: the FUSE layer holds one lock around it."""

    def __init__(self, image: DirImage | None = None, uid: int | None = None, gid: int | None = None) -> None:
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self._load(image or DirImage())

    def _load(self, image: DirImage) -> None:
        self.inodes: dict[int, Inode] = {}
        self._next_ino = ROOT
        root = self._new(True, image.mode, self.uid, self.gid)
        self._fill(root, image)
        self._garbage = False

    def _fill(self, node: Inode, image: DirImage) -> None:
        """Volatile = durable = `image` under `node`."""
        for name, child_image in image.entries.items():
            if isinstance(child_image, DirImage):
                child = self._new(True, child_image.mode, self.uid, self.gid)
                self._fill(child, child_image)
            else:
                child = self._new(False, child_image.mode, self.uid, self.gid)
                child.data = bytearray(child_image.data)
                child.durable_data = bytes(child_image.data)
            node.entries[name] = child.ino
            node.durable_entries[name] = child.ino
            child.vlinks = 1
            child.dparents.add((node.ino, name))

    def _new(self, is_dir: bool, mode: int, uid: int, gid: int) -> Inode:
        now = _now()
        node = Inode(self._next_ino, is_dir, mode & 0o7777, uid, gid, now, now, now, durable_mode=mode & 0o7777)
        self.inodes[node.ino] = node
        self._next_ino += 1
        return node

    # ----------------------------------------------------------------------- lookups

    def node(self, ino: int) -> Inode:
        try:
            return self.inodes[ino]
        except KeyError:
            raise fs_error(errno.ENOENT, f"inode {ino}") from None

    def lookup(self, path: str) -> int:
        ino = ROOT
        for part in _split(path):
            node = self.inodes[ino]
            if not node.is_dir:
                raise fs_error(errno.ENOTDIR, path)
            try:
                ino = node.entries[part]
            except KeyError:
                raise fs_error(errno.ENOENT, path) from None
        return ino

    def _parent(self, path: str) -> tuple[Inode, str]:
        parts = _split(path)
        if not parts:
            raise fs_error(errno.EBUSY, "the root")
        parent = self.node(self.lookup("/" + "/".join(parts[:-1])))
        if not parent.is_dir:
            raise fs_error(errno.ENOTDIR, path)
        return parent, parts[-1]

    def stat(self, ino: int) -> dict[str, int]:
        node = self.node(ino)
        if node.is_dir:
            mode = stat.S_IFDIR | node.mode
            size = 4096
            nlink = 2 + sum(1 for c in node.entries.values() if self.inodes[c].is_dir)
        else:
            mode = stat.S_IFREG | node.mode
            size = len(node.data)
            nlink = node.vlinks
        return dict(st_ino=node.ino, st_mode=mode, st_nlink=nlink, st_size=size, st_uid=node.uid,
                    st_gid=node.gid, st_atime=node.atime_ns, st_mtime=node.mtime_ns, st_ctime=node.ctime_ns,
                    st_blocks=(size + 511) // 512, st_blksize=4096)

    def readdir(self, ino: int) -> list[tuple[str, int]]:
        node = self.node(ino)
        if not node.is_dir:
            raise fs_error(errno.ENOTDIR)
        return list(node.entries.items())

    # ----------------------------------------------------------------------- volatile changes

    def create(self, path: str, mode: int = 0o644, uid: int | None = None, gid: int | None = None,
               exclusive: bool = False) -> int:
        """The file at `path`, created empty if missing (EEXIST if `exclusive`)."""
        parent, name = self._parent(path)
        if name in parent.entries:
            if exclusive:
                raise fs_error(errno.EEXIST, path)
            existing = self.inodes[parent.entries[name]]
            if existing.is_dir:
                raise fs_error(errno.EISDIR, path)
            return existing.ino
        return self._link_new(parent, name, False, mode, uid, gid)

    def mkdir(self, path: str, mode: int = 0o755, uid: int | None = None, gid: int | None = None) -> int:
        parent, name = self._parent(path)
        if name in parent.entries:
            raise fs_error(errno.EEXIST, path)
        return self._link_new(parent, name, True, mode, uid, gid)

    def _link_new(self, parent, name: str, is_dir: bool, mode: int, uid: int | None, gid: int | None) -> int:
        """A new inode named `name` in `parent` (a volatile change until the directory is synced)."""
        _check_name(name, parent.ino)
        node = self._new(is_dir, mode, self.uid if uid is None else uid, self.gid if gid is None else gid)
        node.vlinks = 1
        parent.entries[name] = node.ino
        self._touch(parent)
        return node.ino

    def unlink(self, path: str) -> None:
        parent, name = self._parent(path)
        ino = parent.entries.get(name)
        if ino is None:
            raise fs_error(errno.ENOENT, path)
        if self.inodes[ino].is_dir:
            raise fs_error(errno.EISDIR, path)
        del parent.entries[name]
        self._touch(parent)
        self.inodes[ino].ctime_ns = _now()
        self.inodes[ino].vlinks -= not name.startswith(HIDDEN)
        self._garbage = True

    def rmdir(self, path: str) -> None:
        parent, name = self._parent(path)
        ino = parent.entries.get(name)
        if ino is None:
            raise fs_error(errno.ENOENT, path)
        node = self.inodes[ino]
        if not node.is_dir:
            raise fs_error(errno.ENOTDIR, path)
        if _linked(node.entries):  # a hidden name left by an unlinked open file does not count
            raise fs_error(errno.ENOTEMPTY, path)
        del parent.entries[name]
        node.vlinks -= 1
        self._touch(parent)
        self._garbage = True

    def rename(self, old: str, new: str, noreplace: bool = False) -> list[Effect]:
        """Move `old` to `new` in the volatile view. Effects only for a directory (moved at once)."""
        src_parent, src_name = self._parent(old)
        ino = src_parent.entries.get(src_name)
        if ino is None:
            raise fs_error(errno.ENOENT, old)
        node = self.inodes[ino]
        dst_parent, dst_name = self._parent(new)
        if node.is_dir and (new + "/").startswith(old.rstrip("/") + "/"):
            raise fs_error(errno.EINVAL, f"{old} into itself")
        target = dst_parent.entries.get(dst_name)
        if target == ino:
            return []
        if target is not None:
            if noreplace:
                raise fs_error(errno.EEXIST, new)
            victim = self.inodes[target]
            if node.is_dir and not victim.is_dir:
                raise fs_error(errno.ENOTDIR, new)
            if not node.is_dir and victim.is_dir:
                raise fs_error(errno.EISDIR, new)
            if victim.is_dir and _linked(victim.entries):
                raise fs_error(errno.ENOTEMPTY, new)
        _check_name(dst_name, dst_parent.ino)
        if target is not None:
            self.inodes[target].vlinks -= not dst_name.startswith(HIDDEN)
            self._garbage = True
        node.vlinks += src_name.startswith(HIDDEN) - dst_name.startswith(HIDDEN)
        del src_parent.entries[src_name]
        dst_parent.entries[dst_name] = ino
        self._touch(src_parent)
        self._touch(dst_parent)
        node.ctime_ns = _now()
        effects: list[Effect] = []
        if node.is_dir and src_parent.durable_entries.get(src_name) == ino:
            effects += self._ddel(src_parent, src_name)
            effects += self._dset(dst_parent, dst_name, ino)
        return effects

    def write(self, ino: int, offset: int, data: bytes) -> int:
        node = self._file(ino)
        end = offset + len(data)
        if offset > len(node.data):
            node.data.extend(bytes(offset - len(node.data)))
        node.data[offset:end] = data
        node.mtime_ns = node.ctime_ns = _now()
        node.dirty = True
        return len(data)

    def read(self, ino: int, offset: int, size: int) -> bytes:
        node = self._file(ino)
        return bytes(node.data[offset:offset + size])

    def size(self, ino: int) -> int:
        return len(self._file(ino).data)

    def truncate(self, ino: int, length: int) -> None:
        if length < 0:
            raise fs_error(errno.EINVAL, "negative length")
        node = self._file(ino)
        if length < len(node.data):
            del node.data[length:]
        else:
            node.data.extend(bytes(length - len(node.data)))
        node.mtime_ns = node.ctime_ns = _now()
        node.dirty = True

    def chmod(self, ino: int, mode: int) -> None:
        node = self.node(ino)
        node.mode = mode & 0o7777
        node.ctime_ns = _now()
        if not node.is_dir:
            node.dirty = True  # a file's mode becomes durable with its next fsync

    def chown(self, ino: int, uid: int, gid: int) -> None:
        node = self.node(ino)
        if uid != -1:
            node.uid = uid
        if gid != -1:
            node.gid = gid
        node.ctime_ns = _now()

    def utimens(self, ino: int, atime_ns: int | None, mtime_ns: int | None) -> None:
        node = self.node(ino)
        if atime_ns is not None:
            node.atime_ns = atime_ns
        if mtime_ns is not None:
            node.mtime_ns = mtime_ns
        node.ctime_ns = _now()

    def pin(self, ino: int) -> None:
        """An open handle: the inode outlives its last name until `unpin`."""
        self.node(ino).opens += 1

    def unpin(self, ino: int) -> None:
        node = self.inodes.get(ino)
        if node is not None and node.opens > 0:
            node.opens -= 1
            self._garbage = True
        self.collect()

    def _file(self, ino: int) -> Inode:
        node = self.node(ino)
        if node.is_dir:
            raise fs_error(errno.EISDIR)
        return node

    def _touch(self, node: Inode) -> None:
        node.mtime_ns = node.ctime_ns = _now()

    # ----------------------------------------------------------------------- durability

    def fsync(self, ino: int) -> list[Effect]:
        """A file's content and mode become durable, under every durable name it has."""
        node = self.node(ino)
        if node.is_dir:
            return self.fsyncdir(ino)
        if not node.dirty:
            return []
        node.durable_data = bytes(node.data)
        node.durable_mode = node.mode
        node.dirty = False
        return [WriteFile(p, node.durable_data, node.durable_mode) for p in self.durable_paths(ino)]

    def forget_dirty(self, ino: int) -> None:
        """fsyncgate: a failed fsync leaves the file clean but not durable."""
        node = self.node(ino)
        if not node.is_dir:
            node.dirty = False

    def fsyncdir(self, ino: int) -> list[Effect]:
        """A directory's names (and its mode) become durable: the durable entries become the volatile ones."""
        node = self.node(ino)
        if not node.is_dir:
            raise fs_error(errno.ENOTDIR)
        effects: list[Effect] = []
        if node.durable_mode != node.mode:
            node.durable_mode = node.mode
            effects += [MakeDir(p, node.mode) for p in self.durable_paths(ino)]
        wanted = _linked(node.entries)
        for name in [n for n in node.durable_entries if n not in wanted]:
            effects += self._ddel(node, name)
        for name, child in wanted.items():
            if node.durable_entries.get(name) != child:
                effects += self._dset(node, name, child)
        self.collect()
        return effects

    def sync_all(self) -> list[Effect]:
        """Everything becomes durable, as at a clean unmount: every file's content, then every
        directory's names from the root down."""
        effects: list[Effect] = []
        dirs = list(self._volatile_dirs())
        for d in dirs:
            for child in _linked(d.entries).values():
                node = self.inodes[child]
                if not node.is_dir:
                    node.dirty = node.dirty or node.durable_data != node.data or node.durable_mode != node.mode
                    effects += self.fsync(child)
        for d in dirs:
            effects += self.fsyncdir(d.ino)
        return effects

    def _volatile_dirs(self) -> Iterator[Inode]:
        """Every directory of the volatile view, parents before children."""
        queue = [self.inodes[ROOT]]
        while queue:
            d = queue.pop(0)
            yield d
            queue += [self.inodes[c] for c in _linked(d.entries).values() if self.inodes[c].is_dir]

    def _ddel(self, parent: Inode, name: str) -> list[Effect]:
        child = parent.durable_entries.pop(name)
        self.inodes[child].dparents.discard((parent.ino, name))
        self._garbage = True
        return [Remove(p + (name,)) for p in self.durable_paths(parent.ino)]

    def _dset(self, parent: Inode, name: str, ino: int) -> list[Effect]:
        old = parent.durable_entries.get(name)
        if old == ino:
            return []
        node = self.inodes[ino]
        replace_in_place = old is not None and not node.is_dir and not self.inodes[old].is_dir
        if old is not None:
            self.inodes[old].dparents.discard((parent.ino, name))
            self._garbage = True
        parent.durable_entries[name] = ino
        node.dparents.add((parent.ino, name))
        effects: list[Effect] = []
        for p in self.durable_paths(parent.ino):
            if old is not None and not replace_in_place:
                effects.append(Remove(p + (name,)))
            effects += self._materialize(ino, p + (name,))
        return effects

    def _materialize(self, ino: int, path: Path) -> list[Effect]:
        """Effects writing inode `ino`'s durable state at `path`."""
        node = self.inodes[ino]
        if not node.is_dir:
            return [WriteFile(path, node.durable_data, node.durable_mode)]
        effects: list[Effect] = [MakeDir(path, node.durable_mode)]
        for name, child in node.durable_entries.items():
            effects += self._materialize(child, path + (name,))
        return effects

    def durable_paths(self, ino: int, _depth: int = 0) -> list[Path]:
        """Every path of the durable image at which inode `ino` is found."""
        if ino == ROOT:
            return [()]
        if _depth > 4096:
            raise RuntimeError("diskfs model: a cycle in the durable tree")
        return [p + (name,) for parent, name in sorted(self.inodes[ino].dparents)
                for p in self.durable_paths(parent, _depth + 1)]

    # ----------------------------------------------------------------------- images, crash, counts

    def durable_image(self) -> DirImage:
        return self._image(ROOT, durable=True)

    def volatile_image(self) -> DirImage:
        return self._image(ROOT, durable=False)

    def _image(self, ino: int, durable: bool) -> Node:
        node = self.inodes[ino]
        if not node.is_dir:
            return FileImage(node.durable_data, node.durable_mode) if durable else FileImage(bytes(node.data), node.mode)
        entries = node.durable_entries if durable else node.entries
        return DirImage({name: self._image(c, durable) for name, c in entries.items()},
                        node.durable_mode if durable else node.mode)

    def crash(self) -> None:
        """Power loss: the volatile view drops back to the durable image; open handles are gone."""
        self._load(self.durable_image())

    def collect(self) -> None:
        """Forget inodes no name (volatile or durable) and no open handle reaches."""
        if not self._garbage:
            return
        seen: set[int] = set()
        stack = [ROOT] + [n.ino for n in self.inodes.values() if n.opens]
        while stack:
            ino = stack.pop()
            if ino in seen:
                continue
            seen.add(ino)
            node = self.inodes[ino]
            if node.is_dir:
                stack += list(node.entries.values()) + list(node.durable_entries.values())
        for ino in [i for i in self.inodes if i not in seen]:
            node = self.inodes.pop(ino)
            for name, child in node.durable_entries.items():  # a dead directory's durable names
                if child in self.inodes:
                    self.inodes[child].dparents.discard((ino, name))
        self._garbage = False

    def unsynced_bytes(self) -> int:
        """Bytes of the volatile view a power loss would change: the size of every file whose
        content differs from its durable content."""
        return sum(len(n.data) for n in self._volatile_files() if n.data != n.durable_data)

    def file_count(self) -> int:
        return sum(1 for _ in self._volatile_files())

    def _volatile_files(self) -> Iterator[Inode]:
        for d in self._volatile_dirs():
            for child in _linked(d.entries).values():
                if not self.inodes[child].is_dir:
                    yield self.inodes[child]
