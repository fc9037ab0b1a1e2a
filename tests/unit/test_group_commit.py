"""The syncer's group commit: shared durability, nothing visible before its file is in place."""
from __future__ import annotations

import errno
import json
import threading
from pathlib import Path
from typing import Callable

import pytest

from trainer.group_commit import DiskFailed, GroupCommit, write_staged
from trainer.simdisk import SimDisk
from trainer.storage import FILES, FileStorage, Storage, SyncFailed

WAIT = 10.0  # every wait in these tests is bounded by this


class HookedSync(FileStorage):
    """The real disk, with a hook run before each group's sync (to hold or break it)."""

    def __init__(self, hook: Callable[[list[Path], Path], None]) -> None:
        super().__init__()
        self.hook = hook

    def sync_files(self, paths: list[Path], root: Path) -> None:
        self.hook(paths, root)
        super().sync_files(paths, root)


def make(tmp_path: Path, state: dict, lock: threading.Condition | None = None,
         storage: Storage = FILES) -> GroupCommit:
    lock = lock or threading.Condition()
    return GroupCommit(tmp_path, tmp_path / "meta.json", lambda: lock, lambda: dict(state), storage=storage)


def staged(tmp_path: Path, name: str, applied: list[str], state: dict | None = None, storage: Storage = FILES):
    s = write_staged(tmp_path / "pending" / f"{name}.bin", name.encode(), storage=storage)

    def apply() -> None:
        assert storage.exists(s.final), "applied before its file was in place"
        applied.append(name)
        if state is not None:
            state["accepted"] = state.get("accepted", 0) + 1
    s.apply = apply
    return s


def test_a_commit_makes_the_file_final_applies_it_and_writes_the_document(tmp_path):
    state: dict = {"n": 1}
    gc = make(tmp_path, state)
    applied: list[str] = []
    s = staged(tmp_path, "a", applied, state)
    assert s.tmp.exists() and not s.final.exists()
    assert gc.commit(s) == 1
    assert s.final.read_bytes() == b"a" and not s.tmp.exists()
    assert applied == ["a"]
    assert json.loads((tmp_path / "meta.json").read_text()) == {"n": 1, "accepted": 1}


def test_pushes_waiting_behind_a_commit_share_the_next_one(tmp_path, monkeypatch):
    """While one commit's sync is slow, the others queue and go out together: far fewer
    groups than commits, and every commit's file applied exactly once."""
    release = threading.Event()
    entered = threading.Event()

    def slow_sync(paths, root):
        entered.set()
        assert release.wait(WAIT), "the test never released the first sync"
    state: dict = {}
    gc = make(tmp_path, state, storage=HookedSync(slow_sync))
    applied: list[str] = []
    groups: dict[str, int] = {}

    def push(name: str) -> None:
        groups[name] = gc.commit(staged(tmp_path, name, applied, state))

    first = threading.Thread(target=push, args=("p0",))
    first.start()
    assert entered.wait(WAIT), "the first commit never reached its sync"
    rest = [threading.Thread(target=push, args=(f"p{i}",)) for i in range(1, 9)]
    for t in rest:
        t.start()
    deadline = threading.Event()
    for _ in range(100):  # until all eight are queued behind the first (bounded: 100 x 0.05 s)
        with gc._cond:
            if len(gc._queue) == 8:
                break
        deadline.wait(0.05)
    release.set()
    for t in [first, *rest]:
        t.join(WAIT)
        assert not t.is_alive(), "a commit did not return"
    assert sorted(applied) == sorted(f"p{i}" for i in range(9))
    assert groups["p0"] == 1 and {groups[f"p{i}"] for i in range(1, 9)} == {8}
    assert gc.stats.groups == 2 and gc.stats.files == 9
    assert json.loads((tmp_path / "meta.json").read_text())["accepted"] == 9


def test_a_failed_sync_fails_its_group_applies_nothing_removes_the_files_and_the_disk_stays_failed(tmp_path):
    """fsyncgate: after a failed sync a later one may succeed without the lost pages, so
    nothing is made durable again until a restart reads the disk back."""
    disk = SimDisk(roots=(str(tmp_path),))
    gc = make(tmp_path, {}, storage=disk)
    applied: list[str] = []
    s = staged(tmp_path, "x", applied, storage=disk)
    disk.fail("sync_files", errno.EIO)
    with pytest.raises(SyncFailed, match="EIO"):
        gc.commit(s)
    assert applied == [] and not disk.exists(s.tmp) and not disk.exists(s.final)
    assert not disk.exists(tmp_path / "meta.json")
    disk.heal()
    late = staged(tmp_path, "y", applied, storage=disk)
    with pytest.raises(DiskFailed, match="a sync failed earlier"):
        gc.commit(late)
    assert applied == [] and not disk.exists(late.tmp), "a refused commit leaves no temporary"


@pytest.mark.parametrize("step", ["rename", "fsync_dir"])
def test_a_failure_before_the_files_are_in_place_fails_the_group_and_removes_every_file(tmp_path, step):
    disk = SimDisk(roots=(str(tmp_path),))
    gc = make(tmp_path, {}, storage=disk)
    applied: list[str] = []
    s = staged(tmp_path, "x", applied, storage=disk)
    disk.fail(step, errno.EIO)
    with pytest.raises(OSError, match="EIO"):
        gc.commit(s)
    assert applied == [] and not disk.exists(s.tmp) and not disk.exists(s.final)
    assert (gc.failed is not None) == (step == "fsync_dir"), "only a failed sync marks the disk failed"


def test_a_full_disk_at_meta_json_keeps_the_group_whose_files_are_in_place(tmp_path):
    """Past the renames the pushes are durable: they count, and are acknowledged; a commit
    with no file, which exists to write the document, fails; the next commit writes it."""
    disk = SimDisk(roots=(str(tmp_path),))
    state = {"n": 1}
    gc = make(tmp_path, state, storage=disk)
    applied: list[str] = []
    s = staged(tmp_path, "x", applied, state, storage=disk)
    disk.fail("create", errno.ENOSPC)
    assert gc.commit(s) == 1
    assert applied == ["x"] and disk.exists(s.final) and not disk.exists(tmp_path / "meta.json")
    with pytest.raises(OSError, match="ENOSPC"):
        gc.commit()
    assert gc.failed is None and isinstance(gc.document_error, OSError)
    disk.heal()
    gc.commit()
    assert json.loads(disk.read_bytes(tmp_path / "meta.json")) == {"n": 1, "accepted": 1}
    assert gc.document_error is None


def test_a_full_disk_leaves_no_temporary_behind(tmp_path):
    disk = SimDisk(roots=(str(tmp_path),))
    disk.fail("create", errno.ENOSPC)
    with pytest.raises(OSError, match="ENOSPC"):
        write_staged(tmp_path / "pending" / "x.bin", b"x" * 100, storage=disk)
    assert disk.listdir(tmp_path / "pending") == []


def test_a_document_only_commit_sees_changes_made_before_it(tmp_path):
    lock = threading.Condition()
    state = {"incarnation": 1}
    gc = make(tmp_path, state, lock)
    with lock:
        state["incarnation"] = 2
    gc.commit()
    assert json.loads((tmp_path / "meta.json").read_text()) == {"incarnation": 2}


def test_meta_json_never_goes_back_to_an_older_document(tmp_path):
    """Concurrent document commits while the state grows: the file ends at the newest."""
    lock = threading.Condition()
    state = {"n": 0}
    gc = make(tmp_path, state, lock)

    def bump() -> None:
        for _ in range(20):
            with lock:
                state["n"] += 1
            gc.commit()
    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    assert json.loads((tmp_path / "meta.json").read_text())["n"] == 80


def test_a_waiter_gives_up_after_its_timeout_and_its_file_is_removed(tmp_path):
    release = threading.Event()
    entered = threading.Event()

    def stuck(paths, root):
        entered.set()
        release.wait(WAIT)
    gc = make(tmp_path, {}, storage=HookedSync(stuck))
    applied: list[str] = []
    leader = threading.Thread(target=lambda: gc.commit(staged(tmp_path, "lead", applied)))
    leader.start()
    assert entered.wait(WAIT)
    late = staged(tmp_path, "late", applied)
    with pytest.raises(TimeoutError, match="not durable within"):
        gc.commit(late, timeout=0.2)
    assert not late.tmp.exists() and applied == []
    release.set()
    leader.join(WAIT)
    assert applied == ["lead"]
