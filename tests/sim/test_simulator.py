"""The deterministic simulator (chaos/sim): the real syncer on a virtual clock, network and
disk, judged by the same checkers as a live run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.controller import HISTORY_FILE, read_history
from chaos.runner import evaluate_run, judge_events
from chaos.sim.world import SimSettings, event_digest, first_difference, simulate, unsupported
from faults import Schedule
from trainer.events import EventLog, MemoryEvents, read_events
from trainer.protocol import Status

ROOT = Path(__file__).resolve().parents[2]
EVERY_KIND = """\
seed: 3
learners: 3
faults:
- {kind: kill, at: 2, duration: 3, target: learner-1}
- {kind: pause, at: 4, duration: 3, target: learner-2}
- {kind: partition, at: 6, duration: 4, targets: [learner-3]}
- {kind: kill, at: 12, duration: 2, target: syncer}
- {kind: latency, at: 15, duration: 3, target: learner-2, latency_ms: 300}
- {kind: partition, at: 17, duration: 3, targets: [learner-1], mode: refuse}
- {kind: pause, at: 21, duration: 2, target: syncer}
- {kind: power_loss, at: 25, duration: 2, target: syncer}
"""


def schedule_of(text: str, tmp_path: Path) -> Schedule:
    path = tmp_path / "schedule.yaml"
    path.write_text(text)
    return Schedule.load(path)


def test_every_simulated_kind_heals_and_every_check_passes(tmp_path: Path) -> None:
    schedule = schedule_of(EVERY_KIND, tmp_path)
    world = simulate(schedule, tmp_path / "run", SimSettings(learners=3))
    result = evaluate_run(tmp_path / "run", 3)
    assert result.passed, {v.name: v.detail for v in result.verdicts if v.status != "pass"}
    history = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    started = [h for h in history if h.get("event") == "start"]
    assert [h["did"].split()[0] for h in started] == ["SIGKILL", "SIGSTOP", "blackhole", "SIGKILL", "latency",
                                                     "refuse", "SIGSTOP", "power"]
    assert all(h["at"] == h["planned"] for h in started), "simulated faults start exactly when planned"
    events = [json.loads(line) for line in (tmp_path / "run" / "events" / "syncer.jsonl").read_text().splitlines()]
    loads = [e for e in events if e["kind"] == "state_loaded"]
    assert len(loads) == 3 and loads[1]["versions"] != [0], "the syncer recovered its state after the kill"
    assert world.time.now > 1000 + schedule.horizon, "virtual time ran past the schedule"


def test_the_same_seed_gives_the_same_event_log_and_another_seed_another(tmp_path: Path) -> None:
    schedule = schedule_of(EVERY_KIND, tmp_path)
    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        simulate(Schedule.from_dict({**schedule.to_dict(), "seed": seed}), tmp_path / name, SimSettings(learners=3))
        runs[name] = event_digest(tmp_path / name)
    assert runs["a"] == runs["b"], first_difference(tmp_path / "a", tmp_path / "b")
    assert runs["a"] != runs["c"]
    assert first_difference(tmp_path / "a", tmp_path / "c") is not None


def strictly(value: object) -> object:
    """`value` with every type spelled out: equal only if equal and of the same types
    (1 == 1.0 == True, and a tuple is no list once written)."""
    if isinstance(value, dict):
        return ("dict", [(k, strictly(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [strictly(v) for v in value])
    return (type(value).__name__, repr(value))


def test_a_run_kept_in_memory_is_judged_on_exactly_the_events_its_files_hold(tmp_path: Path) -> None:
    schedule = schedule_of(EVERY_KIND, tmp_path)
    run = tmp_path / "run"
    simulate(schedule, run, SimSettings(learners=3))
    on_disk = evaluate_run(run, 3)
    world = simulate(schedule, run, SimSettings(learners=3), memory=True)
    assert sorted(p.name for p in run.iterdir()) == ["events", "history.jsonl", "run.json", "schedule.yaml",
                                                     "verdict.json"], "a run kept in memory writes nothing"
    assert strictly(world.events()) == strictly(read_events(run))
    assert strictly(world.history_entries()) == strictly(read_history(run / HISTORY_FILE))
    in_memory = judge_events(world.events(), world.history_entries(), 3, None)
    assert [v.to_dict() for v in in_memory.verdicts] == [v.to_dict() for v in on_disk.verdicts]


def test_an_event_kept_in_memory_is_what_its_json_line_reads_back_as(tmp_path: Path) -> None:
    odd = {"tuple": (1, (2.0, "x")), "nan": float("nan"), "inf": [float("-inf")], "status": Status.STALE,
           "keys": {1: True, "n": None}, "nested": {"a": [{"b": -0.0}]}}
    plain = {"versions": [1, 2], "d": {"x": "y"}, "big": 2 ** 70, "f": 0.1 + 0.2}
    memory = MemoryEvents()
    for keep in (None, memory):
        log = EventLog(tmp_path, "syncer", monotonic=iter([3.0, 2.0, 1.0]).__next__, wall_clock=lambda: 0.0,
                       pid=1, memory=keep)
        log.emit("odd", **odd)
        log.emit("plain", **plain)
        log.close()
        log.emit("late")  # after close: nowhere
    plain["versions"].append(3)  # a list the emitter changes afterwards: the event keeps what it was
    assert strictly(memory.events()) == strictly(read_events(tmp_path))
    memory.file("learner-1").extend([{"t": 2.0, "n": 2}, {"t": 0.5, "n": 3}])
    assert [e.get("n") for e in memory.events()] == [3, 2, None, None], "by time, ties in file-name order"


def test_a_fault_the_simulator_cannot_model_is_refused_by_name(tmp_path: Path) -> None:
    schedule = schedule_of("seed: 1\nlearners: 2\nfaults:\n"
                           "- {kind: slicer, at: 1, duration: 2, target: learner-1, average_size: 64}\n"
                           "- {kind: partition, at: 1, duration: 2, targets: [learner-2], mode: network}\n", tmp_path)
    problems = unsupported(schedule)
    assert problems == ["faults[0]: kind 'slicer' is not simulated (simulated: kill, pause, partition, latency, "
                        "power_loss)",
                        "faults[1].mode: 'network' is not simulated (simulated: blackhole, refuse)"]
    with pytest.raises(ValueError, match="kind 'slicer' is not simulated"):
        simulate(schedule, tmp_path / "run")
    assert not (tmp_path / "run").exists(), "a refused run leaves nothing behind"


def chaos(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def test_chaos_sim_prints_the_verdicts_and_exits_1_on_a_failed_check(tmp_path: Path) -> None:
    schedule = tmp_path / "kill.yaml"
    schedule.write_text("seed: 4\nlearners: 2\nfaults:\n- {kind: kill, at: 3, duration: 2, target: syncer}\n")
    passed = chaos("sim", str(schedule), "--out", str(tmp_path / "ok"))
    assert passed.returncode == 0, passed.stdout[-2000:] + passed.stderr[-2000:]
    assert "verdict: PASS" in passed.stdout and "PASS    no_lost_acks" in passed.stdout
    failed = chaos("sim", str(schedule), "--out", str(tmp_path / "bad"), "--defect", "ack_before_durable")
    assert failed.returncode == 1, failed.stdout[-2000:] + failed.stderr[-2000:]
    assert "FAIL    no_lost_acks" in failed.stdout
    assert "ISLANDS_SYNCER_DEFECT=ack_before_durable python -m chaos run" in failed.stdout
    refused = chaos("sim", str(schedule), "--out", str(tmp_path / "bad"))
    assert refused.returncode == 2 and "exists and is not empty" in refused.stderr


def test_chaos_explore_json_reports_the_search(tmp_path: Path) -> None:
    done = chaos("explore", "--schedules", "8", "--seed", "1", "--json", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["schedules"] == 8 and report["violations"] == 0 and report["first_failure"] is None
    assert report["seconds"] > 0


