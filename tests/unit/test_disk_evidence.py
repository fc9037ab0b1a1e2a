"""The disk schedule's evidence check catches each way a run can fall short of it."""
from __future__ import annotations

import pytest

from tests.integration.disk_evidence import disk_schedule_problems

FELT = [{"process": "syncer", "kind": "storage_error", "reason": "storage_full"},
        {"process": "syncer", "kind": "disk_failed"}]


def test_either_path_through_the_full_disk_passes() -> None:
    held_back = FELT + [{"process": "syncer", "kind": "merge_failed", "reason": "quorum"}]
    refused = FELT + [{"process": "learner-1", "kind": "push_deferred", "reason": "storage_full"}]
    assert disk_schedule_problems(held_back) == []
    assert disk_schedule_problems(refused) == []


@pytest.mark.parametrize("events, words", [
    (FELT[1:], "never felt"),
    (FELT[:1], "failed sync"),
    (FELT + [{"process": "learner-1", "kind": "push_deferred", "reason": "busy"}], "other than the disk"),
    (FELT + [{"process": "learner-1", "kind": "push", "status": "refused", "reason": "storage_full"}], "dropped"),
    (FELT + [{"process": "syncer", "kind": "leave", "reason": "[Errno 28] No space left on device"}], "instead of refused"),
])
def test_each_shortfall_is_named(events: list[dict], words: str) -> None:
    problems = disk_schedule_problems(events)
    assert len(problems) == 1 and words in problems[0], problems
