"""The clock, disk and power_loss nemeses and what each backend says of them, without a cluster."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from chaos.backends.base import Cluster, UnsupportedFault
from chaos.backends.compose import ComposeCluster, disk_layer_override
from chaos.backends.disk_layer import MODE_FILE
from chaos.backends.swarm import SwarmCluster
from chaos.nemesis import NEMESES
from faults import Clock, Disk, PowerLoss, Schedule
from trainer.clock import WallClock
from trainer.runspec import RunSpec


class ClockOnly(Cluster):
    """A cluster whose only real part is its clock directory."""

    def __init__(self, run_dir: Path, learners: int = 2) -> None:
        self.run_dir, self.learners = run_dir, learners

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def kill(self, target: str) -> None: ...
    def pause(self, target: str) -> None: ...
    def resume(self, target: str) -> None: ...
    def restart(self, target: str) -> None: ...
    def is_running(self, target: str) -> bool: return True
    def is_paused(self, target: str) -> bool: return False


def offset(cluster: Cluster, target: str) -> float:
    """How far `target`'s wall clock is off now, as the process reads it (trainer/clock.py)."""
    return WallClock(cluster.clock_file(target))() - time.time()


def test_a_skew_is_undone_at_its_stop(tmp_path: Path) -> None:
    c = ClockOnly(tmp_path)
    fault = Clock(at=0, duration=1, target="learner-1", mode="skew", offset_s=-60)
    assert "-60 s" in NEMESES.for_fault(fault).start(c, fault)
    assert offset(c, "learner-1") == pytest.approx(-60, abs=0.05)
    NEMESES.for_fault(fault).stop(c, fault)
    assert offset(c, "learner-1") == pytest.approx(0, abs=0.05)


def test_jumps_are_kept_and_add_up_until_the_final_heal(tmp_path: Path) -> None:
    c = ClockOnly(tmp_path)
    back = Clock(at=0, duration=1, target="syncer", mode="jump", offset_s=-3600)
    forward = Clock(at=2, duration=1, target="syncer", mode="jump", offset_s=1800)
    nemesis = NEMESES.for_fault(back)
    nemesis.start(c, back)
    assert "keeps its step" in nemesis.stop(c, back)
    assert offset(c, "syncer") == pytest.approx(-3600, abs=0.05)
    nemesis.start(c, forward)
    assert offset(c, "syncer") == pytest.approx(-1800, abs=0.05)
    assert offset(c, "learner-1") == pytest.approx(0, abs=0.05), "only the target's clock moved"
    assert "set syncer's wall clock true" in c.heal_clocks()
    assert offset(c, "syncer") == pytest.approx(0, abs=0.05)


def test_a_drift_runs_at_its_rate_and_keeps_what_it_gained(tmp_path: Path, monkeypatch) -> None:
    c = ClockOnly(tmp_path)
    fault = Clock(at=0, duration=1, target="learner-2", mode="drift", rate=2.0)
    now = [1000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    nemesis = NEMESES.for_fault(fault)
    nemesis.start(c, fault)
    now[0] += 10.0
    spec = json.loads(c.clock_file("learner-2").read_text())
    assert spec["rate"] == 2.0 and spec["anchor"] == 1000.0
    nemesis.stop(c, fault)
    assert c.clock_offsets["learner-2"] == pytest.approx(10.0), "10 s at twice the speed gained 10 s"
    assert json.loads(c.clock_file("learner-2").read_text()) == {"offset": 10.0, "rate": 1.0, "anchor": 0.0}


def test_a_rank_reads_its_unit_s_clock(tmp_path: Path) -> None:
    c = ClockOnly(tmp_path)
    c.spec = RunSpec(learners=2, ranks=2)
    assert c.clock_file("learner-1/rank-1") == c.clock_file("learner-1") == tmp_path / "clocks" / "learner-1.json"


def test_the_clock_does_not_impair_and_the_disk_faults_need_the_layer() -> None:
    assert not NEMESES["clock"].impairs_learner
    assert NEMESES.need_disk_layer([Disk(at=0, duration=1, target="syncer", mode="full")])
    assert NEMESES.need_disk_layer([PowerLoss(at=0, duration=1, target="syncer")])
    assert not NEMESES.need_disk_layer([Clock(at=0, duration=1, target="syncer", mode="jump", offset_s=1)])


def test_swarm_refuses_disk_and_power_loss_faults_and_says_why(tmp_path: Path) -> None:
    schedule = Schedule.from_dict({"seed": 1, "learners": 2, "faults": [
        {"kind": "disk", "at": 1, "duration": 1, "target": "syncer", "mode": "full"},
        {"kind": "power_loss", "at": 3, "duration": 1, "target": "syncer"},
        {"kind": "clock", "at": 1, "duration": 1, "target": "learner-1", "mode": "jump", "offset_s": 60}]})
    problems = SwarmCluster(tmp_path, learners=2).unsupported(schedule)
    assert len(problems) == 2 and all("/dev/fuse" in p for p in problems), problems
    assert problems[0].startswith("faults[0].kind: disk") and problems[1].startswith("faults[1].kind: power_loss")
    assert ComposeCluster(tmp_path, learners=2).unsupported(schedule) == []


def test_a_disk_fault_on_a_cluster_started_without_the_layer_says_how_to_get_it(tmp_path: Path) -> None:
    cluster = ComposeCluster(tmp_path, learners=2)
    with pytest.raises(UnsupportedFault, match="disk_layer=True"):
        cluster.set_disk("syncer", "full")
    with pytest.raises(UnsupportedFault, match="disk_layer=True"):
        cluster.power_loss("syncer")


def test_the_compose_syncer_gets_what_fuse_needs_and_its_volume_as_the_durable_image() -> None:
    syncer = disk_layer_override()["services"]["syncer"]
    assert syncer["devices"] == ["/dev/fuse:/dev/fuse"] and syncer["cap_add"] == ["SYS_ADMIN"]
    assert syncer["environment"] == {"ISLANDS_DISK_LAYER": "1"}
    assert syncer["volumes"] == ["syncer-state:/islands/state.disk"]


def test_a_disk_mode_set_while_the_syncer_is_down_is_kept_for_its_start(tmp_path: Path, monkeypatch) -> None:
    """A daemon started again (with its container, or after a power loss) reads the mode in force."""
    cluster = ComposeCluster(tmp_path, learners=2, disk_layer=True)
    monkeypatch.setattr(cluster, "_container", lambda target: None)
    monkeypatch.setattr(cluster, "_state", lambda c: "absent")
    cluster.set_disk("syncer", "eio")
    assert json.loads((tmp_path / MODE_FILE).read_text()) == {"mode": "eio", "latency_ms": 50.0}
