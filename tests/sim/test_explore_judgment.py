"""The search judges a schedule as a live run's verdict does: a required (safety) check that
answers unknown fails it, and the other checks left unknown are counted, not passed over."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from chaos.checkers import UNKNOWN
from chaos.sim import explore as ex


def _unknown(names: set[str]):
    """check_events as it is, with the checks in `names` answering unknown."""
    real = ex.check_events

    def check_events(view, *args, **kwargs):
        return [replace(v, status=UNKNOWN, detail="could not judge (planted)") if v.name in names else v
                for v in real(view, *args, **kwargs)]
    return check_events


def test_a_required_check_left_unknown_fails_the_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "check_events", _unknown({"no_lost_acks"}))
    outcome = ex.judge(ex.draw(1, 0, ex.Space()), ex.Space())
    assert outcome.failed == ["no_lost_acks"] and outcome.unknown == []
    assert outcome.details["no_lost_acks"] == "unknown, and required: could not judge (planted)"


def test_other_checks_left_unknown_are_counted_by_the_search(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ex, "check_events", _unknown({"progress", "self_heal"}))
    report = ex.explore(3, 1, ex.Space(), tmp_path, jobs=1)
    assert report["violations"] == 0 and report["schedules"] == 3
    assert report["unknown"] == {"progress": 3, "self_heal": 3}


def test_a_search_where_every_check_judged_reports_no_unknown(tmp_path: Path) -> None:
    report = ex.explore(3, 1, ex.Space(), tmp_path, jobs=1)
    assert report["violations"] == 0 and report["unknown"] == {}
