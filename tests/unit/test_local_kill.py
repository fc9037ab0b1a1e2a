"""The local backend's kill and power loss, without starting a cluster: the target is down
from the moment SIGKILL is sent, and its teardown is reaped when the fault's stop restarts
it. A kill that waited for the kernel to free a large process was recorded 0.42 s late on a
loaded CI machine, and a power loss that waited for the syncer and its disk daemon 0.58 s
late (`faults_applied` failed runs whose signals went out on time)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from chaos.backends import disk_layer
from chaos.backends.disk_layer import LocalDiskLayer
from chaos.backends.local import LocalCluster
from chaos.diskfs import launch
from chaos.processes import ManagedProcess


def _stand_in(tmp_path: Path, name: str, unit: str = "learner-1") -> ManagedProcess:
    proc = ManagedProcess(unit, ["sleep", "60"], tmp_path / f"{name}.log", dict(os.environ))
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


def test_a_power_loss_is_in_force_at_its_signals_and_its_disk_is_reaped_before_it_mounts_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = LocalCluster(tmp_path, learners=1)
    syncer = _stand_in(tmp_path, "syncer", unit="syncer")
    cluster.procs["syncer"] = syncer
    daemon = subprocess.Popen(["sleep", "60"])  # the disk daemon's stand-in
    cluster.disk = LocalDiskLayer(tmp_path, cluster.registry)
    cluster.disk.popen = daemon
    released: list[Path] = []
    mounted: list[subprocess.Popen] = []
    successor: list[ManagedProcess] = []

    def mount_again(*args: object, **kwargs: object) -> subprocess.Popen:
        assert daemon.poll() is not None, "the disk was mounted again before the cut daemon was reaped"
        assert released, "the disk was mounted again before the cut daemon's mount point was freed"
        mounted.append(subprocess.Popen(["sleep", "60"]))
        return mounted[-1]

    def spawn(unit: str) -> ManagedProcess:
        assert syncer.popen.poll() is not None, "the successor started before the cut syncer was reaped"
        assert mounted, "the syncer started again before its disk"
        successor.append(_stand_in(tmp_path, "new", unit="syncer"))
        cluster.procs[unit] = successor[-1]
        return successor[-1]

    monkeypatch.setattr(disk_layer, "start_diskfs", mount_again)
    monkeypatch.setattr(launch, "_release_mount", lambda mount, wait=5.0: released.append(Path(mount)))
    monkeypatch.setattr(cluster, "_spawn_unit", spawn)
    monkeypatch.setattr(cluster, "_wait_syncer_listening", lambda proc: None)
    try:
        with monkeypatch.context() as waits:
            waits.setattr(syncer.popen, "wait", lambda *a, **k: pytest.fail("the power loss waited for the syncer"))
            waits.setattr(daemon, "wait", lambda *a, **k: pytest.fail("the power loss waited for the disk daemon"))
            cluster.power_loss("syncer")
        assert not cluster.is_running("syncer") and cluster.held("syncer")
        assert not cluster.disk.running, "a disk daemon whose power was cut still counted as running"
        assert not released, "the cut freed the mount point itself (its teardown is the restart's)"
        asked: list[str] = []
        monkeypatch.setattr(disk_layer, "DiskControl",
                            lambda path: SimpleNamespace(set_mode=lambda mode, latency_ms: asked.append(mode)))
        cluster.set_disk("syncer", "full")  # a dying daemon's socket may accept and never answer
        assert not asked, "a daemon whose power was cut was asked to change its mode"
        assert json.loads(cluster.disk.mode_file.read_text())["mode"] == "full", "the next daemon's mode was lost"
        cluster.restart("syncer")
        assert (syncer.popen.returncode, daemon.returncode) == (-9, -9), "the cut processes were not reaped"
        assert released == [cluster.disk.mount] and cluster.disk.popen is mounted[0] and cluster.disk.running
        assert successor and cluster.is_running("syncer") and not cluster.held("syncer")
        cluster.set_disk("syncer", "none")
        assert asked == ["none"], "the daemon mounted again was not asked"
    finally:
        for proc in [syncer, *successor]:
            proc.kill()
        for popen in [daemon, *mounted]:
            popen.kill()
            popen.wait()
