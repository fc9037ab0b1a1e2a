"""Events on stderr for container logs ($ISLANDS_EVENTS_TO_STDERR=1): every rare event, the
frequent ones at most every ECHO_EVERY seconds, and the event files unchanged."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from trainer.event_echo import ENV, EventEcho, format_event
from trainer.events import EventLog


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_line_names_process_kind_and_fields() -> None:
    line = format_event({"t": 1.0, "wall": 0.0, "process": "learner-1", "pid": 9, "learner": 1,
                         "kind": "inner_step", "step": 200, "loss": 2.31456, "contributors": list(range(200))},
                        skipped=41)
    assert " learner-1 inner_step step=200 loss=2.315 contributors=[0,1,2" in line
    assert line.endswith("… (+41 not shown)") and "pid=" not in line


def test_frequent_kinds_are_thinned_and_rare_ones_all_shown() -> None:
    out, clock = io.StringIO(), Clock()
    echo = EventEcho(out, every=10.0, clock=clock)
    for step in range(5):
        echo({"process": "learner-1", "kind": "inner_step", "step": step})
    echo({"process": "learner-1", "kind": "push", "seq": 1})
    echo({"process": "learner-1", "kind": "push", "seq": 2})
    clock.now = 10.5
    echo({"process": "learner-1", "kind": "inner_step", "step": 99})
    lines = out.getvalue().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        "learner-1 inner_step step=0", "learner-1 push seq=1", "learner-1 push seq=2",
        "learner-1 inner_step step=99 (+4 not shown)"]


def test_the_event_log_echoes_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delenv(ENV, raising=False)
    quiet = EventLog(tmp_path, "syncer")
    quiet.emit("merge", version=3)
    quiet.close()
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(ENV, "1")
    log = EventLog(tmp_path, "syncer")
    log.emit("merge", version=4)
    log.close()
    assert " syncer merge version=4" in capsys.readouterr().err
    written = [json.loads(line) for line in (tmp_path / "events" / "syncer.jsonl").read_text().splitlines()]
    assert [e["version"] for e in written] == [3, 4], "the event file is the record either way"
