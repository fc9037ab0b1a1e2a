"""The harness catches real bugs: a deliberately broken syncer must be found and shrunk.

Each defect is switched on in the syncer through ISLANDS_SYNCER_DEFECT. Hypothesis draws
schedules until one makes the matching checker fail, then shrinks it until it holds at
most 2 faults (no further: every shrink step is a live run); its printed replay command, run again,
must reproduce the failure within REPLAY_ATTEMPTS tries. A defect that needs a fault to
meet a request in flight is a race: the same 1 s partition reproduced double_apply in 5
of 6 replays on an idle machine (the learner's request in flight was a push, not a pull
or a heartbeat), so one replay alone would fail the suite now and then for no fault of
the harness.

Live, each search costs minutes; the simulator runs the same searches for every planted
defect in seconds (tests/sim/test_defects_found.py: double_apply and the recovery defects
among them). What stays live is this cross-check: one durability defect found and shrunk
on real processes, its replay command reproducing it.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from .support import Trial, run_trial, save_artifacts, suite_trainer_args
from .test_syncer_crash import syncer_crashes

pytestmark = [pytest.mark.property, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
RUN_BUDGETS = {"ack_before_durable": 6}  # live runs per search, shrinking included
REPLAY_ATTEMPTS = 3
SMALL = 2  # the most faults a shrunk schedule may hold

# defect -> (the check that must fail, trainer args on top of the suite's, schedules)
CASES = {
    # The syncer-crash suite: a SIGKILL loses what the syncer acknowledged but had not
    # made durable. Its first kill comes 2 s or more into training: shrinking pulls it to
    # the earliest moment allowed, and at 0.5 s a learner may not have had a push
    # acknowledged yet (the shrunk kill then failed in the search but not in the replays).
    "ack_before_durable": ("no_lost_acks", (), syncer_crashes(first_at_least=2.0)),
}


def search(defect: str, check: str, trainer_args: list[str], strategy, base: Path) -> tuple[list[Trial], int]:
    """Run Hypothesis against the defective syncer; return the failing trials and the run count."""
    failures: list[Trial] = []
    runs = 0

    budget = RUN_BUDGETS[defect]

    @settings(max_examples=budget, deadline=None, database=None, derandomize=True,
              phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(schedule=strategy)
    def defect_is_invisible(schedule) -> None:
        nonlocal runs
        if runs >= budget or not schedule.faults or any(len(t.schedule.faults) <= SMALL for t in failures):
            # Budget spent, nothing to inject, or already as small as asked: count it as a
            # pass, which ends shrinking without another live run.
            return
        runs += 1
        trial = run_trial(schedule, base, learners=2, trainer_args=trainer_args,
                          env={"ISLANDS_SYNCER_DEFECT": defect}, evaluate=False, tail=8.0)
        if trial.failed(check):
            failures.append(trial)
            raise AssertionError(f"{check} failed")

    try:
        defect_is_invisible()
    except Exception:  # noqa: BLE001 - the failure is the point; Flaky replays are fine too
        pass
    return failures, runs


@pytest.mark.parametrize("defect", sorted(CASES))
def test_property_suite_finds_and_shrinks_the_defect(defect: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     request: pytest.FixtureRequest) -> None:
    check, extra_args, strategy = CASES[defect]
    trainer_args = suite_trainer_args(*extra_args)  # with the streaming flags under --chaos-streaming
    monkeypatch.setenv("ISLANDS_SYNCER_DEFECT", defect)
    failures, runs = search(defect, check, trainer_args, strategy, tmp_path)
    assert failures, f"{runs} runs against a syncer with {defect!r} never made {check} fail"
    smallest = min(failures, key=lambda t: (len(t.schedule.faults), t.schedule.horizon))
    assert len(smallest.schedule.faults) <= SMALL, f"shrinking stopped at:\n{smallest.schedule.dumps()}"

    artifacts = save_artifacts(request.config, request.node.nodeid, smallest)
    command = smallest.replay_command(artifacts / "schedule.yaml")
    print(f"\n{defect}: {len(failures)} of {runs} runs failed {check}; shrunk to {len(smallest.schedule.faults)} fault(s); replay:\n"
          f"  {command}")

    outputs = []
    for attempt in range(1, REPLAY_ATTEMPTS + 1):
        argv = shlex.split(command)[1:]  # without the VAR=value prefix, which goes in env below
        cut = argv.index("--")
        # Only the defect's check matters here: no fault-free reference run.
        argv[cut:cut] = ["--out", str(tmp_path / f"replay-{attempt}"), "--reference", "off"]
        assert argv[0] == "python"
        replay = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                                timeout=300, env=dict(os.environ, ISLANDS_SYNCER_DEFECT=defect))
        if replay.returncode == 1 and f"FAIL    {check}" in replay.stdout:
            print(f"{defect}: the replay reproduced it at attempt {attempt}")
            return
        outputs.append(f"attempt {attempt} (exit {replay.returncode}):\n{replay.stdout[-1500:]}{replay.stderr[-500:]}")
    raise AssertionError(f"{REPLAY_ATTEMPTS} replays of the shrunk schedule did not fail {check}:\n"
                         + "\n".join(outputs))
