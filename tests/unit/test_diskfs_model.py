"""chaos/diskfs/model.py: what survives a power loss, without FUSE (runs everywhere).

Each test does what a program does through the mount, then `crash()` (or reads
`durable_image()`) and checks what a Linux file system allows to be left.
"""
from __future__ import annotations

import errno
import random

import pytest

from chaos.diskfs.backing import Backing, load_image
from chaos.diskfs.model import HIDDEN, ROOT, STAGING, DirImage, FileImage, Model


def put(m: Model, path: str, data: bytes, fsync: bool = True) -> int:
    ino = m.create(path)
    m.truncate(ino, 0)
    m.write(ino, 0, data)
    if fsync:
        m.fsync(ino)
    return ino


def fsyncdir(m: Model, path: str = "/") -> None:
    m.fsyncdir(m.lookup(path))


def durable(m: Model) -> dict:
    return m.durable_image().as_dict()


def volatile(m: Model) -> dict:
    return m.volatile_image().as_dict()


def test_a_loaded_image_is_both_views() -> None:
    image = DirImage({"a": FileImage(b"A"), "d": DirImage({"f": FileImage(b"F")})})
    m = Model(image)
    assert volatile(m) == durable(m) == {"a": b"A", "d": {"f": b"F"}}
    m.crash()
    assert volatile(m) == {"a": b"A", "d": {"f": b"F"}}


def test_a_write_without_fsync_is_lost_at_a_crash() -> None:
    m = Model(DirImage({"a": FileImage(b"old")}))
    ino = m.lookup("/a")
    m.write(ino, 0, b"new")
    assert m.read(ino, 0, 10) == b"new"
    assert m.unsynced_bytes() == 3
    m.crash()
    assert volatile(m) == {"a": b"old"}


def test_fsync_without_fsyncdir_of_a_new_file_loses_its_name() -> None:
    m = Model()
    put(m, "/new", b"data")
    assert durable(m) == {}
    m.crash()
    assert volatile(m) == {}


def test_fsync_and_fsyncdir_make_a_new_file_durable() -> None:
    m = Model()
    put(m, "/new", b"data")
    fsyncdir(m)
    m.crash()
    assert volatile(m) == {"new": b"data"}


def test_fsyncdir_without_fsync_makes_the_name_durable_with_the_durable_content() -> None:
    m = Model()
    put(m, "/new", b"data", fsync=False)
    fsyncdir(m)
    assert durable(m) == {"new": b""}
    ino = m.lookup("/new")
    m.fsync(ino)  # now under its durable name too
    assert durable(m) == {"new": b"data"}


def test_the_atomic_replace_pattern() -> None:
    """mkstemp, write, fsync, rename over the target, fsyncdir: the pattern of trainer/atomic.py."""
    m = Model(DirImage({"meta.json": FileImage(b"v1")}))
    put(m, "/.meta.json.123.tmp", b"v2")
    m.rename("/.meta.json.123.tmp", "/meta.json")
    assert volatile(m) == {"meta.json": b"v2"}
    assert durable(m) == {"meta.json": b"v1"}  # the rename is not durable before fsyncdir
    fsyncdir(m)
    assert durable(m) == {"meta.json": b"v2"}
    m.crash()
    assert volatile(m) == {"meta.json": b"v2"}


def test_rename_without_fsync_of_the_file_gives_the_durable_content_under_the_new_name() -> None:
    m = Model(DirImage({"meta.json": FileImage(b"v1")}))
    put(m, "/tmp", b"v2", fsync=False)
    m.rename("/tmp", "/meta.json")
    fsyncdir(m)
    assert durable(m) == {"meta.json": b""}  # the classic zero-length file after a crash


def test_a_rename_across_directories_is_durable_per_directory() -> None:
    m = Model(DirImage({"src": DirImage({"f": FileImage(b"F")}), "dst": DirImage()}))
    m.rename("/src/f", "/dst/g")
    assert durable(m) == {"src": {"f": b"F"}, "dst": {}}
    fsyncdir(m, "/dst")  # the target first: the file under both names
    assert durable(m) == {"src": {"f": b"F"}, "dst": {"g": b"F"}}
    fsyncdir(m, "/src")
    assert durable(m) == {"src": {}, "dst": {"g": b"F"}}

    m = Model(DirImage({"src": DirImage({"f": FileImage(b"F")}), "dst": DirImage()}))
    m.rename("/src/f", "/dst/g")
    fsyncdir(m, "/src")  # the source first: under neither name
    assert durable(m) == {"src": {}, "dst": {}}
    m.crash()
    assert volatile(m) == {"src": {}, "dst": {}}


def test_an_unlink_is_durable_only_after_fsyncdir() -> None:
    m = Model(DirImage({"a": FileImage(b"A")}))
    m.unlink("/a")
    assert volatile(m) == {}
    assert durable(m) == {"a": b"A"}
    m.crash()
    assert volatile(m) == {"a": b"A"}
    m.unlink("/a")
    fsyncdir(m)
    m.crash()
    assert volatile(m) == {}


def test_truncate() -> None:
    m = Model(DirImage({"a": FileImage(b"abcdef")}))
    ino = m.lookup("/a")
    m.truncate(ino, 2)
    assert m.read(ino, 0, 100) == b"ab"
    m.crash()
    ino = m.lookup("/a")
    assert m.read(ino, 0, 100) == b"abcdef"
    m.truncate(ino, 8)
    assert m.read(ino, 0, 100) == b"abcdef\0\0"
    m.fsync(ino)
    m.crash()
    assert volatile(m) == {"a": b"abcdef\0\0"}


def test_a_write_past_the_end_fills_with_zeros() -> None:
    m = Model()
    ino = m.create("/a")
    m.write(ino, 4, b"x")
    assert m.read(ino, 0, 10) == b"\0\0\0\0x"
    assert m.stat(ino)["st_size"] == 5


def test_nested_directories_need_each_parent_fsynced() -> None:
    m = Model()
    m.mkdir("/a")
    m.mkdir("/a/b")
    put(m, "/a/b/f", b"F")
    fsyncdir(m, "/a/b")
    assert durable(m) == {}  # /a itself is not durable yet
    fsyncdir(m, "/")
    assert durable(m) == {"a": {}}  # a new directory is durable empty
    fsyncdir(m, "/a")
    assert durable(m) == {"a": {"b": {"f": b"F"}}}  # b was fsyncdir'd before: its names come along
    m.crash()
    assert volatile(m) == {"a": {"b": {"f": b"F"}}}


def test_rmdir_of_a_durable_tree_is_durable_after_fsyncdir_of_its_parent() -> None:
    m = Model(DirImage({"d": DirImage({"f": FileImage(b"F")})}))
    m.unlink("/d/f")
    m.rmdir("/d")
    assert durable(m) == {"d": {"f": b"F"}}
    fsyncdir(m)
    assert durable(m) == {}


def test_a_directory_rename_is_durable_at_once() -> None:
    """The documented simplification."""
    m = Model(DirImage({"a": DirImage({"f": FileImage(b"F")})}))
    m.rename("/a", "/b")
    assert durable(m) == {"b": {"f": b"F"}}
    m.mkdir("/new")
    m.rename("/new", "/newer")  # never durable: stays so until fsyncdir
    assert durable(m) == {"b": {"f": b"F"}}
    fsyncdir(m)
    assert durable(m) == {"b": {"f": b"F"}, "newer": {}}


def test_libfuse_hidden_names_are_never_durable() -> None:
    m = Model(DirImage({"a": FileImage(b"A")}))
    ino = m.lookup("/a")
    m.pin(ino)  # open
    hidden = f"/{HIDDEN}0000000200000001"
    m.rename("/a", hidden)  # libfuse's unlink of an open file
    assert m.stat(ino)["st_nlink"] == 0
    fsyncdir(m)
    assert durable(m) == {}
    m.unlink(hidden)  # the last close
    m.unpin(ino)
    assert ino not in m.inodes
    assert m.sync_all() == [] or durable(m) == {}


def test_rmdir_ignores_a_hidden_name() -> None:
    m = Model()
    m.mkdir("/d")
    ino = put(m, "/d/f", b"F")
    m.pin(ino)
    m.rename("/d/f", f"/d/{HIDDEN}1")
    m.rmdir("/d")
    assert m.read(ino, 0, 10) == b"F"
    m.unpin(ino)
    assert ino not in m.inodes and volatile(m) == {}


def test_an_unlinked_open_file_lives_until_closed() -> None:
    m = Model()
    ino = put(m, "/a", b"A")
    m.pin(ino)
    m.unlink("/a")
    m.collect()
    assert m.read(ino, 0, 10) == b"A"
    m.unpin(ino)
    assert ino not in m.inodes


def test_fsyncgate_a_forgotten_file_is_not_written_by_a_later_fsync() -> None:
    m = Model(DirImage({"a": FileImage(b"old")}))
    ino = m.lookup("/a")
    m.write(ino, 0, b"new")
    m.forget_dirty(ino)  # the fsync that failed with EIO
    assert m.fsync(ino) == []  # retried: nothing left to write
    assert durable(m) == {"a": b"old"}
    assert m.unsynced_bytes() == 3
    m.write(ino, 0, b"NEW")  # a new write dirties it again
    m.fsync(ino)
    assert durable(m) == {"a": b"NEW"}


def test_sync_all_makes_everything_durable() -> None:
    m = Model(DirImage({"gone": FileImage(b"G"), "d": DirImage({"x": FileImage(b"X")})}))
    m.unlink("/gone")
    put(m, "/d/new", b"N", fsync=False)
    m.mkdir("/d/sub")
    put(m, "/d/sub/deep", b"D", fsync=False)
    m.write(m.lookup("/d/x"), 0, b"Y")
    m.sync_all()
    assert durable(m) == volatile(m) == {"d": {"new": b"N", "sub": {"deep": b"D"}, "x": b"Y"}}
    assert m.unsynced_bytes() == 0


def test_mode_is_durable_with_fsync() -> None:
    m = Model(DirImage({"a": FileImage(b"A", 0o644)}))
    ino = m.lookup("/a")
    m.chmod(ino, 0o600)
    assert m.durable_image().entries["a"].mode == 0o644
    m.fsync(ino)
    assert m.durable_image().entries["a"].mode == 0o600


@pytest.mark.parametrize("call, code", [
    (lambda m: m.lookup("/missing"), errno.ENOENT),
    (lambda m: m.lookup("/f/x"), errno.ENOTDIR),
    (lambda m: m.create("/f", exclusive=True), errno.EEXIST),
    (lambda m: m.create("/d"), errno.EISDIR),
    (lambda m: m.mkdir("/d"), errno.EEXIST),
    (lambda m: m.mkdir("/missing/x"), errno.ENOENT),
    (lambda m: m.unlink("/d"), errno.EISDIR),
    (lambda m: m.unlink("/missing"), errno.ENOENT),
    (lambda m: m.rmdir("/f"), errno.ENOTDIR),
    (lambda m: m.rmdir("/d"), errno.ENOTEMPTY),
    (lambda m: m.rename("/d", "/d/in/itself"), errno.EINVAL),
    (lambda m: m.rename("/f", "/g", noreplace=True), errno.EEXIST),
    (lambda m: m.rename("/f", "/d"), errno.EISDIR),
    (lambda m: m.rename("/e", "/f"), errno.ENOTDIR),
    (lambda m: m.rename("/e", "/d"), errno.ENOTEMPTY),
    (lambda m: m.create("/" + "x" * 256), errno.ENAMETOOLONG),
    (lambda m: m.mkdir("/" + STAGING), errno.EPERM),
    (lambda m: m.read(m.lookup("/d"), 0, 1), errno.EISDIR),
    (lambda m: m.fsyncdir(m.lookup("/f")), errno.ENOTDIR),
    (lambda m: m.truncate(m.lookup("/f"), -1), errno.EINVAL),
])
def test_errors_are_the_ones_linux_gives(call, code) -> None:
    m = Model(DirImage({"f": FileImage(b"F"), "g": FileImage(b"G"), "d": DirImage({"in": DirImage()}),
                        "e": DirImage()}))
    with pytest.raises(OSError) as info:
        call(m)
    assert info.value.errno == code


def test_counts() -> None:
    m = Model(DirImage({"a": FileImage(b"12345"), "d": DirImage({"b": FileImage(b"")})}))
    assert m.file_count() == 2
    assert m.unsynced_bytes() == 0
    put(m, "/c", b"xyz", fsync=False)
    assert m.file_count() == 3
    assert m.unsynced_bytes() == 3


# --------------------------------------------------------------------------- the backing directory


def test_load_image_skips_the_staging_directory(tmp_path) -> None:
    (tmp_path / STAGING).mkdir()
    (tmp_path / STAGING / "1.1").write_bytes(b"torn")
    (tmp_path / "a").write_bytes(b"A")
    assert load_image(tmp_path).as_dict() == {"a": b"A"}
    assert not (tmp_path / STAGING).exists()


def _random_step(m: Model, rng: random.Random) -> list:
    dirs = ["/"] + [f"/{n}" for n in ("d1", "d2") if n in m.node(ROOT).entries]
    parent = rng.choice(dirs).rstrip("/")
    name = rng.choice(["a", "b", "c", "d1", "d2"])
    path = f"{parent}/{name}"
    other = f"{rng.choice(dirs).rstrip('/')}/{rng.choice(['a', 'b', 'c', 'd1', 'd2'])}"
    op = rng.choice(["create", "write", "fsync", "fsyncdir", "fsyncdir", "rename", "unlink", "mkdir", "rmdir",
                     "truncate", "chmod"])
    try:
        if op == "create":
            m.create(path)
        elif op == "mkdir":
            m.mkdir(path)
        elif op == "write":
            m.write(m.lookup(path), rng.randrange(8), bytes([rng.randrange(256)]) * rng.randrange(1, 6))
        elif op == "truncate":
            m.truncate(m.lookup(path), rng.randrange(6))
        elif op == "chmod":
            m.chmod(m.lookup(path), rng.choice([0o600, 0o644, 0o755]))
        elif op == "fsync":
            return m.fsync(m.lookup(path))
        elif op == "fsyncdir":
            return m.fsyncdir(m.lookup(rng.choice(dirs)))
        elif op == "rename":
            return m.rename(path, other, noreplace=rng.random() < 0.2)
        elif op == "unlink":
            m.unlink(path)
        elif op == "rmdir":
            m.rmdir(path)
    except OSError:
        pass
    return []


@pytest.mark.parametrize("seed", range(12))
def test_the_effects_keep_the_backing_directory_equal_to_the_durable_image(tmp_path, seed) -> None:
    """Random programs: after every step the backing directory holds the durable image,
    and a crash brings back exactly that."""
    rng = random.Random(seed)
    root = tmp_path / "backing"
    m = Model(load_image(root))
    backing = Backing(root)
    for step in range(300):
        backing.apply(_random_step(m, rng))
        assert load_image(root).as_dict() == durable(m), f"seed {seed}, step {step}"
        if rng.random() < 0.03:
            m.crash()
            assert volatile(m) == durable(m)
    backing.apply(m.sync_all())
    assert load_image(root).as_dict() == durable(m) == volatile(m)
