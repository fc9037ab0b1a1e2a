"""The cluster a schedule runs on: learner count resolution and rank targets, shared by
`chaos validate` and `chaos run` so that they agree."""
from __future__ import annotations

import pytest

from faults.kinds import Kill, Pause
from faults.schedule import Schedule, ScheduleError, declared_learners
from faults.sizing import DEFAULT_LEARNERS, SizeConflict, resolve_learners


def test_the_schedule_sizes_the_cluster_unless_learners_is_given() -> None:
    assert resolve_learners(2, None) == 2
    assert resolve_learners(None, 5) == 5
    assert resolve_learners(None, None) == DEFAULT_LEARNERS == 3
    assert resolve_learners(4, 4) == 4


def test_a_disagreement_names_both_numbers() -> None:
    with pytest.raises(SizeConflict, match=r"--learners 3 disagrees with quick.yaml's learners: 2"):
        resolve_learners(2, 3, source="quick.yaml")


def test_rank_targets_are_checked_only_when_ranks_are_given() -> None:
    schedule = Schedule(seed=1, faults=(Kill(1, 2, "learner-1/rank-1"), Pause(5, 1, "learner-2/rank-0")))
    assert schedule.problems(learners=2) == []  # ranks unknown: as before, for code that builds schedules
    problems = schedule.problems(learners=2, ranks=1)
    assert len(problems) == 2 and all("runs a single process (--ranks 1)" in p for p in problems)
    assert schedule.problems(learners=2, ranks=2) == []
    with pytest.raises(ScheduleError, match=r"faults\[0\].target: no such target 'learner-1/rank-1'"):
        schedule.validate(learners=2, ranks=1)


def test_loading_reports_rank_problems_with_every_other(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("seed: 1\nfaults:\n- {kind: kill, at: 1, duration: 2, target: learner-9}\n"
                    "- {kind: kill, at: 1, duration: 2, target: learner-1/rank-2}\n")
    with pytest.raises(ScheduleError) as info:
        Schedule.load(path, learners=3, ranks=2)
    assert len(info.value.errors) == 2
    assert "learner-1 runs 2 ranks (rank-0..rank-1; --ranks 2)" in info.value.errors[1]


def test_declared_learners_reads_a_valid_count_only(tmp_path) -> None:
    good, bad, broken = tmp_path / "a.yaml", tmp_path / "b.json", tmp_path / "c.yaml"
    good.write_text("seed: 1\nlearners: 2\nfaults: []\n")
    bad.write_text('{"seed": 1, "learners": 0, "faults": []}')
    broken.write_text("seed: [1\n")
    assert declared_learners(good) == 2
    assert declared_learners(bad) is None and declared_learners(broken) is None
    assert declared_learners(tmp_path / "missing.yaml") is None
