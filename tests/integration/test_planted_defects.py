"""Each check proved by a planted defect it must catch, on live clusters.

A check that a frozen, diverged or idle run could pass is a bug (issue 26). Three defects,
each a real code path of the trainer or a task:

- a task that cannot learn (tests/tasks/frozen.py: its inner optimizer is SGD with lr 0):
  `final_loss` fails, with a fault-free reference (which does not learn either, and is
  refused) and without; in `chaos run` and in pytest;
- a syncer that merges nothing (ISLANDS_SYNCER_DEFECT=merge_nothing: merge events as
  usual, Θ unchanged): `progress` and `rejoined` fail, `no_divergence` is unknown;
- a learner that never adopts (ISLANDS_LEARNER_DEFECT=never_adopt: versions and apply
  events as usual, its model untouched): `converged` fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.runner import run_schedule
from faults import Schedule
from trainer.events import read_events

pytestmark = pytest.mark.integration
pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]
FROZEN = f"{ROOT / 'tests' / 'tasks' / 'frozen.py'}:task"
FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]


def statuses(run_dir: Path) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads((run_dir / "verdict.json").read_text())["checks"]}


def test_a_task_that_cannot_learn_fails_final_loss_in_chaos_run_with_and_without_a_reference(tmp_path: Path) -> None:
    schedule = tmp_path / "none.yaml"
    schedule.write_text("seed: 1\nlearners: 2\nfaults: []\n")
    env = dict(os.environ, ISLANDS_HOME=str(tmp_path / "home"))  # no cached reference: one is run
    for reference in ("auto", "off"):
        out = tmp_path / f"run-{reference}"
        done = subprocess.run([sys.executable, "-m", "chaos", "run", str(schedule), "--task", FROZEN, "--duration",
                               "10", "--reference", reference, "--out", str(out)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=400)
        assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
        assert "FAIL    final_loss          the model learned nothing" in done.stdout, done.stdout[-3000:]
        final = statuses(out)["final_loss"]
        if reference == "auto":
            assert "the reference learned nothing" in final["evidence"]["reference_refused"]["why"], final
        assert statuses(out)["no_divergence"]["status"] == "unknown"


def test_a_task_that_cannot_learn_fails_final_loss_in_pytest(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_frozen=f'''
import pytest

@pytest.mark.chaos(schedule="none.yaml", learners=2, duration=10, task={FROZEN!r})
def test_frozen(chaos_result):
    pass
''')
    (pytester.path / "none.yaml").write_text("seed: 1\nlearners: 2\nfaults: []\n")
    result = pytester.runpytest_subprocess("-p", "islands", "--chaos-reference", "off", "-q", timeout=400)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*final_loss*the model learned nothing*"])


def test_a_syncer_that_merges_nothing_fails_progress_and_rejoined(tmp_path: Path) -> None:
    result = run_schedule(Schedule(seed=1, faults=()), tmp_path / "run", learners=2, trainer_args=FAST, duration=12.0,
                          reference="off", env={"ISLANDS_SYNCER_DEFECT": "merge_nothing"})
    checks = {v.name: v for v in result.verdicts}
    assert checks["progress"].status == "fail" and "not one moved Θ" in checks["progress"].detail
    assert checks["rejoined"].status == "fail" and "moved Θ by nothing" in checks["rejoined"].detail
    assert checks["no_divergence"].status == "unknown"
    assert checks["final_loss"].status == "fail"
    assert checks["no_lost_acks"].status == "pass", "the defect loses no acknowledged push"


def test_a_learner_that_never_adopts_fails_converged(tmp_path: Path) -> None:
    result = run_schedule(Schedule(seed=1, faults=()), tmp_path / "run", learners=2, trainer_args=FAST,
                          duration=12.0, reference="off", env={"ISLANDS_LEARNER_DEFECT": "never_adopt"})
    converged = next(v for v in result.verdicts if v.name == "converged")
    assert converged.status == "fail", converged.detail
    assert converged.evidence["missed_adoptions"], converged.evidence


def test_learners_follow_a_syncer_that_lost_acknowledged_merges(tmp_path: Path) -> None:
    """ack_before_durable killed before its first batched fsync comes back at an older
    version than the learners hold. The checks that must see it do (no_lost_acks,
    monotonic_versions), and the learners, whose pushes from the lost versions the syncer
    refuses, adopt the syncer's version and train on: without that, every push was refused
    for the rest of the run and progress, self_heal and rejoined failed too."""
    schedule = tmp_path / "kill.yaml"
    schedule.write_text("seed: 5\nlearners: 2\nfaults:\n- {kind: kill, at: 3, duration: 2, target: syncer}\n")
    result = run_schedule(Schedule.load(schedule), tmp_path / "run", learners=2, trainer_args=FAST,
                          duration=16.0, reference="off", env={"ISLANDS_SYNCER_DEFECT": "ack_before_durable"})
    checks = {v.name: v for v in result.verdicts}
    assert checks["no_lost_acks"].status == "fail", checks["no_lost_acks"].detail
    assert checks["monotonic_versions"].status == "fail", checks["monotonic_versions"].detail
    for name in ("progress", "self_heal", "rejoined"):
        assert checks[name].status == "pass", f"{name}: {checks[name].detail}"
    everything = read_events(tmp_path / "run")
    for learner in (1, 2):
        events = [e for e in everything if e["process"] == f"learner-{learner}"]
        rollbacks = [e for e in events if e["kind"] == "syncer_rollback"]
        assert rollbacks, f"learner-{learner} never saw the syncer go back"
        followed = [e for e in events if e["kind"] == "apply" and "rollback_from" in e]
        assert followed and followed[0]["version"] < followed[0]["rollback_from"], \
            f"learner-{learner} did not adopt the syncer's older version: {followed[:1]}"
