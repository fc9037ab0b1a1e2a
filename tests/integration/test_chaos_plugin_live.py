"""The pytest plugin's marker and fixtures against a real local cluster."""
from __future__ import annotations

import pytest

from faults import Partition, Schedule

pytestmark = pytest.mark.integration


# The small model of the property suites: it learns the source within ~15 s even on a busy machine.
FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]


@pytest.mark.chaos(schedule="../../examples/schedules/quick.yaml", learners=2, duration=15, trainer_args=FAST)
def test_marker_runs_a_schedule_file(chaos_result) -> None:
    assert chaos_result.passed
    assert chaos_result.summary["merges"] > 0
    assert (chaos_result.run_dir / "history.jsonl").exists()


def test_fixtures_apply_a_schedule_to_a_live_cluster(chaos, toxiproxy, cluster) -> None:
    assert set(toxiproxy.proxies()) == {f"learner-{i}" for i in range(1, cluster.learners + 1)}
    chaos.run(Schedule(seed=1, faults=(Partition(at=1, duration=3, targets=("learner-2",)),)), duration=12)
    chaos.assert_ok()
    assert toxiproxy.toxics("learner-2") == [], "the partition was not healed"
