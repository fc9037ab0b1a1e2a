"""Property (a): random schedules of kill, pause, partition and latency on 3 learners.

Hypothesis draws valid schedules; each runs against a fresh local cluster and every
checker must pass. The `ci` profile draws a handful; `--hypothesis-profile nightly`
draws 200.
"""
from __future__ import annotations


import pytest
from hypothesis import given

from chaos.pytest_plugin import live_settings
from faults.strategies import schedules

from .support import run_trial

pytestmark = [pytest.mark.property, pytest.mark.integration]


@live_settings()
@given(schedule=schedules(learners=3, kinds=("kill", "pause", "partition", "latency"), max_faults=3,
                          horizon=10.0, min_duration=0.5, max_duration=5.0))
def test_every_checker_passes_under_random_faults(schedule, tmp_path_factory: pytest.TempPathFactory,
                                                    request: pytest.FixtureRequest) -> None:
    trial = run_trial(schedule, tmp_path_factory.mktemp("schedules"), learners=3)
    if trial.failed():
        from chaos.pytest_plugin import record_failure_artifacts
        record_failure_artifacts(request, trial.result.run_dir, schedule, trial.learners, trial.trainer_args)
        pytest.fail(f"checks failed: {trial.failed()}\n{trial.explain()}")
