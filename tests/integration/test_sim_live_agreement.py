"""The simulator and a live cluster agree (issue 28): a failure `chaos explore` found and
shrank in the simulator replays on the local backend with the same check failing, and a
schedule the simulator passes passes live too. Where they disagree, one of them has a bug."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.backends.disk_layer import missing_requirements
from chaos.runner import run_schedule
from chaos.sim.explore import Space, draw, explore, judge
from trainer import defects

pytestmark = pytest.mark.integration
FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]


def failed_checks(run_dir: Path) -> set[str]:
    return {c["name"] for c in json.loads((run_dir / "verdict.json").read_text())["checks"] if c["status"] == "fail"}


@pytest.mark.skipif(bool(missing_requirements()),
                    reason=f"a power_loss needs the disk-fault layer: {', '.join(missing_requirements())}")
def test_a_durability_failure_found_in_the_simulator_replays_on_a_live_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(defects.ENV, "ack_before_durable")
    report = explore(100, 1, Space(), tmp_path / "explore", jobs=1)
    failure = report["first_failure"]
    assert failure is not None and "no_lost_acks" in failure["failed"], report
    # The printed command, run as printed (its --out added before the trainer's flags).
    words = shlex.split(failure["live_command"])
    assert words[0] == f"{defects.ENV}=ack_before_durable" and words[1:5] == ["python", "-m", "chaos", "run"]
    argv = [sys.executable, *words[2:6], "--out", str(tmp_path / "live"), *words[6:]]
    done = subprocess.run(argv, env={**os.environ, defects.ENV: "ack_before_durable"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "no_lost_acks" in failed_checks(tmp_path / "live"), \
        f"the simulator's failure did not replay live:\n{done.stdout[-3000:]}"


def test_a_schedule_the_simulator_passes_passes_live(tmp_path: Path) -> None:
    os.environ.pop(defects.ENV, None)
    space = Space()
    # The first drawn schedule of seed 1 with a kill, a pause and a partition among its faults.
    schedule = next(s for s in (draw(1, i, space) for i in range(200))
                    if {"kill", "partition"} <= {f.kind for f in s.faults})
    simulated = judge(schedule, space, keep=tmp_path / "sim")
    assert not simulated.failed, simulated.details
    live = run_schedule(schedule, tmp_path / "live", learners=space.learners, trainer_args=FAST, reference="off")
    assert live.passed, {v.name: v.detail for v in live.verdicts if v.status != "pass"}


def test_explore_on_the_local_backend_runs_live_clusters(tmp_path: Path) -> None:
    """`explore --backend local`: the same seeded draws, each a live cluster."""
    os.environ.pop(defects.ENV, None)
    space = Space(backend="local", max_faults=1, kinds=("kill", "pause"))
    report = explore(1, 7, space, tmp_path, jobs=2)
    assert report["backend"] == "local" and report["jobs"] == 1, report
    assert report["schedules"] == 1 and report["violations"] == 0, report["first_failure"]
