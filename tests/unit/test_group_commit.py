"""The syncer's group commit: shared durability, nothing visible before its file is in place."""
from __future__ import annotations

import errno
import json
import threading
from pathlib import Path
from typing import Callable

import pytest

from trainer.group_commit import DiskFailed, GroupCommit, StillCommitting, write_staged
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


def _with_outcomes(s, outcomes: list[str], name: str):
    """Record the staged push's outcome callbacks (apply, abandon) by name."""
    applied = s.apply

    def apply() -> None:
        applied()
        outcomes.append(f"apply {name}")
    s.apply = apply
    s.abandon = lambda: outcomes.append(f"abandon {name}")
    return s


def test_a_waiter_that_gives_up_before_any_commit_took_it_is_abandoned_once_and_its_file_removed(tmp_path):
    release = threading.Event()
    entered = threading.Event()

    def stuck(paths, root):
        entered.set()
        release.wait(WAIT)
    gc = make(tmp_path, {}, storage=HookedSync(stuck))
    applied: list[str] = []
    outcomes: list[str] = []
    leader = threading.Thread(target=lambda: gc.commit(staged(tmp_path, "lead", applied)))
    leader.start()
    assert entered.wait(WAIT)
    late = _with_outcomes(staged(tmp_path, "late", applied), outcomes, "late")
    with pytest.raises(TimeoutError, match="not durable within"):
        gc.commit(late, timeout=0.2)
    assert not late.tmp.exists() and applied == []
    assert outcomes == ["abandon late"]
    release.set()
    leader.join(WAIT)
    assert applied == ["lead"] and outcomes == ["abandon late"]


@pytest.mark.parametrize("group_fails", [False, True])
def test_a_waiter_that_gives_up_while_its_group_is_written_leaves_the_outcome_to_the_group(tmp_path, group_fails):
    """A push whose wait ends while a commit holds its file may yet be durable: the waiter
    must not release it (a retry would be accepted beside it, and both applied); the group
    applies it, or abandons it if it fails."""
    syncs: list[int] = []
    first_entered, release_first = threading.Event(), threading.Event()
    second_entered, release_second = threading.Event(), threading.Event()

    def hook(paths, root):
        syncs.append(len(paths))
        if len(syncs) == 1:
            first_entered.set()
            assert release_first.wait(WAIT)
        else:
            second_entered.set()
            assert release_second.wait(WAIT)
            if group_fails:
                raise OSError(errno.EIO, "planted")
    gc = make(tmp_path, {}, storage=HookedSync(hook))
    applied: list[str] = []
    outcomes: list[str] = []
    results: dict[str, object] = {}

    def commit(name: str, timeout: float) -> None:
        s = _with_outcomes(staged(tmp_path, name, applied), outcomes, name)
        try:
            results[name] = gc.commit(s, timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            results[name] = exc
    lead = threading.Thread(target=commit, args=("lead", WAIT))
    lead.start()
    assert first_entered.wait(WAIT)
    waiters = [threading.Thread(target=commit, args=(name, 1.0)) for name in ("b", "c")]
    for t in waiters:
        t.start()
    poll = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        with gc._cond:
            if len(gc._queue) == 2:
                break
        poll.wait(0.01)
    release_first.set()  # b and c go out together, one of them leading
    assert second_entered.wait(WAIT)
    for _ in range(int(WAIT / 0.01)):
        if any(isinstance(r, StillCommitting) for r in results.values()):
            break
        poll.wait(0.01)
    gave_up = [n for n, r in results.items() if isinstance(r, StillCommitting)]
    assert len(gave_up) == 1, f"one of b, c leads and the other gives up while it writes: {results}"
    assert not any(o.endswith(gave_up[0]) for o in outcomes), "released while its group was still being written"
    release_second.set()
    for t in (lead, *waiters):
        t.join(WAIT)
    other = ({"b", "c"} - set(gave_up)).pop()
    expected = "abandon" if group_fails else "apply"
    assert sorted(o for o in outcomes if o != "apply lead") == sorted([f"{expected} b", f"{expected} c"])
    assert isinstance(results[other], OSError) if group_fails else results[other] == 2
