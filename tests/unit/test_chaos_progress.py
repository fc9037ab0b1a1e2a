"""What `chaos run` prints while it runs, from the files the run writes."""
from __future__ import annotations

import io
import json
from pathlib import Path

from chaos.progress import JsonlTail, ProgressPrinter, RunProgress


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def append(path: Path, *records: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")


def step(learner: int, t: float, loss: float = 2.5) -> dict:
    return {"t": t, "kind": "inner_step", "learner": learner, "loss": loss}


def test_a_torn_last_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"b":')
    tail = JsonlTail(path)
    assert tail.read() == [{"a": 1}]
    with open(path, "a") as fh:
        fh.write(' 2}\n')
    assert tail.read() == [{"b": 2}]
    assert JsonlTail(tmp_path / "missing.jsonl").read() == []


def test_training_faults_heals_and_the_end_are_said_once_each(tmp_path: Path) -> None:
    clock = Clock()
    progress = RunProgress(tmp_path, learners=2, heartbeat=10.0, clock=clock)
    assert progress.poll() == []  # nothing yet, and no heartbeat before 10 s of quiet
    append(tmp_path / "events" / "learner-1.jsonl", step(1, 104.0))
    append(tmp_path / "events" / "learner-2.jsonl", step(2, 105.0))
    clock.now = 106.0
    lines = progress.poll()
    assert lines == ["chaos:   5.0 s after start  every learner is training (2 learners)"]
    history = tmp_path / "history.jsonl"
    append(history, {"t": 107.0, "event": "heal", "reason": "start", "did": [], "ok": True},
           {"t": 107.5, "event": "begin", "faults": 1, "duration": 20},
           {"t": 108.5, "event": "start", "index": 0, "fault": {"kind": "kill", "target": "learner-1"},
            "did": "SIGKILL learner-1", "ok": True})
    clock.now = 109.0
    lines = progress.poll()
    assert lines == ["chaos: t=  0.0 s  schedule started: 1 fault(s), 20 s on the schedule's clock",
                     "chaos: t=  1.0 s  faults[0] kill learner-1 started: SIGKILL learner-1"]
    append(history, {"t": 112.5, "event": "stop", "index": 0, "fault": {"kind": "kill", "target": "learner-1"},
                     "ok": False, "error": "TimeoutError: no"},
           {"t": 127.5, "event": "heal", "reason": "end", "did": ["restarted learner-1"], "ok": True},
           {"t": 128.0, "event": "end", "errors": ["x"]})
    clock.now = 129.0
    lines = progress.poll()
    assert lines[0] == "chaos: t=  5.0 s  faults[0] kill learner-1 stopped: FAILED: TimeoutError: no"
    assert lines[1] == "chaos: t= 20.0 s  heal (end): restarted learner-1"
    assert lines[2].endswith("schedule done (1 error(s)); stopping the cluster and checking the run")
    assert progress.poll() == []
    clock.now = 200.0
    assert progress.poll() == ["chaos: t= 92.5 s  stopping the cluster and checking the run"], \
        "the heartbeat goes on once the schedule is done, saying what the run does"
    progress.set_phase("running the fault-free reference")
    clock.now = 215.0
    assert progress.poll() == ["chaos: t=107.5 s  running the fault-free reference (15 s so far)"]


def test_a_heartbeat_after_quiet_names_version_loss_and_who_steps(tmp_path: Path) -> None:
    clock = Clock()
    progress = RunProgress(tmp_path, learners=2, heartbeat=10.0, clock=clock)
    clock.now = 111.0
    assert progress.poll() == ["chaos:  11.0 s after start  starting: 0 of 2 learners training so far"]
    append(tmp_path / "events" / "learner-1.jsonl", step(1, 112.0, 2.0), step(1, 121.5, 2.0))
    append(tmp_path / "events" / "learner-2.jsonl", step(2, 112.0, 3.0))
    append(tmp_path / "events" / "syncer.jsonl", {"t": 113.0, "kind": "merge", "version": 4, "learner": None})
    clock.now = 112.5
    assert progress.poll()[0].endswith("every learner is training (2 learners)")
    clock.now = 122.0
    assert progress.poll() == []  # said something 9.5 s ago
    clock.now = 123.0
    [line] = progress.poll()
    assert line.endswith("version 4, training loss 2.500, stepping: learner-1"), line


def test_the_printer_flushes_what_came_last_when_it_stops(tmp_path: Path) -> None:
    out = io.StringIO()
    with ProgressPrinter(RunProgress(tmp_path, learners=1), out=out, poll=60.0):
        append(tmp_path / "history.jsonl", {"t": 1.0, "event": "end", "errors": []})
    assert "schedule done; stopping the cluster and checking the run" in out.getvalue()
