"""Single ranks of a learner unit as fault targets, without starting a cluster."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.backends.base import UnknownTarget
from chaos.backends.local import LocalCluster
from chaos.backends.ranks import published_rank_pid, split_rank, wait_for_rank
from chaos.processes import ManagedProcess
from faults import Kill, Pause, Schedule


def _cluster(tmp_path: Path, learner_args: dict | None = None) -> LocalCluster:
    return LocalCluster(tmp_path, learners=2, learner_args=learner_args)


def test_units_of_several_ranks_add_rank_targets(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, {2: ["--threads", "1", "--ranks", "3"]})
    assert cluster.units() == ["syncer", "learner-1", "learner-2"]
    assert cluster.services() == ["syncer", "learner-1", "learner-2", "learner-2/rank-0", "learner-2/rank-1",
                                  "learner-2/rank-2"]
    assert cluster.link_proxies() == ["learner-1", "learner-2"], "a rank has no link of its own"
    assert cluster.ranks_of(1) == 1 and cluster.ranks_of(2) == 3
    assert _cluster(tmp_path, {1: ["--ranks=2"]}).ranks_of(1) == 2


def test_a_rank_that_does_not_exist_is_refused_before_the_run(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, {1: ["--ranks", "2"]})
    schedule = Schedule(seed=0, faults=(Kill(at=1, duration=1, target="learner-1/rank-1"),
                                        Pause(at=3, duration=1, target="learner-2/rank-0")))
    assert cluster.unsupported(schedule) == [
        "faults[1].target: learner-2 runs 1 rank(s), so 'learner-2/rank-0' does not exist "
        "(give learner-2 more with the learner flag --ranks)"]
    with pytest.raises(UnknownTarget, match="'learner-1/rank-0' has no link of its own"):
        cluster.link_proxy("learner-1/rank-0")


def test_split_rank() -> None:
    assert split_rank("learner-2/rank-1") == ("learner-2", 1)
    assert split_rank("learner-12") == ("learner-12", None)
    assert split_rank("syncer") == ("syncer", None)


def test_rank_pids_come_from_the_units_file_and_must_be_children_of_the_unit(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, {1: ["--ranks", "2"]})
    # A stand-in unit: a shell whose child sleeps; it publishes the child as rank 1.
    child_file = tmp_path / "child"
    unit = ManagedProcess("learner-1", ["bash", "-c", f"sleep 30 & echo $! > {child_file}; wait; sleep 30"],
                          tmp_path / "u.log", dict(os.environ))
    unit.start()
    cluster.procs["learner-1"] = unit
    try:
        for _ in range(200):
            if child_file.exists() and child_file.read_text().strip():
                break
            subprocess.run(["sleep", "0.02"])
        child = int(child_file.read_text())
        stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        units = tmp_path / "units"
        units.mkdir()
        (units / "learner-1.json").write_text(json.dumps({"ranks": [stranger.pid, child], "generation": 0}))
        assert published_rank_pid(tmp_path, "learner-1", 1) == child
        assert cluster.pid("learner-1/rank-1") == child
        assert cluster.pid("learner-1/rank-0") is None, "a PID that is not the unit's child must never be signalled"
        cluster.pause("learner-1/rank-1")
        wait_for_rank(lambda: cluster.is_paused("learner-1/rank-1"), "learner-1/rank-1", timeout=5)
        cluster.resume("learner-1/rank-1")
        wait_for_rank(lambda: not cluster.is_paused("learner-1/rank-1"), "learner-1/rank-1", timeout=5)
        cluster.kill("learner-1/rank-1")
        wait_for_rank(lambda: not cluster.is_running("learner-1/rank-1"), "learner-1/rank-1", timeout=5)
        assert stranger.poll() is None, "the stranger was signalled"
        assert unit.running(), "killing a rank must not kill the unit's supervisor"
        stranger.kill()
        stranger.wait()
    finally:
        unit.signal(signal.SIGKILL)
        unit.popen.wait()


def test_waiting_for_a_rank_fails_naming_it() -> None:
    with pytest.raises(TimeoutError, match="learner-1/rank-1 did not come back within 0s"):
        wait_for_rank(lambda: False, "learner-1/rank-1", timeout=0.01)
