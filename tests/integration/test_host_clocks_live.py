"""Processes on clocks that disagree by seconds and drift (issue 29), on the local backend:
the run probes each host's clock, estimates it within milliseconds of what was set, places
every event on the controller's timeline and passes; judged again with the events on their
own clocks (`chaos check --clock-alignment off`), the same run fails. That second verdict is
the planted defect the alignment must catch: a harness that trusts every clock."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from faults import Schedule
from chaos.runner import run_schedule

pytestmark = pytest.mark.integration
FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]
SET = {"syncer": (-5.0, -300.0), "learner-1": (5.0, 200.0), "learner-2": (7.0, -100.0)}
# A learner killed, another cut off: the windows the checks judge recovery by.
SCHEDULE = {"name": "clocks-apart", "seed": 3, "learners": 2, "faults": [
    {"kind": "kill", "at": 4, "duration": 3, "target": "learner-1"},
    {"kind": "partition", "at": 10, "duration": 4, "targets": ["learner-2"]}]}


def test_a_run_on_clocks_seconds_apart_is_placed_on_one_timeline_and_fails_without_it(tmp_path: Path) -> None:
    spec = ",".join(f"{p}={o:+g}@{d:+g}" for p, (o, d) in SET.items())
    run_dir = tmp_path / "run"
    result = run_schedule(Schedule.from_dict(SCHEDULE), run_dir, learners=2, trainer_args=FAST, reference="off",
                          host_clocks=spec)
    verdicts = {v.name: v for v in result.verdicts}
    assert result.passed, {v.name: v.detail for v in result.verdicts if v.status not in ("pass", "n/a")}
    assert verdicts["timeline"].status == "pass", verdicts["timeline"].detail

    # Each host's estimate against the clock it was given: the offset set at the clock's
    # anchor, drifted by the time from the anchor to the estimate's reference instant.
    clocks = json.loads((run_dir / "clocks.json").read_text())
    assert sorted(clocks) == sorted(f"host-{p}" for p in SET)
    for process, (offset, ppm) in SET.items():
        host_file = json.loads((run_dir / "hosts" / f"host-{process}.json").read_text())
        estimate = clocks[f"host-{process}"]
        expected = offset + ppm * 1e-6 * (estimate["ref"] - host_file["anchor"])
        assert abs(estimate["offset"] - expected) <= estimate["error"] + 0.005, (process, estimate, expected)
        assert estimate["error"] < 0.05 and estimate["samples"] >= 10

    off = subprocess.run([sys.executable, "-m", "chaos", "check", str(run_dir), "--clock-alignment", "off"],
                         capture_output=True, text=True, timeout=120)
    assert off.returncode == 1, off.stdout + off.stderr
    unaligned = json.loads((run_dir / "verdict-clock-alignment-off.json").read_text())
    assert unaligned["failed"], unaligned
    assert json.loads((run_dir / "verdict.json").read_text())["passed"]  # the run's own verdict stays
