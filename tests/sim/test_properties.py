"""The schedule property, in the simulator: under any valid schedule of the simulated fault
kinds, every check passes. Each example costs about 0.2 s instead of a live cluster's
30-60 s, so the property draws 1,000 schedules under the `ci` profile (10,000 `nightly`),
in SHARDS tests of their own seeds (so the suite's two workers share them), and Hypothesis
shrinks a failure to its smallest schedule. The live property
(tests/properties/test_schedules.py) keeps a few examples as a cross-check, and
tests/integration/test_sim_live_agreement.py runs schedules both ways."""
from __future__ import annotations

from hypothesis import given, seed, settings

from chaos.sim.explore import Space, judge
from faults import Schedule
from faults.strategies import schedules

SPACE = Space()
EXAMPLES = {"nightly": 10_000}.get(settings.get_current_profile_name(), 1_000)
SHARDS = 4
SIMULATED = ("kill", "pause", "partition", "latency", "power_loss")


def _shard(number: int):
    @seed(number)
    @settings(max_examples=EXAMPLES // SHARDS, deadline=None)
    @given(schedules(learners=SPACE.learners, kinds=SIMULATED, max_faults=SPACE.max_faults, horizon=SPACE.horizon,
                     min_duration=0.5, max_duration=5.0))
    def test(schedule: Schedule) -> None:
        outcome = judge(schedule, SPACE)
        assert not outcome.failed, f"{schedule.to_dict()}: {outcome.details}"

    test.__name__ = f"test_every_check_passes_under_random_simulated_faults_shard_{number}"
    test.__doc__ = f"Shard {number} of {SHARDS}: {EXAMPLES // SHARDS} schedules drawn from seed {number}."
    return test


test_every_check_passes_under_random_simulated_faults_shard_0 = _shard(0)
test_every_check_passes_under_random_simulated_faults_shard_1 = _shard(1)
test_every_check_passes_under_random_simulated_faults_shard_2 = _shard(2)
test_every_check_passes_under_random_simulated_faults_shard_3 = _shard(3)
