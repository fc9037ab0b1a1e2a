"""The process registry (chaos.processes.Registry): a run reaps what crashed runs left running,
and never the processes of a run that is still alive."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos.processes import Registry, proc_start_time, proc_state


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
