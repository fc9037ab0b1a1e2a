"""Disk faults, power losses and clock steps on live local clusters (issue 27).

The acceptance schedule (examples/schedules/disk-power-clock.yaml: a full disk for 10 s,
a failing disk for 5 s, a power loss of the syncer, wall clocks stepped an hour either
way on the syncer and a learner) passes every check, and the learners' events show
refusals they backed off from, not dropped connections.

A power loss finds what SIGKILL cannot: the planted defect ack_before_sync
acknowledges a push once its file is in place by name, before its contents are synced.
A SIGKILL keeps the page cache, so the same schedule with kills in place of power losses
passes; with power losses (the disk-fault layer under the syncer's state dir, killed with
the syncer) the acknowledged pushes whose contents were never synced are lost, and
`no_lost_acks` says so. Without the defect the power-loss schedule passes: see
examples/schedules/disk-power-clock.yaml and tests/integration/test_chaos_local.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.backends.disk_layer import missing_requirements
from chaos.runner import run_schedule
from faults import Schedule
from trainer.events import read_events

from .disk_evidence import disk_schedule_problems

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(bool(missing_requirements()),
                                 reason=f"the disk-fault layer needs {', '.join(missing_requirements())}")]
FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]
DEFECT = {"ISLANDS_SYNCER_DEFECT": "ack_before_sync"}


def schedule(kind: str) -> Schedule:
    return Schedule.from_dict({"seed": 3, "learners": 2, "faults": [
        {"kind": kind, "at": at, "duration": 2, "target": "syncer"} for at in (5, 12, 19)]})


def verdict(run_dir: Path) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads((run_dir / "verdict.json").read_text())["checks"]}


def test_ack_before_sync_survives_sigkill_and_loses_acknowledged_pushes_at_a_power_loss(tmp_path: Path) -> None:
    killed = run_schedule(schedule("kill"), tmp_path / "kill", learners=2, trainer_args=FAST, env=DEFECT,
                          duration=25, reference="off")
    checks = verdict(tmp_path / "kill")
    assert checks["no_lost_acks"]["status"] == "pass", checks["no_lost_acks"]
    assert checks["faults_applied"]["status"] == "pass", checks["faults_applied"]

    cut = run_schedule(schedule("power_loss"), tmp_path / "power", learners=2, trainer_args=FAST, env=DEFECT,
                       duration=25, reference="off")
    checks = verdict(tmp_path / "power")
    assert checks["faults_applied"]["status"] == "pass", checks["faults_applied"]
    assert checks["no_lost_acks"]["status"] == "fail", checks["no_lost_acks"]
    assert not cut.passed and killed is not None


def test_the_disk_power_and_clock_schedule_passes_with_refusals_not_drops(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_schedule(Schedule.load(ROOT / "examples" / "schedules" / "disk-power-clock.yaml"), run_dir,
                          learners=2, trainer_args=FAST, reference="off")
    assert result.passed, json.dumps(result.document["checks"], indent=1)
    events = read_events(run_dir)
    assert disk_schedule_problems(events) == []
    exits = [e for e in events if e.get("process") == "supervisor" and e["kind"] == "exit" and e.get("exit_code") == 75]
    assert exits, "the syncer did not exit for a restart after the failed sync"
    assert not list((run_dir / "state" / "pending").rglob("*.tmp")), "temporaries left behind"
