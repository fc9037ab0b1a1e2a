"""Property (e): random schedules on learner units of two ranks each.

Kills and pauses may hit a whole unit or a single rank (`learner-N/rank-R`); links are cut
and slowed as for any learner. A killed rank makes its unit restart all its ranks, and
every checker must pass as for single-process learners. The `ci` profile draws a handful.
"""
from __future__ import annotations

import pytest
from hypothesis import given

from chaos.pytest_plugin import live_settings
from faults.strategies import schedules

from .support import run_trial

pytestmark = [pytest.mark.property, pytest.mark.integration]

LEARNERS, RANKS = 2, 2


@live_settings()
@given(schedule=schedules(learners=LEARNERS, kinds=("kill", "pause", "partition", "latency"), max_faults=3,
                          horizon=10.0, min_duration=0.5, max_duration=4.0, include_syncer=False,
                          ranks={i: RANKS for i in range(1, LEARNERS + 1)}))
def test_every_checker_passes_with_units_of_several_ranks(schedule, tmp_path_factory: pytest.TempPathFactory,
                                                          request: pytest.FixtureRequest) -> None:
    trial = run_trial(schedule, tmp_path_factory.mktemp("units"), learners=LEARNERS, ranks=RANKS)
    if trial.failed():
        from chaos.pytest_plugin import record_failure_artifacts
        record_failure_artifacts(request, trial.result.run_dir, schedule, trial.learners, trial.trainer_args)
        pytest.fail(f"checks failed: {trial.failed()}\n{trial.explain()}")
