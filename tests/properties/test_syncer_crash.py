"""Property (c): the syncer is SIGKILLed at random moments and restarted.

Whatever the moments, no acknowledged push is lost, none is applied twice, versions
never go back, training goes on and every learner heals.
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaos.pytest_plugin import live_settings
from faults import Kill, Schedule

from .support import run_trial

pytestmark = [pytest.mark.property, pytest.mark.integration]


@st.composite
def syncer_crashes(draw, first_at_least: float = 0.5) -> Schedule:
    """1-3 SIGKILLs of the syncer at random moments (tenths of a second), each restarted
    after a random outage, never overlapping; the first no earlier than `first_at_least` s."""
    count = draw(st.integers(1, 3))  # shrinks toward a single crash
    faults, t = [], 0.0
    for i in range(count):
        t += draw(st.integers(round(first_at_least * 10) if i == 0 else 5, 40)) / 10
        outage = draw(st.integers(1, 20)) / 10
        faults.append(Kill(at=round(t, 1), duration=outage, target="syncer"))
        t += outage
    return Schedule(seed=draw(st.integers(0, 2**16)), faults=tuple(faults)).validate(2)


@live_settings()
@given(schedule=syncer_crashes())
def test_syncer_crashes_lose_nothing(schedule: Schedule, tmp_path_factory: pytest.TempPathFactory,
                                     request: pytest.FixtureRequest) -> None:
    trial = run_trial(schedule, tmp_path_factory.mktemp("crash"), learners=2)
    if trial.failed():
        from chaos.pytest_plugin import record_failure_artifacts
        record_failure_artifacts(request, trial.result.run_dir, schedule, trial.learners, trial.trainer_args)
        pytest.fail(f"checks failed: {trial.failed()}\n{trial.explain()}")
    restarts = [e for e in trial.result.document["checks"] if e["name"] == "no_lost_acks"][0]
    assert restarts["status"] == "pass" and restarts["evidence"]["acked"] > 0
