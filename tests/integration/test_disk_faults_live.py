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
from collections import Counter
from pathlib import Path

import pytest

from chaos.backends.disk_layer import missing_requirements
from chaos.runner import run_schedule
from faults import Schedule
from trainer.events import read_events

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
    seen = Counter((e.get("process"), e["kind"], str(e.get("reason", e.get("exit_code", "")))) for e in events)
    assert seen[("syncer", "storage_error", "storage_full")] >= 1, "the full disk was never felt"
    # A learner refused for the disk keeps its push and defers it; one whose last push waits
    # for a merge the full disk holds back sends none (either may happen, by timing). None drops one.
    deferred = {reason for (process, kind, reason) in seen if kind == "push_deferred"}
    assert deferred <= {"storage_full", "storage_io"}, seen
    dropped = [e for e in events if e["kind"] == "push" and e.get("status") == "refused"
               and str(e.get("reason", "")).startswith("storage")]
    assert not dropped, f"pushes dropped for a storage refusal: {dropped[:3]}"
    assert seen[("syncer", "disk_failed", "")] >= 1, "the failed sync was not seen"
    assert seen[("supervisor", "exit", "75")] >= 1, "the syncer did not exit for a restart after the failed sync"
    # Before issue 27 a disk error closed the learner's connection: `leave` events whose reason
    # was the OSError ("[Errno 28] No space left on device"), no ERROR, no frame_rejected.
    drops = [e for e in events if e["kind"] == "leave" and any(
        word in str(e.get("reason")) for word in ("No space", "Input/output", "Errno 28", "Errno 5]"))]
    assert not drops, f"learners dropped by the disk faults instead of refused: {drops[:3]}"
    assert not list((run_dir / "state" / "pending").rglob("*.tmp")), "temporaries left behind"
