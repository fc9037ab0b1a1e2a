"""The process registry (chaos.processes.Registry): a run reaps what crashed runs left running,
and never the processes of a run that is still alive."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chaos.processes import Registry, proc_start_time, proc_state

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ISLANDS_HOME", str(tmp_path))
    return tmp_path


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)


def _gone(p: subprocess.Popen) -> bool:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if p.poll() is not None or proc_state(p.pid) in (None, "Z"):
            return True
        time.sleep(0.05)
    return False


def test_a_live_runs_processes_are_left_alone(home: Path) -> None:
    first, second = Registry("islands"), Registry("islands")
    assert first.path != second.path
    p = _sleeper()
    try:
        first.record_pid("syncer", p.pid, ["python"])
        assert second.reap_leftovers() == [], "the first run's owner (this process) is alive"
        assert p.poll() is None and first.path.exists()
    finally:
        p.kill()
        p.wait()


def test_the_processes_of_a_dead_owner_are_reaped(home: Path) -> None:
    p = _sleeper()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = home / "local" / f"islands-{dead.pid}-1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"owner": dead.pid, "owner_start": 1, "processes": [
        {"name": "learner-1", "pid": p.pid, "start": proc_start_time(p.pid), "argv": ["python"]}]}))
    try:
        killed = Registry("islands").reap_leftovers()
        assert killed == [f"learner-1 (pid {p.pid})"]
        assert _gone(p) and not path.exists()
    finally:
        p.kill()
        p.wait()


def test_a_registry_file_from_before_owners_counts_as_orphaned(home: Path) -> None:
    p = _sleeper()
    legacy = home / "local" / "islands.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps([{"name": "syncer", "pid": p.pid, "start": proc_start_time(p.pid), "argv": []}]))
    try:
        assert Registry("islands").reap_leftovers() == [f"syncer (pid {p.pid})"]
        assert _gone(p) and not legacy.exists()
    finally:
        p.kill()
        p.wait()


def test_other_names_are_not_ours(home: Path) -> None:
    other = home / "local" / "islands-test-99999999-1.json"
    other.parent.mkdir(parents=True)
    other.write_text(json.dumps({"owner": 99999999, "owner_start": 1, "processes": []}))
    assert Registry("islands").orphaned() == []
    assert Registry("islands-test").orphaned() == [other]


def test_records_from_threads_at_once_lose_no_entry(home: Path) -> None:
    """Warm spares are recorded from the pool's refills while the controller records
    restarts: each record reads the file, adds one entry and writes it back."""
    registry = Registry("islands")
    threads, per_thread = 8, 25
    go = threading.Barrier(threads)
    errors: list[BaseException] = []

    def record(t: int) -> None:
        go.wait(timeout=10)
        for i in range(per_thread):
            try:
                registry.record_pid(f"p-{t}-{i}", 10_000_000 + t * per_thread + i, ["python"])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    workers = [threading.Thread(target=record, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert not errors, errors[:3]
    assert len(registry.entries()) == threads * per_thread


def test_each_file_names_its_owner_and_run(home: Path, tmp_path: Path) -> None:
    registry = Registry("islands", run_dir=tmp_path / "run")
    registry.record_pid("syncer", os.getpid(), ["python"])
    data = json.loads(registry.path.read_text())
    assert data["owner"] == os.getpid() and data["owner_start"] == proc_start_time(os.getpid())
    assert data["run_dir"] == str((tmp_path / "run").resolve())
    registry.close()
    assert not registry.path.exists() and not registry.lock_path.exists()


OWNER = r"""
import json, subprocess, sys, threading
from chaos.processes import Registry
registry = Registry("islands", run_dir=sys.argv[1])
children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
            for _ in range(3)]
threads = [threading.Thread(target=registry.record_pid, args=(f"learner-{i}", c.pid, ["python"]))
           for i, c in enumerate(children)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"pids": [c.pid for c in children], "path": str(registry.path)}), flush=True)
if sys.stdin.readline().strip() == "reap":
    print(json.dumps({"killed": registry.reap_leftovers()}), flush=True)
    sys.stdin.readline()
for c in children:
    c.kill()
    c.wait()
registry.close()
"""


def _owner(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", OWNER, str(run_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd=ROOT, env=os.environ.copy())


def _line(proc: subprocess.Popen, timeout: float = 60.0) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"owner {proc.pid} said nothing within {timeout:.0f}s"
    return json.loads(proc.stdout.readline())


def _say(proc: subprocess.Popen, word: str) -> None:
    proc.stdin.write(f"{word}\n".encode())
    proc.stdin.flush()


def test_two_live_owners_started_together_never_reap_each_other(home: Path, tmp_path: Path) -> None:
    """Two runs' controllers at once (and a third that was SIGKILLed, whose processes are
    the only leftovers): each reaps the dead one's processes, once, and not the other's."""
    dead = _owner(tmp_path / "dead")
    leftovers = _line(dead)["pids"]
    dead.kill()
    dead.wait(timeout=30)
    first, second = _owner(tmp_path / "a"), _owner(tmp_path / "b")
    try:
        live = {p: _line(p) for p in (first, second)}
        for p in (first, second):
            _say(p, "reap")
        killed = [name for p in (first, second) for name in _line(p)["killed"]]
        assert sorted(killed) == sorted(f"learner-{i} (pid {pid})" for i, pid in enumerate(leftovers)), \
            "every leftover reaped, each once"
        for p, said in live.items():
            assert all(proc_state(pid) not in (None, "Z") for pid in said["pids"]), f"owner {p.pid} lost a process"
            assert json.loads(Path(said["path"]).read_text())["owner"] == p.pid
        assert all(_gone_pid(pid) for pid in leftovers)
    finally:
        for p in (first, second):
            if p.poll() is None:
                _say(p, "exit")
            p.wait(timeout=30)
        for pid in leftovers:
            try:
                os.killpg(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass


def _gone_pid(pid: int) -> bool:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc_state(pid) in (None, "Z"):
            return True
        time.sleep(0.05)
    return False
