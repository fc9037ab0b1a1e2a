"""The syncer's group commit: shared durability, nothing visible before its file is in place."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from trainer import group_commit
from trainer.group_commit import GroupCommit, write_staged

WAIT = 10.0  # every wait in these tests is bounded by this


def make(tmp_path: Path, state: dict, lock: threading.Condition | None = None) -> GroupCommit:
    lock = lock or threading.Condition()
    return GroupCommit(tmp_path, tmp_path / "meta.json", lambda: lock, lambda: dict(state))


def staged(tmp_path: Path, name: str, applied: list[str], state: dict | None = None):
    s = write_staged(tmp_path / "pending" / f"{name}.bin", name.encode())

    def apply() -> None:
        assert s.final.exists(), "applied before its file was in place"
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
    real = group_commit.sync_files

    def slow_sync(paths, root):
        entered.set()
        assert release.wait(WAIT), "the test never released the first sync"
        real(paths, root)
    monkeypatch.setattr(group_commit, "sync_files", slow_sync)
    state: dict = {}
    gc = make(tmp_path, state)
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


def test_a_failed_sync_fails_its_group_applies_nothing_and_removes_the_files(tmp_path, monkeypatch):
    def broken(paths, root):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(group_commit, "sync_files", broken)
    gc = make(tmp_path, {})
    applied: list[str] = []
    s = staged(tmp_path, "x", applied)
    with pytest.raises(OSError, match="Input/output"):
        gc.commit(s)
    assert applied == [] and not s.tmp.exists() and not s.final.exists()
    assert not (tmp_path / "meta.json").exists()
    monkeypatch.undo()
    assert gc.commit(staged(tmp_path, "y", applied)) == 1, "the next commit works again"
    assert applied == ["y"]


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


def test_sync_files_falls_back_to_fsync_without_syncfs(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(group_commit, "_SYNCFS", None)
    monkeypatch.setattr(group_commit.os, "fsync", lambda fd: calls.append(fd))
    files = []
    for i in range(3):
        f = tmp_path / f"f{i}"
        f.write_bytes(b"x")
        files.append(f)
    group_commit.sync_files(files, tmp_path)
    assert len(calls) == 3


def test_a_waiter_gives_up_after_its_timeout_and_its_file_is_removed(tmp_path, monkeypatch):
    release = threading.Event()
    entered = threading.Event()

    def stuck(paths, root):
        entered.set()
        release.wait(WAIT)
    monkeypatch.setattr(group_commit, "sync_files", stuck)
    gc = make(tmp_path, {})
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
