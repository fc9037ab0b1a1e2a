"""The local backend's kill, without starting a cluster: the target is down from the moment
SIGKILL is sent, and its teardown is reaped when the fault's stop restarts it. A kill that
waited for the kernel to free a large process was recorded 0.42 s late on a loaded CI
machine (`faults_applied` failed a run whose signal went out on time)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.backends.local import LocalCluster
from chaos.processes import ManagedProcess


def _stand_in(tmp_path: Path, name: str) -> ManagedProcess:
    proc = ManagedProcess("learner-1", ["sleep", "60"], tmp_path / f"{name}.log", dict(os.environ))
    proc.start()
    return proc


def test_a_killed_target_is_down_at_once_and_reaped_before_its_successor_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = LocalCluster(tmp_path, learners=1)
    old = _stand_in(tmp_path, "old")
    cluster.procs["learner-1"] = old
    successor: list[ManagedProcess] = []

    def spawn(unit: str) -> ManagedProcess:
        assert old.popen.poll() is not None, "the successor started before the killed process was reaped"
        successor.append(_stand_in(tmp_path, "new"))
        cluster.procs[unit] = successor[-1]
        return successor[-1]

    monkeypatch.setattr(cluster, "_spawn_unit", spawn)
    try:
        with monkeypatch.context() as waits:
            waits.setattr(old.popen, "wait", lambda *a, **k: pytest.fail("the kill waited for the teardown"))
            cluster.kill("learner-1")
        assert not cluster.is_running("learner-1"), "a SIGKILLed target still counted as running"
        assert cluster.held("learner-1"), "the supervisor would restart a target a fault holds down"
        cluster.restart("learner-1")
        assert old.popen.returncode == -9, f"the killed process was not reaped: {old.popen.returncode}"
        assert successor and cluster.is_running("learner-1") and not cluster.held("learner-1")
    finally:
        for proc in [old, *successor]:
            proc.kill()
