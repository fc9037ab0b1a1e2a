"""The storage seam: the real disk's discipline (FileStorage) and the simulated disk's
power-loss semantics (SimDisk), which the crash-state test relies on."""
from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from trainer import storage as storage_mod
from trainer.simdisk import SimDisk
from trainer.storage import FUSE_SUPER_MAGIC, FileStorage, SyncFailed, describe_error, filesystem_type


# ----------------------------------------------------------------------------- FileStorage

def test_a_group_is_synced_with_one_syncfs_where_it_is_a_barrier(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(storage_mod.os, "fsync", lambda fd: calls.append("fsync"))
    monkeypatch.setattr(storage_mod, "_SYNCFS", lambda fd: calls.append("syncfs") or 0)
    monkeypatch.setattr(storage_mod, "syncfs_is_a_barrier", lambda root: True)
    files = [tmp_path / f"f{i}" for i in range(3)]
    for f in files:
        f.write_bytes(b"x")
    FileStorage().sync_files(files, tmp_path)
    assert calls == ["syncfs"]


def test_on_fuse_every_file_is_fsynced_since_syncfs_is_not_forwarded(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(storage_mod.os, "fsync", lambda fd: calls.append("fsync"))
    monkeypatch.setattr(storage_mod, "_SYNCFS", lambda fd: calls.append("syncfs") or 0)
    monkeypatch.setattr(storage_mod, "filesystem_type", lambda path: FUSE_SUPER_MAGIC)
    files = [tmp_path / f"f{i}" for i in range(3)]
    for f in files:
        f.write_bytes(b"x")
    FileStorage().sync_files(files, tmp_path)
    assert calls == ["fsync"] * 3


def test_a_failed_syncfs_is_never_followed_by_a_fallback(tmp_path, monkeypatch):
    """fsyncgate: an fsync after a failed syncfs could succeed without the lost pages."""
    calls: list[str] = []
    monkeypatch.setattr(storage_mod.os, "fsync", lambda fd: calls.append("fsync"))

    def failing(fd: int) -> int:
        calls.append("syncfs")
        storage_mod.ctypes.set_errno(errno.EIO)
        return -1
    monkeypatch.setattr(storage_mod, "_SYNCFS", failing)
    monkeypatch.setattr(storage_mod, "syncfs_is_a_barrier", lambda root: True)
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(SyncFailed) as info:
        FileStorage().sync_files([tmp_path / "f"], tmp_path)
    assert calls == ["syncfs"] and info.value.errno == errno.EIO
    assert describe_error(info.value).startswith("EIO (")


def test_a_failed_fsync_is_a_sync_failure(tmp_path, monkeypatch):
    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(storage_mod.os, "fsync", failing)
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(SyncFailed):
        FileStorage().fsync(tmp_path / "f")
    with pytest.raises(SyncFailed):
        FileStorage().fsync_dir(tmp_path)


def test_the_file_system_type_is_read(tmp_path):
    assert isinstance(filesystem_type(tmp_path), int)
    assert filesystem_type(tmp_path / "missing") is None


def test_a_create_that_fails_midway_leaves_no_file(tmp_path):
    def parts():
        yield b"first"
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError):
        FileStorage().create(tmp_path / ".x.tmp", parts())
    assert list(tmp_path.iterdir()) == []


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    store = FileStorage()
    store.atomic_write(tmp_path / "f", b"old")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(storage_mod.os, "fsync", failing)
    with pytest.raises(SyncFailed):
        store.atomic_write(tmp_path / "f", b"new")
    assert (tmp_path / "f").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_mkdir_makes_each_new_directory_durable_in_its_parent(tmp_path, monkeypatch):
    synced: list[str] = []
    store = FileStorage()
    monkeypatch.setattr(store, "fsync_dir", lambda path: synced.append(str(Path(path).relative_to(tmp_path))))
    store.mkdir(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir() and synced == [".", "a"]
    store.mkdir(tmp_path / "a" / "b")
    assert synced == [".", "a"], "an existing directory costs nothing"


def test_sync_tree_makes_every_directory_and_the_root_durable(tmp_path, monkeypatch):
    """A directory whose creator was killed between mkdir(2) and the fsync of its parent
    exists but may vanish at a power loss; mkdir skips it, so recovery syncs the tree."""
    synced: list[str] = []
    store = FileStorage()
    root = tmp_path / "state"
    (root / "pending" / "0").mkdir(parents=True)  # made with no fsync, as by a killed syncer
    (root / "pending" / "0" / "1:1:1.safetensors").write_bytes(b"")
    (root / "quarantine").mkdir()
    monkeypatch.setattr(store, "fsync_dir", lambda path: synced.append(str(Path(path).relative_to(tmp_path))))
    assert store.sync_tree(root) == 5
    assert sorted(synced) == [".", "state", "state/pending", "state/pending/0", "state/quarantine"]


def test_a_recovering_syncer_syncs_its_state_tree(rig, monkeypatch):
    synced: set[Path] = set()
    fsync_dir = FileStorage.fsync_dir
    (rig.state_dir / "pending" / "0").mkdir(parents=True)  # left by a syncer killed mid-mkdir

    def recording(self, path):
        synced.add(Path(path))
        fsync_dir(self, path)
    monkeypatch.setattr(FileStorage, "fsync_dir", recording)
    rig.make()
    assert {rig.state_dir.parent, rig.state_dir, rig.state_dir / "pending", rig.state_dir / "pending" / "0"} <= synced


def test_temporaries_are_found_at_any_depth(tmp_path):
    store = FileStorage()
    (tmp_path / "pending" / "0").mkdir(parents=True)
    (tmp_path / "pending" / "0" / ".x.safetensors.1.2.tmp").write_bytes(b"")
    (tmp_path / ".meta.json.1.2.tmp").write_bytes(b"")
    (tmp_path / "keep.safetensors").write_bytes(b"")
    assert store.remove_temporaries(tmp_path) == 2
    assert sorted(os.listdir(tmp_path)) == ["keep.safetensors", "pending"]


# ----------------------------------------------------------------------------- SimDisk

ROOT = Path("/state")


def disk() -> SimDisk:
    return SimDisk(roots=(str(ROOT),))


def test_an_unsynced_write_is_lost_at_a_power_loss():
    d = disk()
    d.create(ROOT / "a", [b"data"])
    d.fsync_dir(ROOT)
    assert d.crash().read_bytes(ROOT / "a") == b"", "the name was durable, its content never was"
    d.fsync(ROOT / "a")
    assert d.crash().read_bytes(ROOT / "a") == b"data"


def test_a_new_file_needs_its_directory_synced():
    d = disk()
    d.create(ROOT / "a", [b"data"])
    d.fsync(ROOT / "a")
    assert not d.crash().exists(ROOT / "a")
    d.fsync_dir(ROOT)
    assert d.crash().read_bytes(ROOT / "a") == b"data"


def test_a_rename_counts_only_once_its_directory_is_synced():
    d = disk()
    d.atomic_write(ROOT / "f", b"old")
    tmp = ROOT / ".f.tmp"
    d.create(tmp, [b"new"])
    d.fsync(tmp)
    d.rename(tmp, ROOT / "f")
    assert d.read_bytes(ROOT / "f") == b"new"
    after = d.crash()
    assert after.read_bytes(ROOT / "f") == b"old" and not after.exists(tmp), "the temporary's name was never synced"
    d.fsync_dir(ROOT)
    after = d.crash()
    assert after.read_bytes(ROOT / "f") == b"new" and not after.exists(tmp)


def test_a_new_directory_is_durable_in_its_parent_once_mkdir_returns():
    d = disk()
    d.mkdir(ROOT / "pending" / "0")
    d.atomic_write(ROOT / "pending" / "0" / "x", b"x")
    assert d.crash().read_bytes(ROOT / "pending" / "0" / "x") == b"x"
    d.fail("fsync_dir", errno.EIO)
    with pytest.raises(SyncFailed):
        d.mkdir(ROOT / "quarantine")


def test_unlink_counts_once_its_directory_is_synced():
    d = disk()
    d.atomic_write(ROOT / "a", b"a")
    d.unlink(ROOT / "a")
    assert not d.exists(ROOT / "a") and d.crash().exists(ROOT / "a")
    d.fsync_dir(ROOT)
    assert not d.crash().exists(ROOT / "a")


def test_a_torn_write_keeps_a_prefix_of_what_was_unsynced():
    d = disk()
    d.atomic_write(ROOT / "log", b"head")
    d.create(ROOT / "log", [b"head-and-a-long-tail"])  # overwritten in place, not synced
    seen = {d.crash(random.Random(seed)).read_bytes(ROOT / "log") for seed in range(40)}
    assert all(b"head-and-a-long-tail".startswith(s) and s.startswith(b"head") for s in seen)
    assert len(seen) > 3


def test_faults_are_raised_until_healed_and_a_failed_sync_makes_nothing_durable():
    d = disk()
    d.create(ROOT / "a", [b"a"])
    d.fail("fsync", errno.EIO)
    with pytest.raises(SyncFailed):
        d.fsync(ROOT / "a")
    d.fsync_dir(ROOT)
    assert d.crash().read_bytes(ROOT / "a") == b""
    d.heal("fsync")
    d.fsync(ROOT / "a")
    d.fail("create", errno.ENOSPC)
    with pytest.raises(OSError) as info:
        d.create(ROOT / "b", [b"b"])
    assert info.value.errno == errno.ENOSPC and not d.exists(ROOT / "b")
    with pytest.raises(ValueError, match="cannot fail"):
        d.fail("read_bytes", errno.EIO)


def test_a_name_is_the_same_file_however_it_is_spelt():
    """The disk keys names by their normalised text: a Path, its text and a spelling with
    `//` or `.` in it name one file (and one directory), as on a real disk."""
    d = disk()
    d.mkdir(Path(f"{ROOT}/sub/"))
    d.create(Path(f"{ROOT}//sub/./x"), [b"1"])
    assert d.read_bytes(ROOT / "sub" / "x") == b"1" and d.read_bytes(f"{ROOT}/sub/x") == b"1"
    assert d.is_dir(f"{ROOT}/sub") and d.listdir(ROOT) == ["sub"] and d.listdir(ROOT / "sub") == ["x"]
    d.fsync(f"{ROOT}/sub//x")
    d.fsync_dir(ROOT / "sub")
    assert d.crash().read_bytes(ROOT / "sub" / "x") == b"1"


def test_every_durable_change_is_recorded_with_its_op():
    d = disk()
    d.atomic_write(ROOT / "a", b"1")
    first = d.ops
    d.atomic_write(ROOT / "a", b"2")
    assert d.image_at(0).files == {}
    assert d.image_at(first).files[str(ROOT / "a")] == b"1"
    assert d.image_at(d.ops).files[str(ROOT / "a")] == b"2"
    again = SimDisk.from_image(d.image_at(first))
    assert again.read_bytes(ROOT / "a") == b"1" and again.image().digest() == d.image_at(first).digest()
